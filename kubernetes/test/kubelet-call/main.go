// kubelet-call (test support only): calls a DRA plugin's socket as the
// kubelet does, with the kubelet's own generated client
// (k8s.io/kubelet/pkg/apis/dra/v1), and prints the claim's result: each
// device's CDI IDs, or "error: …" (what the pod's events would show).
//
//	kubelet-call prepare|unprepare SOCKET NAMESPACE NAME UID
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-call prepare|unprepare SOCKET NAMESPACE NAME UID")
		os.Exit(2)
	}
	op, socket, ns, name, uid := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := drapb.NewDRAPluginClient(conn)
	claims := []*drapb.Claim{{Namespace: ns, Name: name, Uid: uid}}
	switch op {
	case "prepare":
		r, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		res := r.Claims[uid]
		if res == nil {
			fmt.Println("error: no result for the claim")
			return
		}
		if res.Error != "" {
			fmt.Println("error: " + res.Error)
			return
		}
		for _, d := range res.Devices {
			fmt.Printf("%s/%s %s\n", d.PoolName, d.DeviceName, strings.Join(d.CdiDeviceIds, " "))
		}
	case "unprepare":
		r, err := client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if res := r.Claims[uid]; res != nil && res.Error != "" {
			fmt.Println("error: " + res.Error)
			return
		}
		fmt.Println("unprepared")
	default:
		fmt.Fprintln(os.Stderr, "prepare or unprepare")
		os.Exit(2)
	}
}
