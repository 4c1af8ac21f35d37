package plugin

import (
	"testing"

	"astraeusd/kubernetes/internal/daemon"
)

// The pool lists GPUs fullest first, leaves out those that offer nothing
// or are unhealthy, and publishes each one's offer as its memory.
func TestResourcesListFullestFirst(t *testing.T) {
	offers := []daemon.Offer{
		{Index: 0, UUID: "GPU-a", Model: "A", Bytes: 28 * Step, Healthy: true, Whole: true},
		{Index: 1, UUID: "GPU-b", Model: "B", Bytes: 4 * Step, Healthy: true},
		{Index: 2, UUID: "GPU-c", Model: "C", Bytes: 0, Healthy: true},
		{Index: 3, UUID: "GPU-d", Model: "D", Bytes: 8 * Step, Healthy: false},
	}
	pool := Resources("majin", offers).Pools["majin"]
	if len(pool.Slices) != 2 || len(pool.Slices[0].SharedCounters) != 2 {
		t.Fatalf("a slice of counters, then one of devices: %+v", pool.Slices)
	}
	devices := pool.Slices[1].Devices
	if len(devices) != 3 || devices[0].Name != "gpu-1" || devices[1].Name != "gpu-0" || devices[2].Name != "gpu-0-whole" {
		t.Fatalf("devices %+v", devices)
	}
	// The whole device takes every use of its GPU's counters, a share one.
	whole := devices[2].ConsumesCounters[0]
	wholeUses := whole.Counters["uses"].Value
	if whole.CounterSet != "gpu-0" || wholeUses.Value() != Uses {
		t.Fatalf("whole consumes %+v", whole)
	}
	shareUses := devices[1].ConsumesCounters[0].Counters["uses"].Value
	if shareUses.Value() != 1 || devices[2].AllowMultipleAllocations != nil {
		t.Fatalf("shared %+v whole %+v", devices[1], devices[2])
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
