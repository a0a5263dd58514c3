package agent

// The informer handlers through agent.New on fake clientsets (no root, no OVS): each test puts objects
// in the fake API, runs the agent's informers (syncInformers, the "sync informers" start-up step) and
// checks the node view's snapshot against what the objects mean. A change the agent must ignore is
// followed by a valid marker change on the same informer: events of one informer arrive in order, so
// once the marker shows, the ignored change has been handled.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/egress"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkfake "github.com/ofsdn/ofsdn/client/clientset/versioned/fake"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/proc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
)

const testNode = "n1"

// The informers the agent runs, by resource: all of them must watch before a test changes anything
// (the fake API drops events between an informer's list and its watch).
var agentWatches = []string{"clusternetworks", "hostsubnets", "netnamespaces", "services", "endpointslices", "pods", "namespaces", "networkpolicies",
	"egressnetworkpolicies"}

// waitTimeout bounds every wait for an informer event: a guard against a hang, not a speed target.
const waitTimeout = time.Minute

type fakeAPI struct {
	kube   *kubefake.Clientset
	net    *networkfake.Clientset
	ctx    context.Context
	logs   *logLines // what the agent logged
	events *eventLog // the Events it recorded
}

// logLines keeps an agent's log lines, so a test can tell that an event it must ignore was handled.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{})
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// count is how many lines hold s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// startAgent builds an agent on fake clientsets holding objects, runs its informers until the test ends
// and returns once every informer watches.
func startAgent(t testing.TB, objects ...runtime.Object) (*Agent, *fakeAPI) {
	t.Helper()
	a, api, watching := newTestAgent(t, objects...)
	if err := a.syncInformers(api.ctx); err != nil {
		t.Fatal(err)
	}
	var seen []string
	proc.Eventually(t, waitTimeout, "every informer watching", func() bool {
		for {
			select {
			case r := <-watching:
				seen = append(seen, r)
			default:
				for _, r := range agentWatches {
					if !slices.Contains(seen, r) {
						return false
					}
				}
				return true
			}
		}
	})
	return a, api
}

// newTestAgent builds an agent on fake clientsets holding objects; watching tells each watch opened.
func newTestAgent(t testing.TB, objects ...runtime.Object) (*Agent, *fakeAPI, chan string) {
	t.Helper()
	var kubeObjs, netObjs []runtime.Object
	for _, o := range objects {
		switch o.(type) {
		case *networkv1.ClusterNetwork, *networkv1.HostSubnet, *networkv1.NetNamespace, *networkv1.EgressNetworkPolicy:
			netObjs = append(netObjs, o)
		default:
			kubeObjs = append(kubeObjs, o)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	api := &fakeAPI{kube: kubefake.NewClientset(kubeObjs...), net: networkfake.NewSimpleClientset(netObjs...), ctx: ctx, logs: &logLines{},
		events: &eventLog{}}
	watching := make(chan string, 2*len(agentWatches))
	for _, cs := range []interface {
		PrependWatchReactor(string, k8stesting.WatchReactionFunc)
		Tracker() k8stesting.ObjectTracker
	}{api.kube, api.net} {
		cs.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
			w, err := cs.Tracker().Watch(action.GetResource(), action.GetNamespace())
			if err != nil {
				return false, nil, err
			}
			watching <- action.GetResource().Resource
			return true, w, nil
		})
	}

	a, err := New(Config{NodeName: testNode, Logger: api.logs.logger()}, Deps{Kube: api.kube, Net: api.net, Events: api.events})
	if err != nil {
		t.Fatal(err)
	}
	return a, api, watching
}

// waitSnapshot waits until the view's snapshot satisfies ok and returns it; on a timeout it fails
// with the last snapshot.
func waitSnapshot(t *testing.T, a *Agent, what string, ok func(st pipeline.NodeState, pending []string) bool) pipeline.NodeState {
	t.Helper()
	var st pipeline.NodeState
	var pending []string
	if err := proc.Until(context.Background(), waitTimeout, func() bool {
		snap := a.view.snapshot()
		st, pending = snap.state, snap.waiting
		return ok(st, pending)
	}); err != nil {
		t.Fatalf("waiting for %s: %v; the view has %+v (pending %v)", what, err, st, pending)
	}
	return st
}

func clusterNetwork(name string, mode networkv1.PluginMode, cidrs ...networkv1.CIDR) *networkv1.ClusterNetwork {
	return &networkv1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkv1.ClusterNetworkSpec{ClusterCIDRs: cidrs,
		HostSubnetLength: 9, ServiceNetwork: "172.30.0.0/16", PluginMode: mode}}
}

func hostSubnet(name, host, hostIP, subnet string) *networkv1.HostSubnet {
	return &networkv1.HostSubnet{ObjectMeta: metav1.ObjectMeta{Name: name}, Host: host, HostIP: hostIP, Subnet: networkv1.CIDR(subnet)}
}

func netNamespace(name string, id uint32) *networkv1.NetNamespace {
	return &networkv1.NetNamespace{ObjectMeta: metav1.ObjectMeta{Name: name}, NetName: name, NetID: id}
}

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func TestClusterNetworkHandler(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cn       *networkv1.ClusterNetwork
		wantMode pipeline.Mode
		wantNets []netip.Prefix
		wantLog  string // an error the agent must log about the object
	}{
		{"multitenant", clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"), pipeline.ModeMultitenant, prefixes("10.128.0.0/14"), ""},
		{"subnet, two CIDRs, a host address masked to its network", clusterNetwork("default", networkv1.PluginModeSubnet, "10.128.0.0/14", "10.200.0.7/16"),
			pipeline.ModeSubnet, prefixes("10.128.0.0/14", "10.200.0.0/16"), ""},
		{"networkpolicy", clusterNetwork("default", networkv1.PluginModeNetworkPolicy, "10.128.0.0/14"), pipeline.ModeNetworkPolicy, prefixes("10.128.0.0/14"), ""},
		{"a malformed CIDR is dropped, the others kept", clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/33", "10.132.0.0/14"),
			pipeline.ModeMultitenant, prefixes("10.132.0.0/14"), `"cidr"="10.128.0.0/33"`},
		{"an unknown mode is flat", clusterNetwork("default", "openflow-magic", "10.128.0.0/14"), pipeline.ModeSubnet, prefixes("10.128.0.0/14"),
			`unknown pluginMode \"openflow-magic\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, api := startAgent(t, tc.cn)
			// syncInformers returned: the handlers have seen every object the API held.
			if st := a.view.snapshot().state; st.Mode != tc.wantMode || !reflect.DeepEqual(st.ClusterNetworks, tc.wantNets) {
				t.Errorf("mode %s networks %v, want %s %v", st.Mode, st.ClusterNetworks, tc.wantMode, tc.wantNets)
			}
			if tc.wantLog != "" && api.logs.count(tc.wantLog) != 1 {
				t.Errorf("no error logged with %s:\n%s", tc.wantLog, api.logs)
			}
		})
	}

	t.Run("deleting default keeps the last configuration", func(t *testing.T) {
		a, api := startAgent(t, clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"))
		if err := api.net.NetworkV1().ClusterNetworks().Delete(api.ctx, "default", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		proc.Eventually(t, waitTimeout, "the deletion handled", func() bool { return api.logs.count("ClusterNetwork deleted") == 1 })
		if st := a.view.snapshot().state; st.Mode != pipeline.ModeMultitenant || !reflect.DeepEqual(st.ClusterNetworks, prefixes("10.128.0.0/14")) {
			t.Errorf("after the deletion: mode %s networks %v", st.Mode, st.ClusterNetworks)
		}
	})
	t.Run("another ClusterNetwork than default is ignored", func(t *testing.T) {
		a, _ := startAgent(t, clusterNetwork("other", networkv1.PluginModeMultitenant, "10.0.0.0/8"))
		if st := a.view.snapshot().state; st.Mode != pipeline.ModeSubnet || len(st.ClusterNetworks) != 0 {
			t.Errorf("ClusterNetwork other configured the node: mode %s networks %v", st.Mode, st.ClusterNetworks)
		}
	})
}

// Every object the API held when the agent started is in the view once its informers have synced: the
// first render after a restart must not miss a tenant (its pods' flows would be deleted).
func TestSyncInformersHandlesEveryInitialObject(t *testing.T) {
	objs := []runtime.Object{clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14")}
	const n = 3000
	for i := range n {
		objs = append(objs, netNamespace(fmt.Sprintf("ns-%d", i), uint32(10+i)))
	}
	a, api, _ := newTestAgent(t, objs...)
	if err := a.syncInformers(api.ctx); err != nil {
		t.Fatal(err)
	}
	a.view.mu.Lock()
	got := len(a.view.vnids)
	a.view.mu.Unlock()
	if got != n {
		t.Errorf("%d of %d NetNamespaces in the view when syncInformers returned", got, n)
	}
}

func TestHostSubnetHandler(t *testing.T) {
	a, api := startAgent(t,
		clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"),
		hostSubnet(testNode, testNode, "192.0.2.1", "10.128.0.1/23"), // a host address: the node gets the network
		hostSubnet("n3", "n3", "192.0.2.3", "10.128.4.0/23"),
		hostSubnet("n2", "n2", "192.0.2.2", "10.128.2.0/23"),
		hostSubnet("bad", "bad", "192.0.2.9", "not-a-cidr"),
		hostSubnet("badip", "badip", "192.0.2.300", "10.128.8.0/23"),
	)
	remote := func(name, ip, subnet string) pipeline.RemoteNode {
		return pipeline.RemoteNode{Name: name, NodeIP: netip.MustParseAddr(ip), Subnet: netip.MustParsePrefix(subnet)}
	}
	st := a.view.snapshot().state
	if n := api.logs.count("malformed HostSubnet ignored"); n != 2 {
		t.Errorf("%d malformed HostSubnets reported, want 2 (bad, badip)", n)
	}
	if err := a.view.Ready(); err != nil {
		t.Errorf("view not ready with a HostSubnet and the ClusterNetwork: %v", err)
	}
	if st.LocalSubnet != netip.MustParsePrefix("10.128.0.0/23") || st.NodeIP != netip.MustParseAddr("192.0.2.1") || st.NodeName != testNode {
		t.Errorf("local: %s %s %s", st.NodeName, st.LocalSubnet, st.NodeIP)
	}
	want := []pipeline.RemoteNode{remote("n2", "192.0.2.2", "10.128.2.0/23"), remote("n3", "192.0.2.3", "10.128.4.0/23")}
	if !reflect.DeepEqual(st.RemoteNodes, want) {
		t.Errorf("remote nodes (malformed ones ignored):\n got %+v\nwant %+v", st.RemoteNodes, want)
	}

	hss := api.net.NetworkV1().HostSubnets()
	// n2 moves to another address; n3 is updated to a malformed subnet (it keeps its last good one); the
	// local HostSubnet is deleted (the node keeps its subnet until a new one arrives); n4 arrives.
	if _, err := hss.Update(api.ctx, hostSubnet("n2", "n2", "192.0.2.22", "10.128.2.0/23"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hss.Update(api.ctx, hostSubnet("n3", "n3", "192.0.2.3", "10.128.4.0/99"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := hss.Delete(api.ctx, testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hss.Create(api.ctx, hostSubnet("n4", "n4", "192.0.2.4", "10.128.6.0/23"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st = waitSnapshot(t, a, "n4", func(st pipeline.NodeState, _ []string) bool { return len(st.RemoteNodes) == 3 })
	want = []pipeline.RemoteNode{remote("n2", "192.0.2.22", "10.128.2.0/23"), remote("n3", "192.0.2.3", "10.128.4.0/23"), remote("n4", "192.0.2.4", "10.128.6.0/23")}
	if !reflect.DeepEqual(st.RemoteNodes, want) {
		t.Errorf("remote nodes:\n got %+v\nwant %+v", st.RemoteNodes, want)
	}
	if st.LocalSubnet != netip.MustParsePrefix("10.128.0.0/23") || st.NodeIP != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("the local subnet was lost with its HostSubnet: %s %s", st.LocalSubnet, st.NodeIP)
	}
	if peers := a.view.peers(); len(peers) != 3 {
		t.Errorf("peers %v, want the three remote nodes' addresses", peers)
	}

	// A remote node that goes leaves the view; a new local HostSubnet replaces the old.
	if err := hss.Delete(api.ctx, "n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := hss.Create(api.ctx, hostSubnet(testNode, testNode, "192.0.2.1", "10.128.10.0/23"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st = waitSnapshot(t, a, "n3 gone and the new local subnet", func(st pipeline.NodeState, _ []string) bool {
		return len(st.RemoteNodes) == 2 && st.LocalSubnet == netip.MustParsePrefix("10.128.10.0/23")
	})
	if names := []string{st.RemoteNodes[0].Name, st.RemoteNodes[1].Name}; !slices.Equal(names, []string{"n2", "n4"}) {
		t.Errorf("remote nodes %v, want n2 n4", names)
	}
}

// attachPod puts a pod on the node's bridge in the view, as a CNI ADD does, and returns the view's
// generation with it.
func attachPod(a *Agent, namespace, name, ip string, ofport uint32) uint64 {
	return a.view.Attach(attach.Pod{Namespace: namespace, Name: name, IP: netip.MustParseAddr(ip),
		MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(ofport)}, OFPort: ofport})
}

func TestNetNamespaceHandler(t *testing.T) {
	a, api := startAgent(t, clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"),
		hostSubnet(testNode, testNode, "192.0.2.1", "10.128.0.0/23"), netNamespace("blue", 12), netNamespace("default", 0))
	attachPod(a, "blue", "b1", "10.128.0.5", 5)
	attachPod(a, "red", "r1", "10.128.0.6", 6)
	attachPod(a, "default", "d1", "10.128.0.7", 7)
	vnids := func(st pipeline.NodeState) map[string]uint32 {
		m := map[string]uint32{}
		for _, p := range st.Pods {
			m[p.Namespace+"/"+p.Name] = p.VNID
		}
		return m
	}
	// A pod whose namespace has no VNID yet gets no connectivity rather than the wrong tenant's.
	var pending []string
	st := waitSnapshot(t, a, "blue and default's VNIDs", func(st pipeline.NodeState, p []string) bool {
		pending = p
		return len(st.Pods) == 2
	})
	if got, want := vnids(st), map[string]uint32{"blue/b1": 12, "default/d1": 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("pod VNIDs %v, want %v", got, want)
	}
	if !slices.Equal(pending, []string{"red/r1"}) {
		t.Errorf("pending %v, want red/r1", pending)
	}

	nns := api.net.NetworkV1().NetNamespaces()
	if _, err := nns.Create(api.ctx, netNamespace("red", 12), metav1.CreateOptions{}); err != nil { // red joined blue
		t.Fatal(err)
	}
	if _, err := nns.Update(api.ctx, netNamespace("blue", 14), metav1.UpdateOptions{}); err != nil { // then blue isolated
		t.Fatal(err)
	}
	waitSnapshot(t, a, "red's VNID and blue's new one", func(st pipeline.NodeState, _ []string) bool {
		return reflect.DeepEqual(vnids(st), map[string]uint32{"blue/b1": 14, "red/r1": 12, "default/d1": 0})
	})
	if err := nns.Delete(api.ctx, "red", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, a, "red's pod pending again", func(_ pipeline.NodeState, p []string) bool { return slices.Equal(p, []string{"red/r1"}) })

	// In a flat mode VNIDs are allocated but isolate nothing: every pod is global.
	if _, err := api.net.NetworkV1().ClusterNetworks().Update(api.ctx, clusterNetwork("default", networkv1.PluginModeSubnet, "10.128.0.0/14"),
		metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, a, "subnet mode", func(st pipeline.NodeState, _ []string) bool {
		return st.Mode == pipeline.ModeSubnet && reflect.DeepEqual(vnids(st), map[string]uint32{"blue/b1": 0, "default/d1": 0})
	})
}

// TestRemotePodsInSnapshot: in multitenant mode with an uplink port each remote node carries its pods'
// addresses with their namespaces' VNIDs; pods of namespaces without a VNID, of this node, hostNetwork
// or finished ones are left out; other modes carry none.
func TestRemotePodsInSnapshot(t *testing.T) {
	v := newNodeView("n1", egress.NewInputs(0))
	v.mode, v.uplink = pipeline.ModeMultitenant, "br-ul"
	v.localSubnet, v.nodeIP = netip.MustParsePrefix("10.128.0.0/23"), netip.MustParseAddr("192.0.2.11")
	v.remote["n2"] = pipeline.RemoteNode{Name: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23")}
	v.vnids = map[string]uint32{"a": 20, "default": 0}
	w := &watchRemotePods{view: v, sync: newFlowSync(v, nil, flowSyncHooks{}, klog.Background())}
	pod := func(ns, name, node, ip string, mod func(*k8sobj.Pod)) *k8sobj.Pod {
		p := &k8sobj.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, NodeName: node, IPs: []string{ip}, Phase: corev1.PodRunning}
		if mod != nil {
			mod(p)
		}
		return p
	}
	for _, p := range []*k8sobj.Pod{
		pod("a", "x", "n2", "10.128.2.5", nil),
		pod("default", "y", "n2", "10.128.2.3", nil),
		pod("novnid", "z", "n2", "10.128.2.9", nil),
		pod("a", "local", "n1", "10.128.0.5", nil),
		pod("a", "host", "n2", "192.0.2.12", func(p *k8sobj.Pod) { p.HostNetwork = true }),
		pod("a", "done", "n2", "10.128.2.7", func(p *k8sobj.Pod) { p.Phase = corev1.PodSucceeded }),
		pod("a", "pending", "n2", "", func(p *k8sobj.Pod) { p.IPs = nil }),
	} {
		w.pod(p, false)
	}
	st := v.snapshot().state
	want := []pipeline.RemotePod{{IP: netip.MustParseAddr("10.128.2.3"), VNID: 0}, {IP: netip.MustParseAddr("10.128.2.5"), VNID: 20}}
	if got := st.RemoteNodes[0].Pods; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("n2's pods %v, want %v", got, want)
	}
	w.pod(pod("a", "x", "n2", "10.128.2.5", nil), true)
	if st = v.snapshot().state; len(st.RemoteNodes[0].Pods) != 1 {
		t.Errorf("a deleted pod stays: %v", st.RemoteNodes[0].Pods)
	}
	v.mode = pipeline.ModeSubnet
	if st = v.snapshot().state; st.RemoteNodes[0].Pods != nil {
		t.Errorf("subnet mode carries pods: %v", st.RemoteNodes[0].Pods)
	}
}

// TestUplinkInSnapshot: what the uplink job records reaches the state the flows render from.
func TestUplinkInSnapshot(t *testing.T) {
	v := newNodeView("n1", egress.NewInputs(0))
	v.encap = pipeline.EncapNone
	v.remote["n2"] = pipeline.RemoteNode{Name: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23")}
	v.remote["n3"] = pipeline.RemoteNode{Name: "n3", NodeIP: netip.MustParseAddr("198.51.100.13"), Subnet: netip.MustParsePrefix("10.128.4.0/23")}
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	if !v.SetUplink("br-ul", map[string]bool{"n2": true}, mac) {
		t.Fatal("a new uplink changed nothing")
	}
	if v.SetUplink("br-ul", map[string]bool{"n2": true}, nil) {
		t.Error("the same uplink (MAC unknown this time) changed something")
	}
	st := v.snapshot().state
	if !st.Uplink || !st.RemoteNodes[0].OnSegment || st.RemoteNodes[1].OnSegment || st.GatewayMAC.String() != mac.String() {
		t.Errorf("snapshot: uplink %v, on segment %v %v, gateway MAC %s", st.Uplink, st.RemoteNodes[0].OnSegment, st.RemoteNodes[1].OnSegment, st.GatewayMAC)
	}
}
