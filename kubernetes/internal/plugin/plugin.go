package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"astraeusd/kubernetes/internal/daemon"
)

// CDIKind is the kind of the CDI device each prepared claim gets: its
// containers are told ASTRAEUS_GPU_MEMORY_GB (their share, or the GPU's
// memory when whole).
const CDIKind = "astraeus.dev/claim"

// Driver is the plugin: the kubelet calls it, it asks the daemon.
type Driver struct {
	Name   string
	Node   string
	Daemon *daemon.Client
	// CDIDir is where claims' CDI specs are written (/var/run/cdi).
	CDIDir string
	// GPUDevice is the CDI device giving a container the GPU itself,
	// "{uuid}" replaced (NVIDIA's own: nvidia.com/gpu={uuid}); "" for none.
	GPUDevice string
	// Hook is astraeusctl's path: each claim's spec runs `astraeusctl
	// claim-hook UID` as its containers are created, binding them to the
	// claim in the daemon (holders, limits); "" for no hook.
	Hook string
	// HookBusAddress is the daemon's bus for the hook ("": the system bus).
	HookBusAddress string
	Helper         *kubeletplugin.Helper

	mu sync.Mutex
	// gpus maps a published device's name to its GPU's UUID.
	gpus map[string]string
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Publish publishes what the daemon offers now.
func (d *Driver) Publish(ctx context.Context) error {
	offers, err := d.Daemon.Offers(ctx)
	if err != nil {
		return err
	}
	gpus := make(map[string]string, 2*len(offers))
	for _, o := range offers {
		if o.MIG {
			gpus[MIGName(o.Index)] = o.UUID
			continue
		}
		gpus[DeviceName(o.Index)] = o.UUID
		gpus[WholeName(o.Index)] = o.UUID
	}
	d.mu.Lock()
	d.gpus = gpus
	d.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("publishing what astraeusd offers", "gpus", offers)
	return d.Helper.PublishResources(ctx, Resources(d.Node, offers))
}

func (d *Driver) gpuOf(device string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	uuid, ok := d.gpus[device]
	return uuid, ok
}

// PrepareResourceClaims books each claim's device with the daemon.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = d.prepare(ctx, c)
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)}
	}
	var mine []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == d.Name {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		return kubeletplugin.PrepareResult{}
	}
	if len(mine) > 1 {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s asks for %d GPUs of %s; one GPU a claim for now", c.Namespace, c.Name, len(mine), d.Name)}
	}
	r := mine[0]
	uuid, ok := d.gpuOf(r.Device)
	if !ok {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s is not one this node published", r.Device)}
	}
	// A share's consumed memory; the whole device (no consumed
	// capacity: not shared) is asked of the daemon whole (0).
	var bytes uint64
	if q, ok := r.ConsumedCapacity["memory"]; ok && strings.HasPrefix(r.Device, "gpu-") && !strings.HasSuffix(r.Device, "-whole") {
		bytes = uint64(q.Value())
	}
	uid := string(c.UID)
	memoryGB, err := d.Daemon.Prepare(ctx, uid, c.Namespace, c.Name, uuid, bytes)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if err := d.writeSpec(uid, memoryGB); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	ids := []string{CDIKind + "=" + uid}
	if d.GPUDevice != "" {
		ids = append(ids, strings.ReplaceAll(d.GPUDevice, "{uuid}", uuid))
	}
	return kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{
		Requests:     []string{r.Request},
		PoolName:     r.Pool,
		DeviceName:   r.Device,
		CDIDeviceIDs: ids,
		ShareID:      r.ShareID,
	}}}
}

func (d *Driver) specPath(uid string) string {
	return filepath.Join(d.CDIDir, "astraeus-claim-"+uid+".json")
}

// HookTimeout is how long the runtime lets the hook run (seconds): the
// daemon answers once the share's limits are set and read back.
const HookTimeout = 60

// Spec is the claim's CDI spec: its containers are told their share, and
// (with a Hook) bound to the claim as they are created.
func (d *Driver) Spec(uid, memoryGB string) cdi.Spec {
	edits := cdi.ContainerEdits{
		Env: []string{"ASTRAEUS_GPU_MEMORY_GB=" + memoryGB},
	}
	if d.Hook != "" {
		args := []string{"astraeusctl"}
		if d.HookBusAddress != "" {
			args = append(args, "--bus-address", d.HookBusAddress)
		}
		timeout := HookTimeout
		edits.Hooks = []*cdi.Hook{{
			HookName: "createContainer",
			Path:     d.Hook,
			Args:     append(args, "claim-hook", uid),
			Timeout:  &timeout,
		}}
	}
	spec := cdi.Spec{
		Kind:    CDIKind,
		Devices: []cdi.Device{{Name: uid, ContainerEdits: edits}},
	}
	// The oldest version that has what it uses (0.5.0 for a UID that
	// starts with a digit): runtimes as old as podman 4.3 refuse a spec
	// newer than they know ("unresolvable CDI devices").
	spec.Version, _ = cdi.MinimumRequiredVersion(&spec)
	return spec
}

// writeSpec writes the claim's CDI spec whole (a temporary file renamed).
func (d *Driver) writeSpec(uid, memoryGB string) error {
	data, err := json.Marshal(d.Spec(uid, memoryGB))
	if err != nil {
		return err
	}
	path := d.specPath(uid)
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return fmt.Errorf("writing the claim's CDI spec: %w", err)
	}
	return os.Rename(path+".tmp", path)
}

// Cleanup unprepares the claims the daemon holds that the API server no
// longer has (deleted while prepared, their kubelet's unprepare lost): a
// claim is gone only when a full list, taken after the daemon's, lacks it.
func (d *Driver) Cleanup(ctx context.Context, client kubernetes.Interface) error {
	held, err := d.Daemon.ClaimUIDs(ctx)
	if err != nil || len(held) == 0 {
		return err
	}
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	known := make(map[string]bool, len(claims.Items))
	for _, c := range claims.Items {
		known[string(c.UID)] = true
	}
	for _, uid := range held {
		if known[uid] {
			continue
		}
		klog.FromContext(ctx).Info("unpreparing a claim the API server no longer has", "uid", uid)
		if err := d.Daemon.Unprepare(ctx, uid); err != nil {
			return err
		}
		if err := os.Remove(d.specPath(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// UnprepareResourceClaims ends each claim's worker and its CDI spec.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		err := d.Daemon.Unprepare(ctx, string(c.UID))
		if err == nil {
			if rm := os.Remove(d.specPath(string(c.UID))); rm != nil && !errors.Is(rm, os.ErrNotExist) {
				err = rm
			}
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError logs what the helper could not do in the background.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// WatchHealthStatus: health is in the slice (an unhealthy GPU is left
// out), not reported separately yet.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
