package plugin

import (
	"testing"

	"astraeusd/kubernetes/internal/daemon"
)

// The pool lists GPUs fullest first, leaves out those that offer nothing
// or are unhealthy, and publishes each one's offer as its memory.
func TestResourcesListFullestFirst(t *testing.T) {
	offers := []daemon.Offer{
		{Index: 0, UUID: "GPU-a", Model: "A", Bytes: 28 * Step, Healthy: true},
		{Index: 1, UUID: "GPU-b", Model: "B", Bytes: 4 * Step, Healthy: true},
		{Index: 2, UUID: "GPU-c", Model: "C", Bytes: 0, Healthy: true},
		{Index: 3, UUID: "GPU-d", Model: "D", Bytes: 8 * Step, Healthy: false},
	}
	pool := Resources("majin", offers).Pools["majin"]
	devices := pool.Slices[0].Devices
	if len(devices) != 2 || devices[0].Name != "gpu-1" || devices[1].Name != "gpu-0" {
		t.Fatalf("devices %+v", devices)
	}
	memory := devices[1].Capacity["memory"].Value
	if memory.Value() != 28*Step {
		t.Fatalf("gpu-0 offers %v", memory.String())
	}
	if !*devices[0].AllowMultipleAllocations {
		t.Fatal("shared by many claims")
	}
	if *devices[0].Attributes["uuid"].StringValue != "GPU-b" {
		t.Fatalf("uuid %v", devices[0].Attributes["uuid"])
	}
}
