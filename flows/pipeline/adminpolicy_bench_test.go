package pipeline

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
)

// adminBenchPolicy is a policy of subjects local pods (ports from 10) and rules ingress rules, each
// admitting peers pod addresses on its own TCP port.
func adminBenchPolicy(name string, priority int32, subjects, peers, rules int) AdminPolicyState {
	p := AdminPolicyState{Name: name, Tier: AdminTierAdmin, Priority: priority}
	for i := range subjects {
		p.Pods = append(p.Pods, PolicyPod{OFPort: uint32(10 + i)})
	}
	for r := range rules {
		rule := AdminRule{Name: fmt.Sprintf("r%d", r), Action: []AdminAction{AdminAccept, AdminDeny, AdminPass}[r%3],
			PolicyRule: PolicyRule{Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: uint16(1000 + r)}}}}
		for i := range peers {
			rule.Peers = append(rule.Peers, PolicyPeer{Net: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 129, byte(i / 250), byte(1 + i%250)}), 32)})
		}
		p.Ingress = append(p.Ingress, rule)
	}
	return p
}

// BenchmarkAdminPolicyFlowsNPlusM: a ClusterNetworkPolicy of 25 rules between 200 subject pods and 200
// peers costs N+M flows per rule (plus its port and decision flows), not N×M. Target ≤ 1.1 × (N+M).
func BenchmarkAdminPolicyFlowsNPlusM(b *testing.B) {
	const n, m, rules = 200, 200, 25
	p := adminBenchPolicy("big", 10, n, m, rules)
	var flows int
	var took time.Duration
	for b.Loop() {
		start := time.Now()
		st, err := renderAdminPolicy(&p, func(_ bool, i int) uint16 { return uint16(60000 - i) })
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		flows = len(st.Flows)
	}
	perRule := float64(flows) / rules
	b.ReportMetric(perRule, "flows/rule")
	b.ReportMetric(perRule/float64(n+m), "flows-per-rule/(N+M)")
	b.ReportMetric(float64(took.Microseconds())/1000/float64(b.N), "render-ms")
	b.Logf("%d subject pods × %d peers × %d rules: %d flows, %.1f per rule = %.3f × (N+M) (target ≤ 1.1); one flow per pair would be %d per rule",
		n, m, rules, flows, perRule, perRule/float64(n+m), n*m)
	if perRule > 1.1*float64(n+m) {
		b.Errorf("%.1f flows per rule, more than 1.1 × (N+M) = %.0f", perRule, 1.1*float64(n+m))
	}
}

// BenchmarkAdminPolicyPriorityChangeOnOVS: 100 ClusterNetworkPolicies (20 subjects × 20 peers × 5
// rules each) on a real bridge; one of them moves to another spec.priority. Flow-mods and the time of
// render + install, against the flows of the whole table.
func BenchmarkAdminPolicyPriorityChangeOnOVS(b *testing.B) {
	br := ofbridge.New(b)
	ctx := context.Background()
	st := NodeState{Mode: ModeNetworkPolicy, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"),
		LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"), ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}}
	for i := range 20 {
		st.Pods = append(st.Pods, PodState{Namespace: "ns", Name: fmt.Sprintf("p%d", i), IP: netip.AddrFrom4([4]byte{10, 128, 0, byte(10 + i)}),
			MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(10 + i)}, OFPort: uint32(10 + i)})
	}
	for i := range 100 {
		st.AdminPolicies = append(st.AdminPolicies, adminBenchPolicy(fmt.Sprintf("cnp-%03d", i), int32(i*10), 20, 20, 5))
	}
	var renderer Renderer
	owners, failed, err := renderer.Render(st)
	if err != nil || len(failed) > 0 {
		b.Fatal(err, failed)
	}
	r := newReconciler(br.Switch, 1)
	if _, err := install(ctx, r, nil, owners); err != nil {
		b.Fatal(err)
	}
	tableFlows := 0
	for o, os := range owners {
		if o.Category == reconcile.CategoryAdminPolicy {
			tableFlows += len(os.Flows)
		}
	}
	applied := owners
	var took time.Duration
	var mods, changes int
	moves := []int32{995, 500} // cnp-050 goes to the end, then back
	k := 0
	for b.Loop() {
		st.AdminPolicies = append([]AdminPolicyState(nil), st.AdminPolicies...)
		st.AdminPolicies[50].Priority = moves[k%2]
		k++
		start := time.Now()
		next, failed, err := renderer.Render(st)
		if err != nil || len(failed) > 0 {
			b.Fatal(err, failed)
		}
		res, err := install(ctx, r, applied, next)
		if err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		mods += res.Stats.Changes()
		changes++
		applied = next
	}
	perChange := float64(mods) / float64(changes)
	ms := float64(took.Microseconds()) / 1000 / float64(changes)
	b.ReportMetric(perChange, "flow-mods/change")
	b.ReportMetric(ms, "ms/change")
	b.ReportMetric(float64(tableFlows), "cnp-flows")
	b.Logf("100 policies, %d ClusterNetworkPolicy flows; one policy's priority changed: %.0f flow-mods, %.1f ms render + install (one bundle)",
		tableFlows, perChange, ms)
}
