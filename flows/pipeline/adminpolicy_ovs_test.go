package pipeline

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// TestAdminPoliciesOnOVS renders ClusterNetworkPolicies of both tiers onto a real bridge, over tenant
// isolation (multitenant mode) and over NetworkPolicy (networkpolicy mode), and sends real TCP and
// UDP. Each step's expectations are written from the API's text: Admin, then the namespace's layer,
// then Baseline, then allow; Accept (replies too) and Deny stop, Pass skips the rest of its tier.
func TestAdminPoliciesOnOVS(t *testing.T) {
	l := newSvcLab(t)
	// a and c share tenant 10, b is tenant 11, g is global.
	a := l.addPod(t, "a", 10, 10, []int{80, 81}, []int{53})
	b := l.addPod(t, "b", 11, 11, []int{80, 81}, []int{53})
	c := l.addPod(t, "c", 12, 10, []int{80, 81}, []int{53})
	g := l.addPod(t, "g", 13, 0, []int{80, 81}, []int{53})
	pods := map[string]pod{"a": a, "b": b, "c": c, "g": g}
	for _, p := range pods {
		if _, err := p.Exec("ethtool", "-K", "eth0", "tx", "off"); err != nil {
			t.Fatal(err)
		}
	}
	host := func(p pod) PolicyPeer { return PolicyPeer{Net: netip.PrefixFrom(p.IP.Addr(), 32)} }
	port := func(p pod) PolicyPod { return PolicyPod{OFPort: uint32(p.OFPort)} }
	tcp := func(n uint16) []PolicyPort { return []PolicyPort{{Protocol: IPProtoTCP, Port: n}} }
	type edge struct {
		from, to, network string
		port              int
		want              bool
	}
	check := func(t *testing.T, step string, edges []edge) {
		t.Helper()
		l.settle(t)
		for _, e := range edges {
			_, err := probe(pods[e.from].Pod, e.network, fmt.Sprintf("%s:%d", pods[e.to].IP.Addr(), e.port), 700*time.Millisecond)
			if got := err == nil; got != e.want {
				t.Errorf("%s: %s → %s %s/%d: reachable %v, want %v", step, e.from, e.to, e.network, e.port, got, e.want)
			}
		}
	}
	l.apply(t)
	check(t, "tenants alone", []edge{
		{"a", "b", "tcp", 80, false}, {"a", "c", "tcp", 80, true}, {"a", "g", "udp", 53, true}, {"b", "g", "tcp", 80, true}, {"g", "b", "tcp", 80, true},
	})

	// An Admin ingress Accept opens b to a on tcp/80 across tenants (replies included), and nothing
	// else; an Admin Deny closes c to a inside their tenant; b denies all its egress, which does not
	// stop the replies of connections it accepts.
	l.state.AdminPolicies = []AdminPolicyState{
		{Name: "open-b", Tier: AdminTierAdmin, Priority: 10, Pods: []PolicyPod{port(b)}, Ingress: []AdminRule{
			{Name: "a-web", Action: AdminAccept, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}, Ports: tcp(80)}}}},
		{Name: "close-c", Tier: AdminTierAdmin, Priority: 10, Pods: []PolicyPod{port(c)}, Ingress: []AdminRule{
			{Name: "not-a", Action: AdminDeny, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}}}}},
		{Name: "b-silent", Tier: AdminTierAdmin, Priority: 20, Pods: []PolicyPod{port(b)}, Egress: []AdminRule{
			{Name: "all", Action: AdminDeny, PolicyRule: PolicyRule{AllPeers: true}}}},
	}
	l.apply(t)
	check(t, "admin accept, deny", []edge{
		{"a", "b", "tcp", 80, true}, {"a", "b", "tcp", 81, false}, {"a", "b", "udp", 53, false}, {"b", "a", "tcp", 80, false},
		{"a", "c", "tcp", 80, false}, {"a", "c", "udp", 53, false}, {"c", "a", "tcp", 80, true}, {"g", "c", "tcp", 80, true},
		{"b", "g", "tcp", 80, false}, {"g", "b", "tcp", 80, true},
	})

	// Order within the Admin tier: a Pass ahead of close-c hands a → c back to the tenant layer (same
	// tenant: undecided) and on to Baseline, whose default deny for c then applies; an Accept ahead
	// of it wins on tcp/81.
	l.state.AdminPolicies = append(l.state.AdminPolicies[:1],
		AdminPolicyState{Name: "close-c", Tier: AdminTierAdmin, Priority: 10, Pods: []PolicyPod{port(c)}, Ingress: []AdminRule{
			{Name: "pass-web", Action: AdminPass, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}, Ports: tcp(80)}},
			{Name: "accept-81", Action: AdminAccept, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}, Ports: tcp(81)}},
			{Name: "not-a", Action: AdminDeny, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}}}}},
		AdminPolicyState{Name: "c-baseline", Tier: AdminTierBaseline, Priority: 0, Pods: []PolicyPod{port(c)}, Ingress: []AdminRule{
			{Name: "from-g", Action: AdminAccept, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(g)}}},
			{Name: "default-deny", Action: AdminDeny, PolicyRule: PolicyRule{AllPeers: true}}}},
	)
	l.apply(t)
	check(t, "pass to baseline", []edge{
		{"a", "c", "tcp", 80, false}, {"a", "c", "tcp", 81, true}, {"a", "c", "udp", 53, false}, {"g", "c", "udp", 53, true},
		{"a", "b", "tcp", 80, true}, {"b", "g", "tcp", 80, true},
	})

	// Priorities: a Deny at 5 ahead of open-b's Accept at 10 closes a → b again; moved behind it (15),
	// the Accept wins once more.
	deny := AdminPolicyState{Name: "deny-b", Tier: AdminTierAdmin, Priority: 5, Pods: []PolicyPod{port(b)}, Ingress: []AdminRule{
		{Name: "a", Action: AdminDeny, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}}}}}
	l.state.AdminPolicies = append(l.state.AdminPolicies, deny)
	l.apply(t)
	check(t, "deny first", []edge{{"a", "b", "tcp", 80, false}})
	l.state.AdminPolicies[len(l.state.AdminPolicies)-1].Priority = 15
	l.apply(t)
	check(t, "deny moved behind", []edge{{"a", "b", "tcp", 80, true}, {"a", "b", "tcp", 81, false}})

	// networkpolicy mode: a NetworkPolicy isolates c (only g may connect). Baseline cannot open what it
	// decided; Admin can. b is isolated by nobody: Baseline denies a on tcp/81 there.
	l.state.Mode = ModeNetworkPolicy
	for i := range l.state.Pods {
		l.state.Pods[i].VNID = 0
		l.state.Pods[i].IngressIsolated = l.state.Pods[i].Name == "c"
	}
	l.state.Policies = []PolicyState{{Namespace: "t", Name: "c-from-g", Ingress: true, Pods: []PolicyPod{port(c)},
		IngressRules: []PolicyRule{{Peers: []PolicyPeer{host(g)}}}}}
	l.state.AdminPolicies = []AdminPolicyState{
		{Name: "c-baseline", Tier: AdminTierBaseline, Priority: 0, Pods: []PolicyPod{port(c), port(b)}, Ingress: []AdminRule{
			{Name: "a-81", Action: AdminDeny, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}, Ports: tcp(81)}},
			{Name: "a", Action: AdminAccept, PolicyRule: PolicyRule{Peers: []PolicyPeer{host(a)}}}}},
	}
	l.apply(t)
	check(t, "networkpolicy decides before baseline", []edge{
		{"a", "c", "tcp", 80, false}, {"g", "c", "tcp", 80, true}, {"a", "b", "tcp", 81, false}, {"a", "b", "tcp", 80, true}, {"c", "b", "tcp", 81, true},
	})
	l.state.AdminPolicies = append(l.state.AdminPolicies, AdminPolicyState{Name: "open-c", Tier: AdminTierAdmin, Priority: 0,
		Pods: []PolicyPod{port(c)}, Ingress: []AdminRule{{Name: "a-udp", Action: AdminAccept, PolicyRule: PolicyRule{
			Peers: []PolicyPeer{host(a)}, Ports: []PolicyPort{{Protocol: IPProtoUDP}}}}}})
	l.apply(t)
	check(t, "admin over networkpolicy", []edge{{"a", "c", "udp", 53, true}, {"a", "c", "tcp", 80, false}})
}
