package adminpolicy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/agent/policy"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cluster the tests resolve against: namespaces a (team=x) and b (team=y); pods a/web (local, port
// 3, named port http=tcp/8080), a/db (local, port 4), b/api (remote, named port http=udp/9000), a
// hostNetwork pod and a Failed pod in b; nodes n1 (role=infra) and n2.
func world(t *testing.T) *Index {
	t.Helper()
	x := NewIndex("n1")
	ip := netip.MustParseAddr
	c := NewChanges()
	c.Namespaces["a"] = policy.NamespaceChange{Labels: map[string]string{"team": "x"}}
	c.Namespaces["b"] = policy.NamespaceChange{Labels: map[string]string{"team": "y"}}
	c.Pods["a/web"] = &policy.Pod{Namespace: "a", Name: "web", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{ip("10.128.0.3")}, Node: "n1",
		NamedPorts: []pipeline.NamedPort{{Name: "http", Protocol: openflow.IPProtoTCP, Port: 8080}}}
	c.Pods["a/db"] = &policy.Pod{Namespace: "a", Name: "db", Labels: map[string]string{"app": "db"}, IPs: []netip.Addr{ip("10.128.0.4")}, Node: "n1"}
	c.Pods["b/api"] = &policy.Pod{Namespace: "b", Name: "api", Labels: map[string]string{"app": "api"}, IPs: []netip.Addr{ip("10.128.2.5")}, Node: "n2",
		NamedPorts: []pipeline.NamedPort{{Name: "http", Protocol: openflow.IPProtoUDP, Port: 9000}}}
	c.Pods["b/host"] = &policy.Pod{Namespace: "b", Name: "host", IPs: []netip.Addr{ip("192.0.2.12")}, Node: "n2", HostNetwork: true}
	c.Pods["b/done"] = &policy.Pod{Namespace: "b", Name: "done", IPs: []netip.Addr{ip("10.128.2.9")}, Node: "n2", Terminal: true}
	c.Nodes["n1"] = &Node{Labels: map[string]string{"role": "infra"}, Addrs: []netip.Addr{ip("192.0.2.11")}}
	c.Nodes["n2"] = &Node{Labels: map[string]string{}, Addrs: []netip.Addr{ip("192.0.2.12")}}
	x.Apply(c)
	x.SetLocal(map[string]policy.Attachment{"a/web": {OFPort: 3, IP: ip("10.128.0.3")}, "a/db": {OFPort: 4, IP: ip("10.128.0.4")}})
	return x
}

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func peer(addr string, named ...pipeline.NamedPort) pipeline.PolicyPeer {
	return pipeline.PolicyPeer{Net: netip.MustParsePrefix(addr), NamedPorts: named}
}

func TestResolve(t *testing.T) {
	webSubject := cnp.Subject{Pods: &cnp.NamespacedPod{NamespaceSelector: *sel(), PodSelector: *sel("app", "web")}}
	tests := []struct {
		name     string
		spec     cnp.Spec
		want     *pipeline.AdminPolicyState // nil: selects no local pod
		problems []string                   // reasons
	}{{
		name: "namespaces subject and peers: hostNetwork and Failed pods are no peers",
		spec: cnp.Spec{Tier: cnp.AdminTier, Priority: 5, Subject: cnp.Subject{Namespaces: sel("team", "x")},
			Ingress: []cnp.IngressRule{{Name: "from-b", Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: sel("team", "y")}}}}},
		want: &pipeline.AdminPolicyState{Tier: pipeline.AdminTierAdmin, Priority: 5, Pods: []pipeline.PolicyPod{{OFPort: 3}, {OFPort: 4}},
			Ingress: []pipeline.AdminRule{{Name: "from-b", Action: pipeline.AdminDeny, PolicyRule: pipeline.PolicyRule{Peers: []pipeline.PolicyPeer{peer("10.128.2.5/32")}}}}},
	}, {
		name: "egress to networks, nodes and named ports; named ports on every protocol, resolved on peers",
		spec: cnp.Spec{Tier: cnp.BaselineTier, Priority: 0, Subject: webSubject,
			Egress: []cnp.EgressRule{
				{Action: cnp.Accept, To: []cnp.EgressPeer{{Networks: []string{"198.51.100.0/24", "fd00::/8"}}, {Nodes: sel("role", "infra")}},
					Protocols: []cnp.Protocol{{TCP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Range: &cnp.PortRange{Start: 80, End: 90}}}}}},
				{Action: cnp.Pass, To: []cnp.EgressPeer{{Pods: &cnp.NamespacedPod{NamespaceSelector: *sel("team", "y"), PodSelector: *sel()}}},
					Protocols: []cnp.Protocol{{DestinationNamedPort: "http"}}},
			}},
		want: &pipeline.AdminPolicyState{Tier: pipeline.AdminTierBaseline, Pods: []pipeline.PolicyPod{{OFPort: 3}},
			Egress: []pipeline.AdminRule{
				{Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{Peers: []pipeline.PolicyPeer{peer("192.0.2.11/32"), peer("198.51.100.0/24")},
					Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Port: 80, EndPort: 90}}}},
				{Action: pipeline.AdminPass, PolicyRule: pipeline.PolicyRule{
					Peers: []pipeline.PolicyPeer{peer("10.128.2.5/32", pipeline.NamedPort{Name: "http", Protocol: openflow.IPProtoUDP, Port: 9000})},
					Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Name: "http"}, {Protocol: openflow.IPProtoUDP, Name: "http"}, {Protocol: openflow.IPProtoSCTP, Name: "http"}}}},
			}},
	}, {
		name: "ingress named port resolves on the subject: it carries its named ports",
		spec: cnp.Spec{Tier: cnp.AdminTier, Subject: webSubject,
			Ingress: []cnp.IngressRule{{Action: cnp.Accept, From: []cnp.IngressPeer{{Namespaces: sel()}}, Protocols: []cnp.Protocol{{DestinationNamedPort: "http"}}}}},
		want: &pipeline.AdminPolicyState{Tier: pipeline.AdminTierAdmin,
			Pods: []pipeline.PolicyPod{{OFPort: 3, NamedPorts: []pipeline.NamedPort{{Name: "http", Protocol: openflow.IPProtoTCP, Port: 8080}}}},
			Ingress: []pipeline.AdminRule{{Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{
				Peers: []pipeline.PolicyPeer{peer("10.128.0.3/32"), peer("10.128.0.4/32"), peer("10.128.2.5/32")},
				Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Name: "http"}, {Protocol: openflow.IPProtoUDP, Name: "http"}, {Protocol: openflow.IPProtoSCTP, Name: "http"}}}}}},
	}, {
		name: "fail closed: an unknown peer matches nothing in Accept, everything in Deny; domainNames match nothing",
		spec: cnp.Spec{Tier: cnp.AdminTier, Subject: webSubject,
			Egress: []cnp.EgressRule{
				{Action: cnp.Accept, To: []cnp.EgressPeer{{}, {DomainNames: []string{"example.org"}}}},
				{Action: cnp.Deny, To: []cnp.EgressPeer{{}}},
				{Action: cnp.Accept, To: []cnp.EgressPeer{{Networks: []string{"0.0.0.0/0"}}}, Protocols: []cnp.Protocol{{}}},
			}},
		want: &pipeline.AdminPolicyState{Tier: pipeline.AdminTierAdmin, Pods: []pipeline.PolicyPod{{OFPort: 3}},
			Egress: []pipeline.AdminRule{
				{Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{Peers: []pipeline.PolicyPeer{}}},
				{Action: pipeline.AdminDeny, PolicyRule: pipeline.PolicyRule{AllPeers: true}},
				{Action: pipeline.AdminAccept, PolicyRule: pipeline.PolicyRule{Peers: []pipeline.PolicyPeer{}}},
			}},
		problems: []string{ReasonFailedClosed, ReasonDomainNamesUnsupported, ReasonFailedClosed, ReasonFailedClosed},
	}, {
		name: "a subject on another node only: nothing here",
		spec: cnp.Spec{Tier: cnp.AdminTier, Subject: cnp.Subject{Namespaces: sel("team", "y")},
			Ingress: []cnp.IngressRule{{Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: sel()}}}}},
	}, {
		name: "a named port no subject pod has here is a problem",
		spec: cnp.Spec{Tier: cnp.AdminTier, Subject: cnp.Subject{Pods: &cnp.NamespacedPod{PodSelector: *sel("app", "db")}},
			Ingress: []cnp.IngressRule{{Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: sel()}}, Protocols: []cnp.Protocol{{DestinationNamedPort: "http"}}}}},
		want: &pipeline.AdminPolicyState{Tier: pipeline.AdminTierAdmin, Pods: []pipeline.PolicyPod{{OFPort: 4}},
			Ingress: []pipeline.AdminRule{{Action: pipeline.AdminDeny, PolicyRule: pipeline.PolicyRule{
				Peers: []pipeline.PolicyPeer{peer("10.128.0.3/32"), peer("10.128.0.4/32"), peer("10.128.2.5/32")},
				Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Name: "http"}, {Protocol: openflow.IPProtoUDP, Name: "http"}, {Protocol: openflow.IPProtoSCTP, Name: "http"}}}}}},
		problems: []string{ReasonNamedPortUnresolved},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := world(t)
			x.SetPolicy("p", &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: tt.spec})
			got := x.Resolve()
			if tt.want == nil {
				if len(got) != 0 {
					t.Fatalf("resolved %+v, want nothing on this node", got)
				}
				return
			}
			tt.want.Name = "p"
			if len(got) != 1 || !reflect.DeepEqual(got[0], *tt.want) {
				t.Fatalf("resolved\n%+v\nwant\n%+v", got, *tt.want)
			}
			var reasons []string
			for _, p := range x.Problems()["p"] {
				reasons = append(reasons, p.Reason)
			}
			if strings.Join(reasons, ",") != strings.Join(tt.problems, ",") {
				t.Errorf("problems %v, want reasons %v", x.Problems()["p"], tt.problems)
			}
		})
	}
}

// TestIncremental: a change re-resolves exactly the policies it can alter.
func TestIncremental(t *testing.T) {
	x := world(t)
	spec := cnp.Spec{Tier: cnp.AdminTier, Subject: cnp.Subject{Namespaces: sel("team", "x")},
		Ingress: []cnp.IngressRule{{Action: cnp.Deny, From: []cnp.IngressPeer{{Pods: &cnp.NamespacedPod{PodSelector: *sel("app", "api")}}}}}}
	x.SetPolicy("p", &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: spec})
	x.Resolve()
	ip := netip.MustParseAddr
	steps := []struct {
		name   string
		change func(c *Changes)
		marked bool
		peers  []pipeline.PolicyPeer
	}{
		{"an unrelated pod comes", func(c *Changes) {
			c.Pods["b/other"] = &policy.Pod{Namespace: "b", Name: "other", Labels: map[string]string{"app": "x"}, IPs: []netip.Addr{ip("10.128.2.6")}}
		}, false, []pipeline.PolicyPeer{peer("10.128.2.5/32")}},
		{"it becomes a peer", func(c *Changes) {
			c.Pods["b/other"] = &policy.Pod{Namespace: "b", Name: "other", Labels: map[string]string{"app": "api"}, IPs: []netip.Addr{ip("10.128.2.6")}}
		}, true, []pipeline.PolicyPeer{peer("10.128.2.5/32"), peer("10.128.2.6/32")}},
		{"the peer changes address", func(c *Changes) {
			c.Pods["b/other"] = &policy.Pod{Namespace: "b", Name: "other", Labels: map[string]string{"app": "api"}, IPs: []netip.Addr{ip("10.128.2.7")}}
		}, true, []pipeline.PolicyPeer{peer("10.128.2.5/32"), peer("10.128.2.7/32")}},
		{"a node changes: no nodes peer", func(c *Changes) { c.Nodes["n3"] = &Node{Addrs: []netip.Addr{ip("192.0.2.13")}} }, false,
			[]pipeline.PolicyPeer{peer("10.128.2.5/32"), peer("10.128.2.7/32")}},
		{"the subject's namespace stops matching", func(c *Changes) {
			c.Namespaces["a"] = policy.NamespaceChange{Labels: map[string]string{"team": "z"}}
		}, true, nil},
	}
	for _, s := range steps {
		c := NewChanges()
		s.change(&c)
		if got := x.Apply(c); got != s.marked {
			t.Errorf("%s: marked %v, want %v", s.name, got, s.marked)
		}
		got := x.Resolve()
		switch {
		case s.peers == nil && len(got) != 0:
			t.Errorf("%s: resolved %+v, want nothing", s.name, got)
		case s.peers != nil && (len(got) != 1 || !reflect.DeepEqual(got[0].Ingress[0].Peers, s.peers)):
			t.Errorf("%s: resolved %+v, want peers %v", s.name, got, s.peers)
		}
	}
}
