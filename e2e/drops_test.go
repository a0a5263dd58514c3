//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
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
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Drop attribution on the lab (README, "Drops"): for each cause, a packet the cause drops shows up in
// `flowctl drops -f` within a second, naming the object the test expects from what it made (never from
// the agent's code); a control shows that the very probe gets through where nothing drops it. Then a
// flood of denied traffic: the agent's CPU and memory stay bounded, allowed traffic on the same node
// loses nothing, and the per-cause counter moves as the meter's rate says.

// dropWatch is `flowctl drops -f -o json` running as an administrator runs it, from the root namespace
// through the API server.
type dropWatch struct {
	mu   sync.Mutex
	seen []seenDrop
	cmd  *exec.Cmd
}

type seenDrop struct {
	d  debugapi.Drop
	at time.Time // when flowctl printed it
}

func watchDrops(t *testing.T, ctx context.Context) *dropWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "drops", "-f", "-o", "json", "--kubeconfig", lc.API.KubeconfigPath())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &dropWatch{cmd: cmd}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			var d debugapi.Drop
			if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
				continue
			}
			w.mu.Lock()
			w.seen = append(w.seen, seenDrop{d: d, at: time.Now()})
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); _ = cmd.Wait(); <-done })
	return w
}

// wait returns the first drop after since that match accepts, and when flowctl printed it.
func (w *dropWatch) wait(ctx context.Context, since time.Time, timeout time.Duration, match func(debugapi.Drop) bool) (debugapi.Drop, time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for first := true; first || (time.Now().Before(deadline) && ctx.Err() == nil); first = false {
		w.mu.Lock()
		for _, s := range w.seen {
			if !s.d.Time.Before(since) && match(s.d) {
				w.mu.Unlock()
				return s.d, s.at, true
			}
		}
		w.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	return debugapi.Drop{}, time.Time{}, false
}

func (w *dropWatch) dump(since time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, s := range w.seen {
		if !s.d.Time.Before(since) {
			fmt.Fprintf(&b, "  %s %s → %s %s/%d %s [%s] %s\n", s.d.Node, s.d.Src, s.d.Dst, s.d.Proto, s.d.Port, s.d.Cause, s.d.Object, s.d.Verdict)
		}
	}
	return b.String()
}

// expectDrop sends with send, then waits for the drop expect describes; it reports the latency from
// the send to flowctl printing the record.
func expectDrop(t *testing.T, ctx context.Context, w *dropWatch, what string, send func() error, want debugapi.Drop) {
	t.Helper()
	// The agent stamps a record when it decodes the sample, after the packet left: a record older than
	// the send is an earlier probe's. The send runs beside the wait (a dropped TCP probe blocks until
	// its timeout), and the latency is the send's start to flowctl printing the record.
	start := time.Now()
	sent := start
	errc := make(chan error, 1)
	go func() { errc <- send() }()
	defer func() {
		if err := <-errc; err != nil {
			t.Logf("%s: sending: %v (expected for a dropped probe)", what, err)
		}
	}()
	d, at, ok := w.wait(ctx, start, 10*time.Second, func(d debugapi.Drop) bool {
		return d.Cause == want.Cause && d.Src == want.Src && d.Dst == want.Dst && d.Object == want.Object && (want.Port == 0 || d.Port == want.Port)
	})
	if !ok {
		t.Errorf("%s: no drop %s %s → %s port %d [%s] in flowctl drops; it printed:\n%s", what, want.Cause, want.Src, want.Dst, want.Port,
			want.Object, w.dump(start))
		return
	}
	latency := at.Sub(sent)
	t.Logf("%s: in flowctl drops after %v: %s %s → %s %s/%d [%s] table %d %s: %s", what, latency.Round(time.Millisecond), d.Node, d.Src, d.Dst,
		d.Proto, d.Port, d.Object, d.TableID, d.Table, d.Verdict)
	// The target (README: 1–100 ms, 1 s at most) is a figure to read, not a threshold: CI's 2 shared
	// cores delay the agent's sample reader and flowctl's stream behind the lab's other daemons. A record
	// that never comes within the wait's 10 s fails above.
	if latency > time.Second {
		t.Logf("%s: the drop took %v to show in flowctl drops (target within 1 s on a quiet machine)", what, latency)
	}
	latencies.Store(what, latency)
}

// latencies are expectDrop's, for the summary.
var latencies sync.Map

func TestDrops(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	nsA, nsB := "e2e-drop-a", "e2e-drop-b"
	pods := runPods(t, ctx, "drop", []string{nsA, nsB}, []*cluster.Node{n1, n2})
	pod := func(ns string, n *cluster.Node) *cluster.Pod {
		for _, p := range pods {
			if p.Namespace == ns && p.Node == n.Name {
				return p
			}
		}
		t.Fatalf("no pod of %s on %s", ns, n.Name)
		return nil
	}
	a, a2, b := pod(nsA, n1), pod(nsA, n2), pod(nsB, n1)
	w := watchDrops(t, ctx)
	probe := func(from *cluster.Pod, proto string, to netip.AddrPort) func() error {
		return func() error { _, err := from.Probe(ctx, proto, to, 0); return err }
	}
	control := func(what string, f func() error) {
		t.Helper()
		if err := f(); err != nil {
			t.Fatalf("control %s: %v", what, err)
		}
	}

	t.Run("tenant isolation", func(t *testing.T) {
		netids, err := lc.NetIDs(ctx, nsA, nsB)
		if err != nil {
			t.Fatal(err)
		}
		control(a.Key()+" → "+a2.Key()+" (same tenant)", probe(a, "tcp", netip.AddrPortFrom(a2.IP, cluster.TestPort)))
		expectDrop(t, ctx, w, "tenant isolation", probe(a, "tcp", netip.AddrPortFrom(b.IP, cluster.TestPort)), debugapi.Drop{
			Cause: "tenant-isolation", Src: a.Key(), Dst: b.Key(), Port: cluster.TestPort,
			Object: fmt.Sprintf("tenant isolation %d → %d", netids[nsA], netids[nsB])})
	})

	t.Run("service without endpoints", func(t *testing.T) {
		svcs := lc.Client.CoreV1().Services(nsA)
		mk := func(name string, selector map[string]string) netip.Addr {
			s, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Selector: selector,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(cluster.TestPort), Protocol: corev1.ProtocolTCP}}}},
				metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = svcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
			return netip.MustParseAddr(s.Spec.ClusterIP)
		}
		full, empty := mk("drop-full", map[string]string{"app": a2.Name}), mk("drop-empty", map[string]string{"app": "nobody"})
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", netip.AddrPortFrom(full, 80))() == nil }); err != nil {
			t.Fatalf("control: service %s/drop-full never answered: %v", nsA, err)
		}
		var refused error
		if err := proc.Until(ctx, 0, func() bool {
			refused = probe(a, "tcp", netip.AddrPortFrom(empty, 80))()
			return refused != nil && strings.Contains(refused.Error(), "refused")
		}); err != nil {
			t.Fatalf("service %s/drop-empty is not refused: %v", nsA, refused)
		}
		expectDrop(t, ctx, w, "service without endpoints", probe(a, "tcp", netip.AddrPortFrom(empty, 80)), debugapi.Drop{
			Cause: "service-no-endpoints", Src: a.Key(), Dst: empty.String(), Port: 80, Object: fmt.Sprintf("Service %s/drop-empty (port http)", nsA)})
	})

	t.Run("tunnel guard", func(t *testing.T) {
		control(a.Key()+" → "+a2.Key()+" udp", probe(a, "udp", netip.AddrPortFrom(a2.IP, cluster.TestPort)))
		to := netip.AddrPortFrom(n2.IP, uint16(networkv1.DefaultVXLANPort))
		expectDrop(t, ctx, w, "tunnel guard", func() error { return sendUDP(a.NetNS, to, []byte("not vxlan"), 1, 0) }, debugapi.Drop{
			Cause: "tunnel-guard", Src: a.Key(), Dst: n2.IP.String(), Port: to.Port(), Object: "tunnel guard"})
	})

	t.Run("anti-spoofing", func(t *testing.T) {
		own := interfaceMAC(t, a.NetNS)
		spoofed := netip.MustParseAddr("10.128.250.250")
		frame := func(src netip.Addr) []byte {
			return ether(podMAC(a2.IP), own, 0x0800, ipv4UDP(src, a2.IP, 40000, cluster.TestPort, []byte("spoof")))
		}
		// Control: the same frame with the pod's own address is not dropped by anti-spoofing.
		since := time.Now()
		if err := sendFrames(a.NetNS, [][]byte{frame(a.IP)}, 1, 0); err != nil {
			t.Fatal(err)
		}
		expectDrop(t, ctx, w, "anti-spoofing", func() error { return sendFrames(a.NetNS, [][]byte{frame(spoofed)}, 1, 0) }, debugapi.Drop{
			Cause: "anti-spoofing", Src: spoofed.String(), Dst: a2.Key(), Port: cluster.TestPort, Object: "anti-spoofing of pod " + a.Key()})
		if _, _, ok := w.wait(ctx, since, 0, func(d debugapi.Drop) bool { return d.Cause == "anti-spoofing" && d.Src == a.Key() }); ok {
			t.Errorf("control: a frame from the pod's own address was dropped by anti-spoofing")
		}
	})

	t.Cleanup(func() {
		var parts []string
		latencies.Range(func(k, v any) bool {
			parts = append(parts, fmt.Sprintf("%s %v", k, v.(time.Duration).Round(time.Millisecond)))
			return true
		})
		if len(parts) > 0 { // -run may have picked subtests that time none
			sort.Strings(parts)
			t.Logf("send → flowctl drops: %s", strings.Join(parts, "; "))
		}
	})
	t.Run("forged tunnel", func(t *testing.T) {
		forged := netip.MustParseAddr("10.128.99.99")
		inner := ether(podMAC(a.IP), podMAC(forged), 0x0800, ipv4UDP(forged, a.IP, 40000, cluster.TestPort, []byte("forged")))
		vxlan := netip.AddrPortFrom(n1.IP, uint16(networkv1.DefaultVXLANPort))
		// From a host that is no node (the lab's external host): table 10 knows no such tunnel source.
		ext := lc.Lab.External
		expectDrop(t, ctx, w, "tunnel from an unknown source", func() error { return sendUDP(ext.NetNS, vxlan, vxlanPayload(0, inner), 1, 0) },
			debugapi.Drop{Cause: "tunnel-source", Src: forged.String(), Dst: a.Key(), Port: cluster.TestPort, Object: "tunnel from " + ext.IP.String()})
		// From a node, with a VNI of the Networks' range that no Network has.
		vni := networkv1.MaxNetworkVNI
		expectDrop(t, ctx, w, "forged Network VNI", func() error { return sendUDP(n2.NetNS, vxlan, vxlanPayload(vni, inner), 1, 0) },
			debugapi.Drop{Cause: "network-vni", Src: forged.String(), Dst: a.IP.String(), Port: cluster.TestPort,
				Object: fmt.Sprintf("Network VNI %d from %s", vni, n2.IP)})
	})

	t.Run("Network isolation", func(t *testing.T) {
		o := newNetObjects(t)
		labelNamespace(t, ctx, nsA, map[string]string{"e2e-dropnet": "on"})
		o.network(t, ctx, "e2e-dropnet", "10.210.0.0/16", 8, map[string]string{"e2e-dropnet": "on"})
		waitNetwork(t, ctx, "e2e-dropnet", []*cluster.Node{n1, n2})
		o.nadFor(t, ctx, nsA, "dropnet", ofsdnNAD("e2e-dropnet"))
		pods, ifaces := o.netPods(t, ctx, nsA, "dnet", "dropnet", []*cluster.Node{n1})
		if len(ifaces) != 1 {
			t.Fatalf("want one Network interface, got %d", len(ifaces))
		}
		p, iface := pods[0], ifaces[0]
		var mac net.HardwareAddr
		if err := lab.InNetNS(p.NetNS, func() error {
			ifc, err := net.InterfaceByName(iface.ifName)
			if err == nil {
				mac = ifc.HardwareAddr
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		frame := func(dst netip.Addr) []byte {
			return ether(podMAC(dst), mac, 0x0800, ipv4UDP(iface.ip, dst, 40000, cluster.TestPort, []byte("off the network")))
		}
		// Control: within its own Network's CIDR the same frame is no Network isolation drop.
		since := time.Now()
		if err := sendFramesOn(p.NetNS, iface.ifName, [][]byte{frame(netip.MustParseAddr("10.210.200.1"))}, 1, 0); err != nil {
			t.Fatal(err)
		}
		expectDrop(t, ctx, w, "Network isolation", func() error { return sendFramesOn(p.NetNS, iface.ifName, [][]byte{frame(a.IP)}, 1, 0) },
			debugapi.Drop{Cause: "network-isolation", Src: iface.key(), Dst: a.IP.String(), Port: cluster.TestPort, Object: "Network e2e-dropnet"})
		if _, _, ok := w.wait(ctx, since, 0, func(d debugapi.Drop) bool { return d.Cause == "network-isolation" && d.Dst == "10.210.200.1" }); ok {
			t.Errorf("control: a frame within the Network's own CIDR was dropped by Network isolation")
		}
	})

	t.Run("egress firewall", func(t *testing.T) {
		ext := lc.Lab.External
		const port = 9091
		srv := exec.Command("ip", "netns", "exec", ext.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve", "--name", "external", "--tcp", fmt.Sprint(port))
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
		to := netip.AddrPortFrom(ext.IP, port)
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", to)() == nil }); err != nil {
			t.Fatalf("control: %s never reached the external host %s: %v", a.Key(), to, err)
		}
		policies := lc.Net.NetworkV1().EgressNetworkPolicies(nsA)
		rule := func(typ networkv1.EgressNetworkPolicyRuleType, cidr string) networkv1.EgressNetworkPolicyRule {
			return networkv1.EgressNetworkPolicyRule{Type: typ, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: cidr}}
		}
		denied := netip.PrefixFrom(ext.IP, 32).String()
		if _, err := policies.Create(ctx, &networkv1.EgressNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-ext"},
			Spec: networkv1.EgressNetworkPolicySpec{Egress: []networkv1.EgressNetworkPolicyRule{
				rule(networkv1.EgressNetworkPolicyRuleAllow, "198.51.100.254/32"), rule(networkv1.EgressNetworkPolicyRuleDeny, denied)}}},
			metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = policies.Delete(context.Background(), "deny-ext", metav1.DeleteOptions{}) })
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", to)() != nil }); err != nil {
			t.Fatalf("EgressNetworkPolicy %s/deny-ext never denied %s", nsA, to)
		}
		start := time.Now()
		expectDrop(t, ctx, w, "egress firewall", probe(a, "tcp", to), debugapi.Drop{
			Cause: "egress-firewall", Src: a.Key(), Dst: ext.IP.String(), Port: port, Object: "EgressNetworkPolicy " + nsA + "/deny-ext"})
		// The rule that matched, as the API lists it: the second.
		if _, _, ok := w.wait(ctx, start, 0, func(d debugapi.Drop) bool {
			return d.Cause == "egress-firewall" && strings.Contains(d.Verdict, "rule 1 (Deny "+denied+")")
		}); !ok {
			t.Errorf("no egress-firewall drop names rule 1 (Deny %s):\n%s", denied, w.dump(start))
		}
	})

	t.Run("flood", func(t *testing.T) { dropFlood(t, ctx, w, a, a2, b) })
	t.Run("flood across an agent kill", func(t *testing.T) {
		needsStandIn(t, "kills the agent's process; there kubelet restarts it on its own")
		dropFloodAcrossRestart(t, ctx, w, a, a2, b)
	})

	// An Admin tier Deny inside one tenant (multitenant mode): the drop names the ClusterNetworkPolicy.
	// It drops on the destination's node, whose agent knows the source (a pod on another node) only as
	// an address: flowctl names it from the API server's pods.
	t.Run("ClusterNetworkPolicy", func(t *testing.T) {
		toA2 := netip.AddrPortFrom(a2.IP, cluster.TestPort)
		control(a.Key()+" → "+a2.Key()+" (same tenant, no policy)", probe(a, "tcp", toA2))
		f := &cnpFixture{dyn: dynamicClient(t)}
		const name = "e2e-drop-deny"
		ns := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: nsA}}
		f.apply(t, ctx, &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cnp.Spec{
			Tier: cnp.AdminTier, Priority: 5, Subject: cnp.Subject{Namespaces: ns},
			Ingress: []cnp.IngressRule{{Name: "none-from-a", Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: ns}},
				Protocols: []cnp.Protocol{{TCP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Number: int32(cluster.TestPort)}}}}}}}})
		t.Cleanup(func() { f.remove(t, context.Background(), name) })
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", toA2)() != nil }); err != nil {
			t.Fatalf("ClusterNetworkPolicy %s never denied %s → %s", name, a.Key(), a2.Key())
		}
		expectDrop(t, ctx, w, "ClusterNetworkPolicy Deny", probe(a, "tcp", toA2), debugapi.Drop{
			Cause: "cluster-network-policy", Src: a.Key(), Dst: a2.Key(), Port: cluster.TestPort, Object: "ClusterNetworkPolicy " + name})
	})

	t.Run("NetworkPolicy", func(t *testing.T) {
		if err := lc.SetMode(ctx, networkv1.PluginModeNetworkPolicy); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lc.SetMode(context.Background(), networkv1.PluginModeMultitenant) })
		toB := netip.AddrPortFrom(b.IP, cluster.TestPort)
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", toB)() == nil }); err != nil {
			t.Fatalf("control: %s never reached %s in networkpolicy mode: %v", a.Key(), b.Key(), err)
		}
		nps := lc.Client.NetworkingV1().NetworkPolicies
		mkPolicy := func(ns, name string, sel map[string]string, types ...networkingv1.PolicyType) {
			_, err := nps(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nps(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		mkPolicy(nsB, "deny-all", nil, networkingv1.PolicyTypeIngress)
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", toB)() != nil }); err != nil {
			t.Fatalf("%s/deny-all never isolated %s", nsB, b.Key())
		}
		expectDrop(t, ctx, w, "NetworkPolicy ingress isolation", probe(a, "tcp", toB), debugapi.Drop{
			Cause: "policy-ingress", Src: a.Key(), Dst: b.Key(), Port: cluster.TestPort, Object: "NetworkPolicy " + nsB + "/deny-all"})

		toA2 := netip.AddrPortFrom(a2.IP, cluster.TestPort)
		control(a.Key()+" → "+a2.Key(), probe(a, "tcp", toA2))
		mkPolicy(nsA, "deny-egress", map[string]string{"app": a.Name}, networkingv1.PolicyTypeEgress)
		if err := proc.Until(ctx, 0, func() bool { return probe(a, "tcp", toA2)() != nil }); err != nil {
			t.Fatalf("%s/deny-egress never isolated %s", nsA, a.Key())
		}
		expectDrop(t, ctx, w, "NetworkPolicy egress isolation", probe(a, "tcp", toA2), debugapi.Drop{
			Cause: "policy-egress", Src: a.Key(), Dst: a2.Key(), Port: cluster.TestPort, Object: "NetworkPolicy " + nsA + "/deny-egress"})
	})

	// flowctl drops without -f: the recent drops of every node, filtered, as text.
	t.Run("flowctl drops --namespace", func(t *testing.T) {
		out, err := runFlowctl(ctx, "drops", "--namespace", nsB, "--since", "10m")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		t.Logf("flowctl drops --namespace %s --since 10m: %d lines, the first and the last:\n%s\n%s", nsB, len(lines), lines[0], lines[len(lines)-1])
		for _, l := range lines {
			if !strings.Contains(l, " "+nsB+"/") {
				t.Errorf("a drop neither from nor to %s: %s", nsB, l)
			}
		}
		for _, want := range []string{"[tenant isolation ", "[NetworkPolicy " + nsB + "/deny-all]"} {
			if !strings.Contains(out, want) {
				t.Errorf("flowctl drops --namespace %s shows no %s drop", nsB, want)
			}
		}
		// A pod's drops on another node, where its node's agent has only its address: flowctl names it,
		// and finds them by that name.
		out, err = runFlowctl(ctx, "drops", "--namespace", nsA, "--pod", a.Name, "--node", n2.Name, "--since", "10m")
		if err != nil {
			t.Fatal(err)
		}
		if want := " " + n2.Name + " " + a.Key() + " → " + a2.Key() + " "; !strings.Contains(out, want) {
			t.Errorf("flowctl drops --namespace %s --pod %s --node %s shows no drop %s on %s:\n%s", nsA, a.Name, n2.Name, a.Key()+" → "+a2.Key(), n2.Name, out)
		}
	})
}

// floodUDP sends rate datagrams a second from a pod to dst for d, or until ctx ends, and says how many.
func floodUDP(ctx context.Context, from *cluster.Pod, dst netip.AddrPort, rate int, d time.Duration) (int, error) {
	sent := 0
	err := lab.InNetNS(from.NetNS, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		payload := []byte("flood")
		start := time.Now()
		for ctx.Err() == nil {
			elapsed := time.Since(start)
			if elapsed >= d {
				return nil
			}
			for due := int(elapsed.Seconds() * float64(rate)); sent < due; sent++ {
				_, _ = c.Write(payload)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	return sent, err
}

// dropFloodAcrossRestart floods denied datagrams while the agent of their node is killed (-9) and
// starts again: the new agent comes up and takes over its flows under the flood's samples, 100 allowed
// pings/s across the kill lose none, and drops are sampled and streamed again. The flood is 2,000/s,
// what the lab's userspace datapath carries beside the pings without loss on 2 shared cores (at
// 10,000/s the pod's own veth drops ~5% of its pings with no restart at all); the control shows it.
func dropFloodAcrossRestart(t *testing.T, ctx context.Context, w *dropWatch, a, a2, b *cluster.Pod) {
	n := lc.Node(a.Node)
	roundBefore := round(t, ctx, n)
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var sent int
	var floodErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, floodErr = floodUDP(fctx, a, netip.AddrPortFrom(b.IP, cluster.TestPort), 2000, time.Minute)
	}()
	defer func() { stop(); wg.Wait() }()
	// Control: the flood alone costs the allowed pings nothing.
	time.Sleep(500 * time.Millisecond)
	if s, got, out := startPinger(t, a, a2, 300).wait(); s == 0 || got != s {
		t.Errorf("control: allowed pings %s → %s under the flood, no restart: %d sent, %d received\n%s", a.Key(), a2.Key(), s, got, out)
	}
	ok := startPinger(t, a, a2, 1000) // 10 s at pingInterval
	time.Sleep(2 * time.Second)
	began := time.Now()
	restartAgent(t, ctx, n, true, roundBefore, time.Minute)
	t.Logf("agent on %s killed and back in a new round after %v under the flood", n.Name, time.Since(began).Round(time.Millisecond))
	if got, at, found := w.wait(ctx, time.Now(), 10*time.Second, func(d debugapi.Drop) bool {
		return d.Cause == "tenant-isolation" && d.Src == a.Key() && d.Dst == b.Key()
	}); !found {
		t.Errorf("no tenant-isolation drop %s → %s in flowctl drops -f after the restart; it printed:\n%s", a.Key(), b.Key(), w.dump(began))
	} else {
		t.Logf("sampled again after the restart: %s at %s", got.Verdict, at.Format("15:04:05.000"))
	}
	if s, got, out := ok.wait(); s == 0 || got != s {
		t.Errorf("allowed pings %s → %s across the kill: %d sent, %d received\n%s", a.Key(), a2.Key(), s, got, out)
	} else {
		t.Logf("allowed pings across the kill: %d of %d", got, s)
	}
	stop()
	wg.Wait()
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	t.Logf("flood: %d datagrams", sent)
}

// dropFlood sends 10,000 datagrams a second for 10 s from a to b (another tenant on the same node:
// every one dropped by tenant isolation) while a sends allowed datagrams to a2 and checks each is
// answered; it prints the agent's CPU and memory and compares the cause's counter with the meter.
func dropFlood(t *testing.T, ctx context.Context, w *dropWatch, a, a2, b *cluster.Pod) {
	n := lc.Node(a.Node)
	pid := n.AgentPID()
	if pid == 0 {
		t.Fatal("no agent process")
	}
	const rate, seconds = 10000, 10
	before := scrape(t, ctx, n)
	dropped0 := tenantDropPackets(t, ctx, n)
	rss0, _ := vmRSS(pid)
	cpu0 := cpuTicks(t, pid)
	start := time.Now()
	var sent int
	var floodErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, floodErr = floodUDP(ctx, a, netip.AddrPortFrom(b.IP, cluster.TestPort), rate, seconds*time.Second)
	}()
	var allowed, answered int
	var peakRSS float64
	for time.Since(start) < seconds*time.Second {
		allowed++
		if _, err := a.Probe(ctx, "udp", netip.AddrPortFrom(a2.IP, cluster.TestPort), 0); err == nil {
			answered++
		} else {
			t.Logf("allowed datagram %d: %v", allowed, err)
		}
		if r, err := vmRSS(pid); err == nil && r > peakRSS {
			peakRSS = r
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	took := time.Since(start)
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	time.Sleep(time.Second) // the last samples
	cpu1 := cpuTicks(t, pid)
	rss1, _ := vmRSS(pid)
	after := scrape(t, ctx, n)
	dropped := tenantDropPackets(t, ctx, n) - dropped0
	samples := after.get("ofsdn_agent_drop_samples_total", "cause", "tenant-isolation") - before.get("ofsdn_agent_drop_samples_total", "cause", "tenant-isolation")
	lost := 0.0
	for k, v := range after {
		if strings.HasPrefix(k, "ofsdn_agent_drop_samples_lost_total") {
			lost += v - before[k]
		}
	}
	cpu := float64(cpu1-cpu0) / 100 / (took + time.Second).Seconds()
	// The meter passes 100/s with a burst of 100: over the flood, at most rate×duration + burst.
	want := 100*took.Seconds() + 100
	t.Logf("flood: %d datagrams in %v (%.0f/s) from %s to %s; agent on %s: CPU %.1f%% of a core, RSS %.1f MB → %.1f MB (peak %.1f MB); "+
		"the tenant-isolation drop flow counted %d packets; tenant-isolation samples %.0f (meter: at most %.0f), lost %.0f; "+
		"allowed datagrams %s → %s answered %d of %d",
		sent, took.Round(time.Millisecond), float64(sent)/took.Seconds(), a.Key(), b.Key(), n.Name, 100*cpu, rss0/1024, rss1/1024, peakRSS/1024,
		dropped, samples, want, lost, a.Key(), a2.Key(), answered, allowed)
	// What reaches br0 is what the drop flow counts: a starved machine loses some of a flood on the
	// pod's veth before the bridge (seen: 92% arrived while the whole suite ran beside other work).
	if dropped > int64(sent) || dropped < int64(sent)/2 {
		t.Errorf("the tenant-isolation drop flow counted %d packets of the %d sent", dropped, sent)
	} else if dropped < int64(sent) {
		t.Logf("%d of %d datagrams were lost before br0 (the userspace datapath's receive on a busy machine)", int64(sent)-dropped, sent)
	}
	if answered != allowed {
		t.Errorf("allowed traffic lost %d of %d datagrams during the flood", allowed-answered, allowed)
	}
	// The samples are the meter's share of what the drop flow saw: its rate and burst, never more than
	// the flow counted.
	if floor := min(float64(dropped), 0.8*100*float64(seconds)); samples > min(want+10, float64(dropped)) || samples < floor {
		t.Errorf("tenant-isolation samples %.0f: want about the meter's %.0f (at least %.0f) of the %d packets the drop flow counted",
			samples, want, floor, dropped)
	}
	if cpu > 0.5 {
		t.Errorf("agent CPU %.0f%% of a core during the flood: want bounded by the meter (< 50%%)", 100*cpu)
	}
	if peakRSS-rss0 > 50*1024 {
		t.Errorf("agent RSS grew %.1f MB during the flood", (peakRSS-rss0)/1024)
	}
}

// cpuTicks is a process's user + system time in clock ticks (USER_HZ, 100 on Linux).
func cpuTicks(t *testing.T, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	k, _ := strconv.ParseInt(fields[12], 10, 64)
	return u + k
}

var nPacketsRE = regexp.MustCompile(`n_packets=(\d+)`)

// tenantDropPackets is the packet counter of node n's tenant-isolation drop flow (table 80's miss flow),
// which counts every packet where the samples count at most the meter's rate.
func tenantDropPackets(t *testing.T, ctx context.Context, n *cluster.Node) int64 {
	out, err := n.Ofctl(ctx, "dump-flows", "br0", "table=80")
	if err != nil {
		t.Fatal(err)
	}
	var m []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " priority=0 actions=") { // the miss flow: no match at all
			m = nPacketsRE.FindStringSubmatch(l)
		}
	}
	if m == nil {
		t.Fatalf("no table 80 miss flow on %s:\n%s", n.Name, out)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}
