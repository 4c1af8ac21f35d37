package plugin

import (
	"encoding/json"
	"strings"
	"testing"
)

// A claim's spec tells its containers their share and runs the hook that
// binds them to the claim, on the daemon's own bus, before their command.
func TestSpecBindsContainersToTheClaim(t *testing.T) {
	d := &Driver{Hook: "/usr/bin/astraeusctl", HookBusAddress: "unix:path=/run/test-bus"}
	data, err := json.Marshal(d.Spec("0b5e-7", "2.5"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"cdiVersion":"0.5.0","kind":"astraeus.dev/claim","devices":[{"name":"0b5e-7","containerEdits":{` +
		`"env":["ASTRAEUS_GPU_MEMORY_GB=2.5"],` +
		`"hooks":[{"hookName":"createContainer","path":"/usr/bin/astraeusctl",` +
		`"args":["astraeusctl","--bus-address","unix:path=/run/test-bus","claim-hook","0b5e-7"],"timeout":60}]}}],"containerEdits":{}}`
	if string(data) != want {
		t.Fatalf("spec:\n%s\nwant:\n%s", data, want)
	}
	// A UID that starts with a letter needs no more than 0.3.0.
	if v := (&Driver{}).Spec("ab-1", "1").Version; v != "0.3.0" {
		t.Fatalf("version %s for a spec of 0.3.0's features", v)
	}
	// No hook asked for: the share's environment only; the system bus: no address.
	none, _ := json.Marshal((&Driver{}).Spec("u", "1"))
	if strings.Contains(string(none), "hooks") {
		t.Fatalf("a hook with none asked for: %s", none)
	}
	system, _ := json.Marshal((&Driver{Hook: "/x"}).Spec("u", "1"))
	if strings.Contains(string(system), "--bus-address") {
		t.Fatalf("a bus address for the system bus: %s", system)
	}
}
