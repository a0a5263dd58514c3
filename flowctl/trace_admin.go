package flowctl

import (
	"slices"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// adminDecisions are the ClusterNetworkPolicy rules that decided on the packet, in the order it met
// them: their decision flows carry a note naming the policy, tier, direction and rule
// (flows/pipeline/adminpolicy.go). It reads the hops traced so far and the current node's path.
func adminDecisions(res *TraceResult, path *trace.Path) []string {
	var out []string
	add := func(actions []string) {
		if ref, ok := pipeline.AdminRuleOfActions(actions); ok && !slices.Contains(out, ref.String()) {
			out = append(out, ref.String())
		}
	}
	for _, h := range res.Hops {
		for _, s := range h.Steps {
			add(s.Actions)
		}
	}
	if path != nil {
		for _, pass := range path.Passes {
			for _, s := range pass.Steps {
				add(s.Actions)
			}
		}
	}
	return out
}
