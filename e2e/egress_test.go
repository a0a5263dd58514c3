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

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flowctl"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// traffic inside the cluster keeps the pod's address. In multitenant and networkpolicy modes, in both
// encapsulations.
func TestEgressIPSources(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	eip := egressLab(t, ctx)
	holder, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("egress IP %s held by %s", eip, holder)
	pods := runPods(t, ctx, "src", []string{egressNS, noEgressNS}, lc.Nodes)
	forEachMode(t, ctx, func(t *testing.T, mode networkv1.PluginMode) {
		checkSources(t, ctx, eip, pods)
	})
}

func checkSources(t *testing.T, ctx context.Context, eip netip.Addr, pods []*cluster.Pod) {
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

// TestEgressBadInput: an egress IP no node may hold, the same IP claimed by two namespaces, a malformed
// egress range: each is told (a status condition and an Event, or the API's refusal), the namespaces
// it concerns lose their external traffic rather than leak it, and nothing else is broken.
func TestEgressBadInput(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	eip := egressLab(t, ctx)
	if _, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	const badNS = "e2e-egress-bad"
	pods := runPods(t, ctx, "bad", []string{egressNS, badNS, noEgressNS}, lc.Nodes[:1])
	t.Cleanup(func() { _ = lc.SetEgressIPs(context.Background(), badNS) })
	podOf := map[string]*cluster.Pod{}
	for _, p := range pods {
		podOf[p.Namespace] = p
	}
	// sources probes each namespace's pod and returns what the external host saw ("" unreachable).
	sources := func() map[string]string {
		out := map[string]string{}
		for ns, p := range podOf {
			if r, err := p.Probe(ctx, "udp", netip.AddrPortFrom(lc.Lab.External.IP, extPort), 0); err == nil {
				f := strings.Fields(r)
				if ap, err := netip.ParseAddrPort(f[1]); err == nil {
					out[ns] = ap.Addr().String()
				}
			} else {
				out[ns] = ""
			}
		}
		return out
	}
	expect := func(what string, want map[string]string) {
		t.Helper()
		var got map[string]string
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
			if got = sources(); fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
		}
		t.Errorf("%s: the external host saw %v, want %v", what, got, want)
	}
	node := lc.Node(pods[0].Node).IP.String()
	condition := func(ns, typ string) string {
		nn, err := lc.Net.NetworkV1().NetNamespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range nn.Status.Conditions {
			if c.Type == typ {
				return string(c.Status) + "/" + c.Reason
			}
		}
		return ""
	}
	waitCondition := func(ns, typ, want string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if condition(ns, typ) == want {
				return
			}
		}
		t.Errorf("NetNamespace %s: %s is %q, want %q", ns, typ, condition(ns, typ), want)
	}
	expect("to start with", map[string]string{egressNS: eip.String(), badNS: node, noEgressNS: node})

	outside := lc.EgressIP(7).Next() // just past the egress range: no node may hold it
	if err := lc.SetEgressIPs(ctx, badNS, outside); err != nil {
		t.Fatal(err)
	}
	waitCondition(badNS, networkv1.ConditionEgressIPsValid, "False/"+networkv1.ReasonEgressIPNoEligibleNode)
	waitEvent(t, ctx, "", badNS, "EgressIP"+networkv1.ReasonEgressIPNoEligibleNode)
	expect("an egress IP no node may hold", map[string]string{egressNS: eip.String(), badNS: "", noEgressNS: node})

	if err := lc.SetEgressIPs(ctx, badNS, eip); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{egressNS, badNS} {
		waitCondition(ns, networkv1.ConditionEgressIPsValid, "False/"+networkv1.ReasonEgressIPConflict)
		waitEvent(t, ctx, "", ns, "EgressIP"+networkv1.ReasonEgressIPConflict)
	}
	expect("one egress IP claimed twice: neither gets it", map[string]string{egressNS: "", badNS: "", noEgressNS: node})

	if err := lc.SetEgressIPs(ctx, badNS); err != nil {
		t.Fatal(err)
	}
	waitCondition(egressNS, networkv1.ConditionEgressIPsValid, "True/Valid")
	expect("the conflict gone", map[string]string{egressNS: eip.String(), badNS: node, noEgressNS: node})

	_, err := lc.Net.NetworkV1().HostSubnets().Patch(ctx, lc.Nodes[0].Name, types.MergePatchType, []byte(`{"egressCIDRs":["198.51.100.33/27"]}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "no host bits set") {
		t.Errorf("a malformed egress range: %v, want a refusal that says why", err)
	}
	expect("after the refused range", map[string]string{egressNS: eip.String(), badNS: node, noEgressNS: node})
}

// TestEgressTrace: flowctl trace, live, from an egress namespace's pod on a node that does not hold
// the egress IP to the external host names the egress IP and the node it leaves from (the trace follows
// the tunnel to the holder); and a firewall's drop names its rule.
func TestEgressTrace(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	eip := egressLab(t, ctx)
	pods := runPods(t, ctx, "tr", []string{egressNS}, lc.Nodes)
	dst := lc.Lab.External.IP.String()
	// The status names the holder the agents chose, eventually: right after an earlier test's egress IP
	// was taken off and given back, it can still name the holder from before (failover keeps a holder
	// while it lives; a fresh claim need not pick it). So the trace must agree with the status it reads
	// at the time, within 20 s.
	var res *flowctl.TraceResult
	var holder string
	var from *cluster.Pod
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var err error
		if holder, err = lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if p.Node != holder {
				from = p // a pod on a node that does not hold the IP: its trace crosses to the holder
			}
		}
		res = traceJSON(t, ctx, from.Key(), dst, "--port", fmt.Sprint(extPort))
		ok := res.Verdict.Kind == flowctl.VerdictLeftCluster && res.Verdict.EgressIP == eip.String() && res.Verdict.Node == holder && len(res.Hops) == 2
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("trace %s → %s: verdict %+v after %d hops; want it to leave from %s (the status's holder) with egress IP %s",
				from.Key(), dst, res.Verdict, len(res.Hops), holder, eip)
			break
		}
	}
	src := lc.Node(from.Node)
	// A firewall's drop names its rule.
	if err := lc.EnsureNamespace(ctx, fwNS); err != nil {
		t.Fatal(err)
	}
	fwPods := runPods(t, ctx, "trfw", []string{fwNS}, []*cluster.Node{src})
	t.Cleanup(func() {
		_ = lc.Net.NetworkV1().EgressNetworkPolicies(fwNS).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	setPolicy(t, ctx, "fw", allow("192.0.2.0/24"), deny("0.0.0.0/0"))
	var fw *flowctl.TraceResult
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if fw = traceJSON(t, ctx, fwPods[0].Key(), dst, "--port", fmt.Sprint(extPort)); fw.Verdict.Firewall != "" {
			break
		}
	}
	if fw.Verdict.Kind != flowctl.VerdictDropped || fw.Verdict.Firewall != fwNS+"/fw rule 1" || !strings.Contains(fw.Verdict.Text, "Deny 0.0.0.0/0") {
		t.Errorf("trace %s → %s under the firewall: verdict %+v; want a drop by rule 1 (Deny 0.0.0.0/0)", fwPods[0].Key(), dst, fw.Verdict)
	}
	t.Logf("egress IP: %s\nfirewall: %s", res.Verdict.Text, fw.Verdict.Text)
}
