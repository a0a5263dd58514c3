package reconcile

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/internal/fakeswitch"
)

// TestDriftReportsAndResyncRepairsExactlyIt: flows deleted, altered and added and a group deleted and
// altered behind the reconciler's back. Drift names each difference with its owner without sending
// anything; Resync sends exactly those repairs, attributes them to the owners they belong to, and
// leaves no drift.
func TestDriftReportsAndResyncRepairsExactlyIt(t *testing.T) {
	ctx := context.Background()
	sw := fakeswitch.New()
	r := newRec(sw, 1, 1)
	a, b := testOwner("a"), testOwner("b")
	svc := Owner{Category: CategoryService, Name: "ns/web:http"}
	group := func(id uint32, ports ...uint32) GroupEntry {
		g := GroupEntry{ID: id, Type: GroupSelect}
		for _, p := range ports {
			g.Buckets = append(g.Buckets, Bucket{Weight: 1, Actions: []Action{Output{Port: p}}})
		}
		return g
	}
	mustApply(t, r, map[Owner]*OwnerState{
		base: set(versionNote(1)), a: set(ownerFlows(1, 5)), b: set(ownerFlows(2, 6)),
		svc: set([]Flow{F(40, 100, M(append(TCP, IPDst(svcIP), TCPDst(80))...), ToGroup{ID: 10}),
			F(40, 100, M(append(TCP, IPDst(svcIP), TCPDst(81))...), ToGroup{ID: 11})}, group(10, 3, 4), group(11, 5)),
	})
	if rep, err := r.Drift(ctx); err != nil || len(rep.Entries) != 0 || rep.InstalledFlows != rep.DesiredFlows || rep.DesiredGroups != 2 {
		t.Fatalf("fresh install drifts: %+v, %v", rep, err)
	}

	foreign, _ := Compile(F(100, 7, M(InPort(77)), Output{Port: 1}))
	foreign.Cookie = uint64(MakeCookie(3, testOwner("gone")))
	edited, _ := Compile(F(0, 0, M(), Output{Port: 99}))
	alteredGroup, _ := CompileGroup(group(11, 9))
	sw.Tamper(func(flows map[FlowKey]CompiledFlow, groups map[uint32]CompiledGroup) {
		for k, f := range flows {
			switch {
			case k.Table() == 70 && k.Priority() == 100 && f.Cookie == uint64(MakeCookie(1, a)):
				delete(flows, k) // a's ARP delivery
			case k.Table() == 60 && k.Priority() == 100 && f.Cookie == uint64(MakeCookie(1, b)):
				f.Instr = edited.Instr // b's routing
				flows[k] = f
			}
		}
		flows[foreign.Key] = foreign
		delete(groups, 10)
		groups[11] = alteredGroup
	})
	before := sw.Msgs
	rep, err := r.Drift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sw.Msgs != before {
		t.Fatalf("Drift sent %d messages", sw.Msgs-before)
	}
	var got []string
	for _, e := range rep.Entries {
		got = append(got, fmt.Sprintf("%s %s %s %s", e.Owner, e.Kind, e.State, e.Why))
	}
	want := []string{
		"svc/ns/web:http group different buckets",
		"svc/ns/web:http group missing ",
		"test/#" + fmt.Sprintf("%08x", testOwner("gone").Hash()) + " flow unexpected ",
		"test/a flow missing ",
		"test/b flow different actions",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("drift entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, e := range rep.Entries {
		if e.State == DriftDifferent && (e.Desired == "" || e.Installed == "" || e.Desired == e.Installed) {
			t.Errorf("a different entry shows both sides: %+v", e)
		}
	}

	res := must(t)(r.Resync(ctx))
	st := res.Stats
	if st.FlowAdds != 1 || st.FlowModifies != 1 || st.FlowDeletes != 1 || st.GroupAdds != 1 || st.GroupModifies != 1 || st.GroupDeletes != 0 || st.Messages != 5 {
		t.Fatalf("repair sent %s; want exactly the 5 repairs", st)
	}
	wantRepaired := map[Owner]SyncStats{
		a:   {FlowAdds: 1, Messages: 1},
		b:   {FlowModifies: 1, Messages: 1},
		svc: {GroupAdds: 1, GroupModifies: 1, Messages: 2},
		{Category: CategoryTest, Name: fmt.Sprintf("#%08x", testOwner("gone").Hash())}: {FlowDeletes: 1, Messages: 1},
	}
	if fmt.Sprint(res.Repaired) != fmt.Sprint(wantRepaired) {
		t.Fatalf("repaired %v, want %v", res.Repaired, wantRepaired)
	}
	if rep, err := r.Drift(ctx); err != nil || len(rep.Entries) != 0 {
		t.Fatalf("drift after repair: %+v, %v", rep.Entries, err)
	}
	if res := must(t)(r.Resync(ctx)); res.Stats.Messages != 0 || len(res.Repaired) != 0 {
		t.Fatalf("a resync without drift sent %s (%v)", res.Stats, res.Repaired)
	}
	counts := r.Counts()
	if c := counts[CategoryService]; c.Flows != 2 || c.Groups != 2 {
		t.Errorf("service counts %+v", c)
	}
	if c := counts[CategoryTest]; c.Flows != 8+len(versionNote(1)) || c.Groups != 0 {
		t.Errorf("test counts %+v", c)
	}
	desired := r.Desired()
	if len(desired[svc].Groups) != 2 || len(desired[a].Flows) != 4 || desired[a].Flows[0].Cookie != uint64(MakeCookie(1, a)) {
		t.Errorf("desired: %+v", desired[a])
	}
}
