package agent

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"k8s.io/klog/v2"
)

// countingSwitch accepts every bundle and counts them.
type countingSwitch struct{ bundles, msgs int }

func (c *countingSwitch) Bundle(_ context.Context, m [][]byte) error {
	c.bundles++
	c.msgs += len(m)
	return nil
}
func (c *countingSwitch) DumpFlows(context.Context, uint64, uint64) ([][]byte, error) {
	return nil, nil
}
func (c *countingSwitch) DumpGroups(context.Context) ([][]byte, error) { return nil, nil }

func testView() *nodeView {
	v := newNodeView("n1", egress.NewInputs(0))
	v.update(func(v *nodeView) {
		v.mode = pipeline.ModeMultitenant
		v.clusterNets = []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}
		v.nodeIP = netip.MustParseAddr("192.0.2.11")
		v.localSubnet = netip.MustParsePrefix("10.128.0.0/23")
		v.vnids["a"], v.vnids["b"] = 11, 12
		v.pods["a/web"] = attach.Pod{Namespace: "a", Name: "web", IP: netip.MustParseAddr("10.128.0.2"), MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 2}, OFPort: 3}
		v.pods["b/db"] = attach.Pod{Namespace: "b", Name: "db", IP: netip.MustParseAddr("10.128.0.3"), MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 3}, OFPort: 4}
		v.remote["n2"] = pipeline.RemoteNode{Name: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23")}
	})
	return v
}

func TestFlowSyncOnlyChangedOwners(t *testing.T) {
	ctx := context.Background()
	sw := &countingSwitch{}
	v := testView()
	fs := newFlowSync(v, reconcile.New(sw, reconcile.Config{Round: 1}), flowSyncHooks{}, klog.Background())
	if _, err := fs.syncNow(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := fs.syncNow(ctx); err != nil || st.Messages != 0 || sw.bundles != 1 {
		t.Fatalf("unchanged view synced again: %s (%d bundles) %v", st, sw.bundles, err)
	}
	// Namespace a joins b's VNID: web's 3 VNID-bearing flows change, tenant 11 goes away.
	v.update(func(v *nodeView) { v.vnids["a"] = 12 })
	st, err := fs.syncNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.FlowModifies != 3 || st.FlowDeletes != 1 || st.FlowAdds != 0 || sw.bundles != 2 {
		t.Fatalf("join: %s in bundle %d; want 3 modifies and 1 delete in one bundle", st, sw.bundles)
	}
	// A deleted pod's IP goes to a new pod in the same sync: the flows move owner without an error.
	v.update(func(v *nodeView) {
		p := v.pods["b/db"]
		delete(v.pods, "b/db")
		p.Name, p.OFPort = "db2", 9
		v.pods["b/db2"] = p
	})
	if _, err := fs.syncNow(ctx); err != nil {
		t.Fatalf("IP handed from a deleted pod to a new one: %v", err)
	}
	// A pod whose namespace has no VNID yet gets no flows rather than the wrong tenant's.
	v.update(func(v *nodeView) {
		v.pods["c/x"] = attach.Pod{Namespace: "c", Name: "x", IP: netip.MustParseAddr("10.128.0.9"), MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 9}, OFPort: 7}
	})
	st, err = fs.syncNow(ctx)
	if err != nil || st.Messages != 0 {
		t.Fatalf("pod without VNID was rendered: %s %v", st, err)
	}
}

func TestFlowSyncWaitsForNodeState(t *testing.T) {
	fs := newFlowSync(newNodeView("n1", egress.NewInputs(0)), reconcile.New(&countingSwitch{}, reconcile.Config{Round: 1}), flowSyncHooks{}, klog.Background())
	if _, err := fs.syncNow(context.Background()); err == nil {
		t.Fatal("a node without subnet synced")
	}
}

// TestSyncThroughCoalesces: changes made before a sync starts ride on it; a caller whose generation it
// covered sends nothing of its own.
func TestSyncThroughCoalesces(t *testing.T) {
	ctx := context.Background()
	sw := &countingSwitch{}
	v := testView()
	fs := newFlowSync(v, reconcile.New(sw, reconcile.Config{Round: 1}), flowSyncHooks{}, klog.Background())
	var gens []uint64
	for i := range 5 {
		ip := netip.MustParseAddr("10.128.0.20").As4()
		ip[3] += byte(i)
		gens = append(gens, v.update(func(v *nodeView) {
			name := "p" + string(rune('0'+i))
			v.pods["a/"+name] = attach.Pod{Namespace: "a", Name: name, IP: netip.AddrFrom4(ip),
				MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, ip[3]}, OFPort: uint32(20 + i)}
		}))
	}
	st, err := fs.syncThrough(ctx, gens[2])
	if err != nil || st.Messages == 0 || sw.bundles != 1 {
		t.Fatalf("first sync: %s (%d bundles) %v", st, sw.bundles, err)
	}
	for _, g := range gens {
		if st, err := fs.syncThrough(ctx, g); err != nil || st.Messages != 0 {
			t.Fatalf("generation %d was already synced, yet: %s %v", g, st, err)
		}
	}
	if sw.bundles != 1 {
		t.Errorf("%d bundles for 5 changes made before one sync, want 1", sw.bundles)
	}
	g := v.update(func(v *nodeView) { delete(v.pods, "a/p0") })
	if st, err := fs.syncThrough(ctx, g); err != nil || st.Messages == 0 || sw.bundles != 2 {
		t.Fatalf("a later change was not synced: %s (%d bundles) %v", st, sw.bundles, err)
	}
}
