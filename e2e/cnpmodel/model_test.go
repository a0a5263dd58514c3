package cnpmodel

import (
	"net/netip"
	"testing"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/e2e/netpolmodel"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func policy(name string, tier cnp.Tier, prio int32, subject cnp.Subject, ingress []cnp.IngressRule, egress []cnp.EgressRule) cnp.ClusterNetworkPolicy {
	return cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnp.Spec{Tier: tier, Priority: prio, Subject: subject, Ingress: ingress, Egress: egress}}
}

func nsSubject(name string) cnp.Subject { return cnp.Subject{Namespaces: sel("name", name)} }

func fromNS(name string) []cnp.IngressPeer { return []cnp.IngressPeer{{Namespaces: sel("name", name)}} }

func tcp(port int32) []cnp.Protocol {
	return []cnp.Protocol{{TCP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Number: port}}}}
}

// TestAllowed: cases read off the API's text (tiers, actions, the namespace's layer) and the choices
// the package documents for tenants.
func TestAllowed(t *testing.T) {
	pod := func(ns, name, ip string, ports ...corev1.ContainerPort) *netpolmodel.Pod {
		return &netpolmodel.Pod{Namespace: ns, Name: name, Labels: map[string]string{"app": name}, IP: netip.MustParseAddr(ip), Node: "n1", Ports: ports}
	}
	blue := pod("blue", "app", "10.128.0.2", corev1.ContainerPort{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP})
	red := pod("red", "db", "10.128.0.3")
	red2 := pod("red", "web", "10.128.0.4")
	dflt := pod("default", "dns", "10.128.0.5")
	cluster := &netpolmodel.Cluster{
		Namespaces: []netpolmodel.Namespace{{Name: "blue", Labels: map[string]string{"name": "blue"}}, {Name: "red", Labels: map[string]string{"name": "red"}},
			{Name: "default", Labels: map[string]string{"name": "default"}}},
		Pods: []*netpolmodel.Pod{blue, red, red2, dflt},
	}
	vnids := map[string]uint32{"blue": 10, "red": 11, "default": 0}
	shared := policy("shared-db", cnp.AdminTier, 10, cnp.Subject{Pods: &cnp.NamespacedPod{NamespaceSelector: *sel("name", "red"), PodSelector: *sel("app", "db")}},
		[]cnp.IngressRule{{Action: cnp.Accept, From: fromNS("blue"), Protocols: tcp(5432)}, {Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}, nil)
	closedDefault := policy("default-closed", cnp.BaselineTier, 0, nsSubject("default"),
		[]cnp.IngressRule{{Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}, nil)
	passBlue := policy("pass", cnp.AdminTier, 1, nsSubject("red"), []cnp.IngressRule{{Action: cnp.Pass, From: fromNS("blue")}}, nil)
	isolateDefault := networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "from-blue"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("name", "blue")}}}}}}
	ep := netpolmodel.PodEndpoint
	tests := []struct {
		name     string
		mode     Mode
		policies []cnp.ClusterNetworkPolicy
		nps      []networkingv1.NetworkPolicy
		src, dst netpolmodel.Endpoint
		port     int32
		proto    corev1.Protocol
		want     bool
	}{
		{"tenants alone keep blue from red", Multitenant, nil, nil, ep(blue), ep(red), 5432, corev1.ProtocolTCP, false},
		{"an Admin Accept opens red's db to blue across tenants", Multitenant, []cnp.ClusterNetworkPolicy{shared}, nil, ep(blue), ep(red), 5432, corev1.ProtocolTCP, true},
		{"its later Deny closes another port", Multitenant, []cnp.ClusterNetworkPolicy{shared}, nil, ep(blue), ep(red), 22, corev1.ProtocolTCP, false},
		{"an Admin Deny closes a path inside a tenant", Multitenant, []cnp.ClusterNetworkPolicy{shared}, nil, ep(red2), ep(red), 5432, corev1.ProtocolTCP, false},
		{"a pod no policy selects, same tenant: allowed", Multitenant, []cnp.ClusterNetworkPolicy{shared}, nil, ep(red), ep(red2), 80, corev1.ProtocolTCP, true},
		{"Baseline applies where tenants leave it undecided (global)", Multitenant, []cnp.ClusterNetworkPolicy{closedDefault}, nil, ep(blue), ep(dflt), 53, corev1.ProtocolUDP, false},
		{"Pass hands to tenants, which deny", Multitenant, []cnp.ClusterNetworkPolicy{passBlue, shared}, nil, ep(blue), ep(red), 5432, corev1.ProtocolTCP, false},
		{"Baseline is not asked where a NetworkPolicy decided", NetworkPolicy, []cnp.ClusterNetworkPolicy{closedDefault},
			[]networkingv1.NetworkPolicy{isolateDefault}, ep(blue), ep(dflt), 53, corev1.ProtocolUDP, true},
		{"Baseline decides a pod no NetworkPolicy isolates", NetworkPolicy, []cnp.ClusterNetworkPolicy{closedDefault}, nil, ep(blue), ep(dflt), 53, corev1.ProtocolUDP, false},
		{"a lower spec.priority wins", Subnet, []cnp.ClusterNetworkPolicy{
			policy("late-accept", cnp.AdminTier, 20, nsSubject("blue"), []cnp.IngressRule{{Action: cnp.Accept, From: fromNS("red")}}, nil),
			policy("early-deny", cnp.AdminTier, 5, nsSubject("blue"), []cnp.IngressRule{{Action: cnp.Deny, From: fromNS("red")}}, nil)},
			nil, ep(red), ep(blue), 8080, corev1.ProtocolTCP, false},
		{"an egress Deny to a network matches pods too", Subnet, []cnp.ClusterNetworkPolicy{
			policy("no-db-net", cnp.AdminTier, 0, nsSubject("blue"), nil, []cnp.EgressRule{{Action: cnp.Deny, To: []cnp.EgressPeer{{Networks: []string{"10.128.0.3/32"}}}}})},
			nil, ep(blue), ep(red), 5432, corev1.ProtocolTCP, false},
		{"a named port resolves on the destination", Subnet, []cnp.ClusterNetworkPolicy{
			policy("web-only", cnp.AdminTier, 0, nsSubject("blue"), []cnp.IngressRule{
				{Action: cnp.Accept, From: fromNS("red"), Protocols: []cnp.Protocol{{DestinationNamedPort: "web"}}},
				{Action: cnp.Deny, From: fromNS("red")}}, nil)},
			nil, ep(red), ep(blue), 8080, corev1.ProtocolTCP, true},
		{"an unknown peer fails closed in an Accept: it matches nothing", Subnet, []cnp.ClusterNetworkPolicy{
			policy("unknown", cnp.BaselineTier, 0, nsSubject("blue"), nil, []cnp.EgressRule{
				{Action: cnp.Accept, To: []cnp.EgressPeer{{}}}, {Action: cnp.Deny, To: []cnp.EgressPeer{{Namespaces: &metav1.LabelSelector{}}}}})},
			nil, ep(blue), ep(red), 5432, corev1.ProtocolTCP, false},
		{"an unknown peer fails closed in a Deny: it matches everything", Subnet, []cnp.ClusterNetworkPolicy{
			policy("unknown-deny", cnp.AdminTier, 0, nsSubject("blue"), nil, []cnp.EgressRule{{Action: cnp.Deny, To: []cnp.EgressPeer{{}}}})},
			nil, ep(blue), netpolmodel.AddressEndpoint(netip.MustParseAddr("198.51.100.7")), 443, corev1.ProtocolTCP, false},
		{"domainNames match nothing here", Subnet, []cnp.ClusterNetworkPolicy{
			policy("dns-names", cnp.AdminTier, 0, nsSubject("blue"), nil, []cnp.EgressRule{
				{Action: cnp.Accept, To: []cnp.EgressPeer{{DomainNames: []string{"example.org"}}}},
				{Action: cnp.Deny, To: []cnp.EgressPeer{{Networks: []string{"0.0.0.0/0"}}}}})},
			nil, ep(blue), netpolmodel.AddressEndpoint(netip.MustParseAddr("198.51.100.7")), 443, corev1.ProtocolTCP, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := *cluster
			c.Policies = tt.nps
			w := &World{Mode: tt.mode, Cluster: &c, VNIDs: vnids, Policies: tt.policies}
			v, err := w.Allowed(tt.src, tt.dst, tt.port, tt.proto)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != tt.want {
				t.Errorf("%s, want allowed=%v", v, tt.want)
			}
		})
	}
}
