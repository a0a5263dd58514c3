package flows

// Tests of the flow engine against a real ovs-vswitchd: the codec's output as ovs-ofctl sees it, the
// reconciler's promises (idempotent, scoped, atomic, hitless restart, replay after a vswitchd crash).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

// bridge is a real bridge with an OpenFlow session to it.
type bridge struct {
	inst *ovstest.Instance
	sess *ofswitch.Session
	sw   Switch
}

func newBridge(t *testing.T) *bridge {
	t.Helper()
	if testing.Short() {
		t.Skip("real OVS: skipped under -short")
	}
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0"})
	if err != nil {
		t.Fatalf("dial br0: %v", err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return &bridge{inst: inst, sess: sess, sw: ofswitch.FlowsSwitch(sess)}
}

// ofctlFlows returns `ovs-ofctl dump-flows --no-stats` lines in our String() form plus their cookies.
func (b *bridge) ofctlFlows(t *testing.T) []string {
	t.Helper()
	out, err := b.inst.Ofctl("dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "OFPST_FLOW") {
			continue
		}
		cookie := "0x0"
		if strings.HasPrefix(l, "cookie=") {
			c, rest, _ := strings.Cut(l, ", ")
			cookie, l = strings.TrimPrefix(c, "cookie="), rest
		}
		if !strings.HasPrefix(l, "table=") {
			l = "table=0, " + l
		}
		lines = append(lines, "cookie="+cookie+" "+l)
	}
	sort.Strings(lines)
	return lines
}

func withoutCookies(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		_, rest, _ := strings.Cut(l, " ")
		out[i] = rest
	}
	sort.Strings(out)
	return out
}

func TestGoldenAgainstOVS(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	var msgs [][]byte
	for _, tc := range goldenGroups {
		g := tc.group
		m, err := EncodeGroupMod(g)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	want := map[string]bool{}
	for i, tc := range goldenFlows {
		f := tc.flow
		f.Cookie = Cookie(0x1000 + i)
		m, err := EncodeFlowMod(f)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
		want[fmt.Sprintf("cookie=%#x %s", 0x1000+i, f.String())] = true
	}
	if err := b.sw.Bundle(ctx, msgs); err != nil {
		t.Fatalf("install golden flows: %v", err)
	}
	got := b.ofctlFlows(t)
	for _, l := range got {
		if !want[l] {
			t.Errorf("ovs-ofctl shows a flow we did not render:\n  %s", l)
		}
		delete(want, l)
	}
	for l := range want {
		t.Errorf("rendered flow not shown by ovs-ofctl as we print it:\n  %s", l)
	}
	// The same flows read back through our session and decoder print the same.
	raw, err := b.sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, e := range raw {
		f, err := DecodeFlowStats(e)
		if err != nil {
			t.Fatalf("decode a flow OVS returned: %v", err)
		}
		ours = append(ours, fmt.Sprintf("cookie=%s %s", f.Cookie, f))
	}
	sort.Strings(ours)
	if strings.Join(ours, "\n") != strings.Join(got, "\n") {
		t.Errorf("decoded dump differs from ovs-ofctl:\nours:\n%s\novs-ofctl:\n%s", strings.Join(ours, "\n"), strings.Join(got, "\n"))
	}
	out, err := b.inst.Ofctl("dump-groups", "br0")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range goldenGroups {
		g := tc.group
		if !strings.Contains(out, " "+g.String()+"\n") && !strings.HasSuffix(strings.TrimSpace(out), g.String()) {
			t.Errorf("dump-groups does not show %s:\n%s", g, out)
		}
	}
}

// pod is a test pod with its flows' inputs.
type pod struct {
	*ovstest.Pod
	vnid uint32
}

func addPod(b *bridge, name string, host byte, vnid uint32) pod {
	ip := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, host}), 24)
	mac := net.HardwareAddr{0x0a, 0x58, 10, 128, 0, host}
	return pod{b.inst.AddPod("br0", name, ip, mac, 10+int(host)), vnid}
}

// renderPod renders what the agent will for a local pod: anti-spoofing, routing, ARP, isolation.
func renderPod(p pod) []Flow {
	port := uint32(p.OFPort)
	ip := p.IP.Addr()
	return []Flow{
		F(TablePodIngress, 100, M(append(IP, InPort(port), EthSrc(p.MAC), IPSrc(ip))...),
			LoadReg(RegSrcVNID, p.vnid), Goto{Table: TableConntrack}),
		F(TablePodIngress, 100, M(append(ARP, InPort(port), ARPSPA(ip), ARPSHA(p.MAC))...),
			LoadReg(RegSrcVNID, p.vnid), Goto{Table: TableARP}),
		F(TableRouting, 100, M(append(IP, IPDst(ip))...),
			LoadReg(RegDstVNID, p.vnid), LoadReg(RegOutPort, port), Goto{Table: TableIngressIsolation}),
		F(TableARP, 100, M(append(ARP, ARPTPA(ip))...), Output{Port: port}),
	}
}

// renderTenant lets a VNID reach itself.
func renderTenant(vnid uint32) []Flow {
	return []Flow{F(TableIngressIsolation, 100, M(Reg(RegSrcVNID, vnid), Reg(RegDstVNID, vnid)),
		Goto{Table: TableOutput})}
}

func installPods(t *testing.T, r *Reconciler, pods ...pod) {
	t.Helper()
	if err := r.SetDesired(PipelineOwner, RenderBase(), nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if err := r.SetDesired(PodOwner("test", p.Name), renderPod(p), nil); err != nil {
			t.Fatal(err)
		}
		if err := r.SetDesired(TenantOwner(p.vnid), renderTenant(p.vnid), nil); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReconcilerAgainstOVS(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	a, c := addPod(b, "a", 2, 5), addPod(b, "c", 3, 5)
	r := NewReconciler(b.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	installPods(t, r, a, c)
	st, err := r.SyncAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.FlowAdds == 0 {
		t.Fatal("nothing installed")
	}
	if n, err := a.Ping(c.IP.Addr(), 3, 100*time.Millisecond); n != 3 {
		t.Fatalf("pods in one VNID: %d/3 pings (%v)", n, err)
	}
	// Reconciling again sends nothing, against memory and against the switch itself.
	if st, err := r.SyncAll(ctx); err != nil || st.Messages != 0 {
		t.Fatalf("second SyncAll: %s, %v", st, err)
	}
	if st, err := r.ResyncFromSwitch(ctx); err != nil || st.Messages != 0 {
		t.Fatalf("no-op resync from the switch: %s, %v", st, err)
	}
	// Changing one owner changes only that owner's flows.
	before := b.ofctlFlows(t)
	c.vnid = 7
	if err := r.SetDesired(PodOwner("test", "c"), renderPod(c), nil); err != nil {
		t.Fatal(err)
	}
	st, err = r.SyncOwners(ctx, PodOwner("test", "c"))
	if err != nil || st.FlowModifies != 3 || st.Messages != 3 {
		t.Fatalf("change one owner: %s, %v", st, err)
	}
	changed := sortedDiff(before, b.ofctlFlows(t))
	if len(changed) != 6 {
		t.Errorf("want 3 flows replaced (6 lines of diff), got %d:\n%s", len(changed), strings.Join(changed, "\n"))
	}
	for _, l := range changed {
		if !strings.Contains(l, "10.128.0.3") {
			t.Errorf("a flow of another owner changed: %s", l)
		}
	}
	if n, _ := a.Ping(c.IP.Addr(), 2, 100*time.Millisecond); n != 0 {
		t.Fatal("pods in different VNIDs must not reach each other")
	}
}

func TestBundleFailureAgainstOVS(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	r := NewReconciler(b.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	if err := r.SetDesired(PipelineOwner, RenderBase(), nil); err != nil {
		t.Fatal(err)
	}
	bad := F(TableServices, 100, M(append(TCP, IPDst(netip.MustParseAddr("172.30.0.9")), TCPDst(80))...), ToGroup{ID: 99})
	if err := r.SetDesired(ServiceOwner("ns", "web", "http"), []Flow{bad}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := r.SyncAll(ctx)
	if err == nil {
		t.Fatal("a flow pointing at a missing group must fail the bundle")
	}
	if !strings.Contains(err.Error(), "group:99") || !strings.Contains(err.Error(), "OFPBAC_BAD_OUT_GROUP") {
		t.Errorf("error should name the flow and the OpenFlow error: %v", err)
	}
	if got := b.ofctlFlows(t); len(got) != 0 {
		t.Fatalf("a failed bundle left %d flows installed:\n%s", len(got), strings.Join(got, "\n"))
	}
	var fm FailedMessageError
	if !errors.As(err, &fm) {
		t.Errorf("error does not say which message failed: %v", err)
	}
}

// TestRestartLosesNoPacket: two pods ping each other 10 times a second while a new reconciler with the
// next round takes over the bridge; not one ping is lost and the flows end equal but for the round.
func TestRestartLosesNoPacket(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	a, c := addPod(b, "a", 2, 5), addPod(b, "c", 3, 5)
	r1 := NewReconciler(b.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	installPods(t, r1, a, c)
	if _, err := r1.SyncAll(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Ping(c.IP.Addr(), 2, 100*time.Millisecond); n != 2 {
		t.Fatal("no connectivity before the restart")
	}
	before := withoutCookies(b.ofctlFlows(t))

	const pings = 40
	var wg sync.WaitGroup
	var received int
	var pingErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		received, pingErr = a.Ping(c.IP.Addr(), pings, 100*time.Millisecond)
	}()
	time.Sleep(1 * time.Second)
	// The "restarted agent": a new session and reconciler, round 2, owners synced one by one.
	sess2, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: b.inst.MgmtSocket("br0"), Bridge: "br0"})
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	r2 := NewReconciler(ofswitch.FlowsSwitch(sess2), ReconcilerConfig{Round: 2, PipelineVersion: PipelineVersion})
	if err := r2.LoadInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	installPods(t, r2, a, c)
	for _, o := range r2.Owners() {
		if _, err := r2.SyncOwners(ctx, o); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := r2.FinishRound(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if pingErr != nil || received != pings {
		t.Fatalf("pings across the restart: %d/%d received (%v)", received, pings, pingErr)
	}
	after := b.ofctlFlows(t)
	for _, l := range after {
		c := strings.TrimPrefix(strings.Fields(l)[0], "cookie=")
		var v uint64
		fmt.Sscanf(c, "0x%x", &v)
		if Cookie(v).Round() != 2 {
			t.Errorf("flow of another round after FinishRound: %s", l)
		}
	}
	if d := sortedDiff(before, withoutCookies(after)); len(d) != 0 {
		t.Fatalf("flows after the restart differ from before but for the round:\n%s", strings.Join(d, "\n"))
	}
}

// TestVswitchdCrashReplay: ovs-vswitchd dies and comes back with an empty flow table; the session
// reconnects by itself and the replay hook restores exactly the flows of before.
func TestVswitchdCrashReplay(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	a, c := addPod(b, "a", 2, 5), addPod(b, "c", 3, 5)
	r := NewReconciler(b.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	replayed := make(chan error, 4)
	b.sess.OnReconnect(func(ctx context.Context) error {
		_, err := r.ResyncFromSwitch(ctx)
		replayed <- err
		return err
	})
	installPods(t, r, a, c)
	if _, err := r.SyncAll(ctx); err != nil {
		t.Fatal(err)
	}
	before := b.ofctlFlows(t)
	b.inst.KillVswitchd()
	if err := b.inst.StartVswitchd(); err != nil {
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
	if d := sortedDiff(before, b.ofctlFlows(t)); len(d) != 0 {
		t.Fatalf("flows after the crash differ:\n%s", strings.Join(d, "\n"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n, _ := a.Ping(c.IP.Addr(), 1, 100*time.Millisecond); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pods unreachable 5 s after the replay")
		}
	}
}

func sortedDiff(a, b []string) []string {
	d := diffLines(a, b)
	sort.Strings(d)
	return d
}

// TestWireOrderMatchesOVS: every golden flow comes back from ovs-vswitchd byte for byte as we encoded
// it (but tcp_flags, which OVS re-encodes as an ONF experimenter field), so resyncs take the fast path.
func TestWireOrderMatchesOVS(t *testing.T) {
	b := newBridge(t)
	ctx := context.Background()
	var msgs [][]byte
	for _, tc := range goldenGroups {
		m, err := EncodeGroupMod(tc.group)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	sent := map[string]string{}
	for _, tc := range goldenFlows {
		c, err := compileFlow(tc.flow)
		if err != nil {
			t.Fatal(err)
		}
		sent[c.key] = c.instr
		msgs = append(msgs, appendFlowMod(nil, c, cmdAdd, 0, 0))
	}
	if err := b.sw.Bundle(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	raw, err := b.sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range raw {
		k, instr, _, ok := rawFlowParts(e)
		f, _ := DecodeFlowStats(e)
		if _, hasFlags := f.Match.Get(FieldTCPFlags); hasFlags {
			continue
		}
		if want, found := sent[k]; !ok || !found || want != instr {
			t.Errorf("OVS re-encoded %s differently from us", f)
		}
	}
}

// TestRenderIsolatesTenantsOnOVS: Render's flows on a real bridge, pods in two tenants and the global
// VNID: multitenant mode isolates the tenants while VNID 0 reaches both; subnet mode is flat; a pod
// that spoofs another's IP reaches nobody.
func TestRenderIsolatesTenantsOnOVS(t *testing.T) {
	b := newBridge(t)
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
	r := NewReconciler(b.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	apply := func() {
		t.Helper()
		owners, err := Render(state)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range r.Owners() {
			if _, keep := owners[o]; !keep {
				r.DeleteOwner(o)
			}
		}
		if err := r.SetDesiredBatch(owners); err != nil {
			t.Fatal(err)
		}
		if _, err := r.SyncAll(ctx); err != nil {
			t.Fatal(err)
		}
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
