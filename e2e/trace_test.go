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

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flowctl"
	corev1 "k8s.io/api/core/v1"
)

// TestTrace asks flowctl trace the operator's questions on the live lab, checks each verdict against
// what the pipeline intends and against real packets sent the same way, then asks the same questions
// offline from `flowctl dump --node N -o json` files: the offline evaluator must take the same tables,
// flows and owners on every node and reach the same verdict.
func TestTrace(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
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
		// real sends the same packet for real: whether it gets through must agree with the verdict.
		real func() error
	}{
		{"same node allowed", []string{a.Key(), a2.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + a2.Key() + " via node " + n1.Name}, probe(ctx, a, a2.IP, cluster.TestPort)},
		{"cross node allowed", []string{a.Key(), c.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, probe(ctx, a, c.IP, cluster.TestPort)},
		{"tenant isolation", []string{a.Key(), b.Key(), "--port", port}, flowctl.VerdictDropped,
			[]string{"table 80 ingress-isolation", fmt.Sprintf("tenant VNID %d (%s) may not reach VNID %d (%s)", netids[blue], blue, netids[red], red)},
			probe(ctx, a, b.IP, cluster.TestPort)},
		{"global namespace allowed", []string{g.Key(), b.Key(), "--port", port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + b.Key() + " via node " + n1.Name}, probe(ctx, g, b.IP, cluster.TestPort)},
		{"spoofed source", []string{a.Key(), a2.Key(), "--port", port, "--src-ip", b.IP.String()}, flowctl.VerdictDropped,
			[]string{"table 20 pod-ingress", "anti-spoofing", a.Key()}, nil},
		{"service, local endpoint", []string{a2.Key(), "svc/" + blue + "/web", "--endpoint", a.IP.String()}, flowctl.VerdictDelivered,
			[]string{"delivered to " + a.Key() + " via node " + n1.Name}, nil},
		{"service, remote endpoint", []string{a2.Key(), "svc/" + blue + "/web", "--endpoint", c.IP.String() + ":" + port}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, probe(ctx, a2, netip.MustParseAddr(web.Spec.ClusterIP), 80)},
		{"service without endpoints", []string{a2.Key(), "svc/" + blue + "/empty"}, flowctl.VerdictRejected,
			[]string{"service " + blue + "/empty has no ready endpoint"}, probe(ctx, a2, netip.MustParseAddr(empty.Spec.ClusterIP), 80)},
		{"NodePort from outside", []string{ext.IP.String(), n1.Name, "--port", fmt.Sprint(nodePort), "--endpoint", c.IP.String()}, flowctl.VerdictDelivered,
			[]string{"delivered to " + c.Key() + " via node " + n2.Name}, func() error {
				_, err := lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n1.IP, uint16(nodePort)))
				return err
			}},
		{"pod to outside", []string{a.Key(), ext.IP.String(), "--port", "9091"}, flowctl.VerdictLeftCluster,
			[]string{fmt.Sprintf("SNATs it from %s to %s", a.IP, n1.IP)}, probe(ctx, a, ext.IP, 9091)},
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

	// The same questions offline, from each node's dump: the first node's taken on the node (its bridge
	// and its agent's socket in its run directory), the others' through their agents and the API server.
	dir := t.TempDir()
	var dumps []string
	for i, n := range lc.Nodes {
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
