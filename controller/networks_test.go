package controller

// Unit tests of the Networks' sync (networks.go) on fake clientsets, in sync_test.go's style: each case
// states the objects the API holds, runs the syncs until they write nothing more, and checks what the API
// holds against what the objects' semantics ask for. Expected subnets and cross-talk come from the
// test's own model (address arithmetic on uint32s below), not from the code under test.

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

var uidSeq atomic.Int64

// newNetFixture is newFixture whose API gives created objects a UID, as a real one does (the controller
// deletes NetworkSubnets by UID).
func newNetFixture(t *testing.T, o fixtureOpts, objects ...runtime.Object) *fixture {
	t.Helper()
	f := newFixture(t, o, objects...)
	f.net.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if m, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil && m.GetUID() == "" {
			m.SetUID(types.UID(fmt.Sprintf("uid-%d", uidSeq.Add(1))))
		}
		return false, nil, nil
	})
	f.events.take()
	return f
}

type netOpt func(*networkv1.Network)

// netw is a Network as an administrator writes it.
func netw(name, cidr string, bits int32, opts ...netOpt) *networkv1.Network {
	n := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("net-" + name), Generation: 1},
		Spec: networkv1.NetworkSpec{CIDR: networkv1.CIDR(cidr), HostSubnetLength: bits}}
	for _, o := range opts {
		o(n)
	}
	return n
}

func specVNI(id uint32) netOpt { return func(n *networkv1.Network) { n.Spec.VNI = id } }

// held: the controller gave the Network this VNI before (its status and finalizer say so).
func held(id uint32) netOpt {
	return func(n *networkv1.Network) {
		n.Status.VNI = id
		n.Finalizers = []string{networkv1.NetworkInUseFinalizer}
	}
}

func talksTo(names ...string) netOpt { return func(n *networkv1.Network) { n.Spec.CrossTalk = names } }

func bornAt(sec int) netOpt {
	return func(n *networkv1.Network) { n.CreationTimestamp = metav1.NewTime(time.Unix(int64(1e9+sec), 0)) }
}

func deletedAt(n *networkv1.Network) {
	now := metav1.NewTime(time.Unix(2e9, 0))
	n.DeletionTimestamp = &now
}

func netSubnet(network, node, hostIP, subnet string, pods int64) *networkv1.NetworkSubnet {
	name := networkv1.NetworkSubnetName(network, node)
	return &networkv1.NetworkSubnet{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("ns-" + name)},
		Network: network, Node: node, HostIP: hostIP, Subnet: networkv1.CIDR(subnet), Status: networkv1.NetworkSubnetStatus{Attachments: pods}}
}

// cluster is n nodes n1..nN, each with an InternalIP 192.0.2.i and a HostSubnet on it.
func cluster(n int) []runtime.Object {
	var out []runtime.Object
	for i := 1; i <= n; i++ {
		name, ip := fmt.Sprintf("n%d", i), fmt.Sprintf("192.0.2.%d", i)
		out = append(out, node(name, internal(ip)), hostSubnet(name, ip, fmt.Sprintf("10.128.%d.0/23", 2*i)))
	}
	return out
}

func hostIPs(n int) map[string]string {
	out := map[string]string{}
	for i := 1; i <= n; i++ {
		out[fmt.Sprintf("n%d", i)] = fmt.Sprintf("192.0.2.%d", i)
	}
	return out
}

func objs(lists ...[]runtime.Object) []runtime.Object { return slices.Concat(lists...) }

// syncNetworks syncs every Network the API holds and every one a NetworkSubnet names, in name order, and
// returns the writes.
func (f *fixture) syncNetworks() []string {
	f.t.Helper()
	names := map[string]bool{}
	nets, err := f.net.NetworkV1().Networks().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, n := range nets.Items {
		names[n.Name] = true
	}
	subs, err := f.net.NetworkV1().NetworkSubnets().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range subs.Items {
		names[s.Network] = true
	}
	f.writes()
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	for _, n := range sorted {
		if err := f.c.syncNetwork(f.ctx, n); err != nil {
			f.t.Fatalf("syncNetwork %s: %v", n, err)
		}
	}
	return f.writes()
}

// converge runs rounds of syncNetworks, the informers catching up between rounds, until one writes
// nothing; it returns every write.
func (f *fixture) converge() []string {
	f.t.Helper()
	var all []string
	for range 10 {
		f.resync()
		w := f.syncNetworks()
		if len(w) == 0 {
			return all
		}
		all = append(all, w...)
	}
	f.t.Fatalf("still writing after 10 rounds: %q", all)
	return nil
}

func (f *fixture) network(name string) *networkv1.Network {
	f.t.Helper()
	n, err := f.net.NetworkV1().Networks().Get(f.ctx, name, metav1.GetOptions{})
	f.net.ClearActions()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// networkSubnets maps node → NetworkSubnet for one Network (by the objects' network field).
func (f *fixture) networkSubnets(network string) map[string]networkv1.NetworkSubnet {
	f.t.Helper()
	list, err := f.net.NetworkV1().NetworkSubnets().List(f.ctx, metav1.ListOptions{})
	f.net.ClearActions()
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]networkv1.NetworkSubnet{}
	for _, s := range list.Items {
		if s.Network == network {
			if _, dup := out[s.Node]; dup {
				f.t.Errorf("two NetworkSubnets of %s on node %s", network, s.Node)
			}
			out[s.Node] = s
		}
	}
	return out
}

// The model: IPv4 ranges as uint32 first..last.

type span struct{ first, last uint32 }

func spanOf(t *testing.T, cidr string) span {
	t.Helper()
	addr, bits, ok := strings.Cut(cidr, "/")
	ip := netip.MustParseAddr(addr).As4()
	var n int
	if _, err := fmt.Sscanf(bits, "%d", &n); !ok || err != nil {
		t.Fatalf("bad CIDR %q", cidr)
	}
	first := binary.BigEndian.Uint32(ip[:])
	size := uint32(1<<(32-n) - 1)
	return span{first, first + size}
}

func (s span) overlaps(o span) bool { return s.first <= o.last && o.first <= s.last }

// checkNetworkSubnets checks a Network's NetworkSubnets against the nodes that should have one (node →
// hostIP): each named <network>.<node>, on the node's hostIP, a /(32-hostBits) of the Network's CIDR,
// aligned, none shared, owned by the Network.
func checkNetworkSubnets(t *testing.T, got map[string]networkv1.NetworkSubnet, n *networkv1.Network, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: NetworkSubnets on %v, want on %v", n.Name, keys(got), keys(want))
	}
	cidr := spanOf(t, string(n.Spec.CIDR))
	size := uint32(1) << n.Spec.HostSubnetLength
	seen := map[span]string{}
	for node, ip := range want {
		s, ok := got[node]
		if !ok {
			t.Errorf("%s: node %s has no NetworkSubnet", n.Name, node)
			continue
		}
		if s.Name != n.Name+"."+node || s.Network != n.Name || s.HostIP != ip {
			t.Errorf("%s: NetworkSubnet %s (network %q node %q hostIP %q), want %s.%s on %s", n.Name, s.Name, s.Network, s.Node, s.HostIP, n.Name, node, ip)
		}
		p := spanOf(t, string(s.Subnet))
		if p.last-p.first+1 != size || p.first%size != 0 || p.first < cidr.first || p.last > cidr.last {
			t.Errorf("%s: node %s has %s, not a /%d of %s", n.Name, node, s.Subnet, 32-n.Spec.HostSubnetLength, n.Spec.CIDR)
		}
		for q, other := range seen {
			if q.overlaps(p) {
				t.Errorf("%s: nodes %s and %s overlap at %s", n.Name, node, other, s.Subnet)
			}
		}
		seen[p] = node
		if len(s.OwnerReferences) != 0 || s.Annotations["network.ofsdn.io/network-uid"] != string(n.UID) {
			t.Errorf("%s: NetworkSubnet %s owners %+v, annotations %v: want no owner reference (the garbage collector must not delete it) and the Network's uid %s",
				n.Name, s.Name, s.OwnerReferences, s.Annotations, n.UID)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func condition(t *testing.T, n *networkv1.Network, typ string) metav1.Condition {
	t.Helper()
	if n == nil {
		t.Fatalf("no Network")
	}
	c := meta.FindStatusCondition(n.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("%s has no %s condition: %+v", n.Name, typ, n.Status.Conditions)
	}
	if c.ObservedGeneration != n.Generation {
		t.Errorf("%s %s: observedGeneration %d, want %d", n.Name, typ, c.ObservedGeneration, n.Generation)
	}
	return *c
}

func wantCondition(t *testing.T, n *networkv1.Network, typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	c := condition(t, n, typ)
	if c.Status != status || c.Reason != reason {
		t.Errorf("%s %s = %s/%s (%q), want %s/%s", n.Name, typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return c
}

const vniLo = networkv1.MinNetworkVNI

func TestNetworkVNI(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vnis    [2]uint32 // zero: the API's range
		objects []runtime.Object
		// want: Network → its status.vni afterwards (0: none, and Valid False with wantReason[name]).
		want       map[string]uint32
		wantReason map[string]string
		wantEvents []event
		// wantHolder: a VNIConflict message must name this Network.
		wantHolder string
	}{{
		name:    "spec.vni is taken when free",
		objects: []runtime.Object{netw("blue", "10.1.0.0/16", 8, specVNI(vniLo+7))},
		want:    map[string]uint32{"blue": vniLo + 7},
	}, {
		name:    "without spec.vni: the first free VNI",
		objects: []runtime.Object{netw("blue", "10.1.0.0/16", 8, held(vniLo), bornAt(1)), netw("red", "10.1.0.0/16", 8, bornAt(2))},
		want:    map[string]uint32{"blue": vniLo, "red": vniLo + 1},
	}, {
		name: "a VNI another Network holds: VNIConflict naming the holder, which keeps it",
		objects: []runtime.Object{netw("green", "10.1.0.0/16", 8, held(vniLo+5), bornAt(1)),
			netw("red", "10.2.0.0/16", 8, specVNI(vniLo+5), bornAt(2))},
		want:       map[string]uint32{"green": vniLo + 5, "red": 0},
		wantReason: map[string]string{"red": "VNIConflict"},
		wantEvents: []event{{"red", corev1.EventTypeWarning, "VNIConflict", ""}},
		wantHolder: "green",
	}, {
		name: "two Networks asking for one VNI at once: the first synced gets it",
		objects: []runtime.Object{netw("a", "10.1.0.0/16", 8, specVNI(vniLo+9)),
			netw("b", "10.2.0.0/16", 8, specVNI(vniLo+9))},
		want:       map[string]uint32{"a": vniLo + 9, "b": 0},
		wantReason: map[string]string{"b": "VNIConflict"},
		wantEvents: []event{{"b", corev1.EventTypeWarning, "VNIConflict", ""}},
		wantHolder: "a",
	}, {
		name: "two statuses claiming one VNI (a corrupt state): the older keeps it, the other gets a free one",
		objects: []runtime.Object{netw("young", "10.1.0.0/16", 8, held(vniLo+3), bornAt(2)),
			netw("old", "10.1.0.0/16", 8, held(vniLo+3), bornAt(1))},
		want: map[string]uint32{"old": vniLo + 3, "young": vniLo},
	}, {
		name:       "spec.vni out of range (the CRD refuses it; the controller checks again)",
		objects:    []runtime.Object{netw("blue", "10.1.0.0/16", 8, specVNI(5000))},
		want:       map[string]uint32{"blue": 0},
		wantReason: map[string]string{"blue": "VNIOutOfRange"},
		wantEvents: []event{{"blue", corev1.EventTypeWarning, "VNIOutOfRange", ""}},
	}, {
		name:       "no VNI left",
		vnis:       [2]uint32{vniLo, vniLo},
		objects:    []runtime.Object{netw("a", "10.1.0.0/16", 8, held(vniLo)), netw("b", "10.2.0.0/16", 8)},
		want:       map[string]uint32{"a": vniLo, "b": 0},
		wantReason: map[string]string{"b": "VNIExhausted"},
		wantEvents: []event{{"b", corev1.EventTypeWarning, "VNIExhausted", ""}},
	}, {
		name: "invalid addresses: InvalidCIDR, no VNI",
		objects: []runtime.Object{netw("v6", "fd00::/64", 8), netw("hostbits", "10.1.0.1/16", 8),
			netw("toolong", "10.1.0.0/28", 8)},
		want:       map[string]uint32{"v6": 0, "hostbits": 0, "toolong": 0},
		wantReason: map[string]string{"v6": "InvalidCIDR", "hostbits": "InvalidCIDR", "toolong": "InvalidCIDR"},
		wantEvents: []event{{"hostbits", corev1.EventTypeWarning, "InvalidCIDR", ""}, {"toolong", corev1.EventTypeWarning, "InvalidCIDR", ""},
			{"v6", corev1.EventTypeWarning, "InvalidCIDR", ""}},
	}, {
		name:    "a spec.vni edited later is ignored: the VNI is for life",
		objects: []runtime.Object{netw("blue", "10.1.0.0/16", 8, held(vniLo+2), specVNI(vniLo+8))},
		want:    map[string]uint32{"blue": vniLo + 2},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newNetFixture(t, fixtureOpts{}, objs(cluster(2), tc.objects)...)
			if tc.vnis != [2]uint32{} {
				f.c.nets.vniRange = tc.vnis
				f.c.mu.Lock()
				if err := f.c.rebuildNetworksLocked(); err != nil {
					t.Fatal(err)
				}
				f.c.mu.Unlock()
			}
			f.converge()
			for name, want := range tc.want {
				n := f.network(name)
				if n.Status.VNI != want {
					t.Errorf("%s: status.vni %d, want %d", name, n.Status.VNI, want)
				}
				if !slices.Contains(n.Finalizers, networkv1.NetworkInUseFinalizer) {
					t.Errorf("%s: no finalizer %v", name, n.Finalizers)
				}
				if want != 0 {
					wantCondition(t, n, networkv1.ConditionValid, metav1.ConditionTrue, "Accepted")
					checkNetworkSubnets(t, f.networkSubnets(name), n, hostIPs(2))
					continue
				}
				c := wantCondition(t, n, networkv1.ConditionValid, metav1.ConditionFalse, tc.wantReason[name])
				if tc.wantHolder != "" && tc.wantReason[name] == "VNIConflict" && !strings.Contains(c.Message, "Network "+tc.wantHolder) {
					t.Errorf("%s: VNIConflict message %q does not name %s", name, c.Message, tc.wantHolder)
				}
				if got := f.networkSubnets(name); len(got) > 0 {
					t.Errorf("%s is not valid, yet has NetworkSubnets %v", name, keys(got))
				}
				wantCondition(t, n, networkv1.ConditionSubnetsAvailable, metav1.ConditionFalse, "NotValid")
			}
			// The VNIs held are exactly the statuses', each once.
			seen := map[uint32]string{}
			for name, want := range tc.want {
				if want == 0 {
					continue
				}
				if other, dup := seen[want]; dup {
					t.Errorf("%s and %s share VNI %d", name, other, want)
				}
				seen[want] = name
				if f.c.nets.vnis.Users(want) != 1 {
					t.Errorf("VNI %d has %d users counted", want, f.c.nets.vnis.Users(want))
				}
			}
			if got := len(f.c.nets.vnis.InUse()); got != len(seen) {
				t.Errorf("%d VNIs counted (%v), %d held", got, f.c.nets.vnis.InUse(), len(seen))
			}
			got := f.events.take()
			slices.SortFunc(got, func(a, b event) int { return strings.Compare(a.object+a.reason, b.object+b.reason) })
			checkEvents(t, got, tc.wantEvents)
		})
	}
}

// The Network holding a contested VNI goes: the one waiting for it gets it.
func TestNetworkVNIFreedGoesToTheWaitingNetwork(t *testing.T) {
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(1), []runtime.Object{
		netw("green", "10.1.0.0/16", 8, held(vniLo+5), bornAt(1)), netw("red", "10.2.0.0/16", 8, specVNI(vniLo+5), bornAt(2))})...)
	f.converge()
	if n := f.network("red"); n.Status.VNI != 0 {
		t.Fatalf("red got VNI %d green holds", n.Status.VNI)
	}
	if err := f.net.NetworkV1().Networks().Delete(f.ctx, "green", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	red := f.network("red")
	if red.Status.VNI != vniLo+5 {
		t.Errorf("red: VNI %d once green is gone, want %d", red.Status.VNI, vniLo+5)
	}
	wantCondition(t, red, networkv1.ConditionValid, metav1.ConditionTrue, "Accepted")
	if got := f.networkSubnets("green"); len(got) > 0 {
		t.Errorf("green's NetworkSubnets outlive it: %v", keys(got))
	}
}

// A NetworkSubnet per node with a HostSubnet, on its hostIP, kept in step with it; a node that goes
// loses its NetworkSubnet.
func TestNetworkSubnetsPerNode(t *testing.T) {
	blue := netw("blue", "10.1.0.0/16", 8)
	red := netw("red", "10.1.0.0/16", 8) // the same CIDR: Networks may overlap
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(3), []runtime.Object{
		node("nosubnet", internal("192.0.2.50")),             // a Node without a HostSubnet yet: no NetworkSubnet
		hostSubnet("nonode", "192.0.2.60", "10.128.60.0/23"), // a HostSubnet whose Node is gone
		blue, red,
	})...)
	f.converge()
	for _, n := range []*networkv1.Network{blue, red} {
		checkNetworkSubnets(t, f.networkSubnets(n.Name), n, hostIPs(3))
		got := f.network(n.Name)
		wantCondition(t, got, networkv1.ConditionSubnetsAvailable, metav1.ConditionTrue, "Available")
		wantCondition(t, got, networkv1.ConditionInUse, metav1.ConditionFalse, "Unused")
		if got.Status.ObservedGeneration != got.Generation {
			t.Errorf("%s: observedGeneration %d, want %d", n.Name, got.Status.ObservedGeneration, got.Generation)
		}
	}
	before := f.networkSubnets("blue")

	// n2's address changes: its HostSubnet's hostIP does, and so do its NetworkSubnets (same subnet).
	hs, _ := f.net.NetworkV1().HostSubnets().Get(f.ctx, "n2", metav1.GetOptions{})
	hs.HostIP = "192.0.2.22"
	if _, err := f.net.NetworkV1().HostSubnets().Update(f.ctx, hs, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := f.converge()
	if !slices.Equal(w, []string{"update networksubnets/blue.n2", "update networksubnets/red.n2"}) {
		t.Errorf("writes %q, want the two NetworkSubnets of n2 updated", w)
	}
	want := hostIPs(3)
	want["n2"] = "192.0.2.22"
	checkNetworkSubnets(t, f.networkSubnets("blue"), blue, want)
	if got := f.networkSubnets("blue")["n2"].Subnet; got != before["n2"].Subnet {
		t.Errorf("n2's subnet changed %s → %s with its address", before["n2"].Subnet, got)
	}

	// n3 goes (Node deleted; the HostSubnet may still be there): its NetworkSubnets go, subnets released.
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, "n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	delete(want, "n3")
	checkNetworkSubnets(t, f.networkSubnets("blue"), blue, want)
	checkNetworkSubnets(t, f.networkSubnets("red"), red, want)
	if used := f.c.nets.allocs["blue"].subnets.Used(); used != 2 {
		t.Errorf("blue: %d subnets counted, want 2", used)
	}
	// n1's HostSubnet goes: so do its NetworkSubnets.
	if err := f.net.NetworkV1().HostSubnets().Delete(f.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	delete(want, "n1")
	checkNetworkSubnets(t, f.networkSubnets("blue"), blue, want)
}

// A CIDR too small for the nodes: those that fit get subnets, the Network says how many lack one (a
// Warning Event once), and a subnet a departing node frees goes to a waiting node.
func TestNetworkSubnetExhaustionAndRelease(t *testing.T) {
	small := netw("small", "10.9.0.0/24", 6) // four /26s for five nodes
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(5), []runtime.Object{small})...)
	f.converge()
	capacity := int(spanOf(t, "10.9.0.0/24").last-spanOf(t, "10.9.0.0/24").first+1) >> 6
	got := f.networkSubnets("small")
	if len(got) != capacity {
		t.Fatalf("%d NetworkSubnets, want %d (the CIDR's capacity)", len(got), capacity)
	}
	want := map[string]string{}
	for node := range got {
		want[node] = hostIPs(5)[node]
	}
	checkNetworkSubnets(t, got, small, want)
	n := f.network("small")
	c := wantCondition(t, n, networkv1.ConditionSubnetsAvailable, metav1.ConditionFalse, "Exhausted")
	if !strings.Contains(c.Message, "1 node(s)") {
		t.Errorf("Exhausted message %q does not say one node lacks a subnet", c.Message)
	}
	wantCondition(t, n, networkv1.ConditionValid, metav1.ConditionTrue, "Accepted")
	checkEvents(t, f.events.take(), []event{{"small", corev1.EventTypeWarning, "Exhausted", ""}})
	if w := f.converge(); len(w) > 0 {
		t.Errorf("a resync while exhausted wrote %q", w)
	}
	checkEvents(t, f.events.take(), nil)

	// A node with a subnet goes: its subnet goes to the one waiting.
	var waiting, gone string
	for node := range hostIPs(5) {
		if _, ok := got[node]; !ok {
			waiting = node
		}
	}
	gone = keys(got)[0]
	freed := got[gone].Subnet
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	got = f.networkSubnets("small")
	delete(want, gone)
	want[waiting] = hostIPs(5)[waiting]
	checkNetworkSubnets(t, got, small, want)
	if got[waiting].Subnet != freed {
		t.Errorf("%s got %s; the only free subnet is %s", waiting, got[waiting].Subnet, freed)
	}
	wantCondition(t, f.network("small"), networkv1.ConditionSubnetsAvailable, metav1.ConditionTrue, "Available")
}

// crossTalkModel is the effective cross-talk the API asks for: x and y exchange traffic when either
// names the other and both exist, are valid and not being deleted, with CIDRs that do not overlap.
func crossTalkModel(t *testing.T, nets []*networkv1.Network, valid map[string]bool) map[string][]string {
	out := map[string][]string{}
	for _, x := range nets {
		for _, y := range nets {
			if x.Name == y.Name || !valid[x.Name] || !valid[y.Name] || x.DeletionTimestamp != nil || y.DeletionTimestamp != nil {
				continue
			}
			if !slices.Contains(x.Spec.CrossTalk, y.Name) && !slices.Contains(y.Spec.CrossTalk, x.Name) {
				continue
			}
			if spanOf(t, string(x.Spec.CIDR)).overlaps(spanOf(t, string(y.Spec.CIDR))) {
				continue
			}
			out[x.Name] = append(out[x.Name], y.Name)
		}
		slices.Sort(out[x.Name])
	}
	return out
}

func TestNetworkCrossTalk(t *testing.T) {
	withFinalizer := func(n *networkv1.Network) { n.Finalizers = []string{networkv1.NetworkInUseFinalizer} }
	for _, tc := range []struct {
		name string
		nets []*networkv1.Network
		// wantTalk: the CrossTalk condition's reason per Network (Effective when not listed);
		// missing: the names its message must list.
		wantTalk   map[string]string
		missing    map[string][]string
		wantEvents []event
	}{{
		name: "one side naming the other is enough: both carry it",
		nets: []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("b")), netw("b", "10.2.0.0/16", 8)},
	}, {
		name: "both naming each other",
		nets: []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("b", "c")), netw("b", "10.2.0.0/16", 8, talksTo("a")),
			netw("c", "10.3.0.0/24", 6, talksTo("b"))},
	}, {
		name:       "overlapping CIDRs are refused; the rest still talk",
		nets:       []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("b", "c")), netw("b", "10.2.0.0/16", 8), netw("c", "10.1.128.0/17", 8)},
		wantTalk:   map[string]string{"a": "Overlapping"},
		missing:    map[string][]string{"a": {"c"}},
		wantEvents: []event{{"a", corev1.EventTypeWarning, "Overlapping", ""}},
	}, {
		name:       "a Network that does not exist",
		nets:       []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("nope", "b")), netw("b", "10.2.0.0/16", 8)},
		wantTalk:   map[string]string{"a": "UnknownNetwork"},
		missing:    map[string][]string{"a": {"nope"}},
		wantEvents: []event{{"a", corev1.EventTypeWarning, "UnknownNetwork", ""}},
	}, {
		name:     "a Network that is not valid carries none",
		nets:     []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("bad")), netw("bad", "10.2.0.1/16", 8, talksTo("a"))},
		wantTalk: map[string]string{"a": "UnknownNetwork", "bad": "NotValid"}, missing: map[string][]string{"a": {"bad"}},
		wantEvents: []event{{"a", corev1.EventTypeWarning, "UnknownNetwork", ""}, {"bad", corev1.EventTypeWarning, "InvalidCIDR", ""}},
	}, {
		name: "a Network being deleted carries none",
		nets: []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("gone")),
			netw("gone", "10.2.0.0/16", 8, withFinalizer, deletedAt, talksTo("a"))},
		wantTalk: map[string]string{"a": "UnknownNetwork"}, missing: map[string][]string{"a": {"gone"}},
		wantEvents: []event{{"a", corev1.EventTypeWarning, "UnknownNetwork", ""}},
	}, {
		name:       "naming itself",
		nets:       []*networkv1.Network{netw("a", "10.1.0.0/16", 8, talksTo("a"))},
		wantTalk:   map[string]string{"a": "Overlapping"},
		missing:    map[string][]string{"a": {"a"}},
		wantEvents: []event{{"a", corev1.EventTypeWarning, "Overlapping", ""}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var objects []runtime.Object
			for _, n := range tc.nets {
				objects = append(objects, n)
			}
			f := newNetFixture(t, fixtureOpts{}, objs(cluster(1), objects)...)
			f.converge()
			valid := map[string]bool{}
			for _, n := range tc.nets {
				_, err := networkCIDR(n.Spec) // validity is the VNI test's business; here: the addresses
				valid[n.Name] = err == nil
			}
			model := crossTalkModel(t, tc.nets, valid)
			for _, n := range tc.nets {
				got := f.network(n.Name)
				if got == nil {
					continue // deleted, no pods: gone
				}
				if !slices.Equal(got.Status.CrossTalk, model[n.Name]) {
					t.Errorf("%s: crossTalk %v, want %v", n.Name, got.Status.CrossTalk, model[n.Name])
				}
				reason := cmpOr(tc.wantTalk[n.Name], "Effective")
				if n.DeletionTimestamp != nil {
					continue
				}
				status := metav1.ConditionFalse
				if reason == "Effective" {
					status = metav1.ConditionTrue
				}
				c := wantCondition(t, got, networkv1.ConditionCrossTalk, status, reason)
				for _, m := range tc.missing[n.Name] {
					if !strings.Contains(c.Message, m+" (") {
						t.Errorf("%s: CrossTalk message %q does not list %s", n.Name, c.Message, m)
					}
				}
			}
			ev := f.events.take()
			slices.SortFunc(ev, func(a, b event) int { return strings.Compare(a.object+a.reason, b.object+b.reason) })
			checkEvents(t, ev, tc.wantEvents)
		})
	}
}

// TestNetworkCrossTalkAmbiguous: a Network's peers never overlap each other (a destination address must
// name one network). A pair in effect keeps its traffic when another Network with the same addresses as
// one side asks for the other: the newcomer is refused as Ambiguous, naming the pair it collides with;
// once the established pair goes, the newcomer gets its turn.
func TestNetworkCrossTalkAmbiguous(t *testing.T) {
	established := func(peers ...string) netOpt { return func(n *networkv1.Network) { n.Status.CrossTalk = peers } }
	red := netw("red", "10.1.0.0/16", 8, talksTo("green"), established("green"))
	green := netw("green", "10.3.0.0/16", 8, established("red"))
	blue := netw("blue", "10.1.0.0/16", 8, talksTo("green")) // red's addresses; "blue" < "red" by name
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(1), []runtime.Object{red, green, blue})...)
	f.converge()
	for name, want := range map[string][]string{"red": {"green"}, "green": {"red"}, "blue": nil} {
		if got := f.network(name).Status.CrossTalk; !slices.Equal(got, want) {
			t.Errorf("%s: crossTalk %v, want %v", name, got, want)
		}
	}
	c := wantCondition(t, f.network("blue"), networkv1.ConditionCrossTalk, metav1.ConditionFalse, "Ambiguous")
	if !strings.Contains(c.Message, "green (") || !strings.Contains(c.Message, "red") {
		t.Errorf("blue's CrossTalk message %q names neither green nor the red pair it collides with", c.Message)
	}
	wantCondition(t, f.network("green"), networkv1.ConditionCrossTalk, metav1.ConditionTrue, "Effective")
	ev := f.events.take()
	if !slices.ContainsFunc(ev, func(e event) bool { return e.object == "blue" && e.reason == "Ambiguous" }) {
		t.Errorf("no Ambiguous Warning Event on blue: %+v", ev)
	}
	// red stops asking: blue and green talk.
	r := f.network("red").DeepCopy()
	r.Spec.CrossTalk = nil
	if _, err := f.net.NetworkV1().Networks().Update(f.ctx, r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	for name, want := range map[string][]string{"red": nil, "green": {"blue"}, "blue": {"green"}} {
		if got := f.network(name).Status.CrossTalk; !slices.Equal(got, want) {
			t.Errorf("after red let go: %s: crossTalk %v, want %v", name, got, want)
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// A change to a Network's spec.crossTalk re-syncs the Networks it names now and those it named before;
// one that does not change what peers depend on re-syncs only itself.
func TestNetworkCrossTalkChangeQueuesPeers(t *testing.T) {
	f := newNetFixture(t, fixtureOpts{}, netw("a", "10.1.0.0/16", 8, talksTo("b")), netw("b", "10.2.0.0/16", 8),
		netw("c", "10.3.0.0/16", 8), netw("d", "10.4.0.0/16", 8, talksTo("a")), netw("e", "10.5.0.0/16", 8))
	queued(f.c.nets.queue)
	old := netw("a", "10.1.0.0/16", 8, talksTo("b"))
	f.c.networkUpdated(old, netw("a", "10.1.0.0/16", 8, talksTo("c")))
	if got, want := queued(f.c.nets.queue), []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("queued %v, want %v (itself, old and new peers, and d that names it)", got, want)
	}
	relabelled := old.DeepCopy()
	relabelled.Labels = map[string]string{"x": "y"}
	f.c.networkUpdated(old, relabelled)
	if got := queued(f.c.nets.queue); !slices.Equal(got, []string{"a"}) {
		t.Errorf("queued %v, want only a", got)
	}
}

// A deleted Network keeps everything while pods are attached, says so (InUse Deleting, a Normal Event
// once), and goes once none are: NetworkSubnets deleted, VNI and subnets released, finalizer removed.
func TestNetworkDeletionWaitsForAttachments(t *testing.T) {
	blue := netw("blue", "10.1.0.0/16", 8)
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(3), []runtime.Object{blue})...)
	if w := f.converge(); !slices.Contains(w, "update networks/blue") {
		t.Errorf("writes %q: the finalizer was not added", w)
	}
	n := f.network("blue")
	vni := n.Status.VNI
	subnets := f.networkSubnets("blue")
	// Agents report 2 pods on n1 and 3 on n2.
	for node, pods := range map[string]int64{"n1": 2, "n2": 3} {
		s := subnets[node]
		s.Status.Attachments = pods
		if _, err := f.net.NetworkV1().NetworkSubnets().UpdateStatus(f.ctx, &s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.converge()
	n = f.network("blue")
	if n.Status.Attachments != 5 {
		t.Errorf("attachments %d, want 5", n.Status.Attachments)
	}
	if c := wantCondition(t, n, networkv1.ConditionInUse, metav1.ConditionTrue, "Attached"); c.Message != "5 pods on 2 nodes" {
		t.Errorf("InUse message %q", c.Message)
	}

	deletedAt(n)
	if _, err := f.net.NetworkV1().Networks().Update(f.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.events.take()
	f.converge()
	n = f.network("blue")
	if n == nil || !slices.Contains(n.Finalizers, networkv1.NetworkInUseFinalizer) {
		t.Fatalf("blue lost its finalizer with pods attached: %+v", n)
	}
	if c := wantCondition(t, n, networkv1.ConditionInUse, metav1.ConditionTrue, "Deleting"); c.Message != "5 pods still attached on nodes n1, n2" {
		t.Errorf("InUse message %q", c.Message)
	}
	if len(n.Status.CrossTalk) > 0 || n.Status.VNI != vni {
		t.Errorf("deleting: crossTalk %v vni %d, want none and %d", n.Status.CrossTalk, n.Status.VNI, vni)
	}
	if got := f.networkSubnets("blue"); len(got) != 3 {
		t.Errorf("NetworkSubnets %v while pods are attached, want all 3", keys(got))
	}
	checkEvents(t, f.events.take(), []event{{"blue", corev1.EventTypeNormal, "Deleting", ""}})
	if w := f.converge(); len(w) > 0 {
		t.Errorf("a resync while waiting wrote %q", w)
	}
	checkEvents(t, f.events.take(), nil)

	// n2's pods go; n1 is deleted with its pods still counted (its agent is gone with it): no pod is left.
	s := f.networkSubnets("blue")["n2"]
	s.Status.Attachments = 0
	if _, err := f.net.NetworkV1().NetworkSubnets().UpdateStatus(f.ctx, &s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	if c := condition(t, f.network("blue"), networkv1.ConditionInUse); c.Message != "2 pods still attached on nodes n1" {
		t.Errorf("InUse message %q", c.Message)
	}
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.converge()
	n = f.network("blue")
	if slices.Contains(n.Finalizers, networkv1.NetworkInUseFinalizer) {
		t.Errorf("finalizer still there with no pod attached")
	}
	if got := f.networkSubnets("blue"); len(got) > 0 {
		t.Errorf("NetworkSubnets %v left", keys(got))
	}
	if f.c.nets.vnis.Users(vni) != 0 || f.c.nets.allocs["blue"] != nil {
		t.Errorf("VNI %d (users %d) or subnets still held", vni, f.c.nets.vnis.Users(vni))
	}
	if err := f.net.Tracker().Delete(networkv1.SchemeGroupVersion.WithResource("networks"), "", "blue"); err != nil {
		t.Fatal(err)
	}
	if w := f.converge(); len(w) > 0 {
		t.Errorf("writes %q after the Network went", w)
	}
}

// A corrupt or hand-made NetworkSubnet is replaced with an Event, once; nothing crashes.
func TestCorruptNetworkSubnetReplaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		subnet *networkv1.NetworkSubnet
		event  bool // a Warning Event on the Network (not for a stray of a Network that is gone)
	}{
		{name: "outside the CIDR", subnet: netSubnet("blue", "n2", "192.0.2.2", "10.99.0.0/24", 0), event: true},
		{name: "the wrong size", subnet: netSubnet("blue", "n2", "192.0.2.2", "10.1.0.0/25", 0), event: true},
		{name: "not a CIDR", subnet: netSubnet("blue", "n2", "192.0.2.2", "10.1.0.0", 0), event: true},
		{name: "overlapping another node's", subnet: netSubnet("blue", "n2", "192.0.2.2", "10.1.7.0/24", 0), event: true},
		{name: "a name that is not <network>.<node>", subnet: func() *networkv1.NetworkSubnet {
			s := netSubnet("blue", "n2", "192.0.2.2", "10.1.9.0/24", 0)
			s.Name, s.UID = "blue.elsewhere", "ns-odd"
			return s
		}(), event: true},
		{name: "of a Network that is gone", subnet: netSubnet("gone", "n1", "192.0.2.1", "10.1.0.0/24", 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blue := netw("blue", "10.1.0.0/16", 8, held(vniLo))
			f := newNetFixture(t, fixtureOpts{}, objs(cluster(3), []runtime.Object{blue, netSubnet("blue", "n1", "192.0.2.1", "10.1.7.0/24", 0), tc.subnet})...)
			f.converge()
			checkNetworkSubnets(t, f.networkSubnets("blue"), blue, hostIPs(3))
			if got := f.networkSubnets("gone"); len(got) > 0 {
				t.Errorf("NetworkSubnets of a Network that is gone: %v", keys(got))
			}
			if _, err := f.net.NetworkV1().NetworkSubnets().Get(f.ctx, "blue.elsewhere", metav1.GetOptions{}); err == nil {
				t.Errorf("blue.elsewhere is still there")
			}
			if s := f.networkSubnets("blue")["n1"]; s.Subnet != "10.1.7.0/24" {
				t.Errorf("the valid NetworkSubnet of n1 changed to %s", s.Subnet)
			}
			var want []event
			if tc.event {
				want = []event{{"blue", corev1.EventTypeWarning, "InvalidNetworkSubnet", ""}}
			}
			checkEvents(t, f.events.take(), want)
			if w := f.converge(); len(w) > 0 {
				t.Errorf("writes %q after the replacement", w)
			}
		})
	}
}

// The informer still shows a NetworkSubnet the controller deleted: it is neither adopted nor reported.
func TestDeletedNetworkSubnetStillShown(t *testing.T) {
	small := netw("small", "10.9.0.0/25", 6) // two /26s for three nodes
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(3), []runtime.Object{small})...)
	f.converge()
	f.events.take()
	got := f.networkSubnets("small")
	gone := keys(got)[0]
	stale := got[gone]
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	f.syncNetworks() // deletes gone's, gives its subnet to the waiting node
	f.resync()
	if err := f.nf.Network().V1().NetworkSubnets().Informer().GetIndexer().Add(&stale); err != nil {
		t.Fatal(err)
	}
	if err := f.c.syncNetwork(f.ctx, "small"); err != nil {
		t.Fatal(err)
	}
	if w := f.writes(); len(w) > 0 {
		t.Errorf("writes %q for a deletion the informer has not shown yet", w)
	}
	checkEvents(t, f.events.take(), nil)
	want := hostIPs(3)
	delete(want, gone)
	f.converge()
	checkNetworkSubnets(t, f.networkSubnets("small"), small, want)
}

// A controller that starts again (a restart, a new leader) keeps every VNI and subnet, and a resync
// with nothing changed writes nothing.
func TestNetworksRestartAndQuietResync(t *testing.T) {
	f := newNetFixture(t, fixtureOpts{}, objs(cluster(3), []runtime.Object{
		netw("blue", "10.1.0.0/16", 8, talksTo("green")), netw("red", "10.1.0.0/16", 8, specVNI(vniLo+100)),
		netw("green", "10.2.0.0/24", 6), netw("small", "10.3.0.0/25", 6)})...)
	f.converge()
	if w := f.converge(); len(w) > 0 {
		t.Errorf("a resync with nothing changed wrote %q", w)
	}

	// Everything the API holds, handed to a new controller.
	var objects []runtime.Object
	for _, list := range []func() (runtime.Object, error){
		func() (runtime.Object, error) { return f.kube.CoreV1().Nodes().List(f.ctx, metav1.ListOptions{}) },
		func() (runtime.Object, error) {
			return f.net.NetworkV1().HostSubnets().List(f.ctx, metav1.ListOptions{})
		},
		func() (runtime.Object, error) { return f.net.NetworkV1().Networks().List(f.ctx, metav1.ListOptions{}) },
		func() (runtime.Object, error) {
			return f.net.NetworkV1().NetworkSubnets().List(f.ctx, metav1.ListOptions{})
		},
	} {
		l, err := list()
		if err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(l)
		objects = append(objects, items...)
	}
	g := newNetFixture(t, fixtureOpts{}, objects...)
	for _, name := range []string{"blue", "red", "green", "small"} {
		if f.c.nets.vni[name] != g.c.nets.vni[name] || g.c.nets.vni[name] == 0 {
			t.Errorf("%s: VNI %d rebuilt as %d", name, f.c.nets.vni[name], g.c.nets.vni[name])
		}
		if !maps.Equal(f.c.nets.allocs[name].node, g.c.nets.allocs[name].node) {
			t.Errorf("%s: subnets %v rebuilt as %v", name, f.c.nets.allocs[name].node, g.c.nets.allocs[name].node)
		}
	}
	if w := g.converge(); len(w) > 0 {
		t.Errorf("the new controller wrote %q with nothing changed", w)
	}
	// The gauges count what the API holds: 4 Networks; 3 nodes each, but small's two /26s.
	if n, s := testutil.ToFloat64(g.c.metrics.Networks), testutil.ToFloat64(g.c.metrics.NetworkSubnets); n != 4 || s != 3+3+3+2 {
		t.Errorf("gauges: %v networks, %v network subnets; want 4 and 11", n, s)
	}
	if v := g.network("red").Status.VNI; v != vniLo+100 {
		t.Errorf("red: VNI %d", v)
	}
}
