// Package plugin is the kubelet plugin's DRA side: the devices it
// publishes (what astraeusd offers) and the claims it prepares (asked of
// astraeusd). It decides nothing the daemon decides.
package plugin

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"astraeusd/kubernetes/internal/daemon"
)

// Step is the daemon's quantum of a claim's memory (claim.rs): 256 MiB,
// exactly a quarter of a GB in the ledger.
const Step = 1 << 28

// DeviceName names GPU index i's shared device in the slice.
func DeviceName(index uint32) string { return fmt.Sprintf("gpu-%d", index) }

// WholeName names GPU index i's whole device.
func WholeName(index uint32) string { return fmt.Sprintf("gpu-%d-whole", index) }

// TaintPrefix begins a withheld GPU's device taint key (the rest is why).
const TaintPrefix = "gpu.astraeus.dev/"

// MIGName names MIG instance index i's device (whole only).
func MIGName(index uint32) string { return fmt.Sprintf("mig-%d", index) }

// counterSet names GPU index i's counters: its shared and its whole
// device each consume them, so that the scheduler never allocates both.
func counterSet(index uint32) string { return fmt.Sprintf("gpu-%d", index) }

// Uses a GPU's counter holds: the whole device consumes all of them,
// each allocation of the shared device one (once or per share, either
// way the two exclude each other).
const Uses = 1000

// Resources is the node's pool. A GPU whose offer is withheld is its
// shared device alone, tainted with why. Each GPU that offers the cluster
// something is two devices: `gpu-N`, shared by many claims, its capacity
// what the daemon offers now (attribute shared=true); and, while no local
// worker shares the GPU, `gpu-N-whole`, one claim's (shared=false). A
// counter set per GPU keeps the two apart (a request with no capacity
// takes a shared device's default, not the GPU: a whole GPU is asked of a
// class selecting shared=false). Devices are listed fullest first (least
// left) so the scheduler's first fit approaches the daemon's best fit.
// Counters and devices are slices of their own (the API takes one or the
// other in a slice). A MIG instance is one device, `mig-N`, whole only
// (shared=false, mig=true; no counters: nothing else is published of it),
// while free. Every device says mig, true or false: a class's CEL that
// reads an attribute a device lacks fails the allocation.
func Resources(node string, offers []daemon.Offer) resourceslice.DriverResources {
	sorted := append([]daemon.Offer(nil), offers...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Bytes != sorted[j].Bytes {
			return sorted[i].Bytes < sorted[j].Bytes
		}
		return sorted[i].Index < sorted[j].Index
	})
	uses := func(n int64) map[string]resourceapi.Counter {
		return map[string]resourceapi.Counter{"uses": {Value: *resource.NewQuantity(n, resource.DecimalSI)}}
	}
	var counters []resourceapi.CounterSet
	var devices []resourceapi.Device
	for _, o := range sorted {
		if o.Withheld == "" && !o.Healthy {
			o.Withheld = "unhealthy"
		}
		if o.Bytes < Step && o.Withheld == "" || o.MIG && !o.Healthy {
			continue
		}
		attributes := func(shared bool) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
			a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":   {StringValue: ptr.To(o.UUID)},
				"model":  {StringValue: ptr.To(o.Model)},
				"index":  {IntValue: ptr.To(int64(o.Index))},
				"shared": {BoolValue: ptr.To(shared)},
				"mig":    {BoolValue: ptr.To(o.MIG)},
				// Health is said by a taint (below), not an attribute.
			}
			if o.Driver != "" {
				a["driver"] = resourceapi.DeviceAttribute{StringValue: ptr.To(o.Driver)}
			}
			return a
		}
		// A device one claim takes whole, its capacity said, not consumed.
		whole := func(name string, consumes []resourceapi.DeviceCounterConsumption) resourceapi.Device {
			return resourceapi.Device{
				Name:       name,
				Attributes: attributes(false),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: *resource.NewQuantity(int64(o.Bytes), resource.BinarySI)},
				},
				ConsumesCounters: consumes,
			}
		}
		if o.MIG {
			if o.Whole {
				devices = append(devices, whole(MIGName(o.Index), nil))
			}
			continue
		}
		// Withheld (unhealthy, held whole by the host's own work, or kept
		// for a whole request): the shared device with a taint that says
		// why (KEP-5055, GA in 1.37), no capacity: nothing is allocated
		// on it, and `kubectl get resourceslices -o yaml` shows why.
		if o.Withheld != "" {
			devices = append(devices, resourceapi.Device{
				Name:       DeviceName(o.Index),
				Attributes: attributes(true),
				Taints: []resourceapi.DeviceTaint{{
					Key:    TaintPrefix + o.Withheld,
					Effect: resourceapi.DeviceTaintEffectNoSchedule,
				}},
			})
			continue
		}
		counters = append(counters, resourceapi.CounterSet{Name: counterSet(o.Index), Counters: uses(Uses)})
		devices = append(devices, resourceapi.Device{
			Name:       DeviceName(o.Index),
			Attributes: attributes(true),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {
					Value: *resource.NewQuantity(int64(o.Bytes), resource.BinarySI),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: resource.NewQuantity(1<<30, resource.BinarySI),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  resource.NewQuantity(Step, resource.BinarySI),
							Step: resource.NewQuantity(Step, resource.BinarySI),
						},
					},
				},
			},
			AllowMultipleAllocations: ptr.To(true),
			ConsumesCounters:         []resourceapi.DeviceCounterConsumption{{CounterSet: counterSet(o.Index), Counters: uses(1)}},
		})
		if o.Whole {
			devices = append(devices, whole(WholeName(o.Index),
				[]resourceapi.DeviceCounterConsumption{{CounterSet: counterSet(o.Index), Counters: uses(Uses)}}))
		}
	}
	slices := []resourceslice.Slice{{Devices: devices}}
	if len(counters) > 0 {
		slices = append([]resourceslice.Slice{{SharedCounters: counters}}, slices...)
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{node: {Slices: slices}},
	}
}
