package reconcile

import "reflect"

// Changes is what Apply needs to go from the render prev (what was last applied, by owner; nil when
// nothing was) to the render next: every owner of next that is new or whose state differs, and nil for
// every owner of prev that next no longer has. An owner whose state equals its previous one is left
// out, so Apply compiles and diffs only what changed.
//
// States compare with reflect.DeepEqual, which for slices a renderer hands back again (an unchanged
// owner's) is a pointer check. The returned states are copies of next's entries (their slices shared).
func Changes(prev, next map[Owner]OwnerState) map[Owner]*OwnerState {
	changes := make(map[Owner]*OwnerState)
	for o, st := range next {
		if old, ok := prev[o]; ok && reflect.DeepEqual(old, st) {
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
