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

// DeviceName names GPU index i in the slice.
func DeviceName(index uint32) string { return fmt.Sprintf("gpu-%d", index) }

// Resources is the node's pool: one device per GPU that takes shares,
// its capacity what the daemon offers the cluster now, listed fullest
// first (least left) so the scheduler's first fit approaches the
// daemon's best fit. A GPU that offers nothing is left out.
func Resources(node string, offers []daemon.Offer) resourceslice.DriverResources {
	sorted := append([]daemon.Offer(nil), offers...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Bytes != sorted[j].Bytes {
			return sorted[i].Bytes < sorted[j].Bytes
		}
		return sorted[i].Index < sorted[j].Index
	})
	var devices []resourceapi.Device
	for _, o := range sorted {
		if o.Bytes < Step || !o.Healthy {
			continue
		}
		devices = append(devices, resourceapi.Device{
			Name: DeviceName(o.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":  {StringValue: ptr.To(o.UUID)},
				"model": {StringValue: ptr.To(o.Model)},
				"index": {IntValue: ptr.To(int64(o.Index))},
			},
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
		})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			node: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}
}
