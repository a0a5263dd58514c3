package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	pt "github.com/ofsdn/ofsdn/agent/policy/policytest"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The test cluster of the resolution tests: this node n1 (192.0.2.11, 10.128.0.0/23) and n2
// (192.0.2.12, 10.128.2.0/23); namespaces x (team=a), y (team=b) and z (no labels).
var (
	testNodeAddrs = map[string][]netip.Addr{
		"n1": {netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("10.128.0.1")},
		"n2": {netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("10.128.2.1")},
	}
	testClusterNets = []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}
)

// tpod is a pod of the test cluster: node "n1" attaches it at ofport (0: not attached here).
type tpod struct {
	ns, name, node, ip string
	labels             map[string]string
	ofport             uint32
	localIP            string // the attachment's address when it differs from the status (none yet)
	hostNetwork        bool
	phase              corev1.PodPhase
	ports              []corev1.ContainerPort
}

func (p tpod) api() *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: p.labels},
		Spec:   corev1.PodSpec{NodeName: p.node, HostNetwork: p.hostNetwork, Containers: []corev1.Container{{Name: "c", Ports: p.ports}}},
		Status: corev1.PodStatus{Phase: p.phase, PodIP: p.ip}}
	if pod.Status.Phase == "" {
		pod.Status.Phase = corev1.PodRunning
	}
	if p.ip != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: p.ip}}
	}
	return pod
}

func (p tpod) attachment() (Attachment, bool) {
	if p.ofport == 0 {
		return Attachment{}, false
	}
	ip := p.localIP
	if ip == "" {
		ip = p.ip
	}
	return Attachment{IP: netip.MustParseAddr(ip), OFPort: p.ofport}, true
}

var testPods = []tpod{
	{ns: "x", name: "a", node: "n1", ip: "10.128.0.10", labels: pt.Labels("app", "a"), ofport: 10,
		ports: []corev1.ContainerPort{pt.Named("http", corev1.ProtocolTCP, 8080), pt.Named("dns", corev1.ProtocolUDP, 53), {ContainerPort: 22}}},
	{ns: "x", name: "b", node: "n1", ip: "10.128.0.11", labels: pt.Labels("app", "b"), ofport: 11, ports: []corev1.ContainerPort{pt.Named("http", corev1.ProtocolTCP, 9090)}},
	{ns: "x", name: "c", node: "n2", ip: "10.128.2.12", labels: pt.Labels("app", "c"), ports: []corev1.ContainerPort{pt.Named("http", "", 8081)}},
	{ns: "y", name: "a", node: "n2", ip: "10.128.2.20", labels: pt.Labels("app", "a")},
	{ns: "y", name: "b", node: "n1", ip: "10.128.0.12", labels: pt.Labels("app", "b"), ofport: 12},
	{ns: "z", name: "a", node: "n2", ip: "10.128.2.30", labels: pt.Labels("app", "a"), ports: []corev1.ContainerPort{pt.Named("http", corev1.ProtocolTCP, 8082)}},
	{ns: "x", name: "done", node: "n1", ip: "10.128.0.13", labels: pt.Labels("app", "a"), ofport: 13, phase: corev1.PodSucceeded},
	{ns: "x", name: "host", node: "n2", ip: "192.0.2.12", labels: pt.Labels("app", "host"), hostNetwork: true},
	{ns: "x", name: "noip", node: "n2", labels: pt.Labels("app", "a")},
	{ns: "x", name: "fresh", node: "n1", labels: pt.Labels("app", "fresh"), ofport: 14, localIP: "10.128.0.14"},
	{ns: "x", name: "remote-a", node: "n2", ip: "10.128.2.40", labels: pt.Labels("app", "a")}, // app=a but not attached here
}

var testNamespaces = map[string]map[string]string{
	"x": {"kubernetes.io/metadata.name": "x", "team": "a"},
	"y": {"kubernetes.io/metadata.name": "y", "team": "b"},
	"z": {"kubernetes.io/metadata.name": "z"},
}

// newTestIndex builds an index of the test cluster and the given policies.
func newTestIndex(pods []tpod, policies ...*networkingv1.NetworkPolicy) *Index {
	x := NewIndex("n1")
	for ns, l := range testNamespaces {
		x.SetNamespace(ns, l, false)
	}
	local := map[string]Attachment{}
	for _, p := range pods {
		x.SetPod(k8sobj.PodKey(p.ns, p.name), PodOf(k8sobj.PodOf(p.api())))
		if att, ok := p.attachment(); ok {
			local[k8sobj.PodKey(p.ns, p.name)] = att
		}
	}
	for _, np := range policies {
		x.SetPolicy(np.Namespace+"/"+np.Name, np)
	}
	x.SetLocal(local)
	x.SetNodes(testNodeAddrs, testClusterNets)
	return x
}

func host(ip string, named ...pipeline.NamedPort) pipeline.PolicyPeer {
	return pipeline.PolicyPeer{Net: netip.PrefixFrom(netip.MustParseAddr(ip), 32), NamedPorts: named}
}

func npt(name string, proto uint8, port uint16) pipeline.NamedPort {
	return pipeline.NamedPort{Name: name, Protocol: proto, Port: port}
}

var (
	httpA = npt("http", IPProtoTCP, 8080)
	httpB = npt("http", IPProtoTCP, 9090)
	tcp80 = pipeline.PolicyPort{Protocol: IPProtoTCP, Port: 80}
)

// TestResolvePolicies: each case's expected states are written from the API's documented semantics.
func TestResolvePolicies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   *networkingv1.NetworkPolicy
		want     []pipeline.PolicyState // nil: the policy selects no local pod
		problems []string               // substrings, one per expected problem
	}{{
		name:   "deny all ingress: policyTypes default to Ingress; terminal, remote and unattached pods are not selected",
		policy: pt.Policy("x", "deny", pt.Labels("app", "a"), nil),
		want:   []pipeline.PolicyState{{Namespace: "x", Name: "deny", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 10}}}},
	}, {
		name: "egress rules make Egress default; an empty podSelector selects the namespace's local pods",
		policy: pt.Policy("x", "both", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "both", Ingress: true, Egress: true,
			Pods: []pipeline.PolicyPod{{OFPort: 10}, {OFPort: 11}, {OFPort: 14}}, EgressRules: []pipeline.PolicyRule{{AllPeers: true}}}},
	}, {
		name: "policyTypes Egress alone ignores ingress rules",
		policy: pt.Policy("x", "eg", pt.Labels("app", "b"), func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "eg", Egress: true, Pods: []pipeline.PolicyPod{{OFPort: 11}}}},
	}, {
		name: "podSelector peer: the policy's namespace only; a pod without address is no peer; a local pod attached before its status counts",
		policy: pt.Policy("x", "p", pt.Labels("app", "b"), func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "c", "fresh"}}}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{pt.TCPPort(80)},
			}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "p", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 11}},
			IngressRules: []pipeline.PolicyRule{{Peers: []pipeline.PolicyPeer{host("10.128.0.10"), host("10.128.0.14"), host("10.128.2.12"), host("10.128.2.40")},
				Ports: []pipeline.PolicyPort{tcp80}}}}},
	}, {
		name: "namespaceSelector alone: every pod of the matching namespaces; a hostNetwork pod is its node's addresses",
		policy: pt.Policy("y", "ns", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{pt.NsPeer(pt.Labels("team", "a"))}}}
		}),
		want: []pipeline.PolicyState{{Namespace: "y", Name: "ns", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 12}},
			IngressRules: []pipeline.PolicyRule{{Peers: []pipeline.PolicyPeer{
				host("10.128.0.10"), host("10.128.0.11"), host("10.128.0.14"), host("10.128.2.1"), host("10.128.2.12"), host("10.128.2.40"), host("192.0.2.12")}}}}},
		// x/a, x/b, x/fresh, x/c, x/remote-a; x/host as n2's addresses (its InternalIP and tun0 gateway);
		// x/done (terminal) and x/noip (no address) are no peers.
	}, {
		name: "pod and namespace selector in one peer: matching pods in matching namespaces; two peers: the union",
		policy: pt.Policy("y", "and-or", pt.Labels("app", "b"), func(s *networkingv1.NetworkPolicySpec) {
			both := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: pt.Labels("app", "a")},
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "team", Operator: metav1.LabelSelectorOpDoesNotExist}}}}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{both}},
				{From: []networkingv1.NetworkPolicyPeer{pt.PodPeer(pt.Labels("app", "a")), pt.NsPeer(pt.Labels("kubernetes.io/metadata.name", "z"))}},
			}
		}),
		want: []pipeline.PolicyState{{Namespace: "y", Name: "and-or", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 12}},
			IngressRules: []pipeline.PolicyRule{
				{Peers: []pipeline.PolicyPeer{host("10.128.2.30")}},                         // z/a only
				{Peers: []pipeline.PolicyPeer{host("10.128.2.20"), host("10.128.2.30")}}}}}, // y/a, and all of z
	}, {
		name: "ipBlock with except; an IPv6 block allows nothing here; ports default to TCP, endPort ranges, every port of UDP",
		policy: pt.Policy("x", "block", pt.Labels("app", "a"), func(s *networkingv1.NetworkPolicySpec) {
			udp := corev1.ProtocolUDP
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{pt.BlockPeer("198.51.100.0/24", "198.51.100.128/25"), pt.BlockPeer("2001:db8::/64")},
				Ports: []networkingv1.NetworkPolicyPort{pt.TCPPort(80), {Port: ptr.To(intstr.FromInt32(9000)), EndPort: ptr.To[int32](9100)},
					{Protocol: &udp}},
			}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "block", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 10}},
			IngressRules: []pipeline.PolicyRule{{
				Peers: []pipeline.PolicyPeer{{Net: netip.MustParsePrefix("198.51.100.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("198.51.100.128/25")}}},
				Ports: []pipeline.PolicyPort{tcp80, {Protocol: IPProtoTCP, Port: 9000, EndPort: 9100}, {Protocol: IPProtoUDP}}}}}},
	}, {
		name: "present but empty ingress list: isolation without allows; empty from: everyone",
		policy: pt.Policy("x", "empty", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{}
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{pt.TCPPort(80)}}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "empty", Ingress: true, Egress: true,
			Pods:        []pipeline.PolicyPod{{OFPort: 10}, {OFPort: 11}, {OFPort: 14}},
			EgressRules: []pipeline.PolicyRule{{AllPeers: true, Ports: []pipeline.PolicyPort{tcp80}}}}},
	}, {
		name: "named port, ingress: the selected pods carry the names they have that the rules use",
		policy: pt.Policy("x", "named-in", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolTCP, "http")}}}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "named-in", Ingress: true,
			Pods:         []pipeline.PolicyPod{{OFPort: 10, NamedPorts: []pipeline.NamedPort{httpA}}, {OFPort: 11, NamedPorts: []pipeline.NamedPort{httpB}}, {OFPort: 14}},
			IngressRules: []pipeline.PolicyRule{{AllPeers: true, Ports: []pipeline.PolicyPort{{Protocol: IPProtoTCP, Name: "http"}}}}}},
	}, {
		name: "named port, egress to every peer: the cluster's pods with that port are the peers it resolves against",
		policy: pt.Policy("y", "named-out", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolTCP, "http"), pt.TCPPort(80)}}}
		}),
		want: []pipeline.PolicyState{{Namespace: "y", Name: "named-out", Ingress: true, Egress: true, Pods: []pipeline.PolicyPod{{OFPort: 12}},
			EgressRules: []pipeline.PolicyRule{{AllPeers: true,
				Peers: []pipeline.PolicyPeer{host("10.128.0.10", httpA), host("10.128.0.11", httpB),
					host("10.128.2.12", npt("http", IPProtoTCP, 8081)), host("10.128.2.30", npt("http", IPProtoTCP, 8082))},
				Ports: []pipeline.PolicyPort{{Protocol: IPProtoTCP, Name: "http"}, tcp80}}}}},
	}, {
		name: "named port, egress to an ipBlock: the pods inside it that have the port; selector peers carry theirs",
		policy: pt.Policy("y", "named-block", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{pt.BlockPeer("10.128.0.0/23", "10.128.0.11/32"), pt.NsPeer(pt.Labels("kubernetes.io/metadata.name", "z"))},
				Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolTCP, "http")}}}
		}),
		want: []pipeline.PolicyState{{Namespace: "y", Name: "named-block", Ingress: true, Egress: true, Pods: []pipeline.PolicyPod{{OFPort: 12}},
			EgressRules: []pipeline.PolicyRule{{
				Peers: []pipeline.PolicyPeer{{Net: netip.MustParsePrefix("10.128.0.0/23"), Except: []netip.Prefix{netip.MustParsePrefix("10.128.0.11/32")}},
					host("10.128.0.10", httpA), host("10.128.2.30", npt("http", IPProtoTCP, 8082))},
				Ports: []pipeline.PolicyPort{{Protocol: IPProtoTCP, Name: "http"}}}}}},
	}, {
		name: "bad input narrows: an unparsable peer selector matches nothing, a named port nobody has allows nothing, an ipBlock covering the cluster network is told",
		policy: pt.Policy("x", "bad", pt.Labels("app", "a"), func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: "Near", Values: []string{"a"}}}}}}},
				{Ports: []networkingv1.NetworkPolicyPort{pt.NamedPort(corev1.ProtocolSCTP, "nope")}},
				{From: []networkingv1.NetworkPolicyPeer{pt.BlockPeer("0.0.0.0/0")}},
				{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(70000))}}},
			}
		}),
		want: []pipeline.PolicyState{{Namespace: "x", Name: "bad", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 10}},
			IngressRules: []pipeline.PolicyRule{
				{Peers: []pipeline.PolicyPeer{}},
				{AllPeers: true, Ports: []pipeline.PolicyPort{{Protocol: IPProtoSCTP, Name: "nope"}}},
				{Peers: []pipeline.PolicyPeer{{Net: netip.MustParsePrefix("0.0.0.0/0")}}},
				{Peers: []pipeline.PolicyPeer{}}}}},
		problems: []string{
			`spec.ingress[0].from[0].podSelector cannot be parsed`,
			`spec.ingress[1]: no selected pod on node n1 has a container port named "nope" (SCTP)`,
			`spec.ingress[2].from[0].ipBlock 0.0.0.0/0 covers the whole cluster network 10.128.0.0/14`,
			`spec.ingress[3].ports[0]: port 70000 is out of range`,
		},
	}, {
		name: "an unparsable podSelector selects nothing, and says so",
		policy: pt.Policy("x", "badsel", nil, func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}}
		}),
		problems: []string{"spec.podSelector cannot be parsed"},
	}, {
		name:   "a policy of a namespace without local pods renders nothing here",
		policy: pt.Policy("z", "far", nil, nil),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			x := newTestIndex(testPods, tc.policy)
			got := x.Resolve()
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("states:\n got %+v\nwant %+v", got, tc.want)
			}
			var msgs []string
			for _, p := range x.Problems()[tc.policy.Namespace+"/"+tc.policy.Name] {
				msgs = append(msgs, p.Message)
			}
			if len(msgs) != len(tc.problems) {
				t.Fatalf("problems %q, want %d: %q", msgs, len(tc.problems), tc.problems)
			}
			for i, want := range tc.problems {
				if !strings.Contains(msgs[i], want) {
					t.Errorf("problem %d: %q, want it to say %q", i, msgs[i], want)
				}
			}
		})
	}
}

// world is the cluster a randomized test changes step by step.
type world struct {
	pods       map[string]tpod
	namespaces map[string]map[string]string
	policies   map[string]*networkingv1.NetworkPolicy
	nodeAddrs  map[string][]netip.Addr
}

func (w *world) local() map[string]Attachment {
	out := map[string]Attachment{}
	for k, p := range w.pods {
		if att, ok := p.attachment(); ok {
			out[k] = att
		}
	}
	return out
}

// fromScratch resolves the world with a new index.
func (w *world) fromScratch() ([]pipeline.PolicyState, map[string][]Problem) {
	x := NewIndex("n1")
	for ns, l := range w.namespaces {
		x.SetNamespace(ns, l, false)
	}
	for k, p := range w.pods {
		x.SetPod(k, PodOf(k8sobj.PodOf(p.api())))
	}
	for k, np := range w.policies {
		x.SetPolicy(k, np)
	}
	x.SetLocal(w.local())
	x.SetNodes(w.nodeAddrs, testClusterNets)
	return x.Resolve(), x.Problems()
}

// randomPolicy builds a policy from the shapes the API allows.
func randomPolicy(r *rand.Rand, ns, name string) *networkingv1.NetworkPolicy {
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	sel := func() *metav1.LabelSelector {
		switch r.IntN(4) {
		case 0:
			return &metav1.LabelSelector{}
		case 1:
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{pick("a", "b", "c")}}}}
		}
		return &metav1.LabelSelector{MatchLabels: pt.Labels(pick("app", "role"), pick("a", "b", "c", "r1", "r2"))}
	}
	peers := func() []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for range r.IntN(3) {
			switch r.IntN(4) {
			case 0:
				out = append(out, networkingv1.NetworkPolicyPeer{PodSelector: sel()})
			case 1:
				out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: pt.Labels("team", pick("a", "b"))}})
			case 2:
				out = append(out, networkingv1.NetworkPolicyPeer{PodSelector: sel(), NamespaceSelector: &metav1.LabelSelector{MatchLabels: pt.Labels("team", pick("a", "b"))}})
			default:
				out = append(out, pt.BlockPeer(pick("10.128.0.0/23", "10.128.2.0/24", "0.0.0.0/0"), pick("10.128.0.16/28", "10.128.2.0/30")))
			}
		}
		return out
	}
	ports := func() []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range r.IntN(3) {
			if r.IntN(2) == 0 {
				out = append(out, pt.NamedPort(corev1.ProtocolTCP, pick("http", "metrics")))
			} else {
				out = append(out, pt.TCPPort(80+r.IntN(3)))
			}
		}
		return out
	}
	return pt.Policy(ns, name, sel().MatchLabels, func(s *networkingv1.NetworkPolicySpec) {
		for range r.IntN(3) {
			s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers(), Ports: ports()})
		}
		for range r.IntN(3) {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{To: peers(), Ports: ports()})
		}
	})
}

// TestIncrementalResolutionMatchesFromScratch: after every change of a random sequence — pods created,
// relabelled, given ports, moved to a terminal phase, attached and detached; namespaces relabelled;
// policies created, changed and deleted; a node's addresses changed — the incremental index resolves
// exactly what a new index resolves from the same cluster. So its marking of affected policies misses
// nothing; TestResolvePolicies says the from-scratch resolution is right.
func TestIncrementalResolutionMatchesFromScratch(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	w := &world{pods: map[string]tpod{}, namespaces: map[string]map[string]string{}, policies: map[string]*networkingv1.NetworkPolicy{},
		nodeAddrs: map[string][]netip.Addr{"n1": testNodeAddrs["n1"], "n2": testNodeAddrs["n2"]}}
	x := NewIndex("n1")
	namespaces := []string{"x", "y", "z"}
	pick := func(s ...string) string { return s[r.IntN(len(s))] }
	computed, byRule := 0, 0 // policies resolved whole, and by their changed rules only
	for step := range 3000 {
		var what string
		switch op := r.IntN(10); {
		case op < 4: // a pod comes, changes or goes
			ns := namespaces[r.IntN(3)]
			n := r.IntN(12)
			name := fmt.Sprint("p", n)
			key := k8sobj.PodKey(ns, name)
			if _, ok := w.pods[key]; ok && r.IntN(5) == 0 {
				delete(w.pods, key)
				x.SetPod(key, nil)
				what = "delete pod " + key
				break
			}
			i := int(ns[0]-'x')*16 + n // unique per pod, as addresses and ports are
			p := tpod{ns: ns, name: name, node: pick("n1", "n2"), ip: fmt.Sprintf("10.128.%d.%d", 2*r.IntN(2), 16+i),
				labels: pt.Labels("app", pick("a", "b", "c"), "role", pick("r1", "r2"))}
			if p.node == "n1" && r.IntN(4) > 0 {
				p.ofport = uint32(100 + i)
			}
			switch r.IntN(8) {
			case 0:
				p.phase = corev1.PodFailed
			case 1:
				p.ip = ""
				if p.ofport != 0 {
					p.localIP = fmt.Sprintf("10.128.0.%d", 16+i)
				}
			case 2:
				p.hostNetwork, p.ofport = true, 0
				p.ip = w.nodeAddrs[p.node][0].String()
			}
			if r.IntN(2) == 0 {
				p.ports = []corev1.ContainerPort{pt.Named(pick("http", "metrics"), corev1.ProtocolTCP, int32(8000+r.IntN(3)))}
			}
			w.pods[key] = p
			x.SetPod(key, PodOf(k8sobj.PodOf(p.api())))
			what = fmt.Sprintf("set pod %+v", p)
		case op < 6: // a policy comes, changes or goes
			ns := namespaces[r.IntN(3)]
			key := ns + "/" + fmt.Sprint("np", r.IntN(6))
			if _, ok := w.policies[key]; ok && r.IntN(4) == 0 {
				delete(w.policies, key)
				x.SetPolicy(key, nil)
				what = "delete policy " + key
				break
			}
			np := randomPolicy(r, ns, strings.TrimPrefix(key, ns+"/"))
			w.policies[key] = np
			x.SetPolicy(key, np)
			what = "set policy " + key
		case op < 8: // a namespace is relabelled, created or deleted
			ns := namespaces[r.IntN(3)]
			if r.IntN(6) == 0 {
				delete(w.namespaces, ns)
				x.SetNamespace(ns, nil, true)
				what = "delete namespace " + ns
				break
			}
			l := pt.Labels("kubernetes.io/metadata.name", ns, "team", pick("a", "b", "c"))
			w.namespaces[ns] = l
			x.SetNamespace(ns, l, false)
			what = fmt.Sprintf("namespace %s labels %v", ns, l)
		case op < 9: // a pod is attached or detached here without any API change (CNI)
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range w.pods {
					if !yield(k) {
						return
					}
				}
			})
			if len(keys) == 0 {
				continue
			}
			p := w.pods[keys[r.IntN(len(keys))]]
			if p.ofport != 0 {
				p.ofport = 0
			} else if p.node == "n1" && !p.hostNetwork {
				p.ofport = uint32(200 + int(p.ns[0]-'x')*16 + int(p.name[1]-'0'))
				if p.ip == "" {
					p.localIP = "10.128.0.250"
				}
			}
			w.pods[k8sobj.PodKey(p.ns, p.name)] = p
			what = fmt.Sprintf("attachment of %s: ofport %d", k8sobj.PodKey(p.ns, p.name), p.ofport)
		default: // n2's address changes (its hostNetwork pods are its addresses)
			w.nodeAddrs = map[string][]netip.Addr{"n1": w.nodeAddrs["n1"],
				"n2": {netip.AddrFrom4([4]byte{192, 0, 2, byte(12 + r.IntN(3))}), netip.MustParseAddr("10.128.2.1")}}
			what = fmt.Sprintf("n2 addresses %v", w.nodeAddrs["n2"])
		}
		before := 0
		for _, e := range x.policies {
			if e.dirty {
				before++
			} else if e.anyRule {
				byRule++
			}
		}
		computed += before
		x.SetLocal(w.local())
		x.SetNodes(w.nodeAddrs, testClusterNets)
		got, gotProblems := x.Resolve(), x.Problems()
		want, wantProblems := w.fromScratch()
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotProblems, wantProblems) {
			t.Fatalf("step %d (%s): incremental\n%+v\n%v\nfrom scratch\n%+v\n%v", step, what, got, gotProblems, want, wantProblems)
		}
	}
	// Not everything was resolved again on every step: the marking is selective.
	if n := 3000 * len(w.policies); computed > n/3 {
		t.Errorf("%d policy resolutions over 3000 steps with about %d policies: marking is not selective", computed, len(w.policies))
	}
	if byRule == 0 {
		t.Error("no step resolved a policy's changed rules alone: that path went unchecked")
	}
	t.Logf("%d policy resolutions and %d of changed rules alone over 3000 steps (%d policies at the end)", computed, byRule, len(w.policies))
}

// TestPodChangeMarksOnlyPoliciesItAlters: a label no selector's verdict depends on marks nothing, even
// where selectors match the pod; a label that moves the pod out of one peer marks that policy alone; an
// address change marks every policy that counts the pod as a peer.
func TestPodChangeMarksOnlyPoliciesItAlters(t *testing.T) {
	from := func(peers ...networkingv1.NetworkPolicyPeer) func(s *networkingv1.NetworkPolicySpec) {
		return func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: peers}}
		}
	}
	x := newTestIndex(testPods,
		pt.Policy("x", "from-c", pt.Labels("app", "a"), from(pt.PodPeer(pt.Labels("app", "c")))),
		pt.Policy("x", "from-db", pt.Labels("app", "b"), from(pt.PodPeer(pt.Labels("role", "db")))),
		pt.Policy("y", "from-team-a", nil, from(pt.NsPeer(pt.Labels("team", "a")))))
	x.Resolve()
	dirty := func() []string {
		var out []string
		for k, e := range x.policies {
			if e.dirty || e.anyRule {
				out = append(out, k)
			}
		}
		slices.Sort(out)
		x.Resolve()
		return out
	}
	c := testPods[2] // x/c on n2, app=c: a peer of x/from-c and y/from-team-a
	for _, step := range []struct {
		what string
		pod  tpod
		want []string
	}{
		{"a label nobody selects on", tpod{ns: c.ns, name: c.name, node: c.node, ip: c.ip, labels: pt.Labels("app", "c", "version", "2"), ports: c.ports}, nil},
		{"out of one peer", tpod{ns: c.ns, name: c.name, node: c.node, ip: c.ip, labels: pt.Labels("app", "z"), ports: c.ports}, []string{"x/from-c"}},
		{"into another", tpod{ns: c.ns, name: c.name, node: c.node, ip: c.ip, labels: pt.Labels("app", "z", "role", "db"), ports: c.ports}, []string{"x/from-db"}},
		{"a new address", tpod{ns: c.ns, name: c.name, node: c.node, ip: "10.128.2.99", labels: pt.Labels("app", "z", "role", "db"), ports: c.ports}, []string{"x/from-db", "y/from-team-a"}},
	} {
		x.SetPod(k8sobj.PodKey(c.ns, c.name), PodOf(k8sobj.PodOf(step.pod.api())))
		if got := dirty(); !slices.Equal(got, step.want) {
			t.Errorf("%s: marked %v, want %v", step.what, got, step.want)
		}
	}
}
