package ovstest

import (
	"strings"
	"testing"
)

func TestStartAddBridgeStop(t *testing.T) {
	inst := Start(t)
	inst.AddBridge("br0")
	out, err := inst.Ofctl("dump-flows", "br0")
	if err != nil {
		t.Fatalf("dump-flows: %v", err)
	}
	if strings.TrimSpace(out) != "" && !strings.Contains(out, "OFPST_FLOW") {
		t.Fatalf("unexpected dump: %q", out)
	}
	inst.KillVswitchd()
	if inst.VswitchdPID() != 0 {
		t.Fatal("vswitchd still running after kill")
	}
	if err := inst.StartVswitchd(); err != nil {
		t.Fatal(err)
	}
	if inst.VswitchdPID() == 0 {
		t.Fatal("vswitchd not running after restart")
	}
}
