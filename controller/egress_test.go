package controller

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/internal/egressplan"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
)

func readyNode(name, ip string, ready bool) *corev1.Node {
	n := node(name, internal(ip))
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
	return n
}

func egressSubnet(name, hostIP, subnet string, cidrs []string, ips ...string) *networkv1.HostSubnet {
	hs := hostSubnet(name, hostIP, subnet)
	for _, c := range cidrs {
		hs.EgressCIDRs = append(hs.EgressCIDRs, networkv1.CIDR(c))
	}
	for _, a := range ips {
		hs.EgressIPs = append(hs.EgressIPs, networkv1.EgressIP(a))
	}
	return hs
}

func egressNetNamespace(name string, id uint32, ips ...string) *networkv1.NetNamespace {
	nn := netNamespace(name, id, "")
	for _, a := range ips {
		nn.EgressIPs = append(nn.EgressIPs, networkv1.EgressIP(a))
	}
	return nn
}

// first is the node the ranking puts first for ip among nodes.
func first(ip string, nodes ...string) string {
	return egressplan.Rank(netip.MustParseAddr(ip), nodes)[0]
}

func egressCondition(nn *networkv1.NetNamespace, typ string) string {
	c := meta.FindStatusCondition(nn.Status.Conditions, typ)
	if c == nil {
		return "absent"
	}
	return string(c.Status) + "/" + c.Reason
}

func placements(nn *networkv1.NetNamespace) string {
	var out []string
	for _, e := range nn.Status.EgressIPs {
		out = append(out, string(e.IP)+"@"+e.AssignedNode+"/"+e.Node)
	}
	return strings.Join(out, ",")
}

// TestSyncEgressIPs: the controller's view of egress IPs — validity, the API-level placement that
// follows the agents' holder, and an Event per new problem — for each kind of input, good and bad.
func TestSyncEgressIPs(t *testing.T) {
	const auto = "198.51.100.32/27"
	base := func() []runtime.Object {
		return []runtime.Object{
			readyNode("n1", "198.51.100.11", true), readyNode("n2", "198.51.100.12", true), readyNode("n3", "198.51.100.13", true),
			egressSubnet("n1", "198.51.100.11", "10.128.0.0/23", []string{auto}),
			egressSubnet("n2", "198.51.100.12", "10.128.2.0/23", []string{auto}, "198.51.100.70"),
			egressSubnet("n3", "198.51.100.13", "10.128.4.0/23", nil, "198.51.100.70"),
			namespace("plain"), netNamespace("plain", 12, ""),
		}
	}
	withHolder := func(nn *networkv1.NetNamespace, holder string) *networkv1.NetNamespace {
		for _, a := range nn.EgressIPs {
			nn.Status.EgressIPs = append(nn.Status.EgressIPs, networkv1.EgressIPStatus{IP: a, Node: holder})
		}
		return nn
	}
	tests := []struct {
		name    string
		objects []runtime.Object
		// want per namespace: conditions Valid, Assigned and the placements ip@assigned/holder
		want   map[string][3]string
		events []string // reasons
	}{
		{name: "automatic placement: the ranking's first eligible node",
			objects: []runtime.Object{egressNetNamespace("a", 10, "198.51.100.40")},
			want: map[string][3]string{"a": {"True/Valid", "True/Assigned", "198.51.100.40@" + first("198.51.100.40", "n1", "n2") + "/"},
				"plain": {"absent", "absent", ""}},
			events: []string{"EgressIPAssigned"}},
		{name: "manual placement on two HostSubnets",
			objects: []runtime.Object{egressNetNamespace("a", 10, "198.51.100.70")},
			want:    map[string][3]string{"a": {"True/Valid", "True/Assigned", "198.51.100.70@" + first("198.51.100.70", "n2", "n3") + "/"}},
			events:  []string{"EgressIPAssigned"}},
		{name: "the node the agents moved it to keeps it",
			objects: []runtime.Object{withHolder(egressNetNamespace("a", 10, "198.51.100.70"), "n3"), withHolder(egressNetNamespace("b", 11, "198.51.100.45"), "n2")},
			want: map[string][3]string{"a": {"True/Valid", "True/Assigned", "198.51.100.70@n3/n3"},
				"b": {"True/Valid", "True/Assigned", "198.51.100.45@n2/n2"}},
			events: []string{"EgressIPAssigned", "EgressIPAssigned"}},
		{name: "outside every egressCIDR and list: invalid, the namespace's other IP still placed",
			objects: []runtime.Object{egressNetNamespace("a", 10, "198.51.100.99", "198.51.100.40")},
			want: map[string][3]string{"a": {"False/NoEligibleNode", "True/Assigned",
				"198.51.100.99@/,198.51.100.40@" + first("198.51.100.40", "n1", "n2") + "/"}},
			events: []string{"EgressIPNoEligibleNode", "EgressIPAssigned"}},
		{name: "one IP claimed by two namespaces: both told, neither placed",
			objects: []runtime.Object{egressNetNamespace("a", 10, "198.51.100.40"), egressNetNamespace("b", 11, "198.51.100.40", "198.51.100.41")},
			want: map[string][3]string{"a": {"False/Conflict", "True/Assigned", "198.51.100.40@/"},
				"b":     {"False/Conflict", "True/Assigned", "198.51.100.40@/,198.51.100.41@" + first("198.51.100.41", "n1", "n2") + "/"},
				"plain": {"absent", "absent", ""}},
			events: []string{"EgressIPConflict", "EgressIPConflict", "EgressIPAssigned"}},
		{name: "inside the cluster network or a node's address",
			objects: []runtime.Object{egressNetNamespace("a", 10, "10.128.0.77", "198.51.100.12")},
			want:    map[string][3]string{"a": {"False/InsideCluster", "True/Assigned", "10.128.0.77@/,198.51.100.12@/"}},
			events:  []string{"EgressIPInsideCluster"}},
		{name: "its holder's Node is not Ready: placed on the next",
			objects: []runtime.Object{readyNode("n3", "198.51.100.13", false), withHolder(egressNetNamespace("a", 10, "198.51.100.70"), "n3")},
			want:    map[string][3]string{"a": {"True/Valid", "True/Assigned", "198.51.100.70@n2/n3"}},
			events:  []string{"EgressIPAssigned"}},
		{name: "no Ready node may hold it",
			objects: []runtime.Object{readyNode("n2", "198.51.100.12", false), readyNode("n3", "198.51.100.13", false), egressNetNamespace("a", 10, "198.51.100.70")},
			want:    map[string][3]string{"a": {"True/Valid", "False/NoReadyNode", "198.51.100.70@/"}},
			events:  []string{"EgressIPNoReadyNode"}},
		{name: "a namespace without egress IPs any more loses its egress status",
			objects: []runtime.Object{func() runtime.Object {
				nn := withHolder(egressNetNamespace("a", 10, "198.51.100.40"), "n1")
				nn.EgressIPs = nil
				nn.Status.Conditions = []metav1.Condition{{Type: networkv1.ConditionEgressIPsValid, Status: metav1.ConditionTrue, Reason: "Valid"}}
				return nn
			}()},
			want: map[string][3]string{"a": {"absent", "absent", ""}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := base()
			// Later objects replace earlier ones of the same kind and name.
			for _, o := range tc.objects {
				m, _ := meta.Accessor(o)
				objs = slices.DeleteFunc(objs, func(b runtime.Object) bool {
					mb, _ := meta.Accessor(b)
					return mb.GetName() == m.GetName() && sameKind(o, b)
				})
				objs = append(objs, o)
			}
			f := newFixture(t, fixtureOpts{}, objs...)
			f.events.take()
			if err := f.c.syncEgressIPs(f.ctx); err != nil {
				t.Fatal(err)
			}
			for ns, w := range tc.want {
				nn, ok := f.netNamespace(ns)
				if !ok {
					t.Fatalf("no NetNamespace %s", ns)
				}
				got := [3]string{egressCondition(nn, networkv1.ConditionEgressIPsValid), egressCondition(nn, networkv1.ConditionEgressIPsAssigned), placements(nn)}
				if got != w {
					t.Errorf("%s: got %q, want %q", ns, got, w)
				}
			}
			var reasons []string
			for _, e := range f.events.take() {
				reasons = append(reasons, e.reason)
			}
			if !slices.Equal(reasons, tc.events) {
				t.Errorf("events %v, want %v", reasons, tc.events)
			}
			// Nothing new: a second sync writes nothing and tells nothing.
			f.resync()
			f.writes()
			if err := f.c.syncEgressIPs(f.ctx); err != nil {
				t.Fatal(err)
			}
			if w := f.writes(); len(w) > 0 {
				t.Errorf("second sync wrote %v", w)
			}
			if e := f.events.take(); len(e) > 0 {
				t.Errorf("second sync told %v", e)
			}
		})
	}
}

func sameKind(a, b runtime.Object) bool {
	switch a.(type) {
	case *corev1.Node:
		_, ok := b.(*corev1.Node)
		return ok
	case *networkv1.NetNamespace:
		_, ok := b.(*networkv1.NetNamespace)
		return ok
	case *networkv1.HostSubnet:
		_, ok := b.(*networkv1.HostSubnet)
		return ok
	}
	return false
}

func TestSyncEgressPolicies(t *testing.T) {
	policy := func(ns, name string, rules ...networkv1.EgressNetworkPolicyRule) *networkv1.EgressNetworkPolicy {
		return &networkv1.EgressNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 3},
			Spec: networkv1.EgressNetworkPolicySpec{Egress: rules}}
	}
	deny := networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleDeny, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: "0.0.0.0/0"}}
	bad := networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleAllow, To: networkv1.EgressNetworkPolicyPeer{DNSName: "no_such.example"}}
	f := newFixture(t, fixtureOpts{}, policy("a", "only", deny), policy("b", "one", deny), policy("b", "two"), policy("c", "broken", deny, bad))
	f.events.take()
	if err := f.c.syncEgressPolicies(f.ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a/only": "True/Accepted", "b/one": "False/MultiplePolicies", "b/two": "False/MultiplePolicies", "c/broken": "False/InvalidRule"}
	for key, w := range want {
		ns, name, _ := strings.Cut(key, "/")
		p, err := f.net.NetworkV1().EgressNetworkPolicies(ns).Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(p.Status.Conditions, networkv1.ConditionValid)
		if c == nil || string(c.Status)+"/"+c.Reason != w || p.Status.ObservedGeneration != 3 {
			t.Errorf("%s: %+v (observed %d), want %s", key, c, p.Status.ObservedGeneration, w)
		}
		if key == "c/broken" && (c == nil || !strings.Contains(c.Message, "rule 1")) {
			t.Errorf("%s: message %q does not name the bad rule", key, c.Message)
		}
	}
	var reasons []string
	for _, e := range f.events.take() {
		reasons = append(reasons, e.object+":"+e.reason)
	}
	slices.Sort(reasons)
	if w := []string{"broken:InvalidRule", "one:MultiplePolicies", "two:MultiplePolicies"}; !slices.Equal(reasons, w) {
		t.Errorf("events %v, want %v", reasons, w)
	}
	// Removing the second policy of b: the first becomes enforced.
	if err := f.net.NetworkV1().EgressNetworkPolicies("b").Delete(f.ctx, "two", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	if err := f.c.syncEgressPolicies(f.ctx); err != nil {
		t.Fatal(err)
	}
	p, _ := f.net.NetworkV1().EgressNetworkPolicies("b").Get(f.ctx, "one", metav1.GetOptions{})
	if !meta.IsStatusConditionTrue(p.Status.Conditions, networkv1.ConditionValid) {
		t.Errorf("b/one after b/two went: %+v", p.Status.Conditions)
	}
}

// A Node's update queues the egress IPs' sync only when it turns Ready or not Ready (a status heartbeat
// changes nothing they depend on); its coming and going always do.
func TestEgressQueuedOnNodeReadiness(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	t.Cleanup(q.ShutDown)
	h := onNodeReadiness(q, egressIPsKey)
	ready, heartbeat, notReady := readyNode("n1", "198.51.100.11", true), readyNode("n1", "198.51.100.11", true), readyNode("n1", "198.51.100.11", false)
	heartbeat.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	h.OnUpdate(ready, heartbeat)
	if got := queued(q); len(got) != 0 {
		t.Errorf("a heartbeat queued %v", got)
	}
	h.OnUpdate(ready, notReady)
	if got := queued(q); !slices.Equal(got, []string{egressIPsKey}) {
		t.Errorf("turning not Ready queued %v", got)
	}
	h.OnAdd(ready, false)
	h.OnDelete(ready)
	if got := queued(q); !slices.Equal(got, []string{egressIPsKey}) {
		t.Errorf("add and delete queued %v", got)
	}
}

// TestSyncEgressWrapsWriteErrors: a status write the API refuses comes back from the egress syncs
// wrapped, not flattened into text, so callers can still tell a conflict from another failure.
func TestSyncEgressWrapsWriteErrors(t *testing.T) {
	deny := networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleDeny, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: "0.0.0.0/0"}}
	for _, tc := range []struct {
		name     string
		resource string
		objects  []runtime.Object
		sync     func(*fixture) error
	}{
		{"egress IPs", "netnamespaces", []runtime.Object{egressNetNamespace("a", 10, "10.0.0.9")},
			func(f *fixture) error { return f.c.syncEgressIPs(f.ctx) }},
		{"egress policies", "egressnetworkpolicies", []runtime.Object{&networkv1.EgressNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "only"},
			Spec: networkv1.EgressNetworkPolicySpec{Egress: []networkv1.EgressNetworkPolicyRule{deny}}}},
			func(f *fixture) error { return f.c.syncEgressPolicies(f.ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{}, tc.objects...)
			f.failWrites("update", tc.resource, apierrors.NewConflict(schema.GroupResource{Resource: tc.resource}, "x", errors.New("stale")))
			err := tc.sync(f)
			if !apierrors.IsConflict(err) {
				t.Fatalf("sync: %v, want a conflict it wraps", err)
			}
		})
	}
}
