package pipeline

// Render's flows on a real ovs-vswitchd, with real packets.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/internal/ovstest"
)

// pod is a test pod on the bridge, with its VNID.
type pod struct {
	*ovstest.Pod
	vnid uint32
}

func addPod(b *ofbridge.Bridge, name string, host byte, vnid uint32) pod {
	ip := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, host}), 24)
	mac := net.HardwareAddr{0x0a, 0x58, 10, 128, 0, host}
	return pod{b.Inst.AddPod(ofbridge.Name, name, ip, mac, 10+int(host)), vnid}
}

// install applies a render to a reconciler that holds the render prev (nil: a fresh reconciler), as the
// agent's flow sync does: the owners that changed, and the removal of those gone.
func install(ctx context.Context, r *reconcile.Reconciler, prev, owners map[reconcile.Owner]reconcile.OwnerState) (reconcile.Result, error) {
	res, err := r.Apply(ctx, reconcile.Changes(prev, owners))
	if err == nil && len(res.Failed) > 0 {
		for o, ferr := range res.Failed {
			return res, fmt.Errorf("owner %s: %w", o, ferr)
		}
	}
	return res, err
}

func newReconciler(sw reconcile.Switch, round uint16) *reconcile.Reconciler {
	return reconcile.New(sw, reconcile.Config{Round: round, PipelineVersion: PipelineVersion, VersionOf: VersionOf})
}

// TestRenderIsolatesTenantsOnOVS: Render's flows on a real bridge, pods in two tenants and the global
// VNID: multitenant mode isolates the tenants while VNID 0 reaches both; subnet mode is flat; a pod
// that spoofs another's IP reaches nobody.
func TestRenderIsolatesTenantsOnOVS(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	a, c, g := addPod(b, "a", 2, 11), addPod(b, "c", 3, 12), addPod(b, "g", 4, GlobalVNID)
	state := NodeState{
		Mode: ModeMultitenant, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:     netip.MustParsePrefix("10.128.0.0/24"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
	}
	for _, p := range []pod{a, c, g} {
		state.Pods = append(state.Pods, PodState{Namespace: "t", Name: p.Name, IP: p.IP.Addr(), MAC: p.MAC, OFPort: uint32(p.OFPort), VNID: p.vnid})
	}
	r := newReconciler(b.Switch, 1)
	var applied map[reconcile.Owner]reconcile.OwnerState
	apply := func() {
		t.Helper()
		owners, err := Render(state)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := install(ctx, r, applied, owners); err != nil {
			t.Fatal(err)
		}
		applied = owners
	}
	reach := func(from, to pod) bool {
		n, _ := from.Ping(to.IP.Addr(), 1, 100*time.Millisecond)
		return n == 1
	}
	apply()
	for _, tc := range []struct {
		from, to pod
		want     bool
	}{{a, g, true}, {g, a, true}, {c, g, true}, {a, c, false}, {c, a, false}} {
		if got := reach(tc.from, tc.to); got != tc.want {
			t.Errorf("multitenant: %s → %s reachable=%v, want %v", tc.from.Name, tc.to.Name, got, tc.want)
		}
	}
	state.Mode = ModeSubnet
	apply()
	if !reach(a, c) || !reach(c, a) {
		t.Error("subnet mode must be flat")
	}
	// c takes a's IP: anti-spoofing drops everything it sends from it.
	if _, err := c.Exec("ip", "addr", "add", "10.128.0.2/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exec("ping", "-c", "1", "-W", "1", "-I", "10.128.0.2", g.IP.Addr().String()); strings.Contains(n, " 1 received") {
		t.Error("a pod sending with another pod's IP reached the global pod")
	}
}
