package reconcile_test

// The reconciler's promises against a real ovs-vswitchd, with the pipeline's real flows and real
// packets: idempotent and scoped, atomic, failures isolated per owner, a hitless restart, replay after
// a vswitchd crash, and resyncs that never open a gap while owners change.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

// node is a bridge with pods and the NodeState that renders them.
type node struct {
	b     *ofbridge.Bridge
	state pipeline.NodeState
	pods  map[string]*ovstest.Pod
}

func newNode(t *testing.T) *node {
	return &node{b: ofbridge.New(t), pods: map[string]*ovstest.Pod{}, state: pipeline.NodeState{
		Mode: pipeline.ModeMultitenant, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:     netip.MustParsePrefix("10.128.0.0/24"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
	}}
}

// addPod plugs a pod into the bridge (a veth in a namespace) and into the node's state.
func (n *node) addPod(name string, host byte, vnid uint32) *ovstest.Pod {
	ip := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, host}), 24)
	mac := net.HardwareAddr{0x0a, 0x58, 10, 128, 0, host}
	p := n.b.Inst.AddPod(ofbridge.Name, name, ip, mac, 10+int(host))
	n.pods[name] = p
	n.state.Pods = append(n.state.Pods, pipeline.PodState{Namespace: "t", Name: name, IP: ip.Addr(), MAC: mac, OFPort: uint32(p.OFPort), VNID: vnid})
	return p
}

func (n *node) setVNID(name string, vnid uint32) {
	for i := range n.state.Pods {
		if n.state.Pods[i].Name == name {
			n.state.Pods[i].VNID = vnid
		}
	}
}

func newReconciler(sw reconcile.Switch, round uint16) *reconcile.Reconciler {
	return reconcile.New(sw, reconcile.Config{Round: round, PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf})
}

// renderChanges renders the node and returns what changed since last (as the agent's flow sync does):
// new or different owners, and nil for owners gone.
func renderChanges(t *testing.T, st pipeline.NodeState, last map[reconcile.Owner]reconcile.OwnerState) (map[reconcile.Owner]*reconcile.OwnerState, map[reconcile.Owner]reconcile.OwnerState) {
	t.Helper()
	owners, err := pipeline.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	return reconcile.Changes(last, owners), owners
}

func apply(t *testing.T, r *reconcile.Reconciler, changes map[reconcile.Owner]*reconcile.OwnerState) reconcile.SyncStats {
	t.Helper()
	res, err := r.Apply(context.Background(), changes)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) > 0 {
		t.Fatalf("owners failed: %v", res.Failed)
	}
	return res.Stats
}

func TestApplyAgainstOVS(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	a, c := n.addPod("a", 2, 5), n.addPod("c", 3, 5)
	r := newReconciler(n.b.Switch, 1)
	changes, last := renderChanges(t, n.state, nil)
	if st := apply(t, r, changes); st.FlowAdds == 0 {
		t.Fatal("nothing installed")
	}
	if got, err := a.Ping(c.IP.Addr(), 3, 100*time.Millisecond); got != 3 {
		t.Fatalf("pods in one VNID: %d/3 pings (%v)", got, err)
	}
	// Applying the same render sends nothing; so does a resync against the switch itself.
	if changes, _ := renderChanges(t, n.state, last); len(changes) != 0 {
		t.Fatalf("re-render changed %d owners", len(changes))
	}
	if res, err := r.Resync(ctx); err != nil || res.Stats.Messages != 0 {
		t.Fatalf("no-op resync from the switch: %s, %v", res.Stats, err)
	}
	// Moving c to another VNID changes only c's VNID-bearing flows and adds its tenant's.
	before := n.b.OfctlFlows(t)
	n.setVNID("c", 7)
	changes, _ = renderChanges(t, n.state, last)
	st := apply(t, r, changes)
	if st.FlowModifies != 3 || st.FlowAdds != 1 {
		t.Fatalf("change one pod's VNID: %s; want its 3 flows modified and tenant 7's flow added", st)
	}
	for _, l := range ofbridge.DiffLines(before, n.b.OfctlFlows(t)) {
		if !strings.Contains(l, "10.128.0.3") && !strings.Contains(l, "reg0=0x7") {
			t.Errorf("a flow of another owner changed: %s", l)
		}
	}
	if got, _ := a.Ping(c.IP.Addr(), 2, 100*time.Millisecond); got != 0 {
		t.Fatal("pods in different VNIDs must not reach each other")
	}
}

// An owner OVS refuses (a flow towards a group that does not exist) fails alone: its error names the
// flow and OVS's reason, nothing of it is installed, and every other owner of the same Apply is.
func TestRefusedOwnerAgainstOVS(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	a, c := n.addPod("a", 2, 5), n.addPod("c", 3, 5)
	r := newReconciler(n.b.Switch, 1)
	changes, _ := renderChanges(t, n.state, nil)
	bad := reconcile.Owner{Category: reconcile.CategoryTest, Name: "refused"}
	changes[bad] = &reconcile.OwnerState{Flows: []Flow{
		F(pipeline.TableServices, 100, M(append(TCP, IPDst(netip.MustParseAddr("172.30.0.9")), TCPDst(80))...), ToGroup{ID: 99})}}
	res, err := r.Apply(ctx, changes)
	if err != nil {
		t.Fatal(err)
	}
	ferr := res.Failed[bad]
	if ferr == nil || len(res.Failed) != 1 {
		t.Fatalf("failed owners %v; want exactly %s", res.Failed, bad)
	}
	if !strings.Contains(ferr.Error(), "group:99") || !strings.Contains(ferr.Error(), "OFPBAC_BAD_OUT_GROUP") {
		t.Errorf("error should name the flow and the OpenFlow error: %v", ferr)
	}
	for _, l := range n.b.OfctlFlows(t) {
		if strings.Contains(l, "group:99") {
			t.Errorf("the refused owner's flow is installed: %s", l)
		}
	}
	if got, err := a.Ping(c.IP.Addr(), 3, 100*time.Millisecond); got != 3 {
		t.Fatalf("the other owners were not installed: %d/3 pings (%v)", got, err)
	}
}

// pinger pings continuously from one pod to another at 100/s until stopped.
type pinger struct {
	wg        sync.WaitGroup
	sent, got int
	err       error
}

func startPinger(from *ovstest.Pod, to netip.Addr, count int) *pinger {
	p := &pinger{sent: count}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.got, p.err = from.Ping(to, count, 10*time.Millisecond)
	}()
	return p
}

func (p *pinger) wait(t *testing.T, what string) {
	t.Helper()
	p.wg.Wait()
	if p.err != nil || p.got < p.sent { // ping counts a duplicated reply, too
		t.Errorf("%s: %d of %d pings at 100/s answered (%v)", what, p.got, p.sent, p.err)
	}
}

// TestRestartLosesNoPacket: two pods ping each other 100 times a second both ways while a new
// reconciler with the next round takes over the bridge; not one ping is lost and the flows end equal
// but for the round.
func TestRestartLosesNoPacket(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	a, c := n.addPod("a", 2, 5), n.addPod("c", 3, 5)
	r1 := newReconciler(n.b.Switch, 1)
	changes, _ := renderChanges(t, n.state, nil)
	apply(t, r1, changes)
	if got, _ := a.Ping(c.IP.Addr(), 2, 100*time.Millisecond); got != 2 {
		t.Fatal("no connectivity before the restart")
	}
	before := ofbridge.WithoutCookies(n.b.OfctlFlows(t))

	ac, ca := startPinger(a, c.IP.Addr(), 400), startPinger(c, a.IP.Addr(), 400)
	time.Sleep(500 * time.Millisecond)
	// The "restarted agent": a new session and reconciler, round 2, owners applied a few at a time.
	sess2, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: n.b.Inst.MgmtSocket(ofbridge.Name), Bridge: ofbridge.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	r2 := newReconciler(ofswitch.FlowsSwitch(sess2), 2)
	if _, err := r2.LoadInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	changes, _ = renderChanges(t, n.state, nil)
	for o, st := range changes {
		apply(t, r2, map[reconcile.Owner]*reconcile.OwnerState{o: st})
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := r2.FinishRound(ctx); err != nil {
		t.Fatal(err)
	}
	ac.wait(t, "a → c across the restart")
	ca.wait(t, "c → a across the restart")
	after := n.b.OfctlFlows(t)
	for _, l := range after {
		var v uint64
		fmt.Sscanf(strings.TrimPrefix(strings.Fields(l)[0], "cookie="), "0x%x", &v)
		if reconcile.Cookie(v).Round() != 2 {
			t.Errorf("flow of another round after FinishRound: %s", l)
		}
	}
	if d := ofbridge.DiffLines(before, ofbridge.WithoutCookies(after)); len(d) != 0 {
		t.Fatalf("flows after the restart differ from before but for the round:\n%s", strings.Join(d, "\n"))
	}
}

// TestVswitchdCrashReplay: ovs-vswitchd dies and comes back with an empty flow table; the session
// reconnects by itself and the replay hook restores exactly the flows of before.
func TestVswitchdCrashReplay(t *testing.T) {
	n := newNode(t)
	a, c := n.addPod("a", 2, 5), n.addPod("c", 3, 5)
	r := newReconciler(n.b.Switch, 1)
	replayed := make(chan error, 4)
	n.b.Sess.OnReconnect(func(ctx context.Context) error {
		_, err := r.Resync(ctx)
		replayed <- err
		return err
	})
	changes, _ := renderChanges(t, n.state, nil)
	apply(t, r, changes)
	before := n.b.OfctlFlows(t)
	n.b.Inst.KillVswitchd()
	if err := n.b.Inst.StartVswitchd(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-replayed:
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not reconnect and replay within 20 s")
	}
	if d := ofbridge.DiffLines(before, n.b.OfctlFlows(t)); len(d) != 0 {
		t.Fatalf("flows after the crash differ:\n%s", strings.Join(d, "\n"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got, _ := a.Ping(c.IP.Addr(), 1, 100*time.Millisecond); got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pods unreachable 5 s after the replay")
		}
	}
}

// TestResyncRacingApplyOnOVS: resyncs run back to back while a stream of owner changes is applied
// (other pods come and go, the pinging pods' tenants are re-rendered), and two pods ping each other
// at 100/s both ways: not one ping is lost, and in the end the switch holds exactly the desired flows.
func TestResyncRacingApplyOnOVS(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	a, c := n.addPod("a", 2, 5), n.addPod("c", 3, 5)
	r := newReconciler(n.b.Switch, 1)
	changes, last := renderChanges(t, n.state, nil)
	apply(t, r, changes)

	stop := make(chan struct{})
	var resyncs sync.WaitGroup
	var resyncErr error
	nResyncs := 0
	resyncs.Add(1)
	go func() {
		defer resyncs.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.Resync(ctx); err != nil {
				resyncErr = err
				return
			}
			nResyncs++
		}
	}()
	ac, ca := startPinger(a, c.IP.Addr(), 500), startPinger(c, a.IP.Addr(), 500)
	base := n.state
	for i := 0; i < 150; i++ {
		st := base
		st.Pods = append([]pipeline.PodState(nil), base.Pods...)
		// A churning pod (flows only: no interface needed) and a tenant that comes and goes.
		ip := netip.AddrFrom4([4]byte{10, 128, 0, byte(100 + i%50)})
		st.Pods = append(st.Pods, pipeline.PodState{Namespace: "t", Name: fmt.Sprint("churn", i), IP: ip,
			MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(100 + i%50)}, OFPort: uint32(200 + i%50), VNID: uint32(100 + i%3)})
		st.RemoteNodes = []pipeline.RemoteNode{{Name: fmt.Sprint("n", 2+i%4), NodeIP: netip.AddrFrom4([4]byte{192, 0, 2, byte(20 + i%4)}),
			Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 129, byte(i % 4), 0}), 24)}}
		var changes map[reconcile.Owner]*reconcile.OwnerState
		changes, last = renderChanges(t, st, last)
		apply(t, r, changes)
		time.Sleep(20 * time.Millisecond)
	}
	ac.wait(t, "a → c during resyncs and changes")
	ca.wait(t, "c → a during resyncs and changes")
	close(stop)
	resyncs.Wait()
	if resyncErr != nil {
		t.Fatal(resyncErr)
	}
	if nResyncs < 10 {
		t.Errorf("only %d resyncs ran concurrently with the changes; the race was not exercised", nResyncs)
	}
	want := map[string]bool{}
	for _, f := range r.DesiredFlows() {
		want[fmt.Sprintf("cookie=%#x %s", f.Cookie, f)] = true
	}
	got := n.b.OfctlFlows(t)
	var extra []string
	for _, l := range got {
		if !want[l] && !strings.Contains(l, "table=253") { // ovs-ofctl prints the note trimmed
			extra = append(extra, l)
		}
		delete(want, l)
	}
	for l := range want {
		if !strings.Contains(l, "table=253") {
			t.Errorf("desired flow missing on the switch: %s", l)
		}
	}
	if len(extra) > 0 {
		t.Errorf("flows on the switch nobody wants:\n%s", strings.Join(extra, "\n"))
	}
	t.Logf("%d resyncs raced 150 applies", nResyncs)
}
