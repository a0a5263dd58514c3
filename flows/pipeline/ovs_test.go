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

// TestPodIPv6DroppedUnsampledOnOVS: a pod's kernel sends IPv6 by itself (router solicitations to
// ff02::2, MLD reports to ff02::16); ofsdn carries IPv4 only, so table 20 drops it without a sample,
// while a spoofed IPv4 frame still meets the sampled anti-spoofing miss. Traced through ovs-vswitchd
// (ofproto/trace), so the test does not wait for the pod's kernel.
func TestPodIPv6DroppedUnsampledOnOVS(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	a := addPod(b, "a", 2, 11)
	state := NodeState{
		Mode: ModeMultitenant, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:     netip.MustParsePrefix("10.128.0.0/24"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		Pods:            []PodState{{Namespace: "t", Name: a.Name, IP: a.IP.Addr(), MAC: a.MAC, OFPort: uint32(a.OFPort), VNID: a.vnid}},
	}
	owners, err := Render(state)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := install(ctx, newReconciler(b.Switch, 1), nil, owners); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, flow string
		priority   int  // the table-20 flow that decides
		sampled    bool // its packet goes to the controller (the agent's drop records)
	}{
		{"router solicitation", fmt.Sprintf("in_port=%d,icmp6,dl_src=%s,dl_dst=33:33:00:00:00:02,ipv6_src=fe80::858:aff:fe80:2,ipv6_dst=ff02::2,icmpv6_type=133,icmpv6_code=0",
			a.OFPort, a.MAC), podIPv6DropPriority, false},
		{"MLD report", fmt.Sprintf("in_port=%d,icmp6,dl_src=%s,dl_dst=33:33:00:00:00:16,ipv6_src=::,ipv6_dst=ff02::16,icmpv6_type=143,icmpv6_code=0",
			a.OFPort, a.MAC), podIPv6DropPriority, false},
		{"spoofed IPv4", fmt.Sprintf("in_port=%d,udp,dl_src=%s,dl_dst=0a:58:0a:80:00:01,nw_src=10.128.0.99,nw_dst=10.128.0.1,udp_src=1,udp_dst=2",
			a.OFPort, a.MAC), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := b.Inst.Output("ovs-appctl", "ofproto/trace", "br0", tc.flow)
			if err != nil {
				t.Fatal(err, out)
			}
			dp, _, _ := strings.Cut(out[strings.LastIndex(out, "Datapath actions: ")+len("Datapath actions: "):], "\n")
			decided := false // the trace's table-20 line, "20. [match, ]priority N, cookie C"
			for _, line := range strings.Split(out, "\n") {
				if line = strings.TrimSpace(line); strings.HasPrefix(line, fmt.Sprintf("%d. ", TablePodIngress)) {
					decided = strings.Contains(line, fmt.Sprintf("priority %d,", tc.priority))
				}
			}
			sampled := strings.Contains(dp, "controller(")
			if !decided || sampled != tc.sampled || (!tc.sampled && dp != "drop") {
				t.Errorf("want table %d priority %d to drop it, sampled %v; datapath actions %q; trace:\n%s",
					TablePodIngress, tc.priority, tc.sampled, dp, out)
			}
		})
	}
}
