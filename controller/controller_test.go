package controller_test

// Tests against a real API server: the controller runs in-process as deployed (controllertest). The
// sync functions' unit tests, on fake clientsets, are in sync_test.go.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/controller/controllertest"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// lab is a real API server with deploy/'s CRDs and the controller's RBAC applied, and admin clients.
type lab struct {
	api   *kubelab.Cluster
	admin kubernetes.Interface
	net   networkclient.Interface
}

func newLab(t *testing.T) *lab {
	api := kubelab.StartDeploy(t, kubelab.Options{}, controllertest.Manifests...)
	return &lab{api: api, admin: kubernetes.NewForConfigOrDie(api.AdminConfig()), net: networkclient.NewForConfigOrDie(api.AdminConfig())}
}

// start runs a controller (through leader election, as deployed) until the returned stop is called.
func (l *lab) start(t *testing.T, s networkv1.ClusterNetworkSpec, id string) (stop func()) {
	return controllertest.Start(t, l.api, s, id)
}

func (l *lab) netids(t *testing.T) map[string]uint32 {
	list, err := l.net.NetworkV1().NetNamespaces().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, nn := range list.Items {
		out[nn.Name] = nn.NetID
	}
	return out
}

func (l *lab) createNamespaces(t *testing.T, prefix string, n int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)}}
			if _, err := l.admin.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func TestVNIDs(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	stop := l.start(t, controllertest.Spec("10.128.0.0/14", 9), "a")
	// Killed midway: stop the controller while 200 namespaces arrive, then start another.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			n := 0
			for name := range l.netids(t) {
				if strings.HasPrefix(name, "tenant-") {
					n++
				}
			}
			if n >= 40 {
				stop()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	l.createNamespaces(t, "tenant", 200)
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("the first controller never allocated 40 VNIDs")
	}
	before := l.netids(t)
	t.Logf("%d NetNamespaces when the first controller stopped", len(before))
	l.start(t, controllertest.Spec("10.128.0.0/14", 9), "b")
	var ids map[string]uint32
	proc.Eventually(t, time.Minute, "200 tenant NetNamespaces", func() bool {
		ids = l.netids(t)
		n := 0
		for name := range ids {
			if strings.HasPrefix(name, "tenant-") {
				n++
			}
		}
		return n == 200
	})
	seen := map[uint32]string{}
	for name, id := range ids {
		if prev, ok := before[name]; ok && prev != id {
			t.Errorf("%s changed NETID %d → %d across the restart", name, prev, id)
		}
		if name == "default" || name == "kube-system" {
			if id != 0 {
				t.Errorf("%s has NETID %d, want 0 (global)", name, id)
			}
			continue
		}
		if id < networkv1.MinVNID {
			t.Errorf("%s has NETID %d", name, id)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share NETID %d", name, other, id)
		}
		seen[id] = name
	}

	change := func(ns, req string) uint32 {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, networkv1.ChangeNetworkAnnotation, req)
		if _, err := l.net.NetworkV1().NetNamespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var nn *networkv1.NetNamespace
		proc.Eventually(t, 30*time.Second, "change-network "+req+" carried out", func() bool {
			var err error
			nn, err = l.net.NetworkV1().NetNamespaces().Get(ctx, ns, metav1.GetOptions{})
			_, pending := nn.Annotations[networkv1.ChangeNetworkAnnotation]
			return err == nil && !pending
		})
		return nn.NetID
	}
	a, b := "tenant-1", "tenant-2"
	if got := change(a, "join:"+b); got != ids[b] {
		t.Errorf("join: %s has %d, want %s's %d", a, got, b, ids[b])
	}
	iso := change(a, "isolate")
	if iso == ids[b] || iso == 0 || seen[iso] != "" && seen[iso] != a {
		t.Errorf("isolate: %s got %d (taken by %q)", a, iso, seen[iso])
	}
	if got := change(a, "global"); got != 0 {
		t.Errorf("global: %d", got)
	}
	if got := change(a, "join:no-such-namespace"); got != 0 {
		t.Errorf("a bad join changed NETID to %d", got)
	}
	if got := change(a, "merge-with:x"); got != 0 {
		t.Errorf("a malformed request changed NETID to %d", got)
	}
	proc.Eventually(t, 30*time.Second, "a Warning Event on the malformed request", func() bool {
		evs, _ := l.admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + a + ",reason=InvalidChangeNetwork"})
		return evs != nil && len(evs.Items) >= 2
	})

	// A deleted namespace's VNID is freed (and its NetNamespace removed).
	if err := l.admin.CoreV1().Namespaces().Delete(ctx, b, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestSubnets(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	l.start(t, controllertest.Spec("10.128.0.0/16", 8), "a") // 256 /24s
	addNode := func(name string, ip netip.Addr) {
		n, err := l.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
		if _, err := l.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addNode(fmt.Sprintf("node-%d", i), netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}))
		}()
	}
	wg.Wait()
	var subnets []networkv1.HostSubnet
	proc.Eventually(t, time.Minute, "50 HostSubnets", func() bool {
		list, err := l.net.NetworkV1().HostSubnets().List(ctx, metav1.ListOptions{})
		subnets = nil
		if err == nil {
			subnets = list.Items
		}
		return len(subnets) == 50
	})
	cluster := netip.MustParsePrefix("10.128.0.0/16")
	var got []netip.Prefix
	for _, hs := range subnets {
		p := netip.MustParsePrefix(string(hs.Subnet))
		if !cluster.Contains(p.Addr()) || p.Bits() != 24 {
			t.Errorf("%s got %s, not a /24 of %s", hs.Name, p, cluster)
		}
		for _, q := range got {
			if q.Overlaps(p) {
				t.Errorf("%s overlaps %s", p, q)
			}
		}
		got = append(got, p)
		var i int
		_, _ = fmt.Sscanf(hs.Name, "node-%d", &i)
		if hs.Host != hs.Name || hs.HostIP != fmt.Sprintf("192.0.2.%d", i+1) {
			t.Errorf("HostSubnet %+v", hs)
		}
	}
	// A deleted Node's subnet goes.
	if err := l.admin.CoreV1().Nodes().Delete(ctx, "node-7", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proc.Eventually(t, 30*time.Second, "node-7's HostSubnet removed", func() bool {
		_, err := l.net.NetworkV1().HostSubnets().Get(ctx, "node-7", metav1.GetOptions{})
		return err != nil
	})
}

func TestSubnetExhaustion(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	l.start(t, controllertest.Spec("10.0.0.0/24", 6), "a") // 4 /26s for 5 nodes
	for i := range 5 {
		n, err := l.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.0.2.%d", i+1)}}
		if _, err := l.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	proc.Eventually(t, time.Minute, "the SubnetsAvailable=False condition and the Event", func() bool {
		cn, err := l.net.NetworkV1().ClusterNetworks().Get(ctx, "default", metav1.GetOptions{})
		if err != nil || !meta.IsStatusConditionFalse(cn.Status.Conditions, networkv1.ConditionSubnetsAvailable) {
			return false
		}
		evs, _ := l.admin.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=SubnetExhausted"})
		return evs != nil && len(evs.Items) == 1
	})
	list, _ := l.net.NetworkV1().HostSubnets().List(ctx, metav1.ListOptions{})
	if len(list.Items) != 4 {
		t.Fatalf("%d HostSubnets, want 4", len(list.Items))
	}
	// Freeing one gives the waiting node its subnet, and the condition clears.
	if err := l.admin.CoreV1().Nodes().Delete(ctx, list.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proc.Eventually(t, time.Minute, "the waiting node served and SubnetsAvailable=True", func() bool {
		cn, err := l.net.NetworkV1().ClusterNetworks().Get(ctx, "default", metav1.GetOptions{})
		hs, _ := l.net.NetworkV1().HostSubnets().List(ctx, metav1.ListOptions{})
		return err == nil && meta.IsStatusConditionTrue(cn.Status.Conditions, networkv1.ConditionSubnetsAvailable) && len(hs.Items) == 4
	})
}

func TestTwoReplicas(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	stopA := l.start(t, controllertest.Spec("10.128.0.0/14", 9), "replica-a")
	proc.Eventually(t, 30*time.Second, "a leader", func() bool {
		lease, err := l.admin.CoordinationV1().Leases("ofsdn").Get(ctx, "ofsdn-controller", metav1.GetOptions{})
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "replica-a"
	})
	l.start(t, controllertest.Spec("10.128.0.0/14", 9), "replica-b")
	l.createNamespaces(t, "two", 20)
	proc.Eventually(t, 30*time.Second, "20 NetNamespaces", func() bool { return len(l.netids(t)) >= 20 })
	lease, _ := l.admin.CoordinationV1().Leases("ofsdn").Get(ctx, "ofsdn-controller", metav1.GetOptions{})
	if *lease.Spec.HolderIdentity != "replica-a" {
		t.Fatalf("leader changed to %s while a ran", *lease.Spec.HolderIdentity)
	}
	began := time.Now()
	stopA()
	proc.Eventually(t, 30*time.Second, "replica-b leading", func() bool {
		lease, err := l.admin.CoordinationV1().Leases("ofsdn").Get(ctx, "ofsdn-controller", metav1.GetOptions{})
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "replica-b"
	})
	took := time.Since(began)
	t.Logf("replica-b took over %s after replica-a stopped (lease duration 4s)", took.Round(time.Millisecond))
	l.createNamespaces(t, "after", 5)
	proc.Eventually(t, 30*time.Second, "replica-b allocating", func() bool { return len(l.netids(t)) >= 25 })
	ids := l.netids(t)
	seen := map[uint32]string{}
	for name, id := range ids {
		if id == 0 {
			continue
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share %d across the handover", name, other, id)
		}
		seen[id] = name
	}
}
