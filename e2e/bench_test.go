//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/ofsdn/ofsdn/agent/nodeauth"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/nodesim"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/ofswitch"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkCNIAdd: CNI ADD latency, as the runtime (node simulator) sees it through libcni, for 100 pods
// added 10 at a time on one node. Target p99 < 150 ms.
func BenchmarkCNIAdd(b *testing.B) {
	ctx := context.Background()
	n := lc.Nodes[0]
	if err := lc.EnsureNamespace(ctx, "bench-cni"); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for b.Loop() {
		first := len(n.Sim.CNIAddLatencies())
		for batch := 0; batch < 10; batch++ {
			var wg sync.WaitGroup
			errs := make(chan error, 10)
			for i := 0; i < 10; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					spec := cluster.PodSpec("bench-cni", fmt.Sprintf("p%d-%d", batch, i), n.Name)
					if _, err := lc.RunPod(ctx, spec); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
		all = append(all, n.Sim.CNIAddLatencies()[first:]...)
		b.StopTimer()
		deleteAll(b, "bench-cni")
		b.StartTimer()
	}
	b.ReportMetric(ms(percentile(all, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(all, 0.99)), "p99-ms")
	b.ReportMetric(float64(len(all)), "adds")
	// The agent logs each ADD's phases (-v=2); their percentiles say how much of the runtime's figure the
	// agent spent and on what, and how much went to exec'ing the plugin and waiting for a CPU.
	phases, err := addPhases(n.AgentLog, "bench-cni/")
	if err != nil {
		b.Fatal(err)
	}
	for _, ph := range []string{"total", "ipam", "veth", "ovsdb", "flows"} {
		b.ReportMetric(ms(percentile(phases[ph], 0.5)), "agent-"+ph+"-p50-ms")
		b.ReportMetric(ms(percentile(phases[ph], 0.99)), "agent-"+ph+"-p99-ms")
	}
}

// profileEnv names a directory: when set, the CNI benchmarks save the agent's CPU profile over their
// timed part there (go tool pprof -top <file>), read as an operator would: over TLS with a token allowed
// nodes/pprof (README, "The node API").
const profileEnv = "OFSDN_E2E_PROFILE"

// profileAgent starts a CPU profile of n's agent of the given length when profileEnv is set, and returns
// a wait that saves it as <dir>/<name>.pprof.
func profileAgent(b *testing.B, n *cluster.Node, name string, seconds int) (wait func()) {
	dir := os.Getenv(profileEnv)
	if dir == "" {
		return func() {}
	}
	ctx := context.Background()
	if _, err := lc.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-bench-profiler"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{nodeauth.Group}, Resources: []string{"nodes/" + nodeauth.SubresourcePprof}, Verbs: []string{"get"}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	token, err := lc.NodeAPIToken(ctx, "bench-profiler", "e2e-bench-profiler")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var data []byte
		err := lab.InNetNS(n.NetNS, func() error {
			req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("https://%s:9101/debug/pprof/profile?seconds=%d", n.IP, seconds), nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := cluster.AgentHTTPClient(time.Duration(seconds+30) * time.Second).Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("pprof: %s", resp.Status)
			}
			data, err = io.ReadAll(resp.Body)
			return err
		})
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name+".pprof"), data, 0o644)
		}
		if err != nil {
			b.Logf("profile of %s's agent: %v", n.Name, err)
		}
	}()
	return func() { <-done }
}

// BenchmarkCNIAddRuntimeOnly: the same 100 ADDs, 10 at a time, through libcni and the installed conflist,
// but with nothing else of a pod's start-up competing for the lab's two cores: the sandboxes' netns and
// the pods' API objects (which a runtime's pods have before their ADD, and the agent reads from its
// informer) are made beforehand, and no status update or pod process goes with them. Its gap to
// BenchmarkCNIAdd is what the rest of the lab (three nodes' OVS, the API server, pod processes) costs the
// plugin in CPU contention. With OFSDN_E2E_PROFILE set, the agent's CPU profile of the timed part is saved.
func BenchmarkCNIAddRuntimeOnly(b *testing.B) {
	ctx := context.Background()
	n := lc.Nodes[0]
	const namespace = "bench-cni-direct"
	if err := lc.EnsureNamespace(ctx, namespace); err != nil {
		b.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
	if err != nil {
		b.Fatal(err)
	}
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{n.CNIBinDir}, b.TempDir(), nil)
	rt := func(i int) *libcni.RuntimeConf {
		name := fmt.Sprintf("d%d", i)
		return &libcni.RuntimeConf{ContainerID: fmt.Sprintf("benchdirect%04d", i), IfName: "eth0",
			NetNS: "/var/run/netns/" + nodesim.NetNSName(lc.Lab.Prefix+"-"+n.Name, namespace, name),
			Args:  [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}}
	}
	const pods, parallel = 100, 10
	for i := range pods {
		spec := cluster.PodSpec(namespace, fmt.Sprintf("d%d", i), n.Name)
		spec.Annotations = map[string]string{nodesim.UnmanagedAnnotation: "true"}
		if _, err := lc.Client.CoreV1().Pods(namespace).Create(ctx, spec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		zero := int64(0)
		for i := range pods {
			_ = lc.Client.CoreV1().Pods(namespace).Delete(context.Background(), fmt.Sprintf("d%d", i), metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
	})
	var all []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for i := range pods {
			netns := filepath.Base(rt(i).NetNS)
			if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
				b.Fatalf("netns %s: %v: %s", netns, err, out)
			}
			b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
		}
		saveProfile := profileAgent(b, n, fmt.Sprintf("cni-add-runtime-only-%d", i), 2)
		b.StartTimer()
		for batch := 0; batch < pods/parallel; batch++ {
			var wg sync.WaitGroup
			lat := make([]time.Duration, parallel)
			errs := make([]error, parallel)
			for j := range parallel {
				wg.Go(func() {
					start := time.Now()
					_, errs[j] = cniConf.AddNetworkList(ctx, list, rt(batch*parallel+j))
					lat[j] = time.Since(start)
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			all = append(all, lat...)
		}
		b.StopTimer()
		saveProfile()
		for i := range pods {
			if err := cniConf.DelNetworkList(ctx, list, rt(i)); err != nil {
				b.Fatal(err)
			}
			_ = exec.Command("ip", "netns", "del", filepath.Base(rt(i).NetNS)).Run()
		}
		b.StartTimer()
	}
	b.ReportMetric(ms(percentile(all, 0.5)), "p50-ms")
	b.ReportMetric(ms(percentile(all, 0.99)), "p99-ms")
	b.ReportMetric(float64(len(all)), "adds")
	phases, err := addPhases(n.AgentLog, namespace+"/")
	if err != nil {
		b.Fatal(err)
	}
	for _, ph := range []string{"total", "ipam", "veth", "ovsdb", "flows"} {
		b.ReportMetric(ms(percentile(phases[ph], 0.5)), "agent-"+ph+"-p50-ms")
		b.ReportMetric(ms(percentile(phases[ph], 0.99)), "agent-"+ph+"-p99-ms")
	}
}

var (
	podAttachedPod   = regexp.MustCompile(`"pod attached".*\bpod="([^"]+)"`)
	podAttachedPhase = regexp.MustCompile(`\b(total|ipam|veth|ovsdb|networks-wait|flows)="?([0-9.]+(?:ns|µs|us|ms|s))"?`)
)

// addPhases reads the agent's "pod attached" lines for pods whose key starts with prefix and returns the
// durations of each phase.
func addPhases(agentLog, prefix string) (map[string][]time.Duration, error) {
	data, err := os.ReadFile(agentLog)
	if err != nil {
		return nil, fmt.Errorf("agent log: %w", err)
	}
	phases := map[string][]time.Duration{}
	for line := range strings.Lines(string(data)) {
		m := podAttachedPod.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(m[1], prefix) {
			continue
		}
		for _, kv := range podAttachedPhase.FindAllStringSubmatch(line, -1) {
			d, err := time.ParseDuration(kv[2])
			if err != nil {
				return nil, fmt.Errorf("agent log: %q: %w", line, err)
			}
			phases[kv[1]] = append(phases[kv[1]], d)
		}
	}
	if len(phases["total"]) == 0 {
		return nil, fmt.Errorf("agent log %s: no \"pod attached\" lines for %s* (is the agent at -v=2?)", agentLog, prefix)
	}
	return phases, nil
}

func deleteAll(b *testing.B, namespace string) {
	ctx := context.Background()
	pods, err := lc.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, p := range pods.Items {
		wg.Add(1)
		go func() { defer wg.Done(); _ = lc.DeletePod(ctx, namespace, p.Name) }()
	}
	wg.Wait()
}

// flowWatch polls one owner's flows on every node over OpenFlow (a session of its own per node, as
// flowctl has) until a predicate holds everywhere, and returns when that happened.
type flowWatch struct {
	sessions []*ofswitch.Session
}

func newFlowWatch(b *testing.B) *flowWatch {
	w := &flowWatch{}
	for _, n := range lc.Nodes {
		s, err := ofswitch.Dial(context.Background(), ofswitch.Config{Socket: n.MgmtSocket("br0"), Bridge: "br0", Logger: klog.Background()})
		if err != nil {
			b.Fatal(err)
		}
		w.sessions = append(w.sessions, s)
	}
	b.Cleanup(func() {
		for _, s := range w.sessions {
			s.Close()
		}
	})
	return w
}

// until waits until ok holds for the owner's flows on every node and returns how long after start the last
// node got there.
func (w *flowWatch) until(ctx context.Context, start time.Time, owner reconcile.Owner, ok func(node int, fl []string) bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last time.Duration
	filter := ofswitch.FlowFilter{TableID: openflow.AllTables, Cookie: uint64(reconcile.MakeCookie(0, owner)), CookieMask: reconcile.CookieIdentityMask}
	for i, s := range w.sessions {
		for {
			raw, err := s.DumpFlows(ctx, filter)
			if err != nil {
				return 0, fmt.Errorf("node %d: %w", i, err)
			}
			var fl []string
			for _, r := range raw {
				if f, err := openflow.DecodeFlowStats(r); err == nil {
					fl = append(fl, f.String())
				}
			}
			if ok(i, fl) {
				break
			}
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("node %d: %s never converged: %w (flows %q)", i, owner, ctx.Err(), fl)
			case <-time.After(2 * time.Millisecond):
			}
		}
		last = max(last, time.Since(start))
	}
	return last, nil
}

// BenchmarkConvergence: how long after an API change the flows are on all 3 nodes. Target p99 < 250 ms.
func BenchmarkConvergence(b *testing.B) {
	ctx := context.Background()
	w := newFlowWatch(b)
	b.Run("join", func(b *testing.B) {
		for _, ns := range []string{"bench-join-a", "bench-join-b"} {
			if err := lc.EnsureNamespace(ctx, ns); err != nil {
				b.Fatal(err)
			}
		}
		var pods []*cluster.Pod
		for _, n := range lc.Nodes {
			p, err := lc.RunPod(ctx, cluster.PodSpec("bench-join-a", "a-"+n.Name, n.Name))
			if err != nil {
				b.Fatal(err)
			}
			pods = append(pods, p)
		}
		b.Cleanup(func() { deleteAll(b, "bench-join-a") })
		var took []time.Duration
		for b.Loop() {
			for i := 0; i < 20; i++ {
				req := "join:bench-join-b"
				if i%2 == 1 {
					req = "isolate"
				}
				start := time.Now()
				netid, err := lc.ChangeNetwork(ctx, "bench-join-a", req)
				if err != nil {
					b.Fatal(err)
				}
				load := "load:" + hex(netid) + "->NXM_NX_REG0[]"
				// Every node hosts one of the namespace's pods: wait for each one's new VNID on its own node.
				var worst time.Duration
				for k, p := range pods {
					one := &flowWatch{sessions: w.sessions[k : k+1]}
					d, err := one.until(ctx, start, pipeline.PodOwner(p.Namespace, p.Name), func(_ int, fl []string) bool {
						return slices.ContainsFunc(fl, func(s string) bool { return strings.Contains(s, load) })
					})
					if err != nil {
						b.Fatal(err)
					}
					worst = max(worst, d)
				}
				took = append(took, worst)
			}
		}
		b.ReportMetric(ms(percentile(took, 0.5)), "p50-ms")
		b.ReportMetric(ms(percentile(took, 0.99)), "p99-ms")
	})
	b.Run("policy", func(b *testing.B) {
		// A NetworkPolicy created is enforced once each node's bridge holds its flows (the policy selects
		// a pod on every node, so every node renders it).
		const ns = "bench-np"
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			b.Fatal(err)
		}
		for _, n := range lc.Nodes {
			spec := cluster.PodSpec(ns, "target-"+n.Name, n.Name)
			spec.Labels["role"] = "target"
			if _, err := lc.RunPod(ctx, spec); err != nil {
				b.Fatal(err)
			}
		}
		b.Cleanup(func() { deleteAll(b, ns) })
		setModeFor(b, networkv1.PluginModeNetworkPolicy)
		var took []time.Duration
		for b.Loop() {
			for i := -1; i < 20; i++ { // -1: a warm-up, not counted
				name := fmt.Sprintf("p%d", i+1)
				np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
					Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "target"}},
						Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
							{Port: ptr.To(intstr.FromInt32(cluster.TestPort))}}}}}}
				start := time.Now()
				if _, err := lc.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				d, err := w.until(ctx, start, pipeline.NetPolOwner(ns, name), func(_ int, fl []string) bool {
					return slices.ContainsFunc(fl, func(s string) bool { return strings.Contains(s, "conj_id=") })
				})
				if err != nil {
					b.Fatal(err)
				}
				if i >= 0 {
					took = append(took, d)
				}
				if err := lc.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(ms(percentile(took, 0.5)), "p50-ms")
		b.ReportMetric(ms(percentile(took, 0.99)), "p99-ms")
		b.Logf("policy created → flows on all %d nodes, %d changes: p50 %s, p99 %s (target p99 < 250 ms)",
			len(lc.Nodes), len(took), percentile(took, 0.5), percentile(took, 0.99))
	})
	b.Run("new-node", func(b *testing.B) {
		var took []time.Duration
		for b.Loop() {
			for i := 0; i < 20; i++ {
				name := fmt.Sprintf("bench-node-%d", i)
				ip := netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)})
				start := time.Now()
				if err := registerNode(ctx, name, ip); err != nil {
					b.Fatal(err)
				}
				d, err := w.until(ctx, start, pipeline.NodeOwner(name), func(_ int, fl []string) bool {
					return slices.ContainsFunc(fl, func(s string) bool { return strings.Contains(s, "tun_src="+ip.String()) })
				})
				if err != nil {
					b.Fatal(err)
				}
				took = append(took, d)
				if err := lc.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(ms(percentile(took, 0.5)), "p50-ms")
		b.ReportMetric(ms(percentile(took, 0.99)), "p99-ms")
	})
}

// registerNode creates a Node with an InternalIP, as a kubelet joining the cluster does (the node
// lifecycle controller may touch it in between: retry on conflict).
func registerNode(ctx context.Context, name string, ip netip.Addr) error {
	if _, err := lc.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := lc.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
		_, err = lc.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

func hex(v uint32) string { return "0x" + strconv.FormatUint(uint64(v), 16) }

// setModeFor switches the cluster to mode for the rest of the benchmark and back to multitenant (the
// lab's mode) after it.
func setModeFor(b *testing.B, mode networkv1.PluginMode) {
	ctx := context.Background()
	if err := lc.SetMode(ctx, mode); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := lc.SetMode(ctx, networkv1.PluginModeMultitenant); err != nil {
			b.Error(err)
		}
	})
}

// BenchmarkAgentRSS: the agent's resident memory with 110 local pods and 500 remote HostSubnets (target
// < 80 MB), then in networkpolicy mode with 5,000 pods in the cluster and 500 NetworkPolicies (target
// < 100 MB). The other 4,890 pods are API objects bound to the 500 remote nodes with a Running status
// and an address: every agent watches them (policy peers) though no node runs them. Of the policies,
// 100 select the local pods (this node renders them: peers are pods of other namespaces by label), 400
// select pods elsewhere (this node parses them and renders nothing).
func BenchmarkAgentRSS(b *testing.B) {
	ctx := context.Background()
	n := lc.Nodes[2]
	if err := lc.EnsureNamespace(ctx, "bench-rss"); err != nil {
		b.Fatal(err)
	}
	setModeFor(b, networkv1.PluginModeNetworkPolicy)
	for b.Loop() {
		// 500 remote nodes: Node objects with addresses; the controller gives each a HostSubnet.
		var wg sync.WaitGroup
		sem := make(chan struct{}, 20)
		for i := 0; i < 500; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				name := fmt.Sprintf("bench-remote-%d", i)
				if err := registerNode(ctx, name, netip.AddrFrom4([4]byte{203, 0, byte(114 + i/250), byte(1 + i%250)})); err != nil {
					b.Error(err)
				}
			}()
		}
		for i := 0; i < 110; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				spec := cluster.PodSpec("bench-rss", fmt.Sprintf("p%d", i), n.Name)
				spec.Labels["tier"] = fmt.Sprint("t", i%10)
				if _, err := lc.RunPod(ctx, spec); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		if b.Failed() {
			return
		}
		// Let the agent take in the last HostSubnets, then read its memory.
		time.Sleep(3 * time.Second)
		rss, err := vmRSS(n.AgentPID())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(rss/1024, "agent-RSS-MB-base")
		b.Cleanup(func() { deleteClusterPods(b) })
		if err := createClusterPods(ctx, 4890, 500); err != nil {
			b.Fatal(err)
		}
		if err := createPolicies(ctx); err != nil {
			b.Fatal(err)
		}
		flows, err := settleFlows(ctx, n)
		if err != nil {
			b.Fatal(err)
		}
		withPolicies, err := vmRSS(n.AgentPID())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(withPolicies/1024, "agent-RSS-MB")
		b.ReportMetric(float64(flows), "node-flows")
		b.Logf("agent RSS: %.1f MB with 110 local pods and 500 remote nodes (target < 80 MB); %.1f MB with 5,000 pods and 500 policies, "+
			"%d flows on the node (target < 100 MB)", rss/1024, withPolicies/1024, flows)
		b.StopTimer()
		deleteClusterPods(b)
		deleteAll(b, "bench-rss")
		for i := 0; i < 500; i++ {
			_ = lc.Client.CoreV1().Nodes().Delete(ctx, fmt.Sprintf("bench-remote-%d", i), metav1.DeleteOptions{})
		}
		b.StartTimer()
	}
}

// benchRSSNamespaces hold the pods of the cluster that no lab node runs: team t0..t2.
var benchRSSNamespaces = func() []string {
	var out []string
	for i := range 10 {
		out = append(out, fmt.Sprint("bench-rss-", i))
	}
	return out
}()

// createClusterPods creates n pods bound to the remote nodes bench-remote-0..nodes-1, each Running with
// an address (10.131.128.0/17, which no lab node hosts), labels app=a<i%10>, role=r<i%7> and a
// container port "http".
func createClusterPods(ctx context.Context, n, nodes int) error {
	for i, ns := range benchRSSNamespaces {
		if _, err := lc.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{"team": fmt.Sprint("t", i%3)}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 20)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ns := benchRSSNamespaces[i%len(benchRSSNamespaces)]
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprint("c", i),
				Labels: map[string]string{"app": fmt.Sprint("a", i%10), "role": fmt.Sprint("r", i%7)}},
				Spec: corev1.PodSpec{NodeName: fmt.Sprint("bench-remote-", i%nodes), TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "c", Image: "ofsdn-testpod",
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}}}
			created, err := lc.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				errs <- err
				return
			}
			ip := netip.AddrFrom4([4]byte{10, 131, byte(128 + i>>8), byte(i)}).String()
			created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
			if _, err := lc.Client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// createPolicies creates 500 NetworkPolicies: 100 in bench-rss selecting its local pods by tier, with
// ingress from app=a<k%10>,role=r<k%7> in the namespaces of team t<k%3> on tcp/8080 and http, and
// egress to app=a<(k+1)%10> in namespace bench-rss-<k%10>; and 40 in each bench-rss-<i>, selecting pods
// there, with ingress from role=r<k%7> in any namespace.
func createPolicies(ctx context.Context) error {
	sel := func(kv ...string) *metav1.LabelSelector {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return &metav1.LabelSelector{MatchLabels: m}
	}
	var nps []*networkingv1.NetworkPolicy
	for k := range 100 {
		nps = append(nps, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-rss", Name: fmt.Sprint("local-", k)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("tier", fmt.Sprint("t", k%10)),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", fmt.Sprint("t", k%3)),
						PodSelector: sel("app", fmt.Sprint("a", k%10), "role", fmt.Sprint("r", k%7))}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromInt32(8080))}, {Port: ptr.To(intstr.FromString("http"))}}}},
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("kubernetes.io/metadata.name", benchRSSNamespaces[k%10]),
						PodSelector: sel("app", fmt.Sprint("a", (k+1)%10))}}}}}})
	}
	for i, ns := range benchRSSNamespaces {
		for k := range 40 {
			nps = append(nps, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprint("remote-", k)},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("app", fmt.Sprint("a", (i+k)%10)),
					Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("role", fmt.Sprint("r", k%7))}}}}}})
		}
	}
	for _, np := range nps {
		if _, err := lc.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// deleteClusterPods removes the API-only pods (at once: no kubelet will confirm) and their namespaces.
func deleteClusterPods(b *testing.B) {
	ctx := context.Background()
	for _, ns := range benchRSSNamespaces {
		_ = lc.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		_ = lc.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}
	_ = lc.Client.NetworkingV1().NetworkPolicies("bench-rss").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
}

// settleFlows waits until the node's bridge stops changing (its flow count holds for 3 s) and returns
// the count.
func settleFlows(ctx context.Context, n *cluster.Node) (int, error) {
	s, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: n.MgmtSocket("br0"), Bridge: "br0", Logger: klog.Background()})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	last, same := -1, 0
	deadline := time.Now().Add(5 * time.Minute)
	for same < 6 {
		raw, err := s.DumpFlows(ctx, ofswitch.FlowFilter{TableID: openflow.AllTables})
		if err != nil {
			return 0, err
		}
		if len(raw) == last {
			same++
		} else {
			last, same = len(raw), 0
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("node %s's flows never settled (%d)", n.Name, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
	return last, nil
}

// vmRSS reads a process's resident set in KiB.
func vmRSS(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// BenchmarkEncapsulationThroughput: one TCP stream from a pod on node1 to a pod on node2 through
// ofsdn's br0 with encapsulation vxlan and none (switched live on the same cluster), and between two
// hosts of the lab's own plugged into node1's and node2's underlay bridges, which do nothing but NORMAL
// switching: the baseline of the userspace datapath on this machine, measured in the same run. The
// figures are MB/s and ratios; the two cores are shared with the whole lab, so compare ratios.
func BenchmarkEncapsulationThroughput(b *testing.B) {
	ctx := context.Background()
	const ns = "bench-encap"
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		b.Fatal(err)
	}
	var pods []*cluster.Pod
	for _, n := range lc.Nodes[:2] {
		p, err := lc.RunPod(ctx, cluster.PodSpec(ns, "tp-"+n.Name, n.Name))
		if err != nil {
			b.Fatal(err)
		}
		pods = append(pods, p)
	}
	b.Cleanup(func() { deleteAll(b, ns) })
	var plain []*lab.Host
	for i, n := range lc.Lab.Nodes[:2] {
		h, err := lc.Lab.AttachToUplink(ctx, n, fmt.Sprintf("plain%d", i+1), 40+i)
		if err != nil {
			b.Fatal(err)
		}
		plain = append(plain, h)
	}
	b.Cleanup(func() { _, _ = lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN) })
	const d = 4 * time.Second
	sum := map[string]float64{}
	runs := 0
	measure := func(name, src, dst string, to netip.Addr) {
		_, _ = lab.TCPThroughput(ctx, src, dst, to, 5201, 500*time.Millisecond) // warm the neighbours
		mbps, err := lab.TCPThroughput(ctx, src, dst, to, 5201, d)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		sum[name] += mbps
	}
	for b.Loop() {
		runs++
		measure("normal", plain[0].NetNS, plain[1].NetNS, plain[1].IP)
		for _, e := range []networkv1.Encapsulation{networkv1.EncapsulationVXLAN, networkv1.EncapsulationNone} {
			if _, err := lc.SetEncapsulation(ctx, e); err != nil {
				b.Fatal(err)
			}
			measure(string(e), pods[0].NetNS, pods[1].NetNS, pods[1].IP)
		}
	}
	for k, v := range sum {
		b.ReportMetric(v/float64(runs), k+"-MB/s")
	}
	b.ReportMetric(sum["none"]/sum["normal"], "none/normal")
	b.ReportMetric(sum["vxlan"]/sum["normal"], "vxlan/normal")
	b.ReportMetric(sum["none"]/sum["vxlan"], "none/vxlan")
}
