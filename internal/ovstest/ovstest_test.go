package ovstest

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
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

func TestPodsPingThroughNormalFlows(t *testing.T) {
	inst := Start(t)
	inst.AddBridge("br0")
	a := inst.AddPod("br0", "a", netip.MustParsePrefix("10.128.0.2/24"), net.HardwareAddr{0x0a, 0x58, 0, 0, 0, 2}, 10)
	b := inst.AddPod("br0", "b", netip.MustParsePrefix("10.128.0.3/24"), net.HardwareAddr{0x0a, 0x58, 0, 0, 0, 3}, 11)
	if _, err := inst.Ofctl("add-flow", "br0", "actions=NORMAL"); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Ping(b.IP.Addr(), 3, 200*time.Millisecond); err != nil || n != 3 {
		t.Fatalf("ping through NORMAL: %d/3 (%v)", n, err)
	}
	if _, err := inst.Ofctl("del-flows", "br0"); err != nil {
		t.Fatal(err)
	}
	// The datapath's cached flows follow the tables at the next revalidation: wait for it, or a loaded
	// machine lets the pings through the cache of the NORMAL flow.
	if _, err := inst.Output("ovs-appctl", "revalidator/wait"); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Ping(b.IP.Addr(), 2, 200*time.Millisecond); n != 0 {
		t.Fatal("fail_mode=secure with no flows must drop everything")
	}
}
