//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
)

// Egress IPs on the lab: the external host sees every source address. Namespace e2e-egress leaves from
// an egress IP that any node may hold (egressCIDRs on every HostSubnet); e2e-noegress from its nodes.

const (
	egressNS   = "e2e-egress"
	noEgressNS = "e2e-noegress"
	extPort    = 9300
)

// egressLab sets up the egress range on every node and an egress IP for egressNS, and starts the
// external host's server; it undoes all of it when the test ends.
func egressLab(t *testing.T, ctx context.Context) (eip netip.Addr) {
	t.Helper()
	for _, n := range lc.Nodes {
		if err := lc.SetEgressCIDRs(ctx, n.Name, lc.EgressRange()); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{egressNS, noEgressNS} {
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	eip = lc.EgressIP(0)
	if err := lc.SetEgressIPs(ctx, egressNS, eip); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = lc.SetEgressIPs(ctx, egressNS)
		for _, n := range lc.Nodes {
			_ = lc.SetEgressCIDRs(ctx, n.Name)
		}
	})
	srv := exec.Command("ip", "netns", "exec", lc.Lab.External.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve",
		"--name", "external", "--tcp", fmt.Sprint(extPort), "--udp", fmt.Sprint(extPort))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	return eip
}

// seenBy probes the external host from p and returns the source address it saw (retrying while the
// server starts and an egress IP is being claimed).
func seenBy(ctx context.Context, p *cluster.Pod, proto string) (netip.Addr, error) {
	var last error
	for i := 0; i < 30; i++ {
		r, err := p.Probe(ctx, proto, netip.AddrPortFrom(lc.Lab.External.IP, extPort), 0)
		if err == nil {
			f := strings.Fields(r)
			if len(f) < 2 {
				return netip.Addr{}, fmt.Errorf("reply %q", r)
			}
			ap, perr := netip.ParseAddrPort(f[1])
			if perr != nil {
				return netip.Addr{}, fmt.Errorf("reply %q: %v", r, perr)
			}
			return ap.Addr(), nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return netip.Addr{}, last
}

// TestEgressIPSources: every connection of the egress namespace's pods, from all three nodes, TCP and
// UDP, arrives at the external host from the egress IP; the other namespace's from its node's address;
// traffic inside the cluster keeps the pod's address. In both encapsulations.
func TestEgressIPSources(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	eip := egressLab(t, ctx)
	holder, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("egress IP %s held by %s", eip, holder)
	pods := runPods(t, ctx, "src", []string{egressNS, noEgressNS}, lc.Nodes)
	forEachEncapsulation(t, ctx, func(t *testing.T) {
		for _, p := range pods {
			want := lc.Node(p.Node).IP
			if p.Namespace == egressNS {
				want = eip
			}
			for _, proto := range []string{"tcp", "udp"} {
				got, err := seenBy(ctx, p, proto)
				if err != nil {
					t.Errorf("%s %s → external: %v", p.Key(), proto, err)
					continue
				}
				if got != want {
					t.Errorf("%s (node %s) %s → external seen from %s, want %s", p.Key(), p.Node, proto, got, want)
				}
			}
			// Inside the cluster: the pod's own address (to the namespace's pod on another node).
			for _, q := range pods {
				if q.Node == p.Node || q.Namespace != p.Namespace {
					continue
				}
				r, err := p.Probe(ctx, "tcp", netip.AddrPortFrom(q.IP, cluster.TestPort), 0)
				f := strings.Fields(r)
				if err != nil || len(f) < 2 || !strings.HasPrefix(f[1], p.IP.String()+":") {
					t.Errorf("%s → pod %s: %q %v, want seen from the pod's address %s", p.Key(), q.Key(), r, err, p.IP)
				}
			}
		}
		if t.Failed() {
			for _, n := range lc.Nodes {
				out, _ := n.VswitchdAppctl(ctx, "tnl/neigh/show")
				flows, _ := n.Ofctl(ctx, "dump-flows", "br0", "table=57")
				t.Logf("%s tunnel neighbours:\n%s\ntable 57:\n%s", n.Name, out, flows)
			}
		}
	})
}
