package flowctl

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/drops"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkfake "github.com/ofsdn/ofsdn/client/clientset/versioned/fake"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func namedPod(ns, name, ip string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
	for _, m := range mod {
		m(p)
	}
	return p
}

func hostNetwork(p *corev1.Pod) { p.Spec.HostNetwork = true }
func finished(p *corev1.Pod)    { p.Status.Phase = corev1.PodSucceeded }

// namesFixture is podNames over fake clientsets, with a clock the test moves and a count of lists.
type namesFixture struct {
	kube  *kubefake.Clientset
	names *podNames
	lists atomic.Int32
	mu    sync.Mutex
	clock time.Time
	warns []error
}

func newNamesFixture(t *testing.T, pods ...runtime.Object) *namesFixture {
	t.Helper()
	f := &namesFixture{kube: kubefake.NewClientset(pods...), clock: time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)}
	f.kube.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.lists.Add(1)
		return false, nil, nil // the tracker answers
	})
	netc := networkfake.NewSimpleClientset(&networkv1.ClusterNetwork{ObjectMeta: metav1.ObjectMeta{Name: networkv1.ClusterNetworkName},
		Spec: networkv1.ClusterNetworkSpec{ClusterCIDRs: []networkv1.CIDR{"10.128.0.0/14"}}})
	f.names = newPodNames(f.kube, netc, func(err error) { f.warns = append(f.warns, err) })
	f.names.now = func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.clock }
	return f
}

func (f *namesFixture) advance(d time.Duration) { f.mu.Lock(); f.clock = f.clock.Add(d); f.mu.Unlock() }

// wait waits for the list running (or last run) to end.
func (f *namesFixture) wait() {
	f.names.mu.Lock()
	done := f.names.done
	f.names.mu.Unlock()
	if done != nil {
		<-done
	}
}

// TestPodNamesEnrich: a drop's ends that its node gave as addresses are named from the API server's
// pods, once; a hostNetwork pod, a finished pod and an address two pods claim name nothing; a Network's
// drop and an end its node named are left alone.
func TestPodNamesEnrich(t *testing.T) {
	f := newNamesFixture(t,
		namedPod("blue", "web", "10.128.0.2"),
		namedPod("red", "client", "10.129.0.3"),
		namedPod("kube-system", "proxy", "10.128.0.4", hostNetwork), // not realistic, but must not name
		namedPod("red", "job-old", "10.128.0.5", finished),
		namedPod("red", "job-new", "10.128.0.5"),
		namedPod("red", "twin-a", "10.128.0.6"),
		namedPod("red", "twin-b", "10.128.0.6"),
	)
	f.names.prime(context.Background())
	addr := netip.MustParseAddr
	for _, tc := range []struct {
		name             string
		d                debugapi.Drop
		wantSrc, wantDst string
	}{
		{"remote source", debugapi.Drop{Src: "10.129.0.3", SrcIP: addr("10.129.0.3"), Dst: "blue/web", DstIP: addr("10.128.0.2"), Cause: "cluster-network-policy", TableID: 78},
			"red/client", "blue/web"},
		{"remote destination", debugapi.Drop{Src: "blue/web", SrcIP: addr("10.128.0.2"), Dst: "10.129.0.3", DstIP: addr("10.129.0.3"), Cause: "policy-egress", TableID: 50},
			"blue/web", "red/client"},
		{"hostNetwork pod", debugapi.Drop{Src: "10.128.0.4", SrcIP: addr("10.128.0.4"), Dst: "blue/web", DstIP: addr("10.128.0.2"), Cause: "tenant-isolation", TableID: 80},
			"10.128.0.4", "blue/web"},
		{"finished pod's address reused", debugapi.Drop{Src: "10.128.0.5", SrcIP: addr("10.128.0.5"), Dst: "blue/web", DstIP: addr("10.128.0.2"), Cause: "tenant-isolation", TableID: 80},
			"red/job-new", "blue/web"},
		{"two pods claim it", debugapi.Drop{Src: "10.128.0.6", SrcIP: addr("10.128.0.6"), Dst: "blue/web", DstIP: addr("10.128.0.2"), Cause: "tenant-isolation", TableID: 80},
			"10.128.0.6", "blue/web"},
		{"a Network's address", debugapi.Drop{Src: "blue/web@net1", SrcIP: addr("10.200.0.3"), Dst: "10.129.0.3", DstIP: addr("10.129.0.3"), Cause: "network-isolation", TableID: 130},
			"blue/web@net1", "10.129.0.3"},
		{"named by its node", debugapi.Drop{Src: "green/x", SrcIP: addr("10.128.0.2"), Dst: "?", Cause: "anti-spoofing", TableID: 20},
			"green/x", "?"},
		{"outside the cluster network", debugapi.Drop{Src: "blue/web", SrcIP: addr("10.128.0.2"), Dst: "192.0.2.9", DstIP: addr("192.0.2.9"), Cause: "egress-firewall", TableID: 55},
			"blue/web", "192.0.2.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.d
			f.names.enrich(&d)
			if d.Src != tc.wantSrc || d.Dst != tc.wantDst {
				t.Errorf("%s → %s, want %s → %s", d.Src, d.Dst, tc.wantSrc, tc.wantDst)
			}
		})
	}
	// 10.128.0.4 and 10.128.0.6 missed in the cluster network, within the rate limit of the first list:
	// no list more.
	f.wait()
	if n := f.lists.Load(); n != 1 {
		t.Errorf("%d lists, want the first alone", n)
	}
}

// TestPodNamesRelistOnMiss: a pod newer than the list is named once a miss has listed again; misses
// list again at most once per the rate limit, and an address outside the cluster network never.
func TestPodNamesRelistOnMiss(t *testing.T) {
	ctx := context.Background()
	f := newNamesFixture(t, namedPod("blue", "web", "10.128.0.2"))
	f.names.prime(ctx)
	f.names.prime(ctx) // listed already: nothing
	if n := f.lists.Load(); n != 1 {
		t.Fatalf("%d lists after priming twice, want 1", n)
	}
	if name, ok := f.names.name(netip.MustParseAddr("10.128.0.2")); !ok || name != "blue/web" {
		t.Fatalf("hit: %q %v", name, ok)
	}
	if _, err := f.kube.CoreV1().Pods("red").Create(ctx, namedPod("red", "new", "10.128.0.9"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newPod := netip.MustParseAddr("10.128.0.9")
	f.advance(podNamesRelist)
	if _, ok := f.names.name(newPod); ok {
		t.Fatal("a pod newer than the list is named before a list")
	}
	f.wait()
	if name, ok := f.names.name(newPod); !ok || name != "red/new" || f.lists.Load() != 2 {
		t.Fatalf("after the miss's list: %q %v, %d lists", name, ok, f.lists.Load())
	}
	// Misses within the limit do not list; the first after it does.
	for _, a := range []string{"10.128.0.50", "10.128.0.51", "10.128.0.50"} {
		f.names.name(netip.MustParseAddr(a))
		f.advance(time.Second)
	}
	f.wait()
	if n := f.lists.Load(); n != 2 {
		t.Errorf("%d lists after misses within %v of the last, want 2", n, podNamesRelist)
	}
	f.advance(podNamesRelist)
	f.names.name(netip.MustParseAddr("192.0.2.1")) // outside the cluster network: not a pod's
	f.wait()
	if n := f.lists.Load(); n != 2 {
		t.Errorf("%d lists after a miss outside the cluster network, want 2", n)
	}
	f.names.name(netip.MustParseAddr("10.128.0.50"))
	f.wait()
	if n := f.lists.Load(); n != 3 {
		t.Errorf("%d lists after a miss past the limit, want 3", n)
	}
	// A list that fails is told, and the names already known stay.
	f.kube.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	f.advance(podNamesRelist)
	f.names.name(netip.MustParseAddr("10.128.0.51"))
	f.wait()
	if name, ok := f.names.name(newPod); !ok || name != "red/new" || len(f.warns) != 1 {
		t.Errorf("after a failed list: %q %v, warns %v", name, ok, f.warns)
	}
}

// TestDropsNameRemotePods: flowctl drops (and the console, through the same client) names the far end
// of a drop its node gave as an address, and the namespace filter finds the drop by that name.
func TestDropsNameRemotePods(t *testing.T) {
	ring := drops.NewRing(8)
	now := time.Now().Truncate(time.Millisecond)
	ring.Add(debugapi.Drop{Time: now.Add(-time.Minute), Node: "node2", Src: "10.128.0.2", SrcIP: netip.MustParseAddr("10.128.0.2"),
		Dst: "blue/web-node2", DstIP: netip.MustParseAddr("10.129.0.5"), Proto: "tcp", Port: 80, Cause: string(pipeline.CauseAdminPolicy),
		Verdict: "dropped by a Deny rule of ClusterNetworkPolicy deny (Admin tier, ingress)", Object: "ClusterNetworkPolicy deny",
		Table: "admin-ingress", TableID: 78})
	client := debugapi.NewSocketClient(serveAgent(t, dropAgent{ring: ring}))
	f := newNamesFixture(t, namedPod("red", "client-node1", "10.128.0.2"), namedPod("blue", "web-node2", "10.129.0.5"))
	src := &dropClient{names: f.names, nodes: func(context.Context) ([]string, error) { return []string{"node2"}, nil },
		client: func(string) (*debugapi.Client, error) { return client, nil }}
	for _, tc := range []struct {
		name string
		q    debugapi.DropQuery
		want int
	}{
		{"all", debugapi.DropQuery{}, 1},
		{"the remote source's namespace", debugapi.DropQuery{Namespace: "red"}, 1},
		{"the remote source", debugapi.DropQuery{Namespace: "red", Pod: "client-node1"}, 1},
		{"another namespace", debugapi.DropQuery{Namespace: "green"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := src.recent(context.Background(), tc.q)
			if err != nil || len(got) != tc.want {
				t.Fatalf("%d drops, %v; want %d", len(got), err, tc.want)
			}
			if tc.want > 0 && (got[0].Src != "red/client-node1" || got[0].Dst != "blue/web-node2") {
				t.Errorf("%s → %s, want red/client-node1 → blue/web-node2", got[0].Src, got[0].Dst)
			}
		})
	}
	rec, err := agentDrops{src}.Recent(context.Background(), DropFilter{Namespace: "red"})
	if err != nil || len(rec.Drops) != 1 || rec.Drops[0].Src != "red/client-node1" {
		t.Errorf("console: %+v %v, want the drop from red/client-node1", rec, err)
	}
}
