//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab"
)

// appctl runs ovs-appctl against a node's ovs-vswitchd: OVS's own client, independent of the agent's
// unixctl package.
func appctl(ctx context.Context, n *cluster.Node, args ...string) (string, error) {
	ctl := filepath.Join(n.Dir, fmt.Sprintf("ovs-vswitchd.%d.ctl", n.VswitchdPID()))
	return n.Exec(ctx, "ovs-appctl", append([]string{"-t", ctl}, args...)...)
}

// tunnelNeighbours reads a node's tunnel neighbour cache as IP → "MAC bridge [flags]".
func tunnelNeighbours(t *testing.T, ctx context.Context, n *cluster.Node) map[string]string {
	t.Helper()
	out, err := appctl(ctx, n, "tnl/neigh/show")
	if err != nil {
		t.Fatalf("tnl/neigh/show on %s: %v", n.Name, err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && strings.Count(f[0], ".") == 3 {
			m[f[0]] = strings.Join(f[1:], " ")
		}
	}
	return m
}

// wrongNeighbours lists the peers whose entry in n's tunnel neighbour cache is not the peer's underlay
// MAC on br-ul (the lab's address plan is the model).
func wrongNeighbours(t *testing.T, ctx context.Context, n *cluster.Node) []string {
	t.Helper()
	have := tunnelNeighbours(t, ctx, n)
	var wrong []string
	for _, peer := range lc.Nodes {
		if peer == n {
			continue
		}
		want := peer.MAC.String() + " " + lab.UnderlayBridge
		if got := have[peer.IP.String()]; got != want {
			wrong = append(wrong, fmt.Sprintf("%s: %q, want %q", peer.IP, got, want))
		}
	}
	return wrong
}

// TestTunnelNeighbourCorrected: a wrong MAC in ovs-vswitchd's tunnel neighbour cache (what an ARP
// answered from the wrong interface left there, issue 10) black-holes the tunnel; the agent finds it
// against the kernel's neighbour table and corrects it, and traffic flows again.
func TestTunnelNeighbourCorrected(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n1, n3 := lc.Nodes[0], lc.Nodes[2]
	pods := runPods(t, ctx, "nb", []string{"e2e-neigh"}, []*cluster.Node{n1, n3})
	a, b := pods[0], pods[1]
	deadline := time.Now().Add(10 * time.Second)
	for !a.Ping(ctx, b.IP) {
		if time.Now().After(deadline) {
			t.Fatalf("%s cannot reach %s", a.Name, b.Name)
		}
	}
	if wrong := wrongNeighbours(t, ctx, n1); len(wrong) > 0 {
		t.Fatalf("tunnel neighbours of %s before the test: %v", n1.Name, wrong)
	}
	const bogus = "02:00:00:00:00:01"
	if _, err := appctl(ctx, n1, "tnl/neigh/set", lab.UnderlayBridge, n3.IP.String(), bogus); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if got := tunnelNeighbours(t, ctx, n1)[n3.IP.String()]; !strings.HasPrefix(got, bogus) {
		t.Fatalf("the wrong MAC did not take: %q", got)
	}
	for len(wrongNeighbours(t, ctx, n1)) > 0 {
		if time.Since(began) > time.Minute {
			t.Fatalf("%s's tunnel neighbours still wrong a minute later: %v\n%s", n1.Name, wrongNeighbours(t, ctx, n1), lc.Logs(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(began)
	t.Logf("the agent corrected %s's tunnel neighbour for %s %s after it went wrong (checks every 10 s; a stale kernel entry is re-confirmed first)",
		n1.Name, n3.IP, took.Round(100*time.Millisecond))
	if !a.Ping(ctx, b.IP) || !b.Ping(ctx, a.IP) {
		t.Error("pods cannot reach each other after the correction")
	}
}
