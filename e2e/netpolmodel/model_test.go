package netpolmodel

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The cases below are the examples of the NetworkPolicy documentation (kubernetes.io, "Network
// Policies", and the API reference), each expected verdict written down from the documentation's prose.

var (
	tcp, udp, sctp = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
)

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func policy(ns, name string, spec networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func port(proto corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: ptr.To(intstr.FromInt32(p))}
}

func named(proto *corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: proto, Port: ptr.To(intstr.FromString(name))}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

type world struct {
	*Cluster
	pods map[string]*Pod
}

// newWorld: namespaces with labels ("ns" → k=v,...), pods "ns/name" with labels, addresses from 10.1.0.1
// up, on node n1 unless set otherwise.
func newWorld(namespaces map[string]map[string]string, pods map[string]map[string]string) *world {
	w := &world{Cluster: &Cluster{}, pods: map[string]*Pod{}}
	for name, l := range namespaces {
		ll := map[string]string{"kubernetes.io/metadata.name": name}
		for k, v := range l {
			ll[k] = v
		}
		w.Namespaces = append(w.Namespaces, Namespace{Name: name, Labels: ll})
	}
	ip := netip.MustParseAddr("10.1.0.1")
	keys := make([]string, 0, len(pods))
	for k := range pods {
		keys = append(keys, k)
	}
	// Stable addresses: sorted keys.
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if keys[j] < keys[i] {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		p := &Pod{Namespace: ns, Name: name, Labels: pods[k], Node: "n1", IP: ip}
		ip = ip.Next()
		w.Pods = append(w.Pods, p)
		w.pods[k] = p
	}
	return w
}

func (w *world) ep(key string) Endpoint {
	if p, ok := w.pods[key]; ok {
		return PodEndpoint(p)
	}
	return AddressEndpoint(netip.MustParseAddr(key))
}

type check struct {
	from, to string
	port     int32
	proto    corev1.Protocol
	want     bool
}

func (w *world) expect(t *testing.T, checks []check) {
	t.Helper()
	for _, c := range checks {
		v, err := w.Allowed(w.ep(c.from), w.ep(c.to), c.port, c.proto)
		if err != nil {
			t.Errorf("%s → %s %s/%d: %v", c.from, c.to, c.proto, c.port, err)
			continue
		}
		if v.Allowed != c.want {
			t.Errorf("%s → %s %s/%d: %s, want allowed=%v", c.from, c.to, c.proto, c.port, v, c.want)
		}
	}
}

// The documentation's "test-network-policy": role=db pods in default accept TCP 6379 from role=frontend
// pods of default, from every pod of namespaces labelled project=myproject and from 172.17.0.0/16 but
// 172.17.1.0/24; they may send only to 10.0.0.0/24 on TCP 5978.
func TestDocumentationExample(t *testing.T) {
	w := newWorld(map[string]map[string]string{"default": nil, "myproject": {"project": "myproject"}, "other": nil},
		map[string]map[string]string{
			"default/db": {"role": "db"}, "default/frontend": {"role": "frontend"}, "default/backend": {"role": "backend"},
			"myproject/any": {"role": "whatever"}, "other/frontend": {"role": "frontend"},
		})
	w.Policies = []networkingv1.NetworkPolicy{policy("default", "test-network-policy", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("role", "db"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{block("172.17.0.0/16", "172.17.1.0/24"),
				{NamespaceSelector: sel("project", "myproject")}, {PodSelector: sel("role", "frontend")}},
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, 6379)},
		}},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{block("10.0.0.0/24")},
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, 5978)},
		}},
	})}
	w.expect(t, []check{
		{"default/frontend", "default/db", 6379, tcp, true},
		{"default/frontend", "default/db", 6380, tcp, false},
		{"default/frontend", "default/db", 6379, udp, false},
		{"default/backend", "default/db", 6379, tcp, false},
		{"other/frontend", "default/db", 6379, tcp, false}, // a podSelector alone means the policy's namespace
		{"myproject/any", "default/db", 6379, tcp, true},
		{"172.17.0.9", "default/db", 6379, tcp, true},
		{"172.17.1.9", "default/db", 6379, tcp, false},
		{"172.17.2.1", "default/db", 6379, tcp, true},
		{"172.18.0.1", "default/db", 6379, tcp, false},
		{"default/db", "10.0.0.7", 5978, tcp, true},
		{"default/db", "10.0.0.7", 5979, tcp, false},
		{"default/db", "10.0.1.7", 5978, tcp, false},
		{"default/db", "default/frontend", 5978, tcp, false}, // pods are not in 10.0.0.0/24
		{"default/frontend", "default/backend", 1, udp, true},
		{"default/backend", "myproject/any", 80, tcp, true},
	})
}

func TestDefaultPolicies(t *testing.T) {
	pods := map[string]map[string]string{"a/p": {"app": "p"}, "a/q": {"app": "q"}, "b/r": {"app": "r"}}
	nss := map[string]map[string]string{"a": nil, "b": nil}
	all := networkingv1.PolicyTypeIngress
	for _, tc := range []struct {
		name   string
		spec   networkingv1.NetworkPolicySpec
		checks []check
	}{
		{"default deny ingress", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{all}}, []check{
			{"a/q", "a/p", 80, tcp, false}, {"b/r", "a/p", 80, udp, false}, {"a/p", "b/r", 80, tcp, true}, {"a/p", "a/q", 80, tcp, false},
			{"b/r", "a/p", 0, ProtocolICMP, false}}},
		{"allow all ingress", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{}},
			PolicyTypes: []networkingv1.PolicyType{all}}, []check{
			{"a/q", "a/p", 80, tcp, true}, {"b/r", "a/p", 9999, sctp, true}, {"9.9.9.9", "a/p", 1, udp, true}, {"b/r", "a/p", 0, ProtocolICMP, true}}},
		{"default deny egress", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}, []check{
			{"a/p", "a/q", 80, tcp, false}, {"a/p", "b/r", 80, tcp, false}, {"a/p", "9.9.9.9", 53, udp, false},
			{"b/r", "a/p", 80, tcp, true}}},
		{"allow all egress", networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}, []check{
			{"a/p", "a/q", 80, tcp, true}, {"a/p", "9.9.9.9", 53, udp, true}}},
		{"default deny all", networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}, []check{
			{"a/p", "a/q", 80, tcp, false}, {"b/r", "a/q", 80, tcp, false}, {"a/q", "b/r", 80, tcp, false}, {"b/r", "b/r", 80, tcp, true}}},
		// Unset policyTypes: Ingress, and Egress only because egress rules exist.
		{"defaulted types with egress rules", networkingv1.NetworkPolicySpec{
			Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port(udp, 53)}}}}, []check{
			{"a/p", "b/r", 53, udp, true}, {"a/p", "b/r", 80, tcp, false}, {"b/r", "a/p", 53, udp, false}}},
		{"defaulted types without egress rules", networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel()}}}}}, []check{
			{"a/p", "b/r", 80, tcp, true}, {"a/q", "a/p", 80, tcp, true}, {"b/r", "a/p", 80, tcp, false}}},
		// Egress-only: ingress rules written in the spec do not isolate for ingress.
		{"policyTypes Egress ignores ingress rules", networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "nobody")}}}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel()}}}}}, []check{
			{"b/r", "a/p", 80, tcp, true}, {"a/p", "b/r", 80, tcp, true}, {"a/p", "9.9.9.9", 80, tcp, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(nss, pods)
			w.Policies = []networkingv1.NetworkPolicy{policy("a", "p", tc.spec)}
			w.expect(t, tc.checks)
		})
	}
}

// The documentation's "behaviour of to and from selectors": one peer with both selectors is an AND, two
// peers are an OR.
func TestSelectorsAndVersusOr(t *testing.T) {
	nss := map[string]map[string]string{"db": nil, "alice": {"user": "alice"}, "bob": {"user": "bob"}}
	pods := map[string]map[string]string{"db/x": {"role": "db"}, "db/c": {"role": "client"}, "db/o": {"role": "other"},
		"alice/c": {"role": "client"}, "alice/o": {"role": "other"}, "bob/c": {"role": "client"}}
	and := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("user", "alice"), PodSelector: sel("role", "client")}}
	or := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("user", "alice")}, {PodSelector: sel("role", "client")}}
	for _, tc := range []struct {
		name  string
		from  []networkingv1.NetworkPolicyPeer
		allow map[string]bool
	}{
		{"one peer: client pods in alice's namespaces", and, map[string]bool{"alice/c": true}},
		{"two peers: alice's namespaces, or client pods of the policy's namespace", or, map[string]bool{"alice/c": true, "alice/o": true, "db/c": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(nss, pods)
			w.Policies = []networkingv1.NetworkPolicy{policy("db", "p", networkingv1.NetworkPolicySpec{PodSelector: *sel("role", "db"),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: tc.from}}})}
			var checks []check
			for _, from := range []string{"db/c", "db/o", "alice/c", "alice/o", "bob/c"} {
				checks = append(checks, check{from, "db/x", 5432, tcp, tc.allow[from]})
			}
			w.expect(t, checks)
		})
	}
}

func TestNamespaceByNameAndExpressions(t *testing.T) {
	nss := map[string]map[string]string{"x": {"tier": "web"}, "y": {"tier": "db"}, "z": nil}
	pods := map[string]map[string]string{"x/a": {"pod": "a"}, "y/a": {"pod": "a"}, "y/b": {"pod": "b"}, "z/a": {"pod": "a"}}
	w := newWorld(nss, pods)
	w.Policies = []networkingv1.NetworkPolicy{
		policy("x", "by-name", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{NamespaceSelector: sel("kubernetes.io/metadata.name", "y"), PodSelector: &metav1.LabelSelector{
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "c"}}}}}}}}}),
		policy("z", "notin", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}}}}}}}}}),
	}
	w.expect(t, []check{
		{"y/b", "x/a", 80, tcp, true}, {"y/a", "x/a", 80, tcp, false}, {"z/a", "x/a", 80, tcp, false},
		// NotIn matches namespaces without the label (z itself) and with another value (x).
		{"z/a", "y/a", 80, tcp, false}, {"z/a", "z/a", 80, tcp, true},
	})
	// z/a → x/a: egress allows (x is tier=web) but x/a's ingress does not.
	v, err := w.Allowed(w.ep("z/a"), w.ep("x/a"), 80, tcp)
	if err != nil || v.Allowed || !strings.Contains(v.Egress, "egress rule 0 of z/notin") || !strings.Contains(v.Ingress, "isolated by by-name") {
		t.Errorf("z/a → x/a: %v %v", v, err)
	}
}

// Named ports: ingress resolves the name on the selected pod, with the rule's protocol; egress on each
// peer pod; an address that is no pod has no names.
func TestNamedPorts(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil, "y": nil},
		map[string]map[string]string{"x/a": {"app": "a"}, "x/b": {"app": "b"}, "y/c": {"app": "c"}, "y/d": {"app": "d"}})
	w.pods["x/a"].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: tcp}, {Name: "dns", ContainerPort: 53, Protocol: udp}}
	// protocol unset: TCP; and a "dns" that is TCP, which a UDP rule must not match
	w.pods["x/b"].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 9090}, {Name: "dns", ContainerPort: 53, Protocol: tcp}}
	w.pods["y/c"].Ports = []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: udp}}
	w.pods["y/d"].Ports = []corev1.ContainerPort{{Name: "dns", ContainerPort: 5353, Protocol: udp}, {Name: "web", ContainerPort: 53, Protocol: tcp}}
	w.Policies = []networkingv1.NetworkPolicy{
		policy("x", "http-in", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{named(nil, "http"), named(&udp, "dns")}}}}),
		policy("y", "dns-out", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "c"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named(&udp, "dns")}}}}),
	}
	w.expect(t, []check{
		{"y/d", "x/a", 8080, tcp, true}, {"y/d", "x/a", 9090, tcp, false}, {"y/d", "x/a", 8080, udp, false},
		{"y/d", "x/b", 9090, tcp, true}, {"y/d", "x/b", 8080, tcp, false},
		{"y/d", "x/a", 53, udp, true}, {"y/d", "x/b", 53, udp, false}, {"y/d", "x/b", 53, tcp, false}, // x/b's dns is TCP
		{"y/c", "y/d", 5353, udp, true}, {"y/c", "y/d", 53, udp, false}, {"y/c", "y/d", 53, tcp, false},
		{"y/c", "y/c", 53, udp, true}, // loopback
		{"y/c", "x/a", 53, udp, true}, {"y/c", "x/b", 53, udp, false},
		{"y/c", "8.8.8.8", 53, udp, false}, // no pod, no named port
	})
}

// endPort: a range of ports, both ends included (the documentation's 32000–32768 example).
func TestEndPort(t *testing.T) {
	w := newWorld(map[string]map[string]string{"default": nil}, map[string]map[string]string{"default/db": {"role": "db"}})
	rng := port(tcp, 32000)
	rng.EndPort = ptr.To[int32](32768)
	w.Policies = []networkingv1.NetworkPolicy{policy("default", "multi-port-egress", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("role", "db"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.0.0.0/24")},
			Ports: []networkingv1.NetworkPolicyPort{rng}}}})}
	w.expect(t, []check{
		{"default/db", "10.0.0.1", 32000, tcp, true}, {"default/db", "10.0.0.1", 32768, tcp, true}, {"default/db", "10.0.0.1", 32500, tcp, true},
		{"default/db", "10.0.0.1", 31999, tcp, false}, {"default/db", "10.0.0.1", 32769, tcp, false}, {"default/db", "10.0.0.1", 32000, udp, false},
	})
}

// Policies are additive; a protocol-only port allows every port of that protocol; ports never match ICMP.
func TestUnionAndProtocols(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil, "y": {"ns": "y"}, "z": {"ns": "z"}},
		map[string]map[string]string{"x/a": {"pod": "a"}, "y/a": {"pod": "a"}, "z/a": {"pod": "a"}})
	w.Policies = []networkingv1.NetworkPolicy{
		policy("x", "y-on-80", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}, Ports: []networkingv1.NetworkPolicyPort{port(tcp, 80)}}}}),
		policy("x", "z-on-81", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "z")}}, Ports: []networkingv1.NetworkPolicyPort{port(tcp, 81)}}}}),
		policy("x", "udp-any", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp}}}}}),
	}
	w.expect(t, []check{
		{"y/a", "x/a", 80, tcp, true}, {"y/a", "x/a", 81, tcp, false}, {"z/a", "x/a", 81, tcp, true}, {"z/a", "x/a", 80, tcp, false},
		{"y/a", "x/a", 12345, udp, true}, {"z/a", "x/a", 81, sctp, false}, {"y/a", "x/a", 0, ProtocolICMP, false},
	})
}

// ipBlock: except carves addresses out; another rule or policy may allow them again.
func TestIPBlockExcept(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil}, map[string]map[string]string{"x/a": {"pod": "a"}, "x/b": {"pod": "b"}, "x/c": {"pod": "c"}})
	b := w.pods["x/b"].IP.String()
	w.Policies = []networkingv1.NetworkPolicy{policy("x", "cidr", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/16", b+"/32")}}}})}
	w.expect(t, []check{{"x/a", "x/b", 80, tcp, false}, {"x/a", "x/c", 80, tcp, true}, {"x/a", "10.2.0.1", 80, tcp, false}})
	w.Policies = append(w.Policies, policy("x", "just-b", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block(b + "/32")}}}}))
	w.expect(t, []check{{"x/a", "x/b", 80, tcp, true}, {"x/a", "x/c", 80, tcp, true}})
}

// hostNetwork pods are their node; nodes reach their own pods; other nodes are addresses.
func TestHostNetworkAndNodes(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil}, map[string]map[string]string{"x/a": {"pod": "a"}, "x/host": {"pod": "host"}})
	w.pods["x/host"].HostNetwork = true
	w.pods["x/host"].IP = netip.MustParseAddr("192.0.2.11")
	w.pods["x/host"].Node = "n1"
	w.pods["x/a"].Node = "n1"
	w.Policies = []networkingv1.NetworkPolicy{
		policy("x", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}),
		policy("x", "from-all-pods", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel()}}, Ports: []networkingv1.NetworkPolicyPort{port(tcp, 80)}}}}),
		policy("x", "from-node-2", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{block("192.0.2.12/32")}, Ports: []networkingv1.NetworkPolicyPort{port(tcp, 81)}}}}),
	}
	n1, n2, n3 := NodeEndpoint("n1", netip.MustParseAddr("192.0.2.11")), NodeEndpoint("n2", netip.MustParseAddr("192.0.2.12")),
		NodeEndpoint("n3", netip.MustParseAddr("192.0.2.13"))
	for _, c := range []struct {
		src, dst Endpoint
		port     int32
		want     bool
	}{
		{w.ep("x/a"), w.ep("x/host"), 80, true}, // the hostNetwork pod is not isolated
		{w.ep("x/host"), w.ep("x/a"), 80, true}, // it is the local node
		{n1, w.ep("x/a"), 99, true},
		{n2, w.ep("x/a"), 80, false}, // a node is no pod: podSelector {} does not match it
		{n2, w.ep("x/a"), 81, true},
		{n3, w.ep("x/a"), 81, false},
	} {
		v, err := w.Allowed(c.src, c.dst, c.port, tcp)
		if err != nil || v.Allowed != c.want {
			t.Errorf("%s → %s tcp/%d: %v %v, want allowed=%v", c.src, c.dst, c.port, v, err, c.want)
		}
	}
	// The hostNetwork pod elsewhere (not on x/a's node) is matched by ipBlock only.
	w.pods["x/a"].Node = "n2"
	w.pods["x/host"].IP = netip.MustParseAddr("192.0.2.12")
	w.expect(t, []check{{"x/host", "x/a", 80, tcp, false}, {"x/host", "x/a", 81, tcp, true}})
}

func TestServiceVerdicts(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil, "y": {"ns": "y"}},
		map[string]map[string]string{"x/a": {"pod": "a"}, "x/b": {"pod": "b"}, "y/c": {"pod": "c"}})
	w.pods["x/a"].Ports = []corev1.ContainerPort{{Name: "web", ContainerPort: 80}}
	w.pods["x/b"].Ports = []corev1.ContainerPort{{Name: "web", ContainerPort: 81}}
	w.Policies = []networkingv1.NetworkPolicy{
		policy("x", "a-from-y", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "a"), Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("ns", "y")}}}}}),
		policy("x", "b-on-80", networkingv1.NetworkPolicySpec{PodSelector: *sel("pod", "b"), Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, 80)}}}}),
	}
	svc := Service{Ports: []corev1.ServicePort{{Port: 8000, TargetPort: intstr.FromString("web")}, {Port: 9000, Protocol: tcp, TargetPort: intstr.FromInt32(80)}},
		Endpoints: []*Pod{w.pods["x/a"], w.pods["x/b"]}}
	for _, c := range []struct {
		from string
		port int32
		want map[string]bool
	}{
		{"y/c", 8000, map[string]bool{"x/a": true, "x/b": false}}, // x/b's "web" is 81, only 80 is open
		{"y/c", 9000, map[string]bool{"x/a": true, "x/b": true}},
		{"x/b", 9000, map[string]bool{"x/a": false, "x/b": true}},
	} {
		got, err := w.ServiceVerdicts(w.ep(c.from), svc, c.port, tcp)
		if err != nil {
			t.Fatal(err)
		}
		for ep, want := range c.want {
			if got[ep].Allowed != want {
				t.Errorf("%s → service:%d endpoint %s: %v, want allowed=%v", c.from, c.port, ep, got[ep], want)
			}
		}
	}
	if _, err := w.ServiceVerdicts(w.ep("y/c"), svc, 8000, udp); err == nil {
		t.Error("a port the service does not have must be an error")
	}
}

func TestMalformedInputIsAnError(t *testing.T) {
	w := newWorld(map[string]map[string]string{"x": nil}, map[string]map[string]string{"x/a": {"pod": "a"}, "x/b": {"pod": "b"}})
	for name, spec := range map[string]networkingv1.NetworkPolicySpec{
		"In without values": {PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpIn}}}},
		"bad cidr":          {Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{block("10.0.0.0/33")}}}},
		"empty peer":        {Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}},
		"unknown operator": {Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Near", Values: []string{"a"}}}}}}}}},
	} {
		w.Policies = []networkingv1.NetworkPolicy{policy("x", "bad", spec)}
		if v, err := w.Allowed(w.ep("x/b"), w.ep("x/a"), 80, tcp); err == nil {
			t.Errorf("%s: no error (%v)", name, v)
		}
	}
}

// The model's own selector evaluation agrees with apimachinery's on random selectors and label sets.
func TestSelectorsAgreeWithAPIMachinery(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	keys, values := []string{"a", "b", "c"}, []string{"1", "2", "3"}
	ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
	randLabels := func() map[string]string {
		m := map[string]string{}
		for _, k := range keys {
			if r.IntN(2) == 0 {
				m[k] = values[r.IntN(len(values))]
			}
		}
		return m
	}
	for i := 0; i < 5000; i++ {
		s := &metav1.LabelSelector{}
		if r.IntN(2) == 0 {
			s.MatchLabels = randLabels()
		}
		for n := r.IntN(3); n > 0; n-- {
			req := metav1.LabelSelectorRequirement{Key: keys[r.IntN(len(keys))], Operator: ops[r.IntN(len(ops))]}
			if req.Operator == metav1.LabelSelectorOpIn || req.Operator == metav1.LabelSelectorOpNotIn {
				for m := 1 + r.IntN(2); m > 0; m-- {
					req.Values = append(req.Values, values[r.IntN(len(values))])
				}
			}
			s.MatchExpressions = append(s.MatchExpressions, req)
		}
		l := randLabels()
		ref, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		got, err := matches(s, l)
		if err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		if want := ref.Matches(labels.Set(l)); got != want {
			t.Fatalf("selector %v on %v: model %v, apimachinery %v", s, l, got, want)
		}
	}
}
