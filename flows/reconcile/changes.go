package reconcile

import "reflect"

// Changes is what Apply needs to go from the render prev (what was last applied, by owner; nil when
// nothing was) to the render next: every owner of next that is new or whose state differs, and nil for
// every owner of prev that next no longer has. An owner whose state equals its previous one is left
// out, so Apply compiles and diffs only what changed.
//
// States a renderer hands back again (an unchanged owner's, its very slices) are equal at a pointer
// check; others compare with reflect.DeepEqual. The returned states are copies of next's entries (their
// slices shared).
func Changes(prev, next map[Owner]OwnerState) map[Owner]*OwnerState {
	changes := make(map[Owner]*OwnerState)
	for o, st := range next {
		if old, ok := prev[o]; ok && sameState(old, st) {
			continue
		}
		changes[o] = &st
	}
	for o := range prev {
		if _, still := next[o]; !still {
			changes[o] = nil
		}
	}
	return changes
}

// sameState says whether two states are equal: at once when they share their slices.
func sameState(a, b OwnerState) bool {
	if len(a.Flows) == len(b.Flows) && len(a.Groups) == len(b.Groups) &&
		(len(a.Flows) == 0 || &a.Flows[0] == &b.Flows[0]) && (len(a.Groups) == 0 || &a.Groups[0] == &b.Groups[0]) {
		return true
	}
	return reflect.DeepEqual(a, b)
}
