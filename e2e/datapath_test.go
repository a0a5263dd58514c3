//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// runPods runs one pod per (namespace, node) pair named <prefix>-<node> and deletes them when the test ends.
func runPods(t *testing.T, ctx context.Context, prefix string, namespaces []string, nodes []*cluster.Node) []*cluster.Pod {
	t.Helper()
	for _, ns := range namespaces {
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var pods []*cluster.Pod
	var errs []error
	var wg sync.WaitGroup
	for _, ns := range namespaces {
		for _, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := lc.RunPod(ctx, cluster.PodSpec(ns, prefix+"-"+n.Name, n.Name))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				pods = append(pods, p)
			}()
		}
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, p := range pods {
			_ = lc.DeletePod(context.Background(), p.Namespace, p.Name)
		}
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Key() < pods[j].Key() })
	return pods
}

func TestPodToPod(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	pods := runPods(t, ctx, "conn", []string{"e2e-conn"}, []*cluster.Node{n1, n2})
	a, b := pods[0], pods[1] // conn-<node1>, conn-<node2>
	a2, err := lc.RunPod(ctx, cluster.PodSpec("e2e-conn", "conn2-"+n1.Name, n1.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), a2.Namespace, a2.Name) })
	forEachEncapsulation(t, ctx, func(t *testing.T) { podToPod(t, ctx, a, a2, b) })
}

func podToPod(t *testing.T, ctx context.Context, a, a2, b *cluster.Pod) {
	for _, tc := range []struct {
		name     string
		from, to *cluster.Pod
	}{{"same node", a, a2}, {"across nodes", a, b}, {"across nodes, back", b, a}} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.from.Ping(ctx, tc.to.IP) {
				t.Errorf("ICMP %s → %s failed", tc.from.Key(), tc.to.Key())
			}
			for _, proto := range []string{"tcp", "udp"} {
				r, err := tc.from.Probe(ctx, proto, netip.AddrPortFrom(tc.to.IP, cluster.TestPort), 0)
				if err != nil {
					t.Errorf("%s %s → %s: %v", proto, tc.from.Key(), tc.to.Key(), err)
					continue
				}
				// The server sees the client's own pod address: nothing is NATed inside the cluster network.
				want := fmt.Sprintf("%s %s:", tc.to.Key(), tc.from.IP)
				if !strings.HasPrefix(r, want) {
					t.Errorf("%s %s → %s: reply %q, want %q…", proto, tc.from.Key(), tc.to.Key(), r, want)
				}
			}
		})
	}
	t.Run("1400-byte TCP payloads across nodes", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			if _, err := a.Probe(ctx, "tcp", netip.AddrPortFrom(b.IP, cluster.TestPort), 1400); err != nil {
				t.Fatalf("probe %d: %v", i, err)
			}
		}
	})
}

func TestTenantMatrix(t *testing.T) {
	ctx := ctxT(t, 20*time.Minute)
	namespaces := []string{"default", "e2e-t1", "e2e-t2", "e2e-t3"}
	pods := runPods(t, ctx, "mx", namespaces, lc.Nodes)
	forEachEncapsulation(t, ctx, func(t *testing.T) { tenantMatrix(t, ctx, namespaces, pods) })
}

func tenantMatrix(t *testing.T, ctx context.Context, namespaces []string, pods []*cluster.Pod) {
	check := func(t *testing.T, mode networkv1.PluginMode) {
		t.Helper()
		netids, err := lc.NetIDs(ctx, namespaces...)
		if err != nil {
			t.Fatal(err)
		}
		want := cluster.Expected(pods, netids, mode)
		got, diff, took := lc.WaitMatrix(ctx, pods, want, 15*time.Second)
		t.Logf("%s, NETIDs %v, matched after %s:\n%s", mode, netids, took.Round(time.Millisecond), got.Format(pods))
		if len(diff) > 0 {
			t.Fatalf("%d pairs differ from the %s expectation:\n%s", len(diff), mode, strings.Join(diff, "\n"))
		}
	}
	t.Run("multitenant", func(t *testing.T) { check(t, networkv1.PluginModeMultitenant) })
	t.Run("join t1 to t2", func(t *testing.T) {
		before, _ := lc.NetIDs(ctx, "e2e-t2")
		got, err := lc.ChangeNetwork(ctx, "e2e-t1", "join:e2e-t2")
		if err != nil {
			t.Fatal(err)
		}
		if got != before["e2e-t2"] {
			t.Fatalf("e2e-t1 has NETID %d after joining e2e-t2 (%d)", got, before["e2e-t2"])
		}
		check(t, networkv1.PluginModeMultitenant)
	})
	t.Run("isolate t1", func(t *testing.T) {
		got, err := lc.ChangeNetwork(ctx, "e2e-t1", "isolate")
		if err != nil {
			t.Fatal(err)
		}
		other, _ := lc.NetIDs(ctx, "e2e-t2", "e2e-t3")
		if got == 0 || got == other["e2e-t2"] || got == other["e2e-t3"] {
			t.Fatalf("isolated e2e-t1 has NETID %d, others %v", got, other)
		}
		check(t, networkv1.PluginModeMultitenant)
	})
	t.Run("make t3 global", func(t *testing.T) {
		if got, err := lc.ChangeNetwork(ctx, "e2e-t3", "global"); err != nil || got != 0 {
			t.Fatalf("global: NETID %d, %v", got, err)
		}
		check(t, networkv1.PluginModeMultitenant)
		if _, err := lc.ChangeNetwork(ctx, "e2e-t3", "isolate"); err != nil {
			t.Fatal(err)
		}
		check(t, networkv1.PluginModeMultitenant)
	})
	t.Run("subnet mode", func(t *testing.T) {
		if err := lc.SetMode(ctx, networkv1.PluginModeSubnet); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lc.SetMode(context.Background(), networkv1.PluginModeMultitenant) })
		check(t, networkv1.PluginModeSubnet)
		if err := lc.SetMode(ctx, networkv1.PluginModeMultitenant); err != nil {
			t.Fatal(err)
		}
		check(t, networkv1.PluginModeMultitenant)
	})
}

func TestNodesAndOutside(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	pods := runPods(t, ctx, "host", []string{"e2e-host"}, lc.Nodes)
	forEachEncapsulation(t, ctx, func(t *testing.T) { nodesAndOutside(t, ctx, pods) })
}

func nodesAndOutside(t *testing.T, ctx context.Context, pods []*cluster.Pod) {
	t.Run("every node reaches every pod", func(t *testing.T) {
		for _, n := range lc.Nodes {
			for _, p := range pods {
				if _, err := lc.ProbeFrom(ctx, n.NetNS, "tcp", netip.AddrPortFrom(p.IP, cluster.TestPort)); err != nil {
					t.Errorf("node %s → pod %s: %v", n.Name, p.Key(), err)
				}
			}
		}
	})
	t.Run("pods reach the outside as their node", func(t *testing.T) {
		ext := lc.Lab.External
		srv := exec.Command("ip", "netns", "exec", ext.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve", "--name", "external", "--tcp", "9090", "--udp", "9090")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
		for _, p := range pods {
			node := lc.Node(p.Node)
			var r string
			var err error
			for i := 0; i < 20; i++ { // the server needs a moment to listen
				if r, err = p.Probe(ctx, "tcp", netip.AddrPortFrom(ext.IP, 9090), 0); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("pod %s → external %s: %v", p.Key(), ext.IP, err)
				continue
			}
			if want := "external " + node.IP.String() + ":"; !strings.HasPrefix(r, want) {
				t.Errorf("pod %s → external: reply %q, want the node's address (%q…)", p.Key(), r, want)
			}
		}
	})
}

func TestAntiSpoofing(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pods := runPods(t, ctx, "spoof", []string{"e2e-spoof"}, lc.Nodes[:2])
	victim, target := pods[0], pods[1]
	if err := lc.EnsureNamespace(ctx, "e2e-spoof"); err != nil {
		t.Fatal(err)
	}
	attacker, err := lc.RunPod(ctx, cluster.PodSpec("e2e-spoof", "attacker", victim.Node))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), attacker.Namespace, attacker.Name) })
	ip := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", attacker.NetNS}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
		return nil
	}
	// Baseline: the attacker reaches both with its own identity.
	for _, p := range []*cluster.Pod{victim, target} {
		if !attacker.Ping(ctx, p.IP) {
			t.Fatalf("attacker does not even reach %s with its own identity", p.Key())
		}
	}
	t.Run("another pod's IP", func(t *testing.T) {
		if err := ip("addr", "add", victim.IP.String()+"/32", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ip("addr", "del", victim.IP.String()+"/32", "dev", "eth0") }()
		for _, dst := range []netip.Addr{target.IP, lc.Lab.External.IP} {
			cmd := exec.CommandContext(ctx, "ip", "netns", "exec", attacker.NetNS, "ping", "-n", "-q", "-c", "2", "-W", "1", "-I", victim.IP.String(), dst.String())
			if cmd.Run() == nil {
				t.Errorf("a packet sourced from %s's IP reached %s", victim.Key(), dst)
			}
		}
	})
	t.Run("another pod's MAC", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, "ip", "-n", victim.NetNS, "-o", "link", "show", "eth0").CombinedOutput()
		if err != nil {
			t.Fatal(err, string(out))
		}
		mac := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindStringSubmatch(string(out))
		if mac == nil {
			t.Fatalf("no MAC in %q", out)
		}
		ownOut, _ := exec.CommandContext(ctx, "ip", "-n", attacker.NetNS, "-o", "link", "show", "eth0").CombinedOutput()
		own := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindStringSubmatch(string(ownOut))
		if err := ip("link", "set", "eth0", "address", mac[1]); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ip("link", "set", "eth0", "address", own[1]) }()
		if attacker.Ping(ctx, target.IP) {
			t.Errorf("a packet from %s's MAC reached %s", victim.Key(), target.Key())
		}
	})
	// With its identity back, the attacker is an ordinary pod again.
	if !attacker.Ping(ctx, target.IP) {
		t.Errorf("attacker lost connectivity after restoring its identity")
	}
}

func TestDeletedPodLeavesNothing(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n := lc.Nodes[2]
	if err := lc.EnsureNamespace(ctx, "e2e-del"); err != nil {
		t.Fatal(err)
	}
	p, err := lc.RunPod(ctx, cluster.PodSpec("e2e-del", "gone", n.Name))
	if err != nil {
		t.Fatal(err)
	}
	ports := func() string { out, _ := n.Vsctl(ctx, "--columns=name,external_ids", "list", "Interface"); return out }
	if !strings.Contains(ports(), `"ofsdn/pod-name"=gone`) {
		t.Fatalf("no OVS port with the pod's external_ids:\n%s", ports())
	}
	owner := "pod/e2e-del/gone"
	if dump := flowctlDump(t, ctx, n); !strings.Contains(dump, owner) {
		t.Fatalf("flowctl dump shows no flow owned by %s:\n%s", owner, dump)
	}
	if err := lc.DeletePod(ctx, "e2e-del", "gone"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ports(), `"ofsdn/pod-name"=gone`) {
		t.Errorf("the pod's OVS port is still there:\n%s", ports())
	}
	if dump := flowctlDump(t, ctx, n); strings.Contains(dump, owner) || strings.Contains(dump, p.IP.String()+",") || strings.Contains(dump, p.IP.String()+" ") {
		t.Errorf("flows of the deleted pod remain:\n%s", dump)
	}
	if _, err := os.Stat(filepath.Join(n.StateDir, "ipam", p.IP.String())); !os.IsNotExist(err) {
		t.Errorf("the address store still holds %s (%v)", p.IP, err)
	}
}

// flowctlDump runs flowctl dump on a node's bridge, naming owners.
func flowctlDump(t *testing.T, ctx context.Context, n *cluster.Node) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "dump", "--rundir", n.Dir, "--bridge", "br0").CombinedOutput()
	if err != nil {
		t.Fatalf("flowctl dump on %s: %v\n%s", n.Name, err, out)
	}
	return string(out)
}

func TestManyPodsAtOnce(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n := lc.Nodes[0]
	const count = 30
	if err := lc.EnsureNamespace(ctx, "e2e-many"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	pods := make([]*cluster.Pod, count)
	errs := make([]error, count)
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = lc.RunPod(ctx, cluster.PodSpec("e2e-many", "p"+strconv.Itoa(i), n.Name))
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range count {
			_ = lc.Client.CoreV1().Pods("e2e-many").Delete(context.Background(), "p"+strconv.Itoa(i), metav1.DeleteOptions{})
		}
		for i := range count {
			_ = lc.DeletePod(context.Background(), "e2e-many", "p"+strconv.Itoa(i))
		}
	})
	seen := map[netip.Addr]string{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pod %d: %v", i, err)
		}
		if other, dup := seen[pods[i].IP]; dup {
			t.Fatalf("%s and %s both got %s", other, pods[i].Key(), pods[i].IP)
		}
		seen[pods[i].IP] = pods[i].Key()
	}
	// Each pod reaches its neighbour and a pod on another node.
	remote := runPods(t, ctx, "many-peer", []string{"e2e-many"}, lc.Nodes[1:2])[0]
	for i, p := range pods {
		next := pods[(i+1)%count]
		for _, dst := range []*cluster.Pod{next, remote} {
			if _, err := p.Probe(ctx, "tcp", netip.AddrPortFrom(dst.IP, cluster.TestPort), 0); err != nil {
				t.Errorf("%s → %s: %v", p.Key(), dst.Key(), err)
			}
		}
	}
}
