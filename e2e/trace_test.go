//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flowctl"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestTrace asks flowctl trace the operator's questions on the live lab, checks each verdict against
// what the pipeline intends and against real packets sent the same way, then asks the same questions
// offline from `flowctl dump --node N -o json` files: the offline evaluator must take the same tables,
// flows and owners on every node and reach the same verdict. All of it runs in both encapsulations:
// with none, a packet for another node leaves by the uplink port, and the trace follows it there.
func TestTrace(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	const blue, red = "e2e-trace-blue", "e2e-trace-red"
	for _, ns := range []string{blue, red} {
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := lc.EnsureNamespace(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	pod := func(ns, name string, node *cluster.Node, label string) *cluster.Pod {
		return svcPod(t, ctx, ns, name, node.Name, label, nil)
	}
	a := pod(blue, "a", n1, "web")
	a2 := pod(blue, "a2", n1, "client")
	c := pod(blue, "c", n2, "web")
	b := pod(red, "b", n1, "other")
	g := pod("default", "e2e-trace-g", n2, "global")
	web := createService(t, ctx, blue, "web", corev1.ServiceSpec{Selector: map[string]string{"svc": "web"}, Type: corev1.ServiceTypeNodePort,
		Ports: []corev1.ServicePort{tcpPort("http", 80, cluster.TestPort)}})
	empty := createService(t, ctx, blue, "empty", corev1.ServiceSpec{Selector: map[string]string{"svc": "nobody"},
		Ports: []corev1.ServicePort{tcpPort("http", 80, cluster.TestPort)}})
	waitEndpoints(t, ctx, a2.NetNS, "tcp", clusterIP(web, 80), 2, time.Minute)
	nodePort := web.Spec.Ports[0].NodePort
	ext := lc.Lab.External
	srv := exec.Command("ip", "netns", "exec", ext.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve", "--name", "external", "--tcp", "9091")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	netids, err := lc.NetIDs(ctx, blue, red)
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(cluster.TestPort)

	cases := []struct {
		name string
		args []string
		kind string
		says []string
		// crosses: the packet goes from one node's bridge to another's.
		crosses bool
		// real sends the same packet for real: whether it gets through must agree with the verdict.
		real func() error
	}{
		{"same node allowed", []string{a.Key(), a2.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + a2.Key() + " via node " + n1.Name}, false, probe(ctx, a, a2.IP, cluster.TestPort)},
		{"cross node allowed", []string{a.Key(), c.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, true, probe(ctx, a, c.IP, cluster.TestPort)},
		{"tenant isolation", []string{a.Key(), b.Key(), "--port", port}, flowctl.VerdictDropped,
			[]string{"table 80 ingress-isolation", fmt.Sprintf("tenant VNID %d (%s) may not reach VNID %d (%s)", netids[blue], blue, netids[red], red)},
			false, probe(ctx, a, b.IP, cluster.TestPort)},
		{"global namespace allowed", []string{g.Key(), b.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + b.Key() + " via node " + n1.Name}, true, probe(ctx, g, b.IP, cluster.TestPort)},
		{"tenant isolation across nodes", []string{b.Key(), c.Key(), "--port", port}, flowctl.VerdictDropped,
			[]string{"table 80 ingress-isolation", fmt.Sprintf("tenant VNID %d (%s) may not reach VNID %d (%s)", netids[red], red, netids[blue], blue)},
			true, probe(ctx, b, c.IP, cluster.TestPort)},
		{"spoofed source", []string{a.Key(), a2.Key(), "--port", port, "--src-ip", b.IP.String()}, flowctl.VerdictDropped,
			[]string{"table 20 pod-ingress", "anti-spoofing", a.Key()}, false, nil},
		{"service, local endpoint", []string{a2.Key(), "svc/" + blue + "/web", "--endpoint", a.IP.String()}, flowctl.VerdictDelivered,
			[]string{"delivered to " + a.Key() + " via node " + n1.Name}, false, nil},
		{"service, remote endpoint", []string{a2.Key(), "svc/" + blue + "/web", "--endpoint", c.IP.String() + ":" + port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, true, probe(ctx, a2, netip.MustParseAddr(web.Spec.ClusterIP), 80)},
		{"service without endpoints", []string{a2.Key(), "svc/" + blue + "/empty"}, flowctl.VerdictRejected,
			[]string{"service " + blue + "/empty has no ready endpoint"}, false, probe(ctx, a2, netip.MustParseAddr(empty.Spec.ClusterIP), 80)},
		{"NodePort from outside", []string{ext.IP.String(), n1.Name, "--port", fmt.Sprint(nodePort), "--endpoint", c.IP.String()}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, true, func() error {
				_, err := lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n1.IP, uint16(nodePort)))
				return err
			}},
		{"pod to outside", []string{a.Key(), ext.IP.String(), "--port", "9091"}, flowctl.VerdictLeftCluster,
			[]string{fmt.Sprintf("SNATs it from %s to %s", a.IP, n1.IP)}, false, probe(ctx, a, ext.IP, 9091)},
	}
	// On the node, without an API server to ask: the local agent alone answers a trace that stays on its
	// node, and says what is missing for one that leaves it.
	t.Run("on the node without an API server", func(t *testing.T) {
		local := func(args ...string) (string, error) {
			cmd := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), append([]string{"trace", "--rundir", n1.Dir}, args...)...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no KUBECONFIG, not in a cluster
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		out, err := local(a.Key(), a2.Key(), "--port", port)
		if err != nil || !strings.Contains(out, "verdict: delivered to "+a2.Key()+" via node "+n1.Name) {
			t.Errorf("same-node trace on the node: %v\n%s", err, out)
		}
		out, err = local(a.Key(), c.Key(), "--port", port)
		if err == nil || !strings.Contains(out, "needs the API server") {
			t.Errorf("cross-node trace without an API server: %v\n%s", err, out)
		}
	})

	forEachEncapsulationOf(t, ctx, func(t *testing.T, encap networkv1.Encapsulation) {
		// The port a packet for another node leaves by, and the one it must not.
		exit, notExit := pipeline.PortNameVXLAN, pipeline.PortNameUplink
		if encap == networkv1.EncapsulationNone {
			exit, notExit = notExit, exit
		}
		results := map[string]*flowctl.TraceResult{}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res := traceJSON(t, ctx, tc.args...)
				results[tc.name] = res
				if res.Verdict.Kind != tc.kind {
					t.Errorf("verdict %s: %q, want %s", res.Verdict.Kind, res.Verdict.Text, tc.kind)
				}
				for _, s := range tc.says {
					if !strings.Contains(res.Verdict.Text, s) {
						t.Errorf("verdict %q does not say %q", res.Verdict.Text, s)
					}
				}
				crossed := false
				for _, h := range res.Hops {
					crossed = crossed || strings.HasPrefix(h.Leaves, "leaves by "+exit+" to node ")
					if strings.HasPrefix(h.Leaves, "leaves by "+notExit) {
						t.Errorf("with encapsulation %s, node %s sent it by %s: %s", encap, h.Node, notExit, h.Leaves)
					}
				}
				if crossed != tc.crosses {
					t.Errorf("with encapsulation %s the trace crossed to another node by %s: %v, want %v", encap, exit, crossed, tc.crosses)
				}
				if tc.real != nil {
					err := tc.real()
					if delivered := err == nil; delivered != (tc.kind == flowctl.VerdictDelivered || tc.kind == flowctl.VerdictLeftCluster) {
						t.Errorf("real traffic disagrees with the trace (%s): %v", res.Verdict.Text, err)
					}
				}
				if t.Failed() {
					text, _ := runFlowctl(ctx, append([]string{"trace"}, tc.args...)...)
					t.Log(text)
				}
			})
		}

		// Which endpoint: the service trace names every endpoint and the one followed.
		if s := results["service, remote endpoint"].Service; s == nil || s.Chosen != netip.AddrPortFrom(c.IP, cluster.TestPort).String() ||
			len(s.Endpoints) != 2 || !strings.HasPrefix(s.Owner, "svc/"+blue+"/web:") {
			t.Errorf("service trace: %+v", s)
		}

		// The same questions offline, from each node's dump.
		dumps := nodeDumps(t, ctx, lc.Nodes...)
		for _, tc := range cases {
			live := results[tc.name]
			if live == nil {
				continue
			}
			t.Run("offline "+tc.name, func(t *testing.T) {
				off := traceJSON(t, ctx, append(append([]string{}, tc.args...), dumps...)...)
				if off.Verdict.Text != live.Verdict.Text || off.Verdict.Kind != live.Verdict.Kind {
					t.Errorf("offline verdict %q, live %q", off.Verdict.Text, live.Verdict.Text)
				}
				if lp, op := hopPaths(live), hopPaths(off); lp != op {
					t.Errorf("table paths differ:\nlive:\n%s\noffline:\n%s", lp, op)
				}
			})
		}
	})
}

// nodeDumps saves `flowctl dump -o json` of each node and returns the --dump arguments that trace them
// offline. The first node's is taken on the node (its bridge and its agent's socket in its run
// directory), the others' through their agents and the API server's node proxy: both ways are held
// to give what a trace needs.
func nodeDumps(t *testing.T, ctx context.Context, nodes ...*cluster.Node) []string {
	t.Helper()
	dir := t.TempDir()
	var dumps []string
	for i, n := range nodes {
		where := []string{"--node", n.Name}
		if i == 0 {
			where = []string{"--rundir", n.Dir}
		}
		out, err := runFlowctl(ctx, append([]string{"dump", "-o", "json"}, where...)...)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, n.Name+".json")
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		dumps = append(dumps, "--dump", path)
	}
	return dumps
}

// probe returns a check that the pod reaches dst:port over TCP for real.
func probe(ctx context.Context, from *cluster.Pod, dst netip.Addr, port int) func() error {
	return func() error {
		_, err := from.Probe(ctx, "tcp", netip.AddrPortFrom(dst, uint16(port)), 0)
		return err
	}
}

func traceJSON(t *testing.T, ctx context.Context, args ...string) *flowctl.TraceResult {
	t.Helper()
	out, err := runFlowctl(ctx, append([]string{"trace", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var res flowctl.TraceResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return &res
}

// hopPaths is a trace's path for comparison: per hop, the node and each step's pass, table, priority
// and owner.
func hopPaths(r *flowctl.TraceResult) string {
	var b strings.Builder
	for _, h := range r.Hops {
		fmt.Fprintf(&b, "node %s via %s\n", h.Node, h.Via)
		for _, s := range h.Steps {
			fmt.Fprintf(&b, "  pass %d table %d priority %d owner %s miss %v\n", s.Pass, s.Table, s.Priority, s.Owner, s.Miss)
		}
		fmt.Fprintf(&b, "  => %s\n", h.Leaves)
	}
	return b.String()
}

// TestTraceNetworkPolicy: in networkpolicy mode, a policy that lets only labelled clients reach a pod
// on TCP 8080. flowctl trace names the policy both ways — the allowed client is delivered "allowed by
// NetworkPolicy ns/name", the other dropped at table 80 "by NetworkPolicy ns/name (no rule allows
// tcp/8080)" — real packets agree, and the offline trace from dumps reaches the same verdicts.
func TestTraceNetworkPolicy(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	const ns = "e2e-trace-np"
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	server := svcPod(t, ctx, ns, "server", n1.Name, "server", nil)
	allowed := svcPod(t, ctx, ns, "allowed", n2.Name, "allowed", nil)
	denied := svcPod(t, ctx, ns, "denied", n2.Name, "denied", nil)
	if err := lc.SetMode(ctx, networkv1.PluginModeNetworkPolicy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.SetMode(context.Background(), networkv1.PluginModeMultitenant) })
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(cluster.TestPort)
	pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "server-from-allowed"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"svc": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"svc": "allowed"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}}}}
	if _, err := lc.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lc.Client.NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), pol.Name, metav1.DeleteOptions{})
	})
	owner := "netpol/" + ns + "/" + pol.Name
	// The policy on the server's node: its flows (owner netpol/ns/name) and the denial in the data path.
	deadline := time.Now().Add(30 * time.Second)
	for {
		dump, _ := runFlowctl(ctx, "dump", "--node", n1.Name, "--category", "netpol")
		_, err := denied.Probe(ctx, "tcp", netip.AddrPortFrom(server.IP, cluster.TestPort), 0)
		if strings.Contains(dump, owner) && err != nil {
			break
		}
		if time.Now().After(deadline) {
			if !strings.Contains(dump, owner) {
				t.Fatalf("node %s renders no flow of %s after 30s", n1.Name, owner)
			}
			t.Fatalf("%s is on %s but the denied client still connects", owner, n1.Name)
		}
		time.Sleep(300 * time.Millisecond)
	}
	name := ns + "/" + pol.Name
	allow := traceJSON(t, ctx, allowed.Key(), server.Key(), "--port", fmt.Sprint(cluster.TestPort))
	if allow.Verdict.Kind != flowctl.VerdictDelivered || !strings.Contains(allow.Verdict.Text, "allowed by NetworkPolicy "+name) {
		t.Errorf("allowed client: %q", allow.Verdict.Text)
	}
	if _, err := allowed.Probe(ctx, "tcp", netip.AddrPortFrom(server.IP, cluster.TestPort), 0); err != nil {
		t.Errorf("the allowed client does not connect for real: %v", err)
	}
	deny := traceJSON(t, ctx, denied.Key(), server.Key(), "--port", fmt.Sprint(cluster.TestPort))
	// The pod's isolation drops it, and the verdict names the policy that isolates the pod.
	want := fmt.Sprintf("dropped at table 80 ingress-isolation by the NetworkPolicy isolation of pod %s: isolated by NetworkPolicy %s (no rule allows tcp/%d)",
		server.Key(), name, cluster.TestPort)
	if deny.Verdict.Kind != flowctl.VerdictDropped || deny.Verdict.Text != want || deny.Verdict.Owner != "pod/"+server.Key() {
		t.Errorf("denied client: %+v, want %q", deny.Verdict, want)
	}
	// Offline, from the two nodes' dumps.
	dumps := nodeDumps(t, ctx, n1, n2)
	for _, live := range []*flowctl.TraceResult{allow, deny} {
		src := allowed.Key()
		if live == deny {
			src = denied.Key()
		}
		off := traceJSON(t, ctx, append([]string{src, server.Key(), "--port", fmt.Sprint(cluster.TestPort)}, dumps...)...)
		if off.Verdict.Text != live.Verdict.Text || hopPaths(off) != hopPaths(live) {
			t.Errorf("offline %q / live %q:\n%s\n%s", off.Verdict.Text, live.Verdict.Text, hopPaths(off), hopPaths(live))
		}
	}
}
