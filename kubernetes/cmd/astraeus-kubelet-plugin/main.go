// astraeus-kubelet-plugin: astraeusd's DRA kubelet plugin. A thin adaptor
// between the kubelet (and the API server's ResourceSlices) and the
// daemon's D-Bus API: every decision is the daemon's (docs/kubernetes.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"astraeusd/kubernetes/internal/daemon"
	"astraeusd/kubernetes/internal/plugin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "astraeus-kubelet-plugin:", err)
		os.Exit(1)
	}
}

func run() error {
	driverName := flag.String("driver-name", "gpu.astraeus.dev", "the DRA driver's name")
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME, else the host's name lowercased, as the kubelet's)")
	kubeconfig := flag.String("kubeconfig", "", "a kubeconfig; empty: in-cluster")
	busAddress := flag.String("bus-address", "", "astraeusd's bus; empty: the system bus")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where claims' CDI specs are written")
	gpuDevice := flag.String("gpu-cdi-device", "nvidia.com/gpu={uuid}", "the CDI device giving a container its GPU; empty for none")
	hook := flag.String("hook", "/usr/bin/astraeusctl", "astraeusctl, run as each claim's CDI createContainer hook (claim-hook); empty for none")
	pluginDir := flag.String("plugin-dir", "", "the plugin's socket directory (default /var/lib/kubelet/plugins/<driver>)")
	registrarDir := flag.String("registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registry")
	cleanupEvery := flag.Duration("cleanup-every", time.Minute, "how often claims the API server no longer has are unprepared")
	klog.InitFlags(nil)
	flag.Parse()
	if *nodeName == "" {
		// The kubelet's own default (its --hostname-override unset).
		host, err := os.Hostname()
		if err != nil || host == "" {
			return fmt.Errorf("--node-name (or $NODE_NAME) is required: the host's name is unknown (%v)", err)
		}
		*nodeName = strings.ToLower(host)
	}
	if *pluginDir == "" {
		*pluginDir = "/var/lib/kubelet/plugins/" + *driverName
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("the API server's config: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	d, err := daemon.Connect(*busAddress)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	driver := &plugin.Driver{
		Name:      *driverName,
		Node:      *nodeName,
		Daemon:    d,
		CDIDir:    *cdiDir,
		GPUDevice: *gpuDevice,
		// The hook reaches the daemon the plugin does.
		Hook:           *hook,
		HookBusAddress: *busAddress,
	}
	helper, err := kubeletplugin.Start(ctx, driver,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*nodeName),
		kubeletplugin.DriverName(*driverName),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	driver.Helper = helper
	changes, err := d.Changes(ctx)
	if err != nil {
		return err
	}
	// Published now, again on each change the daemon signals, and again
	// after a failure (the daemon or the API server away).
	retry := time.NewTimer(0)
	cleanup := time.NewTicker(*cleanupEvery)
	defer cleanup.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-cleanup.C:
			if err := driver.Cleanup(ctx, client); err != nil {
				klog.FromContext(ctx).Error(err, "unpreparing claims the API server no longer has")
			}
			continue
		case <-changes:
		case <-retry.C:
		}
		if err := driver.Publish(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "publishing the node's GPUs; trying again in 5 s")
			retry.Reset(5 * time.Second)
		}
	}
}
