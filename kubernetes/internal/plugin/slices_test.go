package plugin

import (
	"strings"
	"testing"

	"astraeusd/kubernetes/internal/daemon"
)

// The pool lists GPUs fullest first, leaves out those that offer nothing
// (and withhold nothing: TestWithheldGPUsAreTaintedWithWhy), and
// publishes each one's offer as its memory.
func TestResourcesListFullestFirst(t *testing.T) {
	offers := []daemon.Offer{
		{Index: 0, UUID: "GPU-a", Model: "A", Bytes: 28 * Step, Healthy: true, Whole: true},
		{Index: 1, UUID: "GPU-b", Model: "B", Bytes: 4 * Step, Healthy: true},
		{Index: 2, UUID: "GPU-c", Model: "C", Bytes: 0, Healthy: true},
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

// A MIG instance is one device, whole only, while free: no shared device,
// no counters; every device says whether it is one.
func TestMIGInstancesArePublishedWholeOnly(t *testing.T) {
	offers := []daemon.Offer{
		{Index: 0, UUID: "GPU-a", Model: "A", Bytes: 8 * Step, Healthy: true, Whole: true},
		{Index: 1, UUID: "MIG-b", Model: "A MIG 1g.6gb", Bytes: 24 * Step, Healthy: true, Whole: true, MIG: true, Driver: "615.20"},
		{Index: 2, UUID: "MIG-c", Model: "A MIG 1g.6gb", Bytes: 0, Healthy: true, MIG: true},
	}
	pool := Resources("majin", offers).Pools["majin"]
	counters := pool.Slices[0].SharedCounters
	if len(counters) != 1 || counters[0].Name != "gpu-0" {
		t.Fatalf("counters only for the GPU: %+v", counters)
	}
	var names []string
	for _, d := range pool.Slices[1].Devices {
		names = append(names, d.Name)
		if d.Name == "mig-1" {
			if d.AllowMultipleAllocations != nil || len(d.ConsumesCounters) != 0 {
				t.Fatalf("a MIG instance is not shared: %+v", d)
			}
			if !*d.Attributes["mig"].BoolValue || *d.Attributes["shared"].BoolValue || *d.Attributes["uuid"].StringValue != "MIG-b" ||
				*d.Attributes["driver"].StringValue != "615.20" {
				t.Fatalf("attributes %+v", d.Attributes)
			}
		} else if *d.Attributes["mig"].BoolValue {
			t.Fatalf("%s says mig", d.Name)
		} else if _, ok := d.Attributes["driver"]; ok {
			t.Fatalf("%s: a driver attribute where the daemon read none", d.Name)
		}
	}
	if strings.Join(names, " ") != "gpu-0 gpu-0-whole mig-1" {
		t.Fatalf("devices %v (mig-2 is taken: left out)", names)
	}
}

// A withheld GPU is published tainted with why (unhealthy when the daemon
// says no more), without capacity or a whole device; an unhealthy MIG
// instance is left out.
func TestWithheldGPUsAreTaintedWithWhy(t *testing.T) {
	offers := []daemon.Offer{
		{Index: 0, UUID: "GPU-a", Model: "A", Bytes: 0, Healthy: false},
		{Index: 1, UUID: "GPU-b", Model: "B", Bytes: 0, Healthy: true, Withheld: "held-by-host"},
		{Index: 2, UUID: "GPU-c", Model: "C", Bytes: 0, Healthy: true},
		{Index: 3, UUID: "MIG-d", Model: "D", Bytes: 0, Healthy: false, MIG: true},
	}
	pool := Resources("majin", offers).Pools["majin"]
	devices := pool.Slices[len(pool.Slices)-1].Devices
	if len(devices) != 2 {
		t.Fatalf("the two withheld GPUs only: %+v", devices)
	}
	for i, why := range []string{"unhealthy", "held-by-host"} {
		d := devices[i]
		if d.Name != DeviceName(uint32(i)) || len(d.Taints) != 1 || d.Taints[0].Key != "gpu.astraeus.dev/"+why ||
			d.Taints[0].Effect != "NoSchedule" || len(d.Capacity) != 0 || len(d.ConsumesCounters) != 0 {
			t.Fatalf("device %d: %+v", i, d)
		}
	}
}
