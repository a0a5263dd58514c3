package pipeline

import (
	"fmt"
	"testing"
)

// TestAssignPriorities holds the priority allocation to its promises: every rule of a table has a
// priority of its own inside the range, in precedence order; the same policies give the same
// priorities; a policy that changes its spec.priority moves only its own rules; a crowded priority
// borrows from the next ones; a table with more rules than priorities is refused.
func TestAssignPriorities(t *testing.T) {
	rules := func(spec ...int32) []adminRuleKey { // one policy per spec.priority given, 25 rules each
		var out []adminRuleKey
		for i, p := range spec {
			for r := range 25 {
				out = append(out, adminRuleKey{priority: p, policy: fmt.Sprintf("p%03d", i), index: r})
			}
		}
		return out
	}
	sorted := func(keys []adminRuleKey) []adminRuleKey { // the renderer's order
		out := append([]adminRuleKey(nil), keys...)
		for i := range out {
			for j := i + 1; j < len(out); j++ {
				a, b := out[i], out[j]
				if b.priority < a.priority || b.priority == a.priority && (b.policy < a.policy || b.policy == a.policy && b.index < a.index) {
					out[i], out[j] = b, a
				}
			}
		}
		return out
	}
	valid := func(t *testing.T, keys []adminRuleKey, got map[adminRuleKey]uint16, lo, hi uint16) {
		t.Helper()
		if len(got) != len(keys) {
			t.Fatalf("%d priorities for %d rules", len(got), len(keys))
		}
		for i, k := range keys {
			p := got[k]
			if p < lo || p > hi {
				t.Errorf("%v at %d, outside [%d, %d]", k, p, lo, hi)
			}
			if i > 0 && got[keys[i-1]] <= p {
				t.Errorf("%v at %d is not below %v at %d", k, p, keys[i-1], got[keys[i-1]])
			}
		}
	}
	t.Run("distinct priorities, 100 policies", func(t *testing.T) {
		specs := make([]int32, 100)
		for i := range specs {
			specs[i] = int32(i * 10)
		}
		keys := sorted(rules(specs...))
		first, err := assignPriorities(keys, adminMinPriority, adminMaxPriority)
		if err != nil {
			t.Fatal(err)
		}
		valid(t, keys, first, adminMinPriority, adminMaxPriority)
		again, _ := assignPriorities(keys, adminMinPriority, adminMaxPriority)
		for k, p := range first {
			if again[k] != p {
				t.Fatalf("%v: %d, then %d for the same policies", k, p, again[k])
			}
		}
		// p050 moves from 500 to 995: only its 25 rules change priority.
		specs[50] = 995
		moved := sorted(rules(specs...))
		second, err := assignPriorities(moved, adminMinPriority, adminMaxPriority)
		if err != nil {
			t.Fatal(err)
		}
		valid(t, moved, second, adminMinPriority, adminMaxPriority)
		changed := 0
		for _, k := range moved {
			old := k
			if k.policy == "p050" {
				old.priority = 500
			}
			if first[old] != second[k] {
				changed++
				if k.policy != "p050" {
					t.Errorf("%v moved from %d to %d", k, first[old], second[k])
				}
			}
		}
		if changed != 25 {
			t.Errorf("%d rules moved, want p050's 25", changed)
		}
	})
	t.Run("many policies at one priority borrow from the next bands", func(t *testing.T) {
		keys := sorted(rules(7, 7, 7, 7, 8, 1000))
		got, err := assignPriorities(keys, adminMinPriority, adminMaxPriority)
		if err != nil {
			t.Fatal(err)
		}
		valid(t, keys, got, adminMinPriority, adminMaxPriority)
	})
	t.Run("a small range is spread evenly", func(t *testing.T) {
		keys := sorted(rules(0, 1000, 1000))
		got, err := assignPriorities(keys, 1000, 1100)
		if err != nil {
			t.Fatal(err)
		}
		valid(t, keys, got, 1000, 1100)
	})
	t.Run("more rules than priorities", func(t *testing.T) {
		if _, err := assignPriorities(rules(1, 2), 1000, 1040); err == nil {
			t.Error("50 rules fit into 41 priorities")
		}
	})
}
