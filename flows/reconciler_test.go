package flows

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
)

// podFlows renders a pod-like owner's flows: anti-spoofing, delivery and ARP.
func podFlows(i int, vnid uint32) []Flow {
	ip := netip.AddrFrom4([4]byte{10, 128, byte(i >> 8), byte(i)})
	port := uint32(10 + i)
	return []Flow{
		F(TablePodIngress, 100, M(append(IP, InPort(port), IPSrc(ip))...), LoadReg(RegSrcVNID, vnid), Goto{TableConntrack}),
		F(TablePodIngress, 100, M(append(ARP, InPort(port), ARPSPA(ip))...), LoadReg(RegSrcVNID, vnid), Goto{TableARP}),
		F(TableRouting, 100, M(append(IP, IPDst(ip))...), LoadReg(RegDstVNID, vnid), LoadReg(RegOutPort, port), Goto{TableIngressIsolation}),
		F(TableARP, 100, M(append(ARP, ARPTPA(ip))...), Output{Port: port}),
	}
}

func basePipeline(version uint32) []Flow {
	return append(DefaultFlows(), VersionFlow(version))
}

func mustSet(t *testing.T, r *Reconciler, o Owner, flows []Flow, groups []GroupEntry) {
	t.Helper()
	if err := r.SetDesired(o, flows, groups); err != nil {
		t.Fatal(err)
	}
}

func mustSync(t *testing.T) func(SyncStats, error) SyncStats {
	return func(stats SyncStats, err error) SyncStats {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return stats
	}
}

func TestReconcilerIdempotentAndScoped(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r := NewReconciler(sw, ReconcilerConfig{Round: 1, PipelineVersion: 1})
	mustSet(t, r, PipelineOwner, basePipeline(1), nil)
	for i := 0; i < 20; i++ {
		mustSet(t, r, PodOwner("ns", fmt.Sprint("p", i)), podFlows(i, 5), nil)
	}
	st := mustSync(t)(r.SyncAll(ctx))
	if want := len(basePipeline(1)) + 20*4; st.FlowAdds != want || sw.bundles != 1 {
		t.Fatalf("first sync: %s in %d bundles, want %d adds in 1 bundle", st, sw.bundles, want)
	}
	st = mustSync(t)(r.SyncAll(ctx))
	if st.Messages != 0 || sw.bundles != 1 {
		t.Fatalf("second sync sent %s; want nothing", st)
	}

	// Change one pod's VNID: only its 3 VNID-bearing flows are modified, in one bundle.
	before := sw.flowStrings()
	mustSet(t, r, PodOwner("ns", "p7"), podFlows(7, 9), nil)
	st = mustSync(t)(r.SyncOwners(ctx, PodOwner("ns", "p7")))
	if st.FlowModifies != 3 || st.Messages != 3 || sw.bundles != 2 {
		t.Fatalf("changing one owner: %s (bundles %d); want 3 modifies", st, sw.bundles)
	}
	after := sw.flowStrings()
	changed := diffLines(before, after)
	for _, l := range changed {
		if !strings.Contains(l, "10.128.0.7") {
			t.Errorf("a flow of another owner changed: %s", l)
		}
	}
	// Remove the pod: its 4 flows go.
	r.DeleteOwner(PodOwner("ns", "p7"))
	st = mustSync(t)(r.SyncOwners(ctx, PodOwner("ns", "p7")))
	if st.FlowDeletes != 4 || len(sw.flows) != len(basePipeline(1))+19*4 {
		t.Fatalf("deleting an owner: %s, switch holds %d flows", st, len(sw.flows))
	}
	if got := mustSync(t)(r.SyncAll(ctx)); got.Messages != 0 {
		t.Fatalf("sync after owner delete not idempotent: %s", got)
	}
}

func diffLines(a, b []string) []string {
	in := map[string]int{}
	for _, l := range a {
		in[l]++
	}
	for _, l := range b {
		in[l]--
	}
	var out []string
	for l, n := range in {
		if n != 0 {
			out = append(out, l)
		}
	}
	return out
}

func TestReconcilerConflictsAndDuplicates(t *testing.T) {
	r := NewReconciler(newFakeSwitch(), ReconcilerConfig{Round: 1})
	f := F(TableRouting, 100, M(append(IP, IPDst(podIP))...), Output{Port: 3})
	mustSet(t, r, PodOwner("a", "x"), []Flow{f}, nil)
	err := r.SetDesired(PodOwner("b", "y"), []Flow{f}, nil)
	if err == nil || !strings.Contains(err.Error(), "pod/a/x") {
		t.Fatalf("second owner of one flow: err %v; want an error naming pod/a/x", err)
	}
	if err := r.SetDesired(PodOwner("c", "z"), []Flow{f, f}, nil); err == nil {
		t.Fatal("duplicate flow within one owner: want an error")
	}
	if err := r.SetDesired(PodOwner("c", "z"), []Flow{F(0, 1, M(InPort(1), InPort(2)))}, nil); err == nil {
		t.Fatal("malformed match: want an error")
	}
	if got := len(r.Owners()); got != 1 {
		t.Fatalf("failed SetDesired calls left owners behind: %v", r.Owners())
	}
}

func TestReconcilerBundleFailureChangesNothing(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r := NewReconciler(sw, ReconcilerConfig{Round: 1})
	mustSet(t, r, PipelineOwner, basePipeline(1), nil)
	mustSync(t)(r.SyncAll(ctx))
	// A flow pointing at a group nobody defined: the fake, like OVS, rejects the whole bundle.
	bad := PodOwner("ns", "bad")
	mustSet(t, r, bad, append(podFlows(1, 5), F(TableServices, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 99})), nil)
	before := sw.flowStrings()
	if _, err := r.SyncOwners(ctx, bad); err == nil {
		t.Fatal("want a bundle error")
	}
	if d := diffLines(before, sw.flowStrings()); len(d) != 0 {
		t.Fatalf("a failed bundle changed the switch: %v", d)
	}
	sw.failAt = 3
	mustSet(t, r, bad, podFlows(1, 5), nil)
	_, err := r.SyncOwners(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "rejected at") {
		t.Fatalf("want an error naming the failed flow, got %v", err)
	}
	sw.failAt = 0
	st := mustSync(t)(r.SyncOwners(ctx, bad))
	if st.FlowAdds != 4 {
		t.Fatalf("after failures the reconciler must still know nothing was installed: %s", st)
	}
}

func TestReconcilerGroups(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r := NewReconciler(sw, ReconcilerConfig{Round: 1})
	svc := ServiceOwner("ns", "web", "http")
	group := func(ports ...uint32) GroupEntry {
		g := GroupEntry{ID: 10, Type: GroupSelect}
		for _, p := range ports {
			g.Buckets = append(g.Buckets, Bucket{Weight: 100, Actions: []Action{Output{Port: p}}})
		}
		return g
	}
	flow := F(TableServices, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 10})
	mustSet(t, r, svc, []Flow{flow}, []GroupEntry{group(3, 4)})
	if st := mustSync(t)(r.SyncOwners(ctx, svc)); st.GroupAdds != 1 || st.FlowAdds != 1 {
		t.Fatalf("install service: %s", st)
	}
	mustSet(t, r, svc, []Flow{flow}, []GroupEntry{group(3, 4, 5)})
	if st := mustSync(t)(r.SyncOwners(ctx, svc)); st.GroupModifies != 1 || st.Messages != 1 {
		t.Fatalf("endpoint added: %s; want one group modify", st)
	}
	r.DeleteOwner(svc)
	if st := mustSync(t)(r.SyncOwners(ctx, svc)); st.GroupDeletes != 1 || st.FlowDeletes != 1 || len(sw.groups) != 0 {
		t.Fatalf("delete service: %s, groups left %d", st, len(sw.groups))
	}
}

// A restart: a new reconciler with the next round re-installs every wanted flow with its new cookie
// (replacing, not deleting, so traffic never misses), and FinishRound removes what is no longer wanted.
func TestReconcilerRestartRounds(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r1 := NewReconciler(sw, ReconcilerConfig{Round: 1, PipelineVersion: 3})
	mustSet(t, r1, PipelineOwner, basePipeline(3), nil)
	for i := 0; i < 5; i++ {
		mustSet(t, r1, PodOwner("ns", fmt.Sprint("p", i)), podFlows(i, 5), nil)
	}
	mustSync(t)(r1.SyncAll(ctx))
	before := sw.flowStrings()

	r2 := NewReconciler(sw, ReconcilerConfig{Round: 2, PipelineVersion: 3})
	if err := r2.LoadInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	if r2.Rebuilding() {
		t.Fatal("same pipeline version must not rebuild")
	}
	mustSet(t, r2, PipelineOwner, basePipeline(3), nil)
	for i := 0; i < 4; i++ { // p4 vanished while the agent was down
		mustSet(t, r2, PodOwner("ns", fmt.Sprint("p", i)), podFlows(i, 5), nil)
	}
	st := mustSync(t)(r2.SyncOwners(ctx, PipelineOwner, PodOwner("ns", "p0")))
	if st.FlowDeletes != 0 || st.FlowAdds != len(basePipeline(3))+4 {
		t.Fatalf("re-cookie sync: %s", st)
	}
	if got := len(sw.flows); got != len(before) {
		t.Fatalf("during the restart the switch must keep every flow: %d, had %d", got, len(before))
	}
	st = mustSync(t)(r2.FinishRound(ctx))
	if st.FlowDeletes != 1 { // one delete by cookie mask for round 1
		t.Fatalf("finish round: %s", st)
	}
	after := sw.flowStrings()
	strip := func(ls []string) []string {
		var out []string
		for _, l := range ls {
			if !strings.Contains(l, "10.128.0.4") {
				out = append(out, l[strings.Index(l, " "):])
			}
		}
		return out
	}
	if d := diffLines(strip(before), strip(after)); len(d) != 0 {
		t.Fatalf("flows after the restart differ from before (but for the round and the vanished pod): %v", d)
	}
	for _, l := range after {
		if !strings.HasPrefix(l, "cookie=0x2") {
			t.Errorf("flow of the old round survived: %s", l)
		}
	}
	if st := mustSync(t)(r2.SyncAll(ctx)); st.Messages != 0 {
		t.Fatalf("sync after restart not idempotent: %s", st)
	}
}

func TestReconcilerPipelineVersionRebuild(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r1 := NewReconciler(sw, ReconcilerConfig{Round: 1, PipelineVersion: 1})
	mustSet(t, r1, PipelineOwner, append(basePipeline(1), F(TableRouting, 5, M(IP...), Output{Port: 2})), nil)
	mustSync(t)(r1.SyncAll(ctx))
	r2 := NewReconciler(sw, ReconcilerConfig{Round: 2, PipelineVersion: 2})
	if err := r2.LoadInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	if !r2.Rebuilding() {
		t.Fatal("another pipeline version must rebuild")
	}
	mustSet(t, r2, PipelineOwner, basePipeline(2), nil)
	st := mustSync(t)(r2.SyncOwners(ctx, PipelineOwner))
	if r2.Rebuilding() || st.FlowAdds != len(basePipeline(2)) || len(sw.flows) != len(basePipeline(2)) {
		t.Fatalf("rebuild: %s, switch holds %d flows", st, len(sw.flows))
	}
}

func TestReconcilerRepairsDrift(t *testing.T) {
	ctx := context.Background()
	sw := newFakeSwitch()
	r := NewReconciler(sw, ReconcilerConfig{Round: 1, PipelineVersion: 1})
	mustSet(t, r, PipelineOwner, basePipeline(1), nil)
	mustSet(t, r, PodOwner("ns", "a"), podFlows(1, 5), nil)
	mustSync(t)(r.SyncAll(ctx))
	want := sw.flowStrings()
	// Someone deletes one flow, edits another, and adds a foreign one behind the agent's back.
	for k := range sw.flows {
		if k[0] == byte(TableARP) {
			delete(sw.flows, k)
			break
		}
	}
	for k, f := range sw.flows {
		if k[0] == byte(TableRouting) && f.cookie != 0 && k[1] == 0 && k[2] == 100 {
			f.instr = []byte(mustInstr(t, Output{Port: 99}))
			sw.flows[k] = f
		}
	}
	foreign, _ := compileFlow(F(TableOutput, 7, M(InPort(77)), Output{Port: 1}))
	sw.flows[foreign.key] = fakeFlow{instr: []byte(foreign.instr)}

	st := mustSync(t)(r.ResyncFromSwitch(ctx))
	if st.FlowAdds != 1 || st.FlowModifies != 1 || st.FlowDeletes != 1 {
		t.Fatalf("drift repair: %s; want 1 add, 1 modify, 1 delete", st)
	}
	if d := diffLines(want, sw.flowStrings()); len(d) != 0 {
		t.Fatalf("after repair the switch differs: %v", d)
	}
	if st := mustSync(t)(r.ResyncFromSwitch(ctx)); st.Messages != 0 {
		t.Fatalf("no-op resync sent %s", st)
	}
}

func mustInstr(t *testing.T, acts ...Action) string {
	b, err := encodeInstructions(acts)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOwnerIndexSaveLoad(t *testing.T) {
	x := NewOwnerIndex()
	owners := []Owner{PipelineOwner, PodOwner("ns", "a"), NodeOwner("n2"), TenantOwner(42), ServiceOwner("ns", "web", "http"), NetPolOwner("ns", "deny")}
	for _, o := range owners {
		x.Add(o)
	}
	path := filepath.Join(t.TempDir(), "owners.json")
	if err := x.Save(path); err != nil {
		t.Fatal(err)
	}
	y, err := LoadOwnerIndex(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range owners {
		c := MakeCookie(7, o)
		if got := y.Name(c); got != o.String() {
			t.Errorf("Name(%s) = %q, want %q", c, got, o.String())
		}
		if c.Round() != 7 || c.Category() != o.Category || c.OwnerHash() != o.Hash() {
			t.Errorf("cookie %s does not decode to round 7, %s, %08x", c, o.Category, o.Hash())
		}
	}
	if _, err := ParseOwner("nonsense"); err == nil {
		t.Error("ParseOwner(nonsense): want an error")
	}
	// A hash collision keeps both owners and names both.
	a, b := Owner{CategoryPod, "x"}, Owner{CategoryPod, "y"}
	z := NewOwnerIndex()
	z.owners[a.Hash()] = []Owner{a}
	z.owners[a.Hash()] = append(z.owners[a.Hash()], b)
	if got := z.Name(MakeCookie(1, a)); got != "pod/x|pod/y" {
		t.Errorf("collision name = %q", got)
	}
}
