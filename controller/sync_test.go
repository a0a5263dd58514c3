package controller

// Unit tests of the sync functions on fake clientsets (no root, no API server): each case states the
// objects the API holds, runs one sync, and checks what the API holds afterwards against what the
// objects' semantics ask for. The informers are never started: the test copies the clientsets' contents
// into their caches (resync), so "the informer has caught up" is a step each case takes or skips.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkfake "github.com/ofsdn/ofsdn/client/clientset/versioned/fake"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// event is one Event the controller recorded.
type event struct{ object, kind, reason, message string }

// eventLog is a record.EventRecorder that keeps what it is told.
type eventLog struct {
	mu     sync.Mutex
	events []event
}

func (l *eventLog) Event(obj runtime.Object, kind, reason, message string) {
	name := ""
	if m, err := meta.Accessor(obj); err == nil {
		name = m.GetName()
	} else if ref, ok := obj.(*corev1.ObjectReference); ok {
		name = ref.Name
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, event{name, kind, reason, message})
}

func (l *eventLog) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	l.Event(obj, kind, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, kind, reason, format string, args ...any) {
	l.Eventf(obj, kind, reason, format, args...)
}

// take returns the events recorded since the last take.
func (l *eventLog) take() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// fixture is a controller on fake clientsets with its allocators rebuilt from the given objects.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	kube   *kubefake.Clientset
	net    *networkfake.Clientset
	kf     informers.SharedInformerFactory
	nf     networkinformers.SharedInformerFactory
	c      *Controller
	events *eventLog
}

// clusterSpec is a multitenant network over one cluster CIDR.
func clusterSpec(cidr string, hostBits int32) networkv1.ClusterNetworkSpec {
	return networkv1.ClusterNetworkSpec{ClusterCIDRs: []networkv1.CIDR{networkv1.CIDR(cidr)}, HostSubnetLength: hostBits,
		ServiceNetwork: "172.30.0.0/16", PluginMode: networkv1.PluginModeMultitenant, VXLANPort: 4789, MTU: 1450}
}

type fixtureOpts struct {
	spec networkv1.ClusterNetworkSpec
	// vnids narrows the VNID range (zero: the API's), so a test can run out of VNIDs.
	vnids [2]uint32
}

func newFixture(t *testing.T, o fixtureOpts, objects ...runtime.Object) *fixture {
	t.Helper()
	if o.spec.ClusterCIDRs == nil {
		o.spec = clusterSpec("10.128.0.0/14", 9)
	}
	var kubeObjs, netObjs []runtime.Object
	for _, obj := range objects {
		switch obj.(type) {
		case *corev1.Node, *corev1.Namespace:
			kubeObjs = append(kubeObjs, obj)
		default:
			netObjs = append(netObjs, obj)
		}
	}
	f := &fixture{t: t, ctx: context.Background(), kube: kubefake.NewClientset(kubeObjs...), net: networkfake.NewSimpleClientset(netObjs...),
		events: &eventLog{}}
	f.kf = informers.NewSharedInformerFactory(f.kube, 0)
	f.nf = networkinformers.NewSharedInformerFactory(f.net, 0)
	c, err := New(f.kube, f.net, f.kf, f.nf, Config{Network: o.spec, GlobalNamespaces: []string{"kube-system"}, Events: f.events,
		Logger: logr.Discard()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.vnids != [2]uint32{} {
		c.vnidRange = o.vnids
	}
	t.Cleanup(func() {
		for _, q := range []workqueue.TypedRateLimitingInterface[string]{c.nodeQ, c.nsQ, c.changeQ, c.statusQ, c.nets.queue, c.egressQ} {
			q.ShutDown()
		}
	})
	f.c = c
	if err := c.ensureClusterNetwork(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.resync()
	if err := c.rebuild(); err != nil {
		t.Fatal(err)
	}
	f.kube.ClearActions()
	f.net.ClearActions()
	return f
}

// resync puts what the clientsets hold into the informers' caches, as running informers would.
func (f *fixture) resync() {
	f.t.Helper()
	replace := func(inf cache.SharedIndexInformer, list runtime.Object, err error) {
		f.t.Helper()
		if err != nil {
			f.t.Fatal(err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			f.t.Fatal(err)
		}
		objs := make([]any, len(items))
		for i := range items {
			objs[i] = items[i]
		}
		if err := inf.GetIndexer().Replace(objs, ""); err != nil {
			f.t.Fatal(err)
		}
	}
	lo := metav1.ListOptions{}
	nodes, err := f.kube.CoreV1().Nodes().List(f.ctx, lo)
	replace(f.kf.Core().V1().Nodes().Informer(), nodes, err)
	nss, err := f.kube.CoreV1().Namespaces().List(f.ctx, lo)
	replace(f.kf.Core().V1().Namespaces().Informer(), nss, err)
	net := f.nf.Network().V1()
	hss, err := f.net.NetworkV1().HostSubnets().List(f.ctx, lo)
	replace(net.HostSubnets().Informer(), hss, err)
	nns, err := f.net.NetworkV1().NetNamespaces().List(f.ctx, lo)
	replace(net.NetNamespaces().Informer(), nns, err)
	cns, err := f.net.NetworkV1().ClusterNetworks().List(f.ctx, lo)
	replace(net.ClusterNetworks().Informer(), cns, err)
	enps, err := f.net.NetworkV1().EgressNetworkPolicies("").List(f.ctx, lo)
	replace(net.EgressNetworkPolicies().Informer(), enps, err)
	nets, err := f.net.NetworkV1().Networks().List(f.ctx, lo)
	replace(net.Networks().Informer(), nets, err)
	nss2, err := f.net.NetworkV1().NetworkSubnets().List(f.ctx, lo)
	replace(net.NetworkSubnets().Informer(), nss2, err)
}

// writes lists the API writes made since the last call, as "verb resource/name[/subresource]".
func (f *fixture) writes() []string {
	var out []string
	for _, a := range append(f.kube.Actions(), f.net.Actions()...) {
		if a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		name := ""
		switch a := a.(type) {
		case interface{ GetObject() runtime.Object }: // create, update
			if m, err := meta.Accessor(a.GetObject()); err == nil {
				name = m.GetName()
			}
		case k8stesting.DeleteAction:
			name = a.GetName()
		}
		w := a.GetVerb() + " " + a.GetResource().Resource + "/" + name
		if sub := a.GetSubresource(); sub != "" {
			w += "/" + sub
		}
		out = append(out, w)
	}
	f.kube.ClearActions()
	f.net.ClearActions()
	return out
}

// failWrites makes the API refuse verb on resource with err until the returned func is called.
func (f *fixture) failWrites(verb, resource string, err error) (heal func()) {
	var mu sync.Mutex
	failing := true
	f.net.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		return failing, nil, err
	})
	return func() { mu.Lock(); failing = false; mu.Unlock() }
}

// syncOnce runs sync(key), the API refusing to create resource with fail when fail is set, and checks
// the error and the writes (wantWrites nil: not checked). heal lets creates through again (nil when
// nothing failed).
func (f *fixture) syncOnce(sync func(context.Context, string) error, key, resource string, fail error, wantErr bool,
	wantWrites []string) (heal func()) {
	f.t.Helper()
	if fail != nil {
		heal = f.failWrites("create", resource, fail)
	}
	if err := sync(f.ctx, key); (err != nil) != wantErr {
		f.t.Fatalf("sync %s: %v, want error %v", key, err, wantErr)
	}
	if w := f.writes(); wantWrites != nil && !slices.Equal(w, wantWrites) {
		f.t.Errorf("writes %q, want %q", w, wantWrites)
	}
	return heal
}

func (f *fixture) hostSubnets() map[string]networkv1.HostSubnet {
	f.t.Helper()
	list, err := f.net.NetworkV1().HostSubnets().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]networkv1.HostSubnet{}
	for _, hs := range list.Items {
		out[hs.Name] = hs
	}
	f.net.ClearActions()
	return out
}

func (f *fixture) netNamespace(name string) (*networkv1.NetNamespace, bool) {
	f.t.Helper()
	nn, err := f.net.NetworkV1().NetNamespaces().Get(f.ctx, name, metav1.GetOptions{})
	f.net.ClearActions()
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return nn, true
}

func (f *fixture) netIDs() map[string]uint32 {
	f.t.Helper()
	list, err := f.net.NetworkV1().NetNamespaces().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.net.ClearActions()
	out := map[string]uint32{}
	for _, nn := range list.Items {
		out[nn.Name] = nn.NetID
	}
	return out
}

// queued drains a queue.
func queued(q workqueue.TypedRateLimitingInterface[string]) []string {
	var out []string
	for q.Len() > 0 {
		k, _ := q.Get()
		q.Done(k)
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func node(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

func internal(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}

func hostSubnet(node, hostIP, subnet string) *networkv1.HostSubnet {
	return &networkv1.HostSubnet{ObjectMeta: metav1.ObjectMeta{Name: node}, Host: node, HostIP: hostIP, Subnet: networkv1.CIDR(subnet)}
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func netNamespace(name string, id uint32, change string) *networkv1.NetNamespace {
	nn := &networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: name}, NetName: name, NetID: id}
	if change != "" {
		nn.Annotations = map[string]string{networkv1.ChangeNetworkAnnotation: change}
	}
	return nn
}

// checkHostSubnets checks the API's HostSubnets against the nodes that should have one (node → hostIP):
// each is a /(32-hostBits) inside the cluster CIDR, named and hosted by its node, and no two overlap.
func checkHostSubnets(t *testing.T, got map[string]networkv1.HostSubnet, want map[string]string, cidr string, hostBits int) {
	t.Helper()
	cluster := netip.MustParsePrefix(cidr)
	if len(got) != len(want) {
		t.Errorf("%d HostSubnets %v, want %d for %v", len(got), got, len(want), want)
	}
	seen := map[netip.Prefix]string{}
	for node, ip := range want {
		hs, ok := got[node]
		if !ok {
			t.Errorf("node %s has no HostSubnet", node)
			continue
		}
		p, err := netip.ParsePrefix(string(hs.Subnet))
		if err != nil || p.Bits() != 32-hostBits || p != p.Masked() || !cluster.Contains(p.Addr()) {
			t.Errorf("node %s: subnet %q is not a /%d of %s", node, hs.Subnet, 32-hostBits, cluster)
		}
		if other, dup := seen[p]; dup {
			t.Errorf("nodes %s and %s share %s", node, other, p)
		}
		seen[p] = node
		if hs.Host != node || hs.HostIP != ip {
			t.Errorf("HostSubnet %s: host %q hostIP %q, want %q %q", node, hs.Host, hs.HostIP, node, ip)
		}
	}
}

func TestSyncNode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cidr    string
		bits    int32
		objects []runtime.Object
		sync    string
		// fail makes the API refuse the HostSubnet create once.
		fail error
		// want: the nodes that have a HostSubnet of the cluster CIDR afterwards, with their hostIP; keep:
		// HostSubnets the controller must leave as they are.
		want       map[string]string
		keep       []string
		wantErr    bool
		wantWrites []string // nil: not checked
		wantEvents []event
		wantStatus bool // the ClusterNetwork status is queued for a refresh
	}{{
		name:       "a new node gets a subnet of the cluster CIDR and its InternalIP as hostIP",
		objects:    []runtime.Object{node("n1", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.1"}, internal("192.0.2.1"))},
		sync:       "n1",
		want:       map[string]string{"n1": "192.0.2.1"},
		wantWrites: []string{"create hostsubnets/n1"},
		wantStatus: true,
	}, {
		name: "a node with no IPv4 InternalIP yet waits for it",
		objects: []runtime.Object{node("n1", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
			internal("2001:db8::1"), internal("not-an-ip"))},
		sync:       "n1",
		want:       map[string]string{},
		wantWrites: []string{},
	}, {
		name: "a second node gets another subnet",
		objects: []runtime.Object{node("n1", internal("192.0.2.1")), hostSubnet("n1", "192.0.2.1", "10.128.0.0/23"),
			node("n2", internal("192.0.2.2"))},
		sync:       "n2",
		want:       map[string]string{"n1": "192.0.2.1", "n2": "192.0.2.2"},
		wantWrites: []string{"create hostsubnets/n2"},
		wantStatus: true,
	}, {
		name:       "a node whose address changed keeps its subnet with the new hostIP",
		objects:    []runtime.Object{node("n1", internal("192.0.2.7")), hostSubnet("n1", "192.0.2.1", "10.128.2.0/23")},
		sync:       "n1",
		want:       map[string]string{"n1": "192.0.2.7"},
		wantWrites: []string{"update hostsubnets/n1"},
	}, {
		name:       "a node whose HostSubnet is current needs no write",
		objects:    []runtime.Object{node("n1", internal("192.0.2.1")), hostSubnet("n1", "192.0.2.1", "10.128.2.0/23")},
		sync:       "n1",
		want:       map[string]string{"n1": "192.0.2.1"},
		wantWrites: []string{},
	}, {
		name:       "a deleted node's HostSubnet goes",
		objects:    []runtime.Object{hostSubnet("gone", "192.0.2.1", "10.128.2.0/23"), node("n2", internal("192.0.2.2")), hostSubnet("n2", "192.0.2.2", "10.128.4.0/23")},
		sync:       "gone",
		want:       map[string]string{"n2": "192.0.2.2"},
		wantWrites: []string{"delete hostsubnets/gone"},
		wantStatus: true,
	}, {
		name: "no subnet left: the node waits, with one Warning Event on it",
		cidr: "10.0.0.0/25", bits: 6, // two /26s
		objects: []runtime.Object{node("n1", internal("192.0.2.1")), hostSubnet("n1", "192.0.2.1", "10.0.0.0/26"),
			node("n2", internal("192.0.2.2")), hostSubnet("n2", "192.0.2.2", "10.0.0.64/26"), node("n3", internal("192.0.2.3"))},
		sync:       "n3",
		want:       map[string]string{"n1": "192.0.2.1", "n2": "192.0.2.2"},
		wantWrites: []string{},
		wantEvents: []event{{"n3", corev1.EventTypeWarning, "SubnetExhausted", ""}},
		wantStatus: true,
	}, {
		name: "a HostSubnet outside the cluster CIDR is neither counted nor deleted",
		cidr: "10.0.0.0/25", bits: 6,
		objects:    []runtime.Object{hostSubnet("old", "192.0.2.9", "10.99.0.0/26"), node("old", internal("192.0.2.9")), node("n1", internal("192.0.2.1"))},
		sync:       "n1",
		want:       map[string]string{"n1": "192.0.2.1"},
		keep:       []string{"old"},
		wantWrites: []string{"create hostsubnets/n1"},
		wantEvents: []event{{"old", corev1.EventTypeWarning, "InvalidSubnet", ""}}, // from the rebuild
		wantStatus: true,
	}, {
		name: "a refused create is retried and frees the subnet it held",
		cidr: "10.0.0.0/26", bits: 6, // one subnet: held by a failed create, nothing would be left
		objects: []runtime.Object{node("n1", internal("192.0.2.1"))},
		sync:    "n1",
		fail:    apierrors.NewServiceUnavailable("etcd down"),
		want:    map[string]string{},
		wantErr: true,
	}, {
		name: "a create refused as already existing is retried too",
		cidr: "10.0.0.0/26", bits: 6,
		objects: []runtime.Object{node("n1", internal("192.0.2.1"))},
		sync:    "n1",
		fail:    apierrors.NewAlreadyExists(schema.GroupResource{Group: networkv1.GroupName, Resource: "hostsubnets"}, "n1"),
		want:    map[string]string{},
		wantErr: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			o := fixtureOpts{}
			if tc.cidr != "" {
				o.spec = clusterSpec(tc.cidr, tc.bits)
			}
			f := newFixture(t, o, tc.objects...)
			heal := f.syncOnce(f.c.syncNode, tc.sync, "hostsubnets", tc.fail, tc.wantErr, tc.wantWrites)
			cidr := string(f.c.accepted.ClusterCIDRs[0])
			got := f.hostSubnets()
			for _, name := range tc.keep {
				if hs, ok := got[name]; !ok || !reflect.DeepEqual(&hs, hostSubnetOf(tc.objects, name)) {
					t.Errorf("HostSubnet %s changed: %+v", name, got[name])
				}
				delete(got, name)
			}
			checkHostSubnets(t, got, tc.want, cidr, int(f.c.accepted.HostSubnetLength))
			checkEvents(t, f.events.take(), tc.wantEvents)
			// A change in the allocations refreshes the ClusterNetwork's status (a failed attempt may or may not).
			if got := slices.Contains(queued(f.c.statusQ), networkv1.ClusterNetworkName); got != tc.wantStatus && tc.fail == nil {
				t.Errorf("status refresh queued %v, want %v", got, tc.wantStatus)
			}
			if heal != nil {
				// The retry, once the API takes writes again, gets the subnet the failed attempt held.
				heal()
				if err := f.c.syncNode(f.ctx, tc.sync); err != nil {
					t.Fatalf("retry: %v", err)
				}
				checkHostSubnets(t, f.hostSubnets(), map[string]string{tc.sync: "192.0.2.1"}, cidr, int(f.c.accepted.HostSubnetLength))
			}
		})
	}
}

func hostSubnetOf(objects []runtime.Object, name string) *networkv1.HostSubnet {
	for _, o := range objects {
		if hs, ok := o.(*networkv1.HostSubnet); ok && hs.Name == name {
			return hs
		}
	}
	return nil
}

// checkEvents compares Events by object, type and reason (messages are for people).
func checkEvents(t *testing.T, got, want []event) {
	t.Helper()
	for i := range got {
		got[i].message = ""
	}
	if !slices.Equal(got, want) {
		t.Errorf("events %+v, want %+v", got, want)
	}
}

// Exhaustion end to end: a node waits while the CIDR is full, the Event is not repeated, the status
// says so, and the subnet a deleted node frees goes to the waiting node.
func TestSubnetExhaustionAndRelease(t *testing.T) {
	f := newFixture(t, fixtureOpts{spec: clusterSpec("10.0.0.0/25", 6)}, // two /26s
		node("n1", internal("192.0.2.1")), node("n2", internal("192.0.2.2")), node("n3", internal("192.0.2.3")))
	for _, n := range []string{"n1", "n2", "n3", "n3"} { // n3 twice: it is retried while it waits
		if err := f.c.syncNode(f.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	f.resync()
	checkHostSubnets(t, f.hostSubnets(), map[string]string{"n1": "192.0.2.1", "n2": "192.0.2.2"}, "10.0.0.0/25", 6)
	checkEvents(t, f.events.take(), []event{{"n3", corev1.EventTypeWarning, "SubnetExhausted", ""}})

	if err := f.c.syncStatus(f.ctx, networkv1.ClusterNetworkName); err != nil {
		t.Fatal(err)
	}
	cn, err := f.net.NetworkV1().ClusterNetworks().Get(f.ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(cn.Status.Conditions, networkv1.ConditionSubnetsAvailable); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("SubnetsAvailable = %+v, want False while n3 waits", c)
	}
	if cn.Status.AllocatedSubnets != 2 || cn.Status.TotalSubnets != 2 {
		t.Errorf("status counts %d/%d, want 2/2", cn.Status.AllocatedSubnets, cn.Status.TotalSubnets)
	}

	// n1 goes: its subnet is freed and the waiting node is queued, and gets it.
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	freed := netip.MustParsePrefix(string(f.hostSubnets()["n1"].Subnet))
	queued(f.c.nodeQ)
	if err := f.c.syncNode(f.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if got := queued(f.c.nodeQ); !slices.Equal(got, []string{"n3"}) {
		t.Fatalf("queued nodes %v after a subnet was freed, want the waiting n3", got)
	}
	f.resync()
	if err := f.c.syncNode(f.ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	got := f.hostSubnets()
	checkHostSubnets(t, got, map[string]string{"n2": "192.0.2.2", "n3": "192.0.2.3"}, "10.0.0.0/25", 6)
	if string(got["n3"].Subnet) != freed.String() {
		t.Errorf("n3 got %s; the only free subnet is %s", got["n3"].Subnet, freed)
	}
	f.resync()
	if err := f.c.syncStatus(f.ctx, networkv1.ClusterNetworkName); err != nil {
		t.Fatal(err)
	}
	cn, _ = f.net.NetworkV1().ClusterNetworks().Get(f.ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if !meta.IsStatusConditionTrue(cn.Status.Conditions, networkv1.ConditionSubnetsAvailable) {
		t.Errorf("SubnetsAvailable not True once every node has a subnet: %+v", cn.Status.Conditions)
	}
}

// A sync that runs again before the informer shows the HostSubnet or NetNamespace it created must not
// allocate a second one: it creates the same object again, which the API answers AlreadyExists.
func TestSyncBeforeTheInformerCaughtUp(t *testing.T) {
	f := newFixture(t, fixtureOpts{}, node("n1", internal("192.0.2.1")), namespace("t1"))
	var subnets []networkv1.CIDR
	var ids []uint32
	for range 2 {
		if err := f.c.syncNode(f.ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := f.c.syncNamespace(f.ctx, "t1"); err != nil {
			t.Fatal(err)
		}
		subnets = append(subnets, f.hostSubnets()["n1"].Subnet)
		nn, _ := f.netNamespace("t1")
		ids = append(ids, nn.NetID)
	}
	if subnets[0] == "" || subnets[0] != subnets[1] || ids[0] != ids[1] {
		t.Errorf("subnets %v, NETIDs %v: want one of each, unchanged", subnets, ids)
	}
	if used := f.c.subnetA.Used(); used != 1 {
		t.Errorf("%d subnets allocated, want 1", used)
	}
	if n := len(f.c.vnidA.InUse()); n != 1 {
		t.Errorf("%d VNIDs in use, want 1", n)
	}
}

func TestSyncNamespace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vnids   [2]uint32
		objects []runtime.Object
		sync    string
		fail    error
		wantErr bool
		// want is the NETID the namespace's NetNamespace has afterwards: "fresh" (one no other
		// NetNamespace has), "global" (0), "none" (no NetNamespace), or "keep" (what it had).
		want       string
		wantWrites []string
	}{{
		name: "a new namespace gets a VNID of its own", objects: []runtime.Object{namespace("t1"), namespace("t2"), netNamespace("t2", 10, "")},
		sync: "t1", want: "fresh", wantWrites: []string{"create netnamespaces/t1"},
	}, {
		name: "default is global", objects: []runtime.Object{namespace("default")},
		sync: "default", want: "global", wantWrites: []string{"create netnamespaces/default"},
	}, {
		name: "a configured global namespace is global", objects: []runtime.Object{namespace("kube-system")},
		sync: "kube-system", want: "global", wantWrites: []string{"create netnamespaces/kube-system"},
	}, {
		name: "an existing NetNamespace is left as it is", objects: []runtime.Object{namespace("t1"), netNamespace("t1", 4242, "")},
		sync: "t1", want: "keep", wantWrites: []string{},
	}, {
		name: "a deleted namespace's NetNamespace goes", objects: []runtime.Object{netNamespace("gone", 12, "")},
		sync: "gone", want: "none", wantWrites: []string{"delete netnamespaces/gone"},
	}, {
		name: "no VNID left: retried, nothing created", vnids: [2]uint32{10, 11},
		objects: []runtime.Object{namespace("t1"), netNamespace("a", 10, ""), netNamespace("b", 11, "")},
		sync:    "t1", wantErr: true, want: "none", wantWrites: []string{},
	}, {
		name: "a refused create is retried", objects: []runtime.Object{namespace("t1")}, fail: apierrors.NewServiceUnavailable("etcd down"),
		sync: "t1", wantErr: true, want: "none",
	}, {
		name: "a NetNamespace another writer made first is taken as it is", objects: []runtime.Object{namespace("t1")},
		fail: apierrors.NewAlreadyExists(schema.GroupResource{Group: networkv1.GroupName, Resource: "netnamespaces"}, "t1"),
		sync: "t1", wantErr: true, want: "none",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{vnids: tc.vnids}, tc.objects...)
			before := f.netIDs()
			inUse := f.c.vnidA.InUse()
			heal := f.syncOnce(f.c.syncNamespace, tc.sync, "netnamespaces", tc.fail, tc.wantErr, tc.wantWrites)
			after := f.netIDs()
			id, has := after[tc.sync]
			switch tc.want {
			case "none":
				if has {
					t.Errorf("%s has a NetNamespace (NETID %d), want none", tc.sync, id)
				}
			case "keep":
				if !has || id != before[tc.sync] {
					t.Errorf("%s: NETID %d (present %v), want its %d", tc.sync, id, has, before[tc.sync])
				}
			case "global":
				if !has || id != networkv1.GlobalVNID {
					t.Errorf("%s: NETID %d (present %v), want 0", tc.sync, id, has)
				}
			case "fresh":
				if !has || id < networkv1.MinVNID || id > networkv1.MaxVNID {
					t.Errorf("%s: NETID %d (present %v), want one of %d-%d", tc.sync, id, has, networkv1.MinVNID, networkv1.MaxVNID)
				}
				for other, oid := range after {
					if other != tc.sync && oid == id {
						t.Errorf("%s got NETID %d, which %s has", tc.sync, id, other)
					}
				}
				if nn, _ := f.netNamespace(tc.sync); nn.NetName != tc.sync {
					t.Errorf("NetName %q, want %q", nn.NetName, tc.sync)
				}
			}
			if tc.want == "none" && !has {
				// Whatever failed, the VNIDs in use are those of the NetNamespaces that exist.
				var want []uint32
				for _, id := range after {
					if id != networkv1.GlobalVNID {
						want = append(want, id)
					}
				}
				slices.Sort(want)
				if got := f.c.vnidA.InUse(); !slices.Equal(got, want) {
					t.Errorf("VNIDs in use %v (before %v), want those of the NetNamespaces, %v", got, inUse, want)
				}
			}
			if heal != nil {
				heal()
				f.resync()
				if err := f.c.syncNamespace(f.ctx, tc.sync); err != nil {
					t.Fatalf("retry: %v", err)
				}
				if _, ok := f.netNamespace(tc.sync); !ok {
					t.Errorf("retry created no NetNamespace")
				}
			}
		})
	}
}

// A VNID shared after a join is freed only when its last namespace goes.
func TestSharedVNIDFreedByItsLastNamespace(t *testing.T) {
	f := newFixture(t, fixtureOpts{}, netNamespace("a", 12, ""), netNamespace("b", 12, ""))
	if err := f.c.syncNamespace(f.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if users := f.c.vnidA.Users(12); users != 1 {
		t.Errorf("VNID 12 has %d users after a went, want 1 (b)", users)
	}
	if err := f.c.syncNamespace(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if users := f.c.vnidA.Users(12); users != 0 {
		t.Errorf("VNID 12 has %d users after both went", users)
	}
}

func TestSyncChangeNetwork(t *testing.T) {
	// a, b and c are tenants; c shares b's VNID (joined before); g is global.
	base := func(aChange string) []runtime.Object {
		return []runtime.Object{netNamespace("a", 10, aChange), netNamespace("b", 11, ""), netNamespace("c", 11, ""), netNamespace("g", 0, "")}
	}
	for _, tc := range []struct {
		name    string
		vnids   [2]uint32
		change  string
		fail    error
		wantErr bool
		// want is a's NETID afterwards: a number, or -1 for "one no other NetNamespace has".
		want        int64
		wantEvent   string // reason of the Event on a
		wantCleared bool
	}{
		{name: "join takes the target's NETID", change: "join:b", want: 11, wantEvent: "NetIDChanged", wantCleared: true},
		{name: "join a global namespace makes it global", change: "join:g", want: 0, wantEvent: "NetIDChanged", wantCleared: true},
		{name: "isolate gives a NETID no one else has", change: "isolate", want: -1, wantEvent: "NetIDChanged", wantCleared: true},
		{name: "global makes the NETID 0", change: "global", want: 0, wantEvent: "NetIDChanged", wantCleared: true},
		{name: "join itself is refused", change: "join:a", want: 10, wantEvent: "InvalidChangeNetwork", wantCleared: true},
		{name: "join a namespace without a NetNamespace is refused", change: "join:nope", want: 10, wantEvent: "InvalidChangeNetwork", wantCleared: true},
		{name: "a malformed target is refused", change: "join:Not_A_Name", want: 10, wantEvent: "InvalidChangeNetwork", wantCleared: true},
		{name: "an unknown request is refused", change: "merge-with:b", want: 10, wantEvent: "InvalidChangeNetwork", wantCleared: true},
		{name: "isolate with no VNID left is refused", vnids: [2]uint32{10, 11}, change: "isolate", want: 10, wantEvent: "InvalidChangeNetwork", wantCleared: true},
		{name: "a refused update is retried", change: "join:b", fail: apierrors.NewServiceUnavailable("etcd down"), wantErr: true, want: 10},
		{name: "a refused isolate is retried", change: "isolate", fail: apierrors.NewConflict(schema.GroupResource{Resource: "netnamespaces"}, "a", errors.New("changed")), wantErr: true, want: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{vnids: tc.vnids}, base(tc.change)...)
			users := map[uint32]int{10: f.c.vnidA.Users(10), 11: f.c.vnidA.Users(11)}
			inUse := f.c.vnidA.InUse()
			var heal func()
			if tc.fail != nil {
				heal = f.failWrites("update", "netnamespaces", tc.fail)
			}
			err := f.c.syncChangeNetwork(f.ctx, "a")
			if (err != nil) != tc.wantErr {
				t.Fatalf("syncChangeNetwork: %v, want error %v", err, tc.wantErr)
			}
			nn, _ := f.netNamespace("a")
			_, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]
			if pending == tc.wantCleared {
				t.Errorf("request still pending %v, want cleared %v", pending, tc.wantCleared)
			}
			ids := f.netIDs()
			switch {
			case tc.want >= 0 && int64(nn.NetID) != tc.want:
				t.Errorf("a has NETID %d, want %d", nn.NetID, tc.want)
			case tc.want < 0:
				for other, id := range ids {
					if other != "a" && id == nn.NetID || nn.NetID < networkv1.MinVNID {
						t.Errorf("a got NETID %d; %s has %d", nn.NetID, other, id)
					}
				}
			}
			for _, other := range []string{"b", "c", "g"} {
				if want := map[string]uint32{"b": 11, "c": 11, "g": 0}[other]; ids[other] != want {
					t.Errorf("%s's NETID changed to %d", other, ids[other])
				}
			}
			var reasons []string
			for _, e := range f.events.take() {
				if e.object == "a" {
					reasons = append(reasons, e.reason)
				}
			}
			if tc.wantEvent == "" && len(reasons) > 0 || tc.wantEvent != "" && !slices.Equal(reasons, []string{tc.wantEvent}) {
				t.Errorf("Events on a: %v, want %q", reasons, tc.wantEvent)
			}
			// The allocator counts exactly the NetNamespaces' VNIDs.
			count := map[uint32]int{}
			for _, id := range ids {
				if id != networkv1.GlobalVNID {
					count[id]++
				}
			}
			for id, n := range count {
				if got := f.c.vnidA.Users(id); got != n {
					t.Errorf("VNID %d: %d users counted, %d NetNamespaces have it (before: %v, in use %v)", id, got, n, users, inUse)
				}
			}
			if got := len(f.c.vnidA.InUse()); got != len(count) {
				t.Errorf("%d VNIDs in use %v, %d in NetNamespaces %v", got, f.c.vnidA.InUse(), len(count), ids)
			}
			if heal != nil {
				heal()
				f.resync()
				if err := f.c.syncChangeNetwork(f.ctx, "a"); err != nil {
					t.Fatalf("retry: %v", err)
				}
				nn, _ := f.netNamespace("a")
				if _, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]; pending || nn.NetID == 10 {
					t.Errorf("retry did not carry the request out: NETID %d, annotations %v", nn.NetID, nn.Annotations)
				}
			}
		})
	}
}

// A NetNamespace with no request, or none at all, needs nothing.
func TestSyncChangeNetworkNothingToDo(t *testing.T) {
	f := newFixture(t, fixtureOpts{}, netNamespace("a", 10, ""))
	for _, name := range []string{"a", "gone"} {
		if err := f.c.syncChangeNetwork(f.ctx, name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if w := f.writes(); len(w) > 0 {
		t.Errorf("writes %q, want none", w)
	}
}

// Objects another writer made (an admin, or a previous leader whose last write landed after this one
// rebuilt) are counted the moment the controller sees them: their subnets and VNIDs are never handed out
// a second time.
func TestAdoptsWhatOtherWritersMade(t *testing.T) {
	t.Run("a HostSubnet", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{spec: clusterSpec("10.0.0.0/25", 6)}, node("n1", internal("192.0.2.1")), node("n2", internal("192.0.2.2")))
		if err := f.net.Tracker().Add(hostSubnet("n1", "192.0.2.1", "10.0.0.0/26")); err != nil {
			t.Fatal(err)
		}
		f.resync()
		for _, n := range []string{"n1", "n2"} {
			if err := f.c.syncNode(f.ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		checkHostSubnets(t, f.hostSubnets(), map[string]string{"n1": "192.0.2.1", "n2": "192.0.2.2"}, "10.0.0.0/25", 6)
	})
	t.Run("a NetNamespace that won the race to create", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{vnids: [2]uint32{10, 11}}, namespace("t1"), namespace("t2"))
		var once sync.Once
		f.net.PrependReactor("create", "netnamespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
			handled := false
			once.Do(func() {
				handled = true
				if err := f.net.Tracker().Add(netNamespace("t1", 11, "")); err != nil {
					t.Error(err)
				}
			})
			if handled {
				return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: networkv1.GroupName, Resource: "netnamespaces"}, "t1")
			}
			return false, nil, nil
		})
		if err := f.c.syncNamespace(f.ctx, "t1"); err == nil {
			t.Fatal("lost the race to create, yet no retry")
		}
		f.resync()
		for _, ns := range []string{"t1", "t2"} {
			if err := f.c.syncNamespace(f.ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
		if ids := f.netIDs(); ids["t1"] != 11 || ids["t2"] != 10 {
			t.Errorf("NETIDs %v, want t1 keeping the 11 the other writer gave it and t2 the other VNID, 10", ids)
		}
	})
	t.Run("a NetNamespace with a request before its namespace sync", func(t *testing.T) {
		f := newFixture(t, fixtureOpts{}, netNamespace("b", 11, ""))
		if err := f.net.Tracker().Add(netNamespace("x", 11, "isolate")); err != nil { // joined to b by hand
			t.Fatal(err)
		}
		f.resync()
		if err := f.c.syncChangeNetwork(f.ctx, "x"); err != nil {
			t.Fatal(err)
		}
		ids := f.netIDs()
		if ids["x"] == 11 || ids["x"] < networkv1.MinVNID {
			t.Errorf("x isolated to %d", ids["x"])
		}
		if users := f.c.vnidA.Users(11); users != 1 {
			t.Errorf("VNID 11 counts %d users; b still has it", users)
		}
	})
}

// An object the controller cannot count is reported once, not on every sync (a Node's status changes
// every few seconds and each change syncs it).
func TestInvalidObjectsReportedOnce(t *testing.T) {
	f := newFixture(t, fixtureOpts{spec: clusterSpec("10.0.0.0/25", 6)},
		node("odd", internal("192.0.2.9")), hostSubnet("odd", "192.0.2.9", "10.99.0.0/26"), namespace("bad"), netNamespace("bad", 1, ""))
	checkEvents(t, f.events.take(), []event{{"odd", corev1.EventTypeWarning, "InvalidSubnet", ""}, {"bad", corev1.EventTypeWarning, "InvalidNetID", ""}})
	for range 3 {
		if err := f.c.syncNode(f.ctx, "odd"); err != nil {
			t.Fatal(err)
		}
		if err := f.c.syncNamespace(f.ctx, "bad"); err != nil {
			t.Fatal(err)
		}
	}
	checkEvents(t, f.events.take(), nil)
	if w := f.writes(); len(w) > 0 {
		t.Errorf("writes %q to objects that must be left alone", w)
	}
	if used := f.c.subnetA.Used(); used != 0 {
		t.Errorf("%d subnets counted, want 0", used)
	}
}

func TestSyncStatus(t *testing.T) {
	allocated := []runtime.Object{node("n1", internal("192.0.2.1")), hostSubnet("n1", "192.0.2.1", "10.0.0.64/26")}
	for _, tc := range []struct {
		name       string
		edit       func(*networkv1.ClusterNetwork) // nil: deleted
		wantValid  metav1.ConditionStatus
		wantReason string
		wantTotal  int64 // subnets the accepted spec holds
		wantEvent  bool
	}{{
		name: "an unchanged spec is valid", edit: func(*networkv1.ClusterNetwork) {},
		wantValid: metav1.ConditionTrue, wantReason: "Accepted", wantTotal: 2,
	}, {
		name:      "a larger CIDR holding every allocation is accepted",
		edit:      func(cn *networkv1.ClusterNetwork) { cn.Spec.ClusterCIDRs = []networkv1.CIDR{"10.0.0.0/24"} },
		wantValid: metav1.ConditionTrue, wantReason: "Accepted", wantTotal: 4,
	}, {
		name:      "a spec that would orphan an allocated subnet is refused",
		edit:      func(cn *networkv1.ClusterNetwork) { cn.Spec.ClusterCIDRs = []networkv1.CIDR{"10.1.0.0/24"} },
		wantValid: metav1.ConditionFalse, wantReason: "OrphansSubnets", wantTotal: 2, wantEvent: true,
	}, {
		name:      "an invalid spec is refused",
		edit:      func(cn *networkv1.ClusterNetwork) { cn.Spec.ClusterCIDRs = []networkv1.CIDR{"10.0.0.1/33"} },
		wantValid: metav1.ConditionFalse, wantReason: "InvalidSpec", wantTotal: 2, wantEvent: true,
	}, {
		name:      "a deleted ClusterNetwork comes back with the accepted spec",
		wantValid: metav1.ConditionTrue, wantReason: "Accepted", wantTotal: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOpts{spec: clusterSpec("10.0.0.0/25", 6)}, allocated...)
			f.events.take()
			cn, err := f.net.NetworkV1().ClusterNetworks().Get(f.ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit == nil {
				err = f.net.NetworkV1().ClusterNetworks().Delete(f.ctx, cn.Name, metav1.DeleteOptions{})
			} else {
				tc.edit(cn)
				cn.Generation++
				_, err = f.net.NetworkV1().ClusterNetworks().Update(f.ctx, cn, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			// Twice when deleted: first it is recreated, then its status is written.
			for range 2 {
				f.resync()
				if err := f.c.syncStatus(f.ctx, networkv1.ClusterNetworkName); err != nil {
					t.Fatal(err)
				}
			}
			cn, err = f.net.NetworkV1().ClusterNetworks().Get(f.ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit == nil && !reflect.DeepEqual(cn.Spec, clusterSpec("10.0.0.0/25", 6)) {
				t.Errorf("recreated with %+v", cn.Spec)
			}
			c := meta.FindStatusCondition(cn.Status.Conditions, networkv1.ConditionValid)
			if c == nil || c.Status != tc.wantValid || c.Reason != tc.wantReason || c.ObservedGeneration != cn.Generation {
				t.Errorf("Valid = %+v, want %s/%s at generation %d", c, tc.wantValid, tc.wantReason, cn.Generation)
			}
			if cn.Status.TotalSubnets != tc.wantTotal || cn.Status.AllocatedSubnets != 1 {
				t.Errorf("status counts %d/%d, want 1/%d", cn.Status.AllocatedSubnets, cn.Status.TotalSubnets, tc.wantTotal)
			}
			var reasons []string
			for _, e := range f.events.take() {
				reasons = append(reasons, e.reason)
			}
			if got := len(reasons) == 1 && reasons[0] == tc.wantReason; got != tc.wantEvent || !tc.wantEvent && len(reasons) > 0 {
				t.Errorf("Events %v, want one %s: %v", reasons, tc.wantReason, tc.wantEvent)
			}
		})
	}
}

// A HostSubnet or NetNamespace deleted by hand comes back with the subnet or VNID it had: the node's
// pods keep their addresses, the namespace its tenant. Also when the deletion crosses the node's own
// re-creation (the informer still showing the HostSubnet the controller has just deleted).
func TestDeletedByHandComesBack(t *testing.T) {
	f := newFixture(t, fixtureOpts{}, node("n1", internal("192.0.2.1")), hostSubnet("n1", "192.0.2.1", "10.128.2.0/23"),
		namespace("t1"), netNamespace("t1", 77, ""))
	if err := f.net.NetworkV1().NetNamespaces().Delete(f.ctx, "t1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	if err := f.c.syncNamespace(f.ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if nn, ok := f.netNamespace("t1"); !ok || nn.NetID != 77 {
		t.Errorf("after a deletion by hand: NetNamespace %+v (present %v), want NETID 77 back", nn, ok)
	}

	if err := f.net.NetworkV1().HostSubnets().Delete(f.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	if err := f.c.syncNode(f.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if hs, ok := f.hostSubnets()["n1"]; !ok || hs.Subnet != "10.128.2.0/23" {
		t.Errorf("after a deletion by hand: HostSubnet %+v (present %v), want 10.128.2.0/23 back", hs, ok)
	}

	// The node goes (its HostSubnet is deleted) and comes back before the informer shows that deletion.
	if err := f.kube.CoreV1().Nodes().Delete(f.ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.resync()
	if err := f.c.syncNode(f.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.kube.CoreV1().Nodes().Create(f.ctx, node("n1", internal("192.0.2.1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The informers show the new Node but still the deleted HostSubnet.
	f.resync()
	if err := f.nf.Network().V1().HostSubnets().Informer().GetIndexer().Add(hostSubnet("n1", "192.0.2.1", "10.128.2.0/23")); err != nil {
		t.Fatal(err)
	}
	if err := f.c.syncNode(f.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	f.resync() // now the deletion shows
	if err := f.c.syncNode(f.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	checkHostSubnets(t, f.hostSubnets(), map[string]string{"n1": "192.0.2.1"}, "10.128.0.0/14", 9)
}
