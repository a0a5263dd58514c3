package flowctl

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
)

// TestTraceAdminPolicy: a verdict a ClusterNetworkPolicy decided names the policy, its tier, the
// direction and the rule, whether it delivered the packet or dropped it.
func TestTraceAdminPolicy(t *testing.T) {
	a, a2, b := netip.MustParseAddr("10.128.0.3"), netip.MustParseAddr("10.128.0.4"), netip.MustParseAddr("10.128.0.5")
	admin := []pipeline.AdminPolicyState{
		{Name: "open-red", Tier: pipeline.AdminTierAdmin, Priority: 3, Pods: []pipeline.PolicyPod{{OFPort: 5}}, Ingress: []pipeline.AdminRule{
			{Name: "from-a", Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{
				Peers: []pipeline.PolicyPeer{{Net: netip.PrefixFrom(a, 32)}}, Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Port: 8080}}}}}},
		{Name: "blue-baseline", Tier: pipeline.AdminTierBaseline, Priority: 0, Pods: []pipeline.PolicyPod{{OFPort: 4}}, Ingress: []pipeline.AdminRule{
			{Name: "", Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{AllPeers: true, Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Port: 80}}}},
			{Name: "default-deny", Action: pipeline.AdminDeny, PolicyRule: pipeline.PolicyRule{AllPeers: true}}}},
	}
	dir := t.TempDir()
	n1Pods := []testPod{{"blue", "a", a, 3}, {"blue", "a2", a2, 4}, {"red", "b", b, 5}}
	dumps := []string{writeNodeDump(t, dir, "n1", n1IP, n1Net, debugapi.RemoteNode{Name: "n2", NodeIP: n2IP, Subnet: n2Net},
		pipeline.ModeMultitenant, pipeline.EncapVXLAN, n1Pods, nil, nil, nil, nil, admin...)}
	cases := []struct {
		name string
		o    TraceOptions
		kind string
		says string
	}{
		{"admin accept across tenants", TraceOptions{Src: "blue/a", Dst: "red/b", Port: 8080}, VerdictDelivered,
			`decided by Admin ClusterNetworkPolicy open-red, ingress rule 0 "from-a": Accept`},
		{"tenant isolation where no rule matches", TraceOptions{Src: "blue/a", Dst: "red/b", Port: 8081}, VerdictDropped,
			"tenant VNID 12 (blue) may not reach VNID 14 (red)"},
		{"baseline deny", TraceOptions{Src: "blue/a", Dst: "blue/a2", Port: 8080}, VerdictDropped,
			`dropped at table 82 baseline-ingress by Baseline ClusterNetworkPolicy blue-baseline, ingress rule 1 "default-deny": Deny`},
		{"baseline accept", TraceOptions{Src: "blue/a", Dst: "blue/a2", Port: 80}, VerdictDelivered,
			"decided by Baseline ClusterNetworkPolicy blue-baseline, ingress rule 0: Accept"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Proto = "tcp"
			res, text := traceOffline(t, dumps, tc.o)
			if res.Verdict.Kind != tc.kind || !strings.Contains(res.Verdict.Text, tc.says) {
				t.Errorf("verdict %s %q, want %s saying %q", res.Verdict.Kind, res.Verdict.Text, tc.kind, tc.says)
			}
			if len(res.Verdict.AdminRules) > 0 && !strings.Contains(text, "decided by "+res.Verdict.AdminRules[0]) {
				t.Errorf("the text does not show the step that decided:\n%s", text)
			}
		})
	}
}
