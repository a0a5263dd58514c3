//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/nodesim"
	"github.com/ofsdn/ofsdn/e2e/testpod"
	"github.com/ofsdn/ofsdn/flowctl"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/lab"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The Networks suite (issue 22). Two Networks with the same CIDR (red, blue) and a third (green) that
// may talk to red; pods on every node attached to two of them and to the cluster network. Who reaches
// whom comes from netModel, written from the objects: a pod's interface reaches the interface that has
// the destination address on its own Network, or on a Network that talks to its own (both name each
// other, addresses apart, namespaces admitted); nothing else, not even at the same address.

// netIface is one pod interface on a Network, as the pod's network-status says.
type netIface struct {
	pod     *cluster.Pod
	ifName  string
	nad     string // namespace/name
	network string
	ip      netip.Addr
}

func (i netIface) key() string { return i.pod.Key() + "@" + i.ifName }

// netModel holds the Networks as the test created them, the pairs that talk (the test says which, from
// the API's rules: asked by either side, addresses apart, first come first served when a Network's
// peers would overlap) and the namespaces each admits.
type netModel struct {
	cidr     map[string]netip.Prefix
	pairs    map[[2]string]bool
	admitted map[string]map[string]bool
}

func talkPair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

func (m netModel) talk(a, b string) bool {
	return a != b && m.pairs[talkPair(a, b)] && !m.cidr[a].Overlaps(m.cidr[b])
}

// answerer says which interface answers a probe from src to dst ("" none).
func (m netModel) answerer(src netIface, dst netip.Addr, all []netIface) string {
	if !m.admitted[src.network][src.pod.Namespace] {
		return ""
	}
	for _, d := range all {
		if d.ip == dst && (d.network == src.network || m.talk(src.network, d.network)) && m.admitted[d.network][d.pod.Namespace] {
			return d.key()
		}
	}
	return ""
}

type netMatrix map[string]map[netip.Addr]string // source interface → destination address → answerer

// netReachability probes from every interface to every interface's address on nodesim.NetworksPort
// (UDP, the source socket bound to its interface) and records who answered.
func netReachability(t *testing.T, ctx context.Context, all []netIface) netMatrix {
	t.Helper()
	var addrs []netip.Addr
	for _, d := range all {
		if !slices.Contains(addrs, d.ip) {
			addrs = append(addrs, d.ip)
		}
	}
	out := netMatrix{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"netns", "exec", s.pod.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "probe-all", "--timeout", "1500ms", "--dev", s.ifName}
			for _, a := range addrs {
				args = append(args, "udp/"+netip.AddrPortFrom(a, nodesim.NetworksPort).String())
			}
			res, err := exec.CommandContext(ctx, "ip", args...).Output()
			row := map[netip.Addr]string{}
			var results []testpod.Result
			if err == nil {
				err = json.Unmarshal(res, &results)
			}
			if err != nil {
				t.Errorf("probe-all from %s: %v", s.key(), err)
			}
			for i, r := range results {
				if r.Error == "" && i < len(addrs) {
					row[addrs[i]] = strings.Fields(r.Reply)[0]
				}
			}
			mu.Lock()
			out[s.key()] = row
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// expectMatrix is netModel's matrix.
func (m netModel) expectMatrix(all []netIface) netMatrix {
	out := netMatrix{}
	for _, s := range all {
		row := map[netip.Addr]string{}
		for _, d := range all {
			if a := m.answerer(s, d.ip, all); a != "" && a != s.key() {
				row[d.ip] = a
			}
		}
		out[s.key()] = row
	}
	return out
}

func diffNetMatrix(got, want netMatrix, all []netIface) []string {
	var out []string
	for _, s := range all {
		for _, d := range all {
			if d.ip == s.ip && d.network == s.network {
				continue // a pod's own address
			}
			if g, w := got[s.key()][d.ip], want[s.key()][d.ip]; g != w && !(w == "" && g == s.key()) {
				out = append(out, fmt.Sprintf("%s (%s %s) → %s: answered by %q, want %q", s.key(), s.network, s.ip, d.ip, g, w))
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// waitNetMatrix probes until the matrix is the model's, or fails after timeout; it returns how long.
func waitNetMatrix(t *testing.T, ctx context.Context, m netModel, all []netIface, timeout time.Duration) time.Duration {
	t.Helper()
	want := m.expectMatrix(all)
	reached := 0
	for _, row := range want {
		reached += len(row)
	}
	if reached == 0 {
		t.Fatal("the model expects no interface to reach another: the matrix would prove nothing")
	}
	start := time.Now()
	for {
		got := netReachability(t, ctx, all)
		diff := diffNetMatrix(got, want, all)
		if len(diff) == 0 {
			t.Logf("network matrix as the model says (%d interfaces, %d reachable pairs) after %s", len(all), reached, time.Since(start).Round(time.Millisecond))
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("network matrix differs from the model after %s:\n%s\n%s", timeout, strings.Join(diff, "\n"), lc.Logs(20))
		}
	}
}

// netObjects creates the suite's Networks, NADs and namespaces and removes them at the end.
type netObjects struct {
	nad   nadclient.Interface
	model netModel
}

func newNetObjects(t *testing.T) *netObjects {
	nad, err := nadclient.NewForConfig(lc.API.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return &netObjects{nad: nad, model: netModel{cidr: map[string]netip.Prefix{}, pairs: map[[2]string]bool{}, admitted: map[string]map[string]bool{}}}
}

func (o *netObjects) network(t *testing.T, ctx context.Context, name, cidr string, hostBits int32, selector map[string]string, talk ...string) {
	t.Helper()
	n := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkv1.NetworkSpec{CIDR: networkv1.CIDR(cidr),
		HostSubnetLength: hostBits, NamespaceSelector: metav1.LabelSelector{MatchLabels: selector}, CrossTalk: talk}}
	if _, err := lc.Net.NetworkV1().Networks().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.deleteNetwork(context.Background(), name) })
	o.model.cidr[name] = netip.MustParsePrefix(cidr)
	for _, peer := range talk {
		o.model.pairs[talkPair(name, peer)] = true
	}
}

func (o *netObjects) deleteNetwork(ctx context.Context, name string) {
	_ = lc.Net.NetworkV1().Networks().Delete(ctx, name, metav1.DeleteOptions{})
}

// waitNetwork waits until the controller gave a Network its VNI and a subnet on every node.
func waitNetwork(t *testing.T, ctx context.Context, name string, nodes []*cluster.Node) *networkv1.Network {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := lc.Net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
		have := 0
		if err == nil && n.Status.VNI != 0 {
			for _, node := range nodes {
				if _, err := lc.Net.NetworkV1().NetworkSubnets().Get(ctx, networkv1.NetworkSubnetName(name, node.Name), metav1.GetOptions{}); err == nil {
					have++
				}
			}
			if have == len(nodes) {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Network %s: no VNI or subnets on every node after a minute (%v, %d subnets)", name, err, have)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (o *netObjects) nadFor(t *testing.T, ctx context.Context, namespace, name, config string) {
	t.Helper()
	d := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: config}}
	if _, err := o.nad.K8sCniCncfIoV1().NetworkAttachmentDefinitions(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func ofsdnNAD(network string) string {
	return fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"type":"ofsdn","network":%q}`, network, network)
}

// labelNamespace sets a namespace's labels (creating it, with its NetNamespace, first).
func labelNamespace(t *testing.T, ctx context.Context, ns string, labels map[string]string) {
	t.Helper()
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if _, err := lc.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// netPods runs a pod per node asking for networks (the annotation) and returns them with their
// interfaces, read from their network-status annotation.
func (o *netObjects) netPods(t *testing.T, ctx context.Context, ns, prefix, annotation string, nodes []*cluster.Node) ([]*cluster.Pod, []netIface) {
	t.Helper()
	var pods []*cluster.Pod
	var ifaces []netIface
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := cluster.PodSpec(ns, prefix+"-"+n.Name, n.Name)
			spec.Annotations = map[string]string{nadv1.NetworkAttachmentAnnot: annotation}
			p, err := lc.RunPod(ctx, spec)
			if err != nil {
				t.Error(err)
				return
			}
			is, err := o.interfaces(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			pods = append(pods, p)
			if err != nil {
				t.Error(err)
			}
			ifaces = append(ifaces, is...)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, p := range pods {
			_ = lc.DeletePod(context.Background(), p.Namespace, p.Name)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	return pods, ifaces
}

// interfaces reads a pod's Network interfaces from its network-status annotation (written by the
// agent shortly after the ADD) and its NADs' networks.
func (o *netObjects) interfaces(ctx context.Context, p *cluster.Pod) ([]netIface, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pod, err := lc.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var statuses []nadv1.NetworkStatus
		if s := pod.Annotations[nadv1.NetworkStatusAnnot]; s != "" {
			if err := json.Unmarshal([]byte(s), &statuses); err != nil {
				return nil, fmt.Errorf("pod %s: network-status: %v", p.Key(), err)
			}
		}
		if len(statuses) > 1 {
			var out []netIface
			for _, st := range statuses {
				if st.Default {
					if st.Interface != "eth0" || len(st.IPs) != 1 || st.IPs[0] != p.IP.String() {
						return nil, fmt.Errorf("pod %s: the default network's status %+v is not its eth0 %s", p.Key(), st, p.IP)
					}
					continue
				}
				ns, name, _ := strings.Cut(st.Name, "/")
				d, err := o.nad.K8sCniCncfIoV1().NetworkAttachmentDefinitions(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return nil, fmt.Errorf("pod %s: network-status names %s: %v", p.Key(), st.Name, err)
				}
				var conf struct{ Network string }
				_ = json.Unmarshal([]byte(d.Spec.Config), &conf)
				if len(st.IPs) != 1 {
					return nil, fmt.Errorf("pod %s: %s has addresses %v", p.Key(), st.Interface, st.IPs)
				}
				out = append(out, netIface{pod: p, ifName: st.Interface, nad: st.Name, network: conf.Network, ip: netip.MustParseAddr(st.IPs[0])})
			}
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("pod %s: no network-status with its Network interfaces after 30s (%q)", p.Key(), pod.Annotations[nadv1.NetworkStatusAnnot])
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitCondition waits until a Network's condition has a reason.
func waitCondition(t *testing.T, ctx context.Context, network, condition, reason string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := lc.Net.NetworkV1().Networks().Get(ctx, network, metav1.GetOptions{})
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == condition && c.Reason == reason {
					t.Logf("%s %s=%s %s: %s", network, condition, c.Status, c.Reason, c.Message)
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Network %s: no %s condition %s after 30s (%v): %+v", network, condition, reason, err, n.Status.Conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func setCrossTalk(t *testing.T, ctx context.Context, name string, talk []string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"crossTalk": talk}})
	if _, err := lc.Net.NetworkV1().Networks().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNetworks: the acceptance on the lab, in one cluster of objects.
func TestNetworks(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	nodes := lc.Nodes[:3]
	o := newNetObjects(t)
	const nsA, nsB = "e2e-net-a", "e2e-net-b"
	labelNamespace(t, ctx, nsA, map[string]string{"e2e-net": "on", "e2e-green": "on"})
	labelNamespace(t, ctx, nsB, map[string]string{"e2e-net": "on", "e2e-green": "on"})
	// red and blue: the same addresses. green: apart, and it may talk to red once red lists it.
	o.network(t, ctx, "e2e-red", "10.200.0.0/16", 8, map[string]string{"e2e-net": "on"})
	o.network(t, ctx, "e2e-blue", "10.200.0.0/16", 8, map[string]string{"e2e-net": "on"})
	o.network(t, ctx, "e2e-green", "10.201.0.0/16", 8, map[string]string{"e2e-green": "on"})
	for _, n := range []string{"e2e-red", "e2e-blue", "e2e-green"} {
		waitNetwork(t, ctx, n, nodes)
	}
	for _, ns := range []string{nsA, nsB} {
		for _, n := range []string{"red", "blue", "green"} {
			o.nadFor(t, ctx, ns, n, ofsdnNAD("e2e-"+n))
		}
	}
	o.model.admitted = map[string]map[string]bool{"e2e-red": {nsA: true, nsB: true}, "e2e-blue": {nsA: true, nsB: true},
		"e2e-green": {nsA: true, nsB: true}}
	podsA, ifA := o.netPods(t, ctx, nsA, "na", "red,blue", nodes)
	podsB, ifB := o.netPods(t, ctx, nsB, "nb", "blue@blue0,green", nodes)
	all := append(append([]netIface(nil), ifA...), ifB...)
	for _, i := range all {
		t.Logf("%s: %s %s", i.key(), i.network, i.ip)
	}
	if len(all) != 12 {
		t.Fatalf("want 12 Network interfaces (2 on each of 6 pods), got %d", len(all))
	}
	// The same address on red and blue on one pod is the point: check the lab gives one.
	same := false
	for _, i := range ifA {
		for _, j := range ifA {
			same = same || (i.pod == j.pod && i.network != j.network && i.ip == j.ip)
		}
	}
	if !same {
		t.Fatal("no pod has the same address on red and blue: the overlap is not tested")
	}

	t.Run("matrix", func(t *testing.T) { waitNetMatrix(t, ctx, o.model, all, 30*time.Second) })

	t.Run("conntrack zones apart", func(t *testing.T) { conntrackZonesApart(t, ctx, ifA, nodes) })

	// clusterMatrix: the pods' cluster network (eth0) matrix is the one the cluster model expects.
	clusterMatrix := func(t *testing.T, what string) {
		t.Helper()
		pods := append(append([]*cluster.Pod(nil), podsA...), podsB...)
		netids, err := lc.NetIDs(ctx, nsA, nsB)
		if err != nil {
			t.Fatal(err)
		}
		cn, err := lc.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, diff, _ := lc.WaitMatrix(ctx, pods, cluster.Expected(pods, netids, cn.Spec.PluginMode), 30*time.Second); len(diff) > 0 {
			t.Fatalf("%s:\n%s", what, strings.Join(diff, "\n"))
		}
	}

	t.Run("cluster network unaffected", func(t *testing.T) { clusterMatrix(t, "cluster network matrix") })

	t.Run("flowctl trace", func(t *testing.T) { traceNetworks(t, ctx, ifA, ifB) })

	t.Run("attacks", func(t *testing.T) { networkAttacks(t, ctx, ifA, ifB) })

	t.Run("encapsulation none", func(t *testing.T) {
		// The cluster network goes unencapsulated; Networks stay in VXLAN (their addresses overlap) and
		// keep every pair of the matrix, and the cluster network its own.
		t.Cleanup(func() {
			if _, err := lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN); err != nil {
				t.Errorf("back to vxlan: %v", err)
			}
		})
		if _, err := lc.SetEncapsulation(ctx, networkv1.EncapsulationNone); err != nil {
			t.Fatal(err)
		}
		waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
		clusterMatrix(t, "cluster network matrix in encapsulation none")
	})

	t.Run("cross-talk live", func(t *testing.T) {
		setCrossTalk(t, ctx, "e2e-red", []string{"e2e-green"})
		o.model.pairs[talkPair("e2e-red", "e2e-green")] = true
		took := waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
		t.Logf("cross-talk on: matrix right %s after the change", took.Round(time.Millisecond))
		// Blue has red's addresses: green talking to both would make 10.200.x.y name two networks. Red
		// came first and keeps its traffic; blue is refused, and says why.
		setCrossTalk(t, ctx, "e2e-blue", []string{"e2e-green"})
		waitCondition(t, ctx, "e2e-blue", networkv1.ConditionCrossTalk, "Ambiguous")
		waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
		setCrossTalk(t, ctx, "e2e-blue", nil)
		setCrossTalk(t, ctx, "e2e-red", nil)
		delete(o.model.pairs, talkPair("e2e-red", "e2e-green"))
		took = waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
		t.Logf("cross-talk off: matrix right %s after the change", took.Round(time.Millisecond))
	})

	t.Run("namespace no longer admitted", func(t *testing.T) {
		labelNamespace(t, ctx, nsB, map[string]string{"e2e-net": "on", "e2e-green": "off"})
		o.model.admitted["e2e-green"][nsB] = false
		waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
		labelNamespace(t, ctx, nsB, map[string]string{"e2e-net": "on", "e2e-green": "on"})
		o.model.admitted["e2e-green"][nsB] = true
		waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
	})

	t.Run("multus-style invocation", func(t *testing.T) { multusStyle(t, ctx, o, podsA[0], all) })

	t.Run("agent restarts under load", func(t *testing.T) { networkRestarts(t, ctx, o, nsA) })

	t.Run("bad input", func(t *testing.T) { networkBadInput(t, ctx, o, nodes) })

	t.Run("deletion waits for pods", func(t *testing.T) { networkDeletion(t, ctx, o, nodes[0]) })

	t.Run("DEL leaves nothing", func(t *testing.T) {
		// Control: while the pods live the census finds each kind of thing it looks for, so an empty
		// census after the DELs means they went, not that the census reads the wrong files or cookies.
		for _, ns := range []string{nsA, nsB} {
			var names []string
			for _, p := range append(append([]*cluster.Pod(nil), podsA...), podsB...) {
				if p.Namespace == ns {
					names = append(names, p.Name)
				}
			}
			var held []string
			for _, n := range nodes {
				held = append(held, networkCensus(t, ctx, n, ns, names))
			}
			for _, kind := range []string{"reservation ", "ports ", "flows of "} {
				if !strings.Contains(strings.Join(held, "; "), kind) {
					t.Fatalf("control: the census finds no %q of namespace %s's live pods: %q", kind, ns, held)
				}
			}
		}
		for _, p := range append(append([]*cluster.Pod(nil), podsA...), podsB...) {
			if err := lc.DeletePod(ctx, p.Namespace, p.Name); err != nil {
				t.Fatal(err)
			}
		}
		for _, ns := range []string{nsA, nsB} {
			list, err := lc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range list.Items {
				_ = lc.DeletePod(ctx, ns, p.Name)
				names = append(names, p.Name)
			}
			for _, p := range append(append([]*cluster.Pod(nil), podsA...), podsB...) {
				if p.Namespace == ns {
					names = append(names, p.Name)
				}
			}
			for _, n := range nodes {
				if l := networkCensus(t, ctx, n, ns, names); l != "" {
					t.Errorf("%s keeps, of namespace %s's deleted pods: %s", n.Name, ns, l)
				}
			}
		}
		// And the Networks' counts came down to zero.
		for _, name := range []string{"e2e-red", "e2e-blue", "e2e-green"} {
			deadline := time.Now().Add(30 * time.Second)
			for {
				n, err := lc.Net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
				if err == nil && n.Status.Attachments == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("Network %s still counts attachments after every pod went: %v %+v", name, err, n.Status)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	})
}

// traceNetworks: flowctl trace, live across the nodes, follows a pod's interface on a Network to the
// pod that has the address on that Network (not the same address on the other Network), and says where
// a Network stops.
func traceNetworks(t *testing.T, ctx context.Context, ifA, ifB []netIface) {
	var red, blue, remoteRed, remoteBlue, green netIface
	for _, i := range ifA {
		switch {
		case i.pod.Node == lc.Nodes[0].Name && i.network == "e2e-red":
			red = i
		case i.pod.Node == lc.Nodes[0].Name && i.network == "e2e-blue":
			blue = i
		case i.pod.Node == lc.Nodes[1].Name && i.network == "e2e-red":
			remoteRed = i
		case i.pod.Node == lc.Nodes[1].Name && i.network == "e2e-blue":
			remoteBlue = i
		}
	}
	for _, i := range ifB {
		if i.network == "e2e-green" {
			green = i
		}
	}
	if remoteRed.ip != remoteBlue.ip {
		t.Fatalf("the remote pod's red and blue addresses differ (%s, %s): the overlap is not traced", remoteRed.ip, remoteBlue.ip)
	}
	for _, tc := range []struct {
		from     netIface
		to       string
		kind     string
		pod, say string
	}{
		{red, remoteRed.ip.String(), flowctl.VerdictDelivered, remoteRed.key(), "(Network e2e-red)"},
		{blue, remoteBlue.ip.String(), flowctl.VerdictDelivered, remoteBlue.key(), "(Network e2e-blue)"},
		{red, remoteBlue.key(), flowctl.VerdictDelivered, remoteRed.key(), ""}, // the address is red's pod's on red
		{red, green.ip.String(), flowctl.VerdictDropped, "", "table 130"},
	} {
		t.Run(tc.from.key()+"→"+tc.to, func(t *testing.T) {
			res := traceJSON(t, ctx, "--proto", "udp", "--port", fmt.Sprint(nodesim.NetworksPort), tc.from.key(), tc.to)
			v := res.Verdict
			if v.Kind != tc.kind || (tc.pod != "" && v.Pod != tc.pod) || !strings.Contains(v.Text, tc.say) {
				t.Fatalf("verdict %+v, want %s to %q saying %q", v, tc.kind, tc.pod, tc.say)
			}
		})
	}
}

// conntrackZonesApart: the same connection (addresses, ports) on red and on blue is two conntrack
// entries on the receiving node, one in each Network's zone, and none in the cluster network's zones.
func conntrackZonesApart(t *testing.T, ctx context.Context, ifA []netIface, nodes []*cluster.Node) {
	find := func(node, network string) netIface {
		for _, i := range ifA {
			if i.pod.Node == node && i.network == network {
				return i
			}
		}
		t.Fatalf("no %s interface on %s", network, node)
		return netIface{}
	}
	dst := nodes[1]
	var want, entries []string
	for _, network := range []string{"e2e-red", "e2e-blue"} {
		from, to := find(nodes[0].Name, network), find(dst.Name, network)
		// One source port for both: the same 5-tuple on both Networks.
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", from.pod.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "probe", "udp",
			netip.AddrPortFrom(to.ip, nodesim.NetworksPort).String(), "--dev", from.ifName, "--sport", "41234").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), to.key()+" ") {
			t.Fatalf("%s → %s: %v: %s", from.key(), to.key(), err, out)
		}
		n, err := lc.Net.NetworkV1().Networks().Get(ctx, network, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		zone := pipeline.NetworkZone(n.Status.VNI)
		ct, err := dst.VswitchdAppctl(ctx, "dpctl/dump-conntrack", "netdev@ovs-netdev", fmt.Sprintf("zone=%d", zone))
		if err != nil {
			t.Fatal(err)
		}
		entry := fmt.Sprintf("src=%s,dst=%s,sport=41234,dport=%d", from.ip, to.ip, nodesim.NetworksPort)
		if !strings.Contains(ct, entry) {
			t.Errorf("%s's zone %d on %s lacks %s:\n%s", network, zone, dst.Name, entry, ct)
		}
		want = append(want, fmt.Sprintf("%s zone %d", network, zone))
		entries = append(entries, entry)
	}
	// Only the probes' own entries: another connection (the cluster network's, in TIME_WAIT) may have
	// picked the same source port.
	ours := func(line string) bool {
		return slices.ContainsFunc(entries, func(e string) bool { return strings.Contains(line, e) })
	}
	all, err := dst.VswitchdAppctl(ctx, "dpctl/dump-conntrack", "netdev@ovs-netdev")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(all, "\n") {
		if ours(line) && !strings.Contains(line, "zone=") {
			t.Errorf("a Network's connection in conntrack's default zone: %s", line)
		}
		for _, z := range []uint16{pipeline.ZoneService, pipeline.ZoneHairpin, pipeline.ZoneMasquerade} {
			if ours(line) && strings.Contains(line, fmt.Sprintf("zone=%d", z)) {
				t.Errorf("a Network's connection in the cluster network's zone %d: %s", z, line)
			}
		}
	}
	t.Logf("the same 5-tuple on both Networks: one entry in each of %v on %s", want, dst.Name)
}

// multusStyle calls the plugin binary exactly as Multus does for one attachment: the
// NetworkAttachmentDefinition's config on stdin (its name and cniVersion, runtimeConfig with the
// annotation's static address), CNI_IFNAME=net5, the pod's sandbox and netns; then DEL.
func multusStyle(t *testing.T, ctx context.Context, o *netObjects, p *cluster.Pod, all []netIface) {
	n := lc.Node(p.Node)
	sandbox := podSandbox(t, ctx, n, p)
	subnet, err := lc.Net.NetworkV1().NetworkSubnets().Get(ctx, networkv1.NetworkSubnetName("e2e-green", n.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	static := netip.MustParsePrefix(string(subnet.Subnet)).Addr().As4()
	static[3] += 9
	staticIP := netip.AddrFrom4(static)
	for _, i := range all {
		if i.ip == staticIP && i.network == "e2e-green" {
			t.Fatalf("%s already has %s", i.key(), staticIP)
		}
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"e2e-green","type":"ofsdn","network":"e2e-green","agentSocket":%q,"runtimeConfig":{"ips":[%q]}}`,
		n.CNISocket, staticIP.String()+"/16")
	call := func(command string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(n.CNIBinDir, "ofsdn"))
		cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+sandbox, "CNI_NETNS=/var/run/netns/"+p.NetNS,
			"CNI_IFNAME=net5", "CNI_PATH="+n.CNIBinDir,
			fmt.Sprintf("CNI_ARGS=IgnoreUnknown=true;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s", p.Namespace, p.Name, sandbox))
		cmd.Stdin = strings.NewReader(conf)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := call("ADD")
	if err != nil {
		t.Fatalf("Multus-style ADD: %v: %s", err, out)
	}
	if !strings.Contains(out, staticIP.String()) {
		t.Fatalf("ADD result lacks %s: %s", staticIP, out)
	}
	net5 := netIface{pod: p, ifName: "net5", network: "e2e-green", ip: staticIP}
	withNet5 := append(append([]netIface(nil), all...), net5)
	waitNetMatrix(t, ctx, o.model, withNet5, 30*time.Second)
	if out, err := call("ADD"); err != nil || !strings.Contains(out, staticIP.String()) {
		t.Fatalf("repeated Multus-style ADD: %v: %s", err, out)
	}
	if out, err := call("DEL"); err != nil {
		t.Fatalf("Multus-style DEL: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", p.NetNS, "link", "show", "net5").CombinedOutput(); err == nil {
		t.Fatalf("net5 still in the pod after DEL: %s", out)
	}
	waitNetMatrix(t, ctx, o.model, all, 30*time.Second)
	if out, err := call("DEL"); err != nil {
		t.Fatalf("DEL again: %v: %s", err, out)
	}
}

// podSandbox is the sandbox ID the node's runtime gave a pod (its eth0 port says).
func podSandbox(t *testing.T, ctx context.Context, n *cluster.Node, p *cluster.Pod) string {
	t.Helper()
	out, err := n.Vsctl(ctx, "--format=json", "--columns=external_ids", "find", "Port",
		"external_ids:ofsdn/pod-namespace="+p.Namespace, "external_ids:ofsdn/pod-name="+p.Name, "external_ids:ofsdn/ifname=eth0")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(out, `"ofsdn/sandbox","`)
	if i < 0 {
		t.Fatalf("no sandbox for %s on %s: %s", p.Key(), n.Name, out)
	}
	rest := out[i+len(`"ofsdn/sandbox","`):]
	return rest[:strings.IndexByte(rest, '"')]
}

// networkRestarts restarts the agent of a node, gracefully and with kill -9, while pods on red ping each
// other across nodes through net1 at 100 packets/s both ways: not one may be lost.
func networkRestarts(t *testing.T, ctx context.Context, o *netObjects, ns string) {
	nodes := lc.Nodes[:2]
	_, ifaces := o.netPods(t, ctx, ns, "nr", "red", nodes)
	if len(ifaces) != 2 {
		t.Fatalf("interfaces %v", ifaces)
	}
	a, b := ifaces[0], ifaces[1]
	if a.pod.Node != nodes[0].Name {
		a, b = b, a
	}
	deadline := time.Now().Add(15 * time.Second)
	for !pingDev(ctx, a, b.ip) || !pingDev(ctx, b, a.ip) {
		if time.Now().After(deadline) {
			t.Fatalf("%s and %s do not reach each other on red before the restarts", a.key(), b.key())
		}
	}
	const window = 15 * time.Second
	count := int(window / (10 * time.Millisecond))
	for _, crash := range []bool{false, true} {
		n := nodes[0]
		name := map[bool]string{false: "graceful", true: "kill-9"}[crash]
		t.Run(name, func(t *testing.T) {
			before := flowsButRound(t, ctx, n)
			roundBefore := round(t, ctx, n)
			pingers := []*pinger{startPingerDev(t, a, b.ip, count), startPingerDev(t, b, a.ip, count)}
			began := time.Now()
			time.Sleep(time.Second)
			restartAgent(t, ctx, n, crash, roundBefore, time.Minute)
			restarted := time.Since(began)
			lost := 0
			for _, p := range pingers {
				sent, got, out := p.wait()
				if sent != count || got != sent {
					t.Errorf("%s: %d sent, %d received (want %d of %d)\n%s", p.name, sent, got, count, count, out)
				}
				lost += sent - got
			}
			t.Logf("%s restart of %s's agent finished %s into the window; %d packets lost on red at 100/s each way",
				name, n.Name, restarted.Round(time.Millisecond), lost)
			after := flowsButRound(t, ctx, n)
			if strings.Join(before, "\n") != strings.Join(after, "\n") {
				t.Errorf("flows differ after the restart:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
			}
		})
	}
}

func pingDev(ctx context.Context, from netIface, to netip.Addr) bool {
	return exec.CommandContext(ctx, "ip", "netns", "exec", from.pod.NetNS, "ping", "-n", "-q", "-c", "1", "-W", "1", "-I", from.ifName, to.String()).Run() == nil
}

func startPingerDev(t *testing.T, from netIface, to netip.Addr, count int) *pinger {
	p := &pinger{name: from.key() + " → " + to.String(),
		cmd: exec.Command("ip", "netns", "exec", from.pod.NetNS, "ping", "-n", "-q", "-i", pingInterval, "-W", "1", "-c", fmt.Sprint(count),
			"-I", from.ifName, to.String())}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// networkBadInput: pods asking for what cannot be given fail their ADD with an error that says why,
// get a Warning Event, and leave nothing behind on the node.
func networkBadInput(t *testing.T, ctx context.Context, o *netObjects, nodes []*cluster.Node) {
	const ns = "e2e-net-bad"
	labelNamespace(t, ctx, ns, map[string]string{"e2e-net": "on"})
	o.nadFor(t, ctx, ns, "red", ofsdnNAD("e2e-red"))
	o.nadFor(t, ctx, ns, "ghost", ofsdnNAD("e2e-no-such-network"))
	o.nadFor(t, ctx, ns, "green", ofsdnNAD("e2e-green")) // ns is not admitted to green
	// A Network too small for the nodes: a /24 cut into /25s has room for two of three.
	o.network(t, ctx, "e2e-tiny", "10.202.0.0/24", 7, map[string]string{"e2e-net": "on"})
	o.nadFor(t, ctx, ns, "tiny", ofsdnNAD("e2e-tiny"))
	var tinyless *cluster.Node
	deadline := time.Now().Add(time.Minute)
	for tinyless == nil {
		have := 0
		for _, n := range nodes {
			if _, err := lc.Net.NetworkV1().NetworkSubnets().Get(ctx, networkv1.NetworkSubnetName("e2e-tiny", n.Name), metav1.GetOptions{}); err == nil {
				have++
			} else {
				tinyless = n
			}
		}
		if have != 2 {
			tinyless = nil
		}
		if tinyless == nil && time.Now().After(deadline) {
			t.Fatalf("e2e-tiny: want subnets on 2 of 3 nodes, have %d", have)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n, err := lc.Net.NetworkV1().Networks().Get(ctx, "e2e-tiny", metav1.GetOptions{}); err == nil {
		for _, c := range n.Status.Conditions {
			if c.Type == "SubnetsAvailable" {
				t.Logf("e2e-tiny SubnetsAvailable=%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
	}
	// A static address in use: that of a running pod's net1 on red.
	inUse := ""
	n0 := nodes[0]
	ifaces := runningIfaces(t, ctx, o, "e2e-net-a", n0)
	for _, i := range ifaces {
		if i.network == "e2e-red" {
			inUse = i.ip.String()
		}
	}
	if inUse == "" {
		t.Fatalf("no red interface on %s to clash with", n0.Name)
	}
	cases := []struct {
		name, annotation, says string
		node                   *cluster.Node
	}{
		{"missing-nad", "nope", "no such NetworkAttachmentDefinition e2e-net-bad/nope", n0},
		{"missing-network", "ghost", `Network "e2e-no-such-network" does not exist`, n0},
		{"interface-twice", "red@x1,red@x1", "asks for interface x1 twice", n0},
		{"static-outside", `[{"name":"red","ips":["10.99.0.5"]}]`, "outside Network e2e-red", n0},
		{"static-in-use", fmt.Sprintf(`[{"name":"red","ips":[%q]}]`, inUse), "in use", n0},
		{"not-admitted", "red,green", `does not admit namespace "e2e-net-bad"`, n0},
		{"no-subnet-here", "red,tiny", "has no subnet on node " + tinyless.Name, tinyless},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := cluster.PodSpec(ns, "bad-"+tc.name, tc.node.Name)
			spec.Annotations = map[string]string{nadv1.NetworkAttachmentAnnot: tc.annotation}
			if _, err := lc.Client.CoreV1().Pods(ns).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lc.DeletePod(context.Background(), ns, spec.Name) })
			msg := waitPodFailure(t, ctx, ns, spec.Name)
			if !strings.Contains(msg, tc.says) {
				t.Errorf("pod's failure %q does not say %q", msg, tc.says)
			}
			if ev := waitPodEvent(ctx, ns, spec.Name, "NetworkAttachmentRefused"); !strings.Contains(ev, tc.says) {
				t.Errorf("Warning Event %q does not say %q", ev, tc.says)
			}
			if l := networkCensus(t, ctx, tc.node, ns, []string{spec.Name}); l != "" {
				t.Errorf("a refused ADD left on %s: %s", tc.node.Name, l)
			}
		})
	}
}

// runningIfaces are the Network interfaces of a namespace's pods on a node.
func runningIfaces(t *testing.T, ctx context.Context, o *netObjects, ns string, n *cluster.Node) []netIface {
	t.Helper()
	list, err := lc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []netIface
	for _, p := range list.Items {
		if p.Spec.NodeName != n.Name || p.Status.PodIP == "" {
			continue
		}
		cp := &cluster.Pod{Namespace: p.Namespace, Name: p.Name, Node: n.Name, IP: netip.MustParseAddr(p.Status.PodIP)}
		is, err := o.interfaces(ctx, cp)
		if err == nil {
			out = append(out, is...)
		}
	}
	return out
}

func waitPodFailure(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p, err := lc.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if p.Status.Phase == corev1.PodRunning {
				t.Fatalf("pod %s/%s runs: its ADD should have failed", ns, name)
			}
			for _, c := range p.Status.Conditions {
				if c.Reason == "NetworkSetupFailed" {
					return c.Message
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s: no failed network setup after a minute", ns, name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitPodEvent(ctx context.Context, ns, name, reason string) string {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		evs, err := lc.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err == nil {
			for _, e := range evs.Items {
				if e.Reason == reason && e.Type == corev1.EventTypeWarning {
					return e.Message
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ""
}

// networkCensus lists what a node holds of a namespace's pods: Network address reservations, OVS
// ports, attachment flows ("" nothing).
func networkCensus(t *testing.T, ctx context.Context, n *cluster.Node, ns string, pods []string) string {
	t.Helper()
	var found []string
	root := filepath.Join(n.StateDir, "networks")
	nets, _ := os.ReadDir(root)
	for _, d := range append(nets, nil) {
		dir := filepath.Join(n.StateDir, "ipam")
		if d != nil {
			dir = filepath.Join(root, d.Name())
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err == nil {
				if f := strings.Split(string(data), "\n"); len(f) > 2 && f[2] == ns {
					found = append(found, "reservation "+dir+"/"+e.Name())
				}
			}
		}
	}
	out, err := n.Vsctl(ctx, "--format=csv", "--columns=name", "find", "Port", "external_ids:ofsdn/pod-namespace="+ns)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) > 1 {
		found = append(found, "ports "+strings.Join(lines[1:], ","))
	}
	dump, err := n.Ofctl(ctx, "dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[uint32]string{}
	for _, name := range pods {
		owners[pipeline.PodOwner(ns, name).Hash()] = name
		for _, ifName := range []string{"net1", "net2", "net3", "net4", "net5", "x1", "blue0"} { // every name the suite uses
			owners[pipeline.AttachmentOwner(ns, name, ifName).Hash()] = name
		}
	}
	for _, m := range cookieRE.FindAllStringSubmatch(dump, -1) {
		var v uint64
		fmt.Sscanf(m[1], "%x", &v)
		if c := reconcile.Cookie(v); c.Category() == reconcile.CategoryPod && owners[c.OwnerHash()] != "" {
			found = append(found, "flows of "+owners[c.OwnerHash()])
		}
	}
	return strings.Join(slices.Compact(found), "; ")
}

// networkDeletion: a Network with pods attached stays (its finalizer) and keeps carrying their traffic;
// once they go, it goes, with its NetworkSubnets and every node's flows for it.
func networkDeletion(t *testing.T, ctx context.Context, o *netObjects, n *cluster.Node) {
	const ns = "e2e-net-del"
	labelNamespace(t, ctx, ns, map[string]string{"e2e-del": "on"})
	o.network(t, ctx, "e2e-doomed", "10.203.0.0/16", 8, map[string]string{"e2e-del": "on"})
	waitNetwork(t, ctx, "e2e-doomed", lc.Nodes)
	o.nadFor(t, ctx, ns, "doomed", ofsdnNAD("e2e-doomed"))
	pods, ifaces := o.netPods(t, ctx, ns, "nd", "doomed", lc.Nodes[:2])
	a, b := ifaces[0], ifaces[1]
	// Control: the cookie this test reads finds the Network's flows while it lives, so "none left"
	// below means they went, not that the test looks for the wrong cookie.
	for _, node := range lc.Nodes[:2] {
		if networkFlows(t, ctx, node, "e2e-doomed") == 0 {
			t.Fatalf("control: no flow of Network e2e-doomed found on %s while it lives", node.Name)
		}
	}
	o.deleteNetwork(ctx, "e2e-doomed")
	time.Sleep(3 * time.Second)
	net, err := lc.Net.NetworkV1().Networks().Get(ctx, "e2e-doomed", metav1.GetOptions{})
	if err != nil || net.DeletionTimestamp == nil {
		t.Fatalf("a Network with pods attached must wait for them: %v %+v", err, net)
	}
	if !pingDev(ctx, a, b.ip) {
		t.Fatalf("the deleted Network's pods lost their traffic before they went")
	}
	for _, p := range pods {
		if err := lc.DeletePod(ctx, p.Namespace, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := lc.Net.NetworkV1().Networks().Get(ctx, "e2e-doomed", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Network e2e-doomed still there a minute after its last pod went: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, node := range lc.Nodes {
		deadline := time.Now().Add(30 * time.Second)
		for {
			left := networkFlows(t, ctx, node, "e2e-doomed")
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s keeps %d flows of the deleted Network", node.Name, left)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := lc.Net.NetworkV1().NetworkSubnets().Get(ctx, networkv1.NetworkSubnetName("e2e-doomed", node.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("NetworkSubnet of %s outlived its Network: %v", node.Name, err)
		}
	}
}

// networkFlows counts a node's flows whose cookie names the Network.
func networkFlows(t *testing.T, ctx context.Context, node *cluster.Node, network string) int {
	t.Helper()
	dump, err := node.Ofctl(ctx, "dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatal(err)
	}
	owner := pipeline.NetworkOwner(network)
	n := 0
	for _, m := range cookieRE.FindAllStringSubmatch(dump, -1) {
		var v uint64
		fmt.Sscanf(m[1], "%x", &v)
		if c := reconcile.Cookie(v); c.Category() == owner.Category && c.OwnerHash() == owner.Hash() {
			n++
		}
	}
	return n
}

// BenchmarkCNIAddNetworks: CNI ADD latency through libcni and the installed conflist, as
// BenchmarkCNIAddRuntimeOnly measures it, for pods with one interface (eth0) and for pods with three
// (eth0 and two Networks the annotation asks for), alternating batches of 10 concurrent ADDs so both see
// the same machine. Reports each's p50/p99 and their ratio.
func BenchmarkCNIAddNetworks(b *testing.B) {
	ctx := context.Background()
	n := lc.Nodes[0]
	const namespace = "bench-cni-networks"
	if err := lc.EnsureNamespace(ctx, namespace); err != nil {
		b.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"bench-net": "on"}}})
	if _, err := lc.Client.CoreV1().Namespaces().Patch(ctx, namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		b.Fatal(err)
	}
	nad, err := nadclient.NewForConfig(lc.API.AdminConfig())
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"bench-one", "bench-two"} {
		nw := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkv1.NetworkSpec{CIDR: "10.210.0.0/16", HostSubnetLength: 8,
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bench-net": "on"}}}}
		if name == "bench-two" {
			nw.Spec.CIDR = "10.211.0.0/16"
		}
		if _, err := lc.Net.NetworkV1().Networks().Create(ctx, nw, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = lc.Net.NetworkV1().Networks().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		d := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: ofsdnNAD(name)}}
		if _, err := nad.K8sCniCncfIoV1().NetworkAttachmentDefinitions(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := lc.Net.NetworkV1().NetworkSubnets().Get(ctx, networkv1.NetworkSubnetName(name, n.Name), metav1.GetOptions{}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("Network %s has no subnet on %s", name, n.Name)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	list, err := libcni.ConfListFromFile(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
	if err != nil {
		b.Fatal(err)
	}
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{n.CNIBinDir}, b.TempDir(), nil)
	// Pods the node simulator leaves alone: the benchmark is their runtime. The agent reads their
	// networks annotation from the API, as it would a kubelet's pod's.
	const pods, parallel = 60, 10
	name := func(i int) string { return fmt.Sprintf("w%d", i) }
	for i := range pods {
		spec := cluster.PodSpec(namespace, name(i), n.Name)
		spec.Annotations = map[string]string{nodesim.UnmanagedAnnotation: "true"}
		if i%(2*parallel) >= parallel { // every other batch asks for two Networks
			spec.Annotations[nadv1.NetworkAttachmentAnnot] = "bench-one,bench-two"
		}
		if _, err := lc.Client.CoreV1().Pods(namespace).Create(ctx, spec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		zero := int64(0)
		for i := range pods {
			_ = lc.Client.CoreV1().Pods(namespace).Delete(context.Background(), name(i), metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
	})
	rt := func(i int) *libcni.RuntimeConf {
		return &libcni.RuntimeConf{ContainerID: fmt.Sprintf("benchnet%04d", i), IfName: "eth0",
			NetNS: "/var/run/netns/" + nodesim.NetNSName(lc.Lab.Prefix+"-"+n.Name, namespace, name(i)),
			Args:  [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name(i)}}}
	}
	var one, three []time.Duration
	for b.Loop() {
		b.StopTimer()
		for i := range pods {
			netns := filepath.Base(rt(i).NetNS)
			if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
				b.Fatalf("netns %s: %v: %s", netns, err, out)
			}
			b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
		}
		b.StartTimer()
		for batch := 0; batch < pods/parallel; batch++ {
			var wg sync.WaitGroup
			lat := make([]time.Duration, parallel)
			errs := make([]error, parallel)
			ifaces := make([]int, parallel)
			for j := range parallel {
				wg.Go(func() {
					start := time.Now()
					res, err := cniConf.AddNetworkList(ctx, list, rt(batch*parallel+j))
					lat[j] = time.Since(start)
					errs[j] = err
					if err == nil {
						if r, err := current.NewResultFromResult(res); err == nil {
							ifaces[j] = len(r.IPs)
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			want := 1
			if batch%2 == 1 {
				want = 3
			}
			for j := range parallel {
				if ifaces[j] != want {
					b.Fatalf("batch %d: a pod got %d addresses, want %d", batch, ifaces[j], want)
				}
			}
			if want == 1 {
				one = append(one, lat...)
			} else {
				three = append(three, lat...)
			}
		}
		b.StopTimer()
		for i := range pods {
			if err := cniConf.DelNetworkList(ctx, list, rt(i)); err != nil {
				b.Fatal(err)
			}
			_ = exec.Command("ip", "netns", "del", filepath.Base(rt(i).NetNS)).Run()
		}
		b.StartTimer()
	}
	b.ReportMetric(ms(percentile(one, 0.5)), "1if-p50-ms")
	b.ReportMetric(ms(percentile(one, 0.99)), "1if-p99-ms")
	b.ReportMetric(ms(percentile(three, 0.5)), "3if-p50-ms")
	b.ReportMetric(ms(percentile(three, 0.99)), "3if-p99-ms")
	b.ReportMetric(ms(percentile(three, 0.99))/ms(percentile(one, 0.99)), "p99-ratio-3/1")
	phases, err := addPhases(n.AgentLog, namespace+"/")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ms(percentile(phases["networks-wait"], 0.99)), "agent-networks-wait-p99-ms")
}

// networkAttacks: a hostile pod on blue and green (and on the cluster network) tries to reach red's
// pods: through the address red and blue share, with red's MAC, spoofing a blue neighbour's address or
// MAC or ARP, from green without cross-talk, and with VXLAN forged with red's VNI from its Network
// interface and from eth0. Red's interfaces, watched by raw sockets, must see none of it. Controls show
// the watch sees what arrives: the same datagram reaches blue's interface at that address, an ordinary
// red datagram reaches red's, and the forged VXLAN sent from a node's host (the trusted underlay) is
// delivered.
func networkAttacks(t *testing.T, ctx context.Context, ifA, ifB []netIface) {
	on := func(ifs []netIface, node int, network string) netIface {
		for _, i := range ifs {
			if i.pod.Node == lc.Nodes[node].Name && i.network == network {
				return i
			}
		}
		t.Fatalf("no %s interface on %s", network, lc.Nodes[node].Name)
		return netIface{}
	}
	vni := map[string]uint32{}
	for _, name := range []string{"e2e-red", "e2e-blue", "e2e-green"} {
		n, err := lc.Net.NetworkV1().Networks().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vni[name] = n.Status.VNI
	}
	macOf := func(i netIface) net.HardwareAddr {
		var mac net.HardwareAddr
		err := lab.InNetNS(i.pod.NetNS, func() error {
			ifc, err := net.InterfaceByName(i.ifName)
			if err == nil {
				mac = ifc.HardwareAddr
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return mac
	}
	blueAtk, greenAtk := on(ifB, 0, "e2e-blue"), on(ifB, 0, "e2e-green")
	redV, blueV := on(ifA, 1, "e2e-red"), on(ifA, 1, "e2e-blue") // one address, two Networks
	redL, blueL := on(ifA, 0, "e2e-red"), on(ifA, 0, "e2e-blue")
	if redV.ip != blueV.ip || redL.ip != blueL.ip {
		t.Fatalf("victims' red and blue addresses differ: %s/%s, %s/%s", redV.ip, blueV.ip, redL.ip, blueL.ip)
	}
	run := fmt.Sprint(time.Now().UnixNano())
	atkMAC, redVMAC, blueLMAC := macOf(blueAtk), macOf(redV), macOf(blueL)
	seen := watchIfaces(t, run, []watchedIface{
		{redV.key(), redV.pod.NetNS, redV.ifName}, {redL.key(), redL.pod.NetNS, redL.ifName},
		{blueV.key(), blueV.pod.NetNS, blueV.ifName}, {blueL.key(), blueL.pod.NetNS, blueL.ifName},
	}, map[string][]spoofedARP{
		redV.key(): {{spa: blueL.ip, sha: atkMAC}}, redL.key(): {{spa: blueL.ip, sha: atkMAC}},
		blueV.key(): {{spa: blueL.ip, sha: atkMAC}}, blueL.key(): {{spa: blueL.ip, sha: atkMAC}},
	})
	udp := func(src, dst netip.Addr, name string) []byte {
		return ipv4UDP(src, dst, 40000, atkInnerPort, marker(run, name))
	}
	tunnelPort := uint16(networkv1.DefaultVXLANPort)
	forged := func(name string) []byte { // red's VNI, an inner frame from node 1's red subnet to redV
		inner := ether(redVMAC, podMAC(redL.ip.Next()), unix.ETH_P_IP, udp(redL.ip.Next(), redV.ip, name))
		return vxlanPayload(vni["e2e-red"], inner)
	}
	type netProbe struct {
		name          string
		send          func() error
		red, blueOnly bool // red: red may see it (a control); blueOnly: only blue's interfaces may
	}
	count := atkPerProbe
	frame := func(from netIface, f []byte) func() error {
		return func() error { return sendFramesOn(from.pod.NetNS, from.ifName, [][]byte{f}, count, 0) }
	}
	probes := []netProbe{
		// Controls.
		{name: "net-legit-red", red: true, send: func() error {
			return sendUDPOn(redL.pod.NetNS, redL.ifName, netip.AddrPortFrom(redV.ip, atkInnerPort), marker(run, "net-legit-red"), count)
		}},
		{name: "net-underlay-red", red: true, send: func() error {
			return sendUDP(lc.Nodes[0].NetNS, netip.AddrPortFrom(lc.Nodes[1].IP, tunnelPort), forged("net-underlay-red"), count, 5*time.Millisecond)
		}},
		// The address red and blue share, from blue: blue's interface has it, red's never sees it.
		{name: "net-blue-to-shared-address", blueOnly: true, send: func() error {
			return sendUDPOn(blueAtk.pod.NetNS, blueAtk.ifName, netip.AddrPortFrom(redV.ip, atkInnerPort), marker(run, "net-blue-to-shared-address"), count)
		}},
		{name: "net-red-mac", blueOnly: true, send: frame(blueAtk, ether(redVMAC, atkMAC, unix.ETH_P_IP, udp(blueAtk.ip, redV.ip, "net-red-mac")))},
		// Spoofing on blue: a neighbour's address, its MAC, ARP claiming its address.
		{name: "net-spoof-ip", send: frame(blueAtk, ether(podMAC(redV.ip), atkMAC, unix.ETH_P_IP, udp(blueL.ip, redV.ip, "net-spoof-ip")))},
		{name: "net-spoof-ip-mac", send: frame(blueAtk, ether(podMAC(redV.ip), blueLMAC, unix.ETH_P_IP, udp(blueL.ip, redV.ip, "net-spoof-ip-mac")))},
		{name: "net-spoof-arp", send: frame(blueAtk, arpFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 2, atkMAC, blueL.ip,
			net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, blueL.ip))},
		// Green does not talk to red: not by address, not through green's gateway.
		{name: "net-green-to-red", send: frame(greenAtk, ether(pipeline.NetworkGatewayMAC(vni["e2e-green"]), macOf(greenAtk), unix.ETH_P_IP,
			udp(greenAtk.ip, redV.ip, "net-green-to-red")))},
		// VXLAN forged with red's VNI, to the node holding the victim: from blue's interface (through its
		// gateway) and from the cluster network.
		{name: "net-vxlan-from-blue", send: frame(blueAtk, ether(pipeline.NetworkGatewayMAC(vni["e2e-blue"]), atkMAC, unix.ETH_P_IP,
			ipv4UDP(blueAtk.ip, lc.Nodes[1].IP, 40000, tunnelPort, forged("net-vxlan-from-blue"))))},
		{name: "net-vxlan-from-eth0", send: func() error {
			return sendUDP(blueAtk.pod.NetNS, netip.AddrPortFrom(lc.Nodes[1].IP, tunnelPort), forged("net-vxlan-from-eth0"), count, 0)
		}},
	}
	for _, p := range probes {
		if err := p.send(); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
	time.Sleep(time.Second)
	seen.close()
	reds, blues := []string{redV.key(), redL.key()}, []string{blueV.key(), blueL.key()}
	attacks := 0
	for _, p := range probes {
		var redSaw, blueSaw int
		for _, k := range reds {
			redSaw += seen.seenBy(k, p.name)
		}
		for _, k := range blues {
			blueSaw += seen.seenBy(k, p.name)
		}
		switch {
		case p.red:
			if redSaw < count-1 {
				t.Errorf("control %s: red's interfaces saw %d of %d: the watch or the datagram is broken", p.name, redSaw, count)
			}
		case p.blueOnly:
			attacks++
			if redSaw > 0 {
				t.Errorf("attack %s: red's interfaces saw %d", p.name, redSaw)
			}
			if p.name == "net-blue-to-shared-address" && blueSaw < count-1 {
				t.Errorf("control %s: blue's interface at the shared address saw %d of %d", p.name, blueSaw, count)
			}
		default:
			attacks++
			if redSaw+blueSaw > 0 {
				t.Errorf("attack %s: red saw %d, blue %d", p.name, redSaw, blueSaw)
			}
		}
	}
	for _, k := range append(reds, blues...) {
		if n := seen.seenBy(k, "arp-spoofed"); n > 0 {
			t.Errorf("%s saw %d ARP packets claiming %s with the attacker's MAC", k, n, blueL.ip)
		}
	}
	t.Logf("%d attacks (%d frames and datagrams) on red's pods from blue, green and the cluster network: 0 delivered; controls: %d ordinary red, %d underlay forgeries to red",
		attacks, attacks*count, seen.seenBy(redV.key(), "net-legit-red"), seen.seenBy(redV.key(), "net-underlay-red"))
}

// sendUDPOn sends payload count times from a socket bound to an interface of netns.
func sendUDPOn(netns, ifName string, dst netip.AddrPort, payload []byte, count int) error {
	return lab.InNetNS(netns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.BindToDevice(fd, ifName); err != nil {
			return err
		}
		to := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
		for range count {
			_ = unix.Sendto(fd, payload, 0, to) // an ICMP error from an earlier one fails a later send; keep going
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	})
}
