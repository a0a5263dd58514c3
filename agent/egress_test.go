package agent

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/ofsdn/ofsdn/agent/attach"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func egressPolicy(ns, name string, rules ...networkv1.EgressNetworkPolicyRule) *networkv1.EgressNetworkPolicy {
	return &networkv1.EgressNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkv1.EgressNetworkPolicySpec{Egress: rules}}
}

// TestEgressInSnapshot: the API's egress objects, through the agent's informers, become the snapshot's
// EgressState as their meaning says: usable IPs (a), none usable (b: outside every range), a firewall
// whose DNS name has no address until resolved and then has the resolver's (c), two policies in one
// namespace (d: deny all); the membership's port joins the guarded ports once anything egress exists,
// and a CNI ADD of a pod waits for its namespace's egress owners. (The held IPs' way into the state:
// agent/egress's TestHeldReachTheSnapshot.)
func TestEgressInSnapshot(t *testing.T) {
	withEgress := func(nn *networkv1.NetNamespace, ips ...networkv1.EgressIP) *networkv1.NetNamespace {
		nn.EgressIPs = ips
		return nn
	}
	hs1 := hostSubnet(testNode, testNode, "198.51.100.11", "10.128.0.0/23")
	hs1.EgressCIDRs = []networkv1.CIDR{"198.51.100.32/27"}
	denyAll := networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleDeny, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: "0.0.0.0/0"}}
	byName := networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleAllow, To: networkv1.EgressNetworkPolicyPeer{DNSName: "api.example"}}
	a, _ := startAgent(t, clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"), hs1,
		hostSubnet("n2", "n2", "198.51.100.12", "10.128.2.0/23"),
		withEgress(netNamespace("a", 10), "198.51.100.40"), withEgress(netNamespace("b", 11), "198.51.100.99"), netNamespace("c", 12), netNamespace("d", 13),
		egressPolicy("c", "fw", byName, denyAll), egressPolicy("d", "one", denyAll), egressPolicy("d", "two", denyAll))
	st := waitSnapshot(t, a, "egress namespaces a-d", func(st pipeline.NodeState, _ []string) bool { return len(st.Egress.Namespaces) == 4 })
	ns := map[string]pipeline.EgressNamespace{}
	for _, n := range st.Egress.Namespaces {
		ns[n.Name] = n
	}
	if got := ns["a"]; !slices.Equal(got.IPs, []netip.Addr{netip.MustParseAddr("198.51.100.40")}) || got.NoUsableIP || got.Firewall != nil {
		t.Errorf("a: %+v", got)
	}
	if got := ns["b"]; len(got.IPs) != 0 || !got.NoUsableIP {
		t.Errorf("b: %+v, want no usable IP", got)
	}
	if fw := ns["c"].Firewall; fw == nil || fw.Policy != "fw" || fw.DenyAll || len(fw.Rules) != 2 || fw.Rules[0].DNSName != "api.example" ||
		len(fw.Rules[0].Dsts) != 0 || !fw.Rules[1].Dsts[0].Addr().IsUnspecified() {
		t.Errorf("c: %+v", fw)
	}
	if fw := ns["d"].Firewall; fw == nil || !fw.DenyAll || fw.Policy != "one" {
		t.Errorf("d: %+v, want the first policy by name, denying all", fw)
	}
	if st.Egress.ServiceNetwork != netip.MustParsePrefix("172.30.0.0/16") || !slices.Contains(st.TunnelPorts, uint16(9107)) {
		t.Errorf("service network %v, guarded ports %v", st.Egress.ServiceNetwork, st.TunnelPorts)
	}
	if names := a.view.egress.DNSNames(); !slices.Equal(names, []string{"api.example"}) {
		t.Errorf("DNS names to resolve: %v", names)
	}
	// The resolver's answer reaches the rule.
	a.egress.Resolved(map[string][]netip.Addr{"api.example": {netip.MustParseAddr("192.0.2.80")}})
	st = waitSnapshot(t, a, "api.example resolved", func(st pipeline.NodeState, _ []string) bool {
		for _, n := range st.Egress.Namespaces {
			if n.Name == "c" && len(n.Firewall.Rules[0].Dsts) == 1 {
				return true
			}
		}
		return false
	})
	// What a CNI ADD waits for.
	a.view.Attach(attach.Pod{Namespace: "c", Name: "p", IP: netip.MustParseAddr("10.128.0.5"), MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 5}, OFPort: 5})
	for _, tc := range []struct {
		ns   string
		want []reconcile.Owner
	}{
		{"a", []reconcile.Owner{pipeline.EgressNamespaceOwner("a")}},
		{"c", []reconcile.Owner{pipeline.EgressNamespaceOwner("c"), pipeline.EgressFirewallOwner("c", "fw")}},
		{"e", nil},
	} {
		if got := a.view.egress.Owners(tc.ns); !slices.Equal(got, tc.want) {
			t.Errorf("owners of %s: %v, want %v", tc.ns, got, tc.want)
		}
	}
}

// TestNoEgressNoPort: without egress IPs or firewalls nothing egress renders, and the membership's port
// is not guarded (it is not in use).
func TestNoEgressNoPort(t *testing.T) {
	a, _ := startAgent(t, clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"),
		hostSubnet(testNode, testNode, "198.51.100.11", "10.128.0.0/23"), netNamespace("a", 10))
	st := waitSnapshot(t, a, "the node", func(st pipeline.NodeState, _ []string) bool { return st.LocalSubnet.IsValid() })
	if len(st.Egress.Namespaces) != 0 || slices.Contains(st.TunnelPorts, uint16(9107)) {
		t.Errorf("egress %+v, guarded ports %v", st.Egress, st.TunnelPorts)
	}
}
