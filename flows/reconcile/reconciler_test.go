package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/internal/fakeswitch"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
)

// The reconciler's own tests use synthetic owners and flows (tables by number), not the pipeline's
// renderers: what is tested here is the diff, the bundles and the bookkeeping, whatever the flows say.

var svcIP = netip.MustParseAddr("172.30.0.1")

func testOwner(name string) Owner { return Owner{Category: CategoryTest, Name: name} }

// ownerFlows are four flows keyed on one address, as a pod-like owner has.
func ownerFlows(i int, vnid uint32) []Flow {
	ip := netip.AddrFrom4([4]byte{10, 128, byte(i >> 8), byte(i)})
	port := uint32(10 + i)
	return []Flow{
		F(20, 100, M(append(IP, InPort(port), IPSrc(ip))...), LoadReg(FieldReg0, vnid), Goto{Table: 30}),
		F(20, 100, M(append(ARP, InPort(port), ARPSPA(ip))...), LoadReg(FieldReg0, vnid), Goto{Table: 70}),
		F(60, 100, M(append(IP, IPDst(ip))...), LoadReg(FieldReg1, vnid), LoadReg(FieldReg2, port), Goto{Table: 80}),
		F(70, 100, M(append(ARP, ARPTPA(ip))...), Output{Port: port}),
	}
}

// versionNote is a synthetic pipeline: a default per table plus the version note the Config reads.
func versionNote(version uint32) []Flow {
	return []Flow{F(0, 0, M(), Goto{Table: 20}), F(20, 0, M()), F(60, 0, M()), F(70, 0, M()), F(253, 0, M(), Uint32Note(version))}
}

func versionOf(f Flow) (uint32, bool) {
	if f.Table != 253 || len(f.Actions) != 1 {
		return 0, false
	}
	if n, ok := f.Actions[0].(Note); ok {
		return n.Uint32()
	}
	return 0, false
}

var base = testOwner("base")

func newRec(sw Switch, round uint16, version uint32) *Reconciler {
	return New(sw, Config{Round: round, PipelineVersion: version, VersionOf: versionOf})
}

func set(flows []Flow, groups ...GroupEntry) *OwnerState {
	return &OwnerState{Flows: flows, Groups: groups}
}

func mustApply(t *testing.T, r *Reconciler, changes map[Owner]*OwnerState) SyncStats {
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

func must(t *testing.T) func(Result, error) Result {
	return func(res Result, err error) Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

func TestApplyIdempotentAndScoped(t *testing.T) {
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	changes := map[Owner]*OwnerState{base: set(versionNote(1))}
	for i := 0; i < 20; i++ {
		changes[testOwner(fmt.Sprint("p", i))] = set(ownerFlows(i, 5))
	}
	st := mustApply(t, r, changes)
	if want := len(versionNote(1)) + 20*4; st.FlowAdds != want || sw.Bundles != 1 {
		t.Fatalf("first apply: %s in %d bundles, want %d adds in 1 bundle", st, sw.Bundles, want)
	}
	if st := mustApply(t, r, changes); st.Messages != 0 || sw.Bundles != 1 {
		t.Fatalf("applying the same state again sent %s; want nothing", st)
	}

	// Change one owner's VNID: only its 3 VNID-bearing flows are modified, in one bundle.
	before := sw.FlowStrings()
	st = mustApply(t, r, map[Owner]*OwnerState{testOwner("p7"): set(ownerFlows(7, 9))})
	if st.FlowModifies != 3 || st.Messages != 3 || sw.Bundles != 2 {
		t.Fatalf("changing one owner: %s (bundles %d); want 3 modifies", st, sw.Bundles)
	}
	for _, l := range ofbridge.DiffLines(before, sw.FlowStrings()) {
		if !strings.Contains(l, "10.128.0.7") {
			t.Errorf("a flow of another owner changed: %s", l)
		}
	}
	// Delete the owner: its 4 flows go.
	st = mustApply(t, r, map[Owner]*OwnerState{testOwner("p7"): nil})
	if st.FlowDeletes != 4 || sw.NumFlows() != len(versionNote(1))+19*4 {
		t.Fatalf("deleting an owner: %s, switch holds %d flows", st, sw.NumFlows())
	}
	if res := must(t)(r.Resync(context.Background())); res.Stats.Messages != 0 {
		t.Fatalf("resync after an owner's deletion is not a no-op: %s", res.Stats)
	}
	if got := len(r.Owners()); got != 20 {
		t.Fatalf("owners left: %d, want 20 (a deleted owner is forgotten)", got)
	}
}

// A flow may move between owners within one Apply (a deleted pod's address given to a new pod):
// the switch replaces it in place, it is never deleted, and no owner fails.
func TestApplyMovesAFlowBetweenOwnersWithoutAGap(t *testing.T) {
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	mustApply(t, r, map[Owner]*OwnerState{testOwner("old"): set(ownerFlows(3, 5))})
	st := mustApply(t, r, map[Owner]*OwnerState{testOwner("old"): nil, testOwner("new"): set(ownerFlows(3, 6))})
	if st.FlowDeletes != 0 || st.FlowAdds != 4 {
		t.Fatalf("hand-over: %s; want 4 replacing adds and no delete", st)
	}
	for _, l := range sw.FlowStrings() {
		if c := cookieOf(t, l); c.OwnerHash() != testOwner("new").Hash() {
			t.Errorf("flow still carries another owner's cookie: %s", l)
		}
	}
}

func cookieOf(t *testing.T, line string) Cookie {
	t.Helper()
	var c uint64
	if _, err := fmt.Sscanf(line, "cookie=%v ", &c); err != nil {
		t.Fatalf("no cookie in %q: %v", line, err)
	}
	return Cookie(c)
}

func TestApplyConflictsAndBadFlowsFailOnlyTheirOwner(t *testing.T) {
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	f := F(60, 100, M(append(IP, IPDst(svcIP))...), Output{Port: 3})
	mustApply(t, r, map[Owner]*OwnerState{testOwner("a"): set([]Flow{f})})
	res := must(t)(r.Apply(context.Background(), map[Owner]*OwnerState{
		testOwner("b"):    set([]Flow{f}),                                // wants a's flow
		testOwner("c"):    set([]Flow{f, f}),                             // a flow twice
		testOwner("d"):    set([]Flow{F(0, 1, M(InPort(1), InPort(2)))}), // malformed match
		testOwner("good"): set(ownerFlows(1, 5)),                         // fine
		testOwner("gone"): nil,                                           // never existed
	}))
	for _, o := range []string{"b", "c", "d"} {
		if res.Failed[testOwner(o)] == nil {
			t.Errorf("owner %s: want a failure, got none", o)
		}
	}
	if err := res.Failed[testOwner("b")]; err == nil || !strings.Contains(err.Error(), "test/a") {
		t.Errorf("conflict error %v; want it to name test/a", err)
	}
	if len(res.Failed) != 3 || res.Stats.FlowAdds != 4 {
		t.Fatalf("failed %v, stats %s; want only b, c, d to fail and good's 4 flows added", res.Failed, res.Stats)
	}
	got := r.Owners()
	if len(got) != 2 {
		t.Fatalf("owners %v; failed owners with nothing installed must not linger", got)
	}
}

// The switch refuses one owner's flow: that owner keeps what it had, every other owner's change is
// installed in the re-sent bundle.
func TestApplyRefusedOwnerKeepsItsLastGoodFlows(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	bad := testOwner("bad")
	mustApply(t, r, map[Owner]*OwnerState{base: set(versionNote(1)), bad: set(ownerFlows(1, 5))})
	lastGood := sw.FlowStrings()
	// bad's new state outputs to a group nobody defined (OVS refuses it: OFPBAC_BAD_OUT_GROUP).
	refused := append(ownerFlows(1, 6), F(40, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 99}))
	changes := map[Owner]*OwnerState{bad: set(refused)}
	for i := 2; i < 6; i++ {
		changes[testOwner(fmt.Sprint("p", i))] = set(ownerFlows(i, 5))
	}
	res := must(t)(r.Apply(ctx, changes))
	if err := res.Failed[bad]; err == nil || !strings.Contains(err.Error(), "group 99") {
		t.Fatalf("failed %v; want bad refused for group 99", res.Failed)
	}
	if len(res.Failed) != 1 || res.Stats.FlowAdds != 16 {
		t.Fatalf("failed %v, stats %s; want the 4 other owners' 16 flows installed", res.Failed, res.Stats)
	}
	for _, l := range lastGood {
		if !contains(sw.FlowStrings(), l) {
			t.Errorf("bad's last good flow is gone: %s", l)
		}
	}
	// Its input is fixed: the next Apply installs it.
	st := mustApply(t, r, map[Owner]*OwnerState{bad: set(ownerFlows(1, 6))})
	if st.FlowModifies != 3 {
		t.Fatalf("retry: %s; want bad's 3 VNID flows modified", st)
	}
	if res := must(t)(r.Resync(ctx)); res.Stats.Messages != 0 {
		t.Fatalf("resync after recovery not a no-op: %s", res.Stats)
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// A refusal no owner can be blamed for fails the Apply as a whole and changes nothing; the next
// Apply of the same state installs it.
func TestApplyUnattributedFailureChangesNothing(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	mustApply(t, r, map[Owner]*OwnerState{base: set(versionNote(1))})
	before := sw.FlowStrings()
	boom := errors.New("connection lost")
	r2 := New(failingSwitch{sw, boom}, Config{Round: 1})
	if _, err := r2.Apply(ctx, map[Owner]*OwnerState{testOwner("x"): set(ownerFlows(1, 5))}); !errors.Is(err, boom) {
		t.Fatalf("err %v; want the switch's", err)
	}
	if d := ofbridge.DiffLines(before, sw.FlowStrings()); len(d) != 0 {
		t.Fatalf("a failed bundle changed the switch: %v", d)
	}
	// A refusal that names a message blames its owner instead: x fails, nothing else is affected.
	sw.FailAt = 3
	res := must(t)(r.Apply(ctx, map[Owner]*OwnerState{testOwner("x"): set(ownerFlows(1, 5))}))
	if res.Failed[testOwner("x")] == nil || sw.NumFlows() != len(before) {
		t.Fatalf("failed %v, switch holds %d flows; want x refused and nothing installed", res.Failed, sw.NumFlows())
	}
	sw.FailAt = 0
	mustApply(t, r, map[Owner]*OwnerState{testOwner("x"): set(ownerFlows(1, 5))})
	if sw.NumFlows() != len(before)+4 {
		t.Fatalf("after a failure and a retry the switch holds %d flows, want %d", sw.NumFlows(), len(before)+4)
	}
}

type failingSwitch struct {
	Switch
	err error
}

func (f failingSwitch) Bundle(context.Context, [][]byte) error { return f.err }

func TestApplyGroups(t *testing.T) {
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	svc := Owner{Category: CategoryService, Name: "ns/web:http"}
	group := func(ports ...uint32) GroupEntry {
		g := GroupEntry{ID: 10, Type: GroupSelect}
		for _, p := range ports {
			g.Buckets = append(g.Buckets, Bucket{Weight: 100, Actions: []Action{Output{Port: p}}})
		}
		return g
	}
	flow := F(40, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 10})
	if st := mustApply(t, r, map[Owner]*OwnerState{svc: set([]Flow{flow}, group(3, 4))}); st.GroupAdds != 1 || st.FlowAdds != 1 {
		t.Fatalf("install service: %s", st)
	}
	if st := mustApply(t, r, map[Owner]*OwnerState{svc: set([]Flow{flow}, group(3, 4, 5))}); st.GroupModifies != 1 || st.Messages != 1 {
		t.Fatalf("endpoint added: %s; want one group modify", st)
	}
	// The group moves to another owner in the same Apply: modified in place, never deleted.
	other := Owner{Category: CategoryService, Name: "ns/api:http"}
	st := mustApply(t, r, map[Owner]*OwnerState{svc: nil, other: set([]Flow{flow}, group(6))})
	if st.GroupDeletes != 0 || st.GroupModifies != 1 || sw.NumGroups() != 1 {
		t.Fatalf("group hand-over: %s, switch holds %d groups", st, sw.NumGroups())
	}
	if st := mustApply(t, r, map[Owner]*OwnerState{other: nil}); st.GroupDeletes != 1 || st.FlowDeletes != 1 || sw.NumGroups() != 0 {
		t.Fatalf("delete service: %s, groups left %d", st, sw.NumGroups())
	}
}

// A restart: a new reconciler with the next round re-installs every wanted flow with its new cookie
// (replacing, not deleting, so traffic never misses), and FinishRound removes what is no longer wanted.
func TestRestartRounds(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r1 := newRec(sw, 1, 3)
	changes := map[Owner]*OwnerState{base: set(versionNote(3))}
	for i := 0; i < 5; i++ {
		changes[testOwner(fmt.Sprint("p", i))] = set(ownerFlows(i, 5))
	}
	mustApply(t, r1, changes)
	before := sw.FlowStrings()

	r2 := newRec(sw, 2, 3)
	rep, err := r2.LoadInstalled(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rebuild || !rep.SawVersion || rep.FoundVersion != 3 || rep.Flows != len(before) {
		t.Fatalf("load report %+v; want version 3 seen, no rebuild, %d flows", rep, len(before))
	}
	delete(changes, testOwner("p4")) // p4 vanished while the agent was down
	st := mustApply(t, r2, changes)
	if st.FlowDeletes != 0 || st.FlowAdds != len(versionNote(3))+4*4 {
		t.Fatalf("re-cookie sync: %s", st)
	}
	if got := sw.NumFlows(); got != len(before) {
		t.Fatalf("during the restart the switch must keep every flow: %d, had %d", got, len(before))
	}
	res := must(t)(r2.FinishRound(ctx))
	if res.Stats.FlowDeletes != 1 { // one delete by cookie mask for round 1
		t.Fatalf("finish round: %s", res.Stats)
	}
	after := sw.FlowStrings()
	strip := func(ls []string) []string {
		var out []string
		for _, l := range ls {
			if !strings.Contains(l, "10.128.0.4") {
				out = append(out, l[strings.Index(l, " "):])
			}
		}
		return out
	}
	if d := ofbridge.DiffLines(strip(before), strip(after)); len(d) != 0 {
		t.Fatalf("flows after the restart differ from before (but for the round and the vanished owner): %v", d)
	}
	for _, l := range after {
		if cookieOf(t, l).Round() != 2 {
			t.Errorf("flow of the old round survived: %s", l)
		}
	}
	if res := must(t)(r2.Resync(ctx)); res.Stats.Messages != 0 {
		t.Fatalf("sync after restart not idempotent: %s", res.Stats)
	}
}

// An owner refused during a restart falls back to the flows the old round installed for it, and
// finishing the round keeps them (re-stamped with the new round) instead of deleting them by mask.
func TestRestartRefusedOwnerKeepsOldRoundFlows(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r1 := newRec(sw, 1, 3)
	mustApply(t, r1, map[Owner]*OwnerState{base: set(versionNote(3)), testOwner("p1"): set(ownerFlows(1, 5))})
	r2 := newRec(sw, 2, 3)
	if _, err := r2.LoadInstalled(ctx); err != nil {
		t.Fatal(err)
	}
	bad := append(ownerFlows(1, 5), F(40, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 99}))
	res := must(t)(r2.Apply(ctx, map[Owner]*OwnerState{base: set(versionNote(3)), testOwner("p1"): set(bad)}))
	if res.Failed[testOwner("p1")] == nil || len(res.Failed) != 1 {
		t.Fatalf("failed %v; want p1 refused", res.Failed)
	}
	must(t)(r2.FinishRound(ctx))
	n := 0
	for _, l := range sw.FlowStrings() {
		if strings.Contains(l, "10.128.0.1") {
			n++
			if cookieOf(t, l).Round() != 2 {
				t.Errorf("kept flow not re-stamped with round 2: %s", l)
			}
		}
	}
	if n != 4 {
		t.Fatalf("p1 kept %d of its 4 last good flows across the restart", n)
	}
}

func TestPipelineVersionRebuild(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r1 := newRec(sw, 1, 1)
	mustApply(t, r1, map[Owner]*OwnerState{base: set(append(versionNote(1), F(60, 5, M(IP...), Output{Port: 2})))})
	r2 := newRec(sw, 2, 2)
	if rep, err := r2.LoadInstalled(ctx); err != nil || !rep.Rebuild {
		t.Fatalf("load: %+v, %v; another pipeline version must rebuild", rep, err)
	}
	res := must(t)(r2.Apply(ctx, map[Owner]*OwnerState{base: set(versionNote(2))}))
	if r2.Rebuilding() || !res.Rebuilt || res.Stats.FlowAdds != len(versionNote(2)) || sw.NumFlows() != len(versionNote(2)) {
		t.Fatalf("rebuild: %s (rebuilt %v), switch holds %d flows", res.Stats, res.Rebuilt, sw.NumFlows())
	}
}

func TestResyncRepairsDrift(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	mustApply(t, r, map[Owner]*OwnerState{base: set(versionNote(1)), testOwner("a"): set(ownerFlows(1, 5))})
	want := sw.FlowStrings()
	// Someone deletes one flow, edits another, and adds a foreign one behind the agent's back.
	foreign, _ := Compile(F(100, 7, M(InPort(77)), Output{Port: 1}))
	edited, _ := Compile(F(0, 0, M(), Output{Port: 99}))
	sw.Tamper(func(flows map[FlowKey]CompiledFlow, _ map[uint32]CompiledGroup) {
		for k := range flows {
			if k.Table() == 70 && k.Priority() == 100 {
				delete(flows, k)
			}
			if k.Table() == 60 && k.Priority() == 100 {
				f := flows[k]
				f.Instr = edited.Instr
				flows[k] = f
			}
		}
		flows[foreign.Key] = foreign
	})
	res := must(t)(r.Resync(ctx))
	if st := res.Stats; st.FlowAdds != 1 || st.FlowModifies != 1 || st.FlowDeletes != 1 {
		t.Fatalf("drift repair: %s; want 1 add, 1 modify, 1 delete", st)
	}
	if d := ofbridge.DiffLines(want, sw.FlowStrings()); len(d) != 0 {
		t.Fatalf("after repair the switch differs: %v", d)
	}
	if res := must(t)(r.Resync(ctx)); res.Stats.Messages != 0 {
		t.Fatalf("no-op resync sent %s", res.Stats)
	}
}

// Resyncs racing a stream of Applies never delete a wanted flow: both hold the one lock for the whole
// of their work, so a resync cannot see an owner between its old and new state.
func TestResyncRacingAppliesKeepsEveryWantedFlow(t *testing.T) {
	ctx := context.Background()
	sw := &recordingSwitch{Switch: fakeswitch.New()}
	r := newRec(sw, 1, 1)
	mustApply(t, r, map[Owner]*OwnerState{base: set(versionNote(1))})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.Resync(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < 300; i++ {
		// Every change rewrites owner "moving" to a new VNID and adds another owner.
		mustApply(t, r, map[Owner]*OwnerState{testOwner("moving"): set(ownerFlows(1, uint32(i))), testOwner(fmt.Sprint("n", i)): set(ownerFlows(2+i, 5))})
	}
	close(stop)
	wg.Wait()
	if n := sw.deletesOf(testOwner("moving")); n != 0 {
		t.Fatalf("a resync deleted %d flows of an owner that always wanted them", n)
	}
	if got, want := sw.Switch.(*fakeswitch.Switch).NumFlows(), len(versionNote(1))+4+300*4; got != want {
		t.Fatalf("switch holds %d flows, want %d", got, want)
	}
}

// recordingSwitch counts strict deletes per owner hash.
type recordingSwitch struct {
	Switch
	mu      sync.Mutex
	deletes map[uint32]int
}

func (s *recordingSwitch) Bundle(ctx context.Context, msgs [][]byte) error {
	if err := s.Switch.Bundle(ctx, msgs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deletes == nil {
		s.deletes = map[uint32]int{}
	}
	for _, m := range msgs {
		if m[1] != TypeFlowMod {
			continue
		}
		if fm, err := ParseFlowMod(m); err == nil && fm.Command == FlowDeleteStrict {
			s.deletes[Cookie(fm.Cookie).OwnerHash()]++
		}
	}
	return nil
}

func (s *recordingSwitch) deletesOf(o Owner) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deletes[o.Hash()]
}

func TestOwnerIndexRoundTrip(t *testing.T) {
	x := NewOwnerIndex()
	owners := []Owner{{CategoryPipeline, "base"}, {CategoryPod, "ns/a"}, {CategoryNode, "n2"}, {CategoryTenant, "42"},
		{CategoryService, "ns/web:http"}, {CategoryNetPol, "ns/deny"}}
	for _, o := range owners {
		x.Add(o)
	}
	data, err := x.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	y, err := ParseOwnerIndex(data)
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
	for _, bad := range []string{"nonsense", "pod/", "nocategory/x"} {
		if _, err := ParseOwner(bad); err == nil {
			t.Errorf("ParseOwner(%q): want an error", bad)
		}
	}
	if _, err := ParseOwnerIndex([]byte(`{"owners":["bad"]}`)); err == nil {
		t.Error("ParseOwnerIndex with a malformed owner: want an error")
	}
	// A hash collision keeps both owners and names both.
	a, b := Owner{CategoryPod, "x"}, Owner{CategoryPod, "y"}
	z := NewOwnerIndex()
	z.owners[a.Hash()] = []Owner{a, b}
	if got := z.Name(MakeCookie(1, a)); got != "pod/x|pod/y" {
		t.Errorf("collision name = %q", got)
	}
}

// A re-rendered owner whose flows are mostly its last render's (the very flows) keeps their entries:
// only the changed flow is sent, and every kept flow's desired entry is the one installed, as before.
// A flow it keeps stays its own: another owner that wants it in the same change fails, even when it
// sorts first, and the owner's flows stay as they are.
func TestApplyKeepsUnchangedFlowsEntries(t *testing.T) {
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	keeper := testOwner("z")
	first := ownerFlows(1, 5)
	mustApply(t, r, map[Owner]*OwnerState{keeper: set(first)})
	entries := map[FlowKey]*flowEntry{}
	for k, e := range r.owners[keeper].flows.desired {
		entries[k] = e
	}
	installed := sw.FlowStrings()
	for _, tc := range []struct {
		name    string
		changes map[Owner]*OwnerState
		sent    int  // flow-mods
		newcome bool // testOwner("a") asks for keeper's first flow, and must fail
	}{
		{"one flow changed", map[Owner]*OwnerState{keeper: set(append(slices.Clone(first[:3]), F(60, 100, M(IP...), Goto{Table: 80})))}, 2, false},
		{"back, and a newcomer wants a kept flow", map[Owner]*OwnerState{keeper: set(first), testOwner("a"): set(first[:1])}, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := must(t)(r.Apply(context.Background(), tc.changes))
			if got := res.Stats.Changes(); got != tc.sent {
				t.Errorf("%d flow-mods (%s), want %d", got, res.Stats, tc.sent)
			}
			if tc.newcome != (res.Failed[testOwner("a")] != nil) || len(res.Failed) > 1 || res.Failed[keeper] != nil {
				t.Errorf("failed %v; want only the newcomer to fail: %v", res.Failed, tc.newcome)
			}
			for k, e := range r.owners[keeper].flows.desired {
				if r.flows.installed[k] != e || r.flows.desired[k] != e {
					t.Errorf("%s: the desired entry is not the one installed and desired", e.c.Flow())
				}
				if old := entries[k]; old != nil && old != e {
					t.Errorf("%s: an unchanged flow got a new entry", e.c.Flow())
				}
			}
			clear(entries) // what the next change keeps
			for k, e := range r.owners[keeper].flows.desired {
				entries[k] = e
			}
		})
	}
	if got := sw.FlowStrings(); !slices.Equal(got, installed) {
		t.Errorf("switch holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(installed, "\n"))
	}
}
