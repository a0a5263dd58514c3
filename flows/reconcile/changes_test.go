package reconcile

import (
	"slices"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

func TestChanges(t *testing.T) {
	a, b, c := testOwner("a"), testOwner("b"), testOwner("c")
	flowsA := ownerFlows(1, 5)
	state := func(flows []Flow, groups ...GroupEntry) OwnerState { return OwnerState{Flows: flows, Groups: groups} }
	group := GroupEntry{ID: 7, Type: GroupSelect, Buckets: []Bucket{{Weight: 1, Actions: []Action{Output{Port: 3}}}}}
	cases := []struct {
		name       string
		prev, next map[Owner]OwnerState
		// want: the owners changed (their state from next) and deleted (nil).
		changed, deleted []Owner
	}{
		{"nothing applied yet: every owner", nil, map[Owner]OwnerState{a: state(flowsA), b: state(nil)}, []Owner{a, b}, nil},
		{"same render: nothing", map[Owner]OwnerState{a: state(flowsA)}, map[Owner]OwnerState{a: state(flowsA)}, nil, nil},
		{"equal content in new memory: nothing", map[Owner]OwnerState{a: state(flowsA)},
			map[Owner]OwnerState{a: state(slices.Clone(flowsA))}, nil, nil},
		{"a flow differs", map[Owner]OwnerState{a: state(flowsA), b: state(ownerFlows(2, 5))},
			map[Owner]OwnerState{a: state(ownerFlows(1, 6)), b: state(ownerFlows(2, 5))}, []Owner{a}, nil},
		{"a group differs", map[Owner]OwnerState{a: state(flowsA)}, map[Owner]OwnerState{a: state(flowsA, group)}, []Owner{a}, nil},
		{"an owner gone, one new", map[Owner]OwnerState{a: state(flowsA), b: state(ownerFlows(2, 5))},
			map[Owner]OwnerState{a: state(flowsA), c: state(ownerFlows(3, 5))}, []Owner{c}, []Owner{b}},
		{"everything gone", map[Owner]OwnerState{a: state(flowsA)}, nil, nil, []Owner{a}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Changes(tc.prev, tc.next)
			if len(got) != len(tc.changed)+len(tc.deleted) {
				t.Errorf("%d changes %v, want %d", len(got), SortedOwnerKeys(got), len(tc.changed)+len(tc.deleted))
			}
			for _, o := range tc.changed {
				st, ok := got[o]
				if !ok || st == nil || len(st.Flows) != len(tc.next[o].Flows) || len(st.Groups) != len(tc.next[o].Groups) {
					t.Errorf("owner %s: change %v (present %v), want its state from next", o, st, ok)
				}
			}
			for _, o := range tc.deleted {
				if st, ok := got[o]; !ok || st != nil {
					t.Errorf("owner %s: change %v (present %v), want nil (delete)", o, st, ok)
				}
			}
		})
	}
}
