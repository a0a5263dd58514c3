//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab"
	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// The egress firewall (EgressNetworkPolicy) on the lab: destinations are addresses of the external
// host (its own and four more it is given), probed from pods on two nodes; the verdicts are the rules'
// meaning, first match wins, unmatched allowed.

const (
	fwNS   = "e2e-fw"
	fwPort = 9303
)

// fwLab is the firewall test's world.
type fwLab struct {
	pods    []*cluster.Pod
	extra   []netip.Addr // the external host's additional addresses: offsets 48-51 of the underlay
	ext     netip.Addr
	records *dnsRecords
}

func newFWLab(t *testing.T, ctx context.Context) *fwLab {
	t.Helper()
	f := &fwLab{ext: lc.Lab.External.IP, records: &dnsRecords{a: map[string][]netip.Addr{}, ttl: 2}}
	f.pods = runPods(t, ctx, "fw", []string{fwNS}, lc.Nodes[:2])
	ext := lc.Lab.External
	for i := range 4 {
		b := lc.Lab.Underlay.Masked().Addr().As4()
		b[3] += byte(48 + i)
		a := netip.AddrFrom4(b)
		f.extra = append(f.extra, a)
		p := netip.PrefixFrom(a, lc.Lab.Underlay.Bits()).String()
		if out, err := exec.Command("ip", "-n", ext.NetNS, "addr", "add", p, "dev", lab.Uplink).CombinedOutput(); err != nil {
			t.Fatalf("add %s to the external host: %v: %s", p, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "-n", ext.NetNS, "addr", "del", p, "dev", lab.Uplink).Run() })
	}
	srv := exec.Command("ip", "netns", "exec", ext.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve",
		"--name", "external", "--tcp", fmt.Sprint(fwPort))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	// UDP answers must come from the address asked (a server bound to every address would answer from
	// the primary one, which the pod's connected socket ignores): one responder per address.
	for _, a := range append([]netip.Addr{ext.IP}, f.extra...) {
		udpResponder(t, netip.AddrPortFrom(a, fwPort))
	}
	f.records.serve(t, netip.AddrPortFrom(ext.IP, 53))
	t.Cleanup(func() {
		_ = lc.Net.NetworkV1().EgressNetworkPolicies(fwNS).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return f
}

func allow(cidr string) networkv1.EgressNetworkPolicyRule {
	return networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleAllow, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: cidr}}
}

func deny(cidr string) networkv1.EgressNetworkPolicyRule {
	return networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleDeny, To: networkv1.EgressNetworkPolicyPeer{CIDRSelector: cidr}}
}

func allowName(name string) networkv1.EgressNetworkPolicyRule {
	return networkv1.EgressNetworkPolicyRule{Type: networkv1.EgressNetworkPolicyRuleAllow, To: networkv1.EgressNetworkPolicyPeer{DNSName: name}}
}

// setPolicy writes the namespace's EgressNetworkPolicy name with rules, and waits until the controller
// has judged this generation.
func setPolicy(t *testing.T, ctx context.Context, name string, rules ...networkv1.EgressNetworkPolicyRule) {
	t.Helper()
	c := lc.Net.NetworkV1().EgressNetworkPolicies(fwNS)
	p, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		p, err = c.Create(ctx, &networkv1.EgressNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: networkv1.EgressNetworkPolicySpec{Egress: rules}}, metav1.CreateOptions{})
	} else {
		p.Spec.Egress = rules
		p, err = c.Update(ctx, p, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := proc.Until(wctx, 0, func() bool {
		cur, err := c.Get(wctx, name, metav1.GetOptions{})
		return err == nil && cur.Status.ObservedGeneration == p.Generation
	}); err != nil {
		t.Fatalf("EgressNetworkPolicy %s/%s generation %d never judged: %v", fwNS, name, p.Generation, err)
	}
}

// reach probes dst from p over proto.
func reach(ctx context.Context, p *cluster.Pod, proto string, dst netip.AddrPort) bool {
	_, err := p.Probe(ctx, proto, dst, 0)
	return err == nil
}

// verdicts probes every pod to every destination over TCP and UDP, in parallel, and returns
// "pod proto dst" → reached.
func (f *fwLab) verdicts(ctx context.Context, dsts []netip.AddrPort) map[string]bool {
	out := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range f.pods {
		for _, d := range dsts {
			for _, proto := range []string{"tcp", "udp"} {
				wg.Go(func() {
					ok := reach(ctx, p, proto, d)
					mu.Lock()
					out[fmt.Sprintf("%s %s %s", p.Name, proto, d)] = ok
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
	return out
}

// expect waits (up to 20 s) until every pod reaches exactly the destinations want says, and reports
// the difference if it never does.
func (f *fwLab) expect(t *testing.T, ctx context.Context, what string, want map[netip.AddrPort]bool) {
	t.Helper()
	var dsts []netip.AddrPort
	for d := range want {
		dsts = append(dsts, d)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := f.verdicts(ctx, dsts)
		var diff []string
		for k, ok := range got {
			f := strings.Fields(k)
			if w := want[netip.MustParseAddrPort(f[2])]; ok != w {
				diff = append(diff, fmt.Sprintf("%s: reached %v, want %v", k, ok, w))
			}
		}
		if len(diff) == 0 {
			t.Logf("%s: %d probes as the rules say", what, len(got))
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			slices.Sort(diff)
			t.Errorf("%s: %s", what, strings.Join(diff, "; "))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (f *fwLab) at(i int) netip.AddrPort { return netip.AddrPortFrom(f.extra[i], fwPort) }

// TestEgressFirewall: rule order, a change applied to established and new connections, deny-all with
// the cluster's DNS (a Service) and the API server (default/kubernetes) reachable, DNS names resolved
// by the agents (and a pod that resolves differently), more than one policy in a namespace.
func TestEgressFirewall(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	if err := lc.EnsureNamespace(ctx, fwNS); err != nil {
		t.Fatal(err)
	}
	f := newFWLab(t, ctx)
	ext := netip.AddrPortFrom(f.ext, fwPort)
	peer := f.pods[1]
	inside := netip.AddrPortFrom(peer.IP, cluster.TestPort)
	node := netip.AddrPortFrom(lc.Nodes[2].IP, 22) // nothing listens: reached means not refused... see below

	t.Run("first match wins", func(t *testing.T) {
		block := netip.PrefixFrom(f.extra[0], 30).String()
		setPolicy(t, ctx, "fw", deny(f.extra[1].String()+"/32"), allow(block), deny("0.0.0.0/0"))
		f.expect(t, ctx, "deny .49, allow .48/30, deny all", map[netip.AddrPort]bool{
			f.at(0): true, f.at(1): false, f.at(2): true, f.at(3): true, ext: false, inside: true})
	})

	t.Run("a change applies to established connections too", func(t *testing.T) {
		p := f.pods[0]
		conn := dialFrom(t, p, f.at(2))
		if err := conn.ask(); err != nil {
			t.Fatalf("established connection to %s before the change: %v", f.at(2), err)
		}
		block := netip.PrefixFrom(f.extra[0], 30).String()
		setPolicy(t, ctx, "fw", deny(f.extra[2].String()+"/32"), deny(f.extra[1].String()+"/32"), allow(block), deny("0.0.0.0/0"))
		cut := false
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
			if conn.ask() != nil {
				cut = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !cut {
			t.Errorf("the established connection to %s still answers 15 s after its destination was denied", f.at(2))
		}
		f.expect(t, ctx, "deny .50 now", map[netip.AddrPort]bool{f.at(0): true, f.at(1): false, f.at(2): false, f.at(3): true})
	})

	t.Run("deny all keeps the cluster", func(t *testing.T) {
		dns := clusterDNS(t, ctx, peer)
		setPolicy(t, ctx, "fw", deny("0.0.0.0/0"))
		f.expect(t, ctx, "deny all: outside", map[netip.AddrPort]bool{f.at(0): false, ext: false, inside: true})
		for _, p := range f.pods {
			// The cluster's DNS: a Service (UDP 53) whose endpoint is a pod.
			if !reach(ctx, p, "udp", dns) {
				t.Errorf("%s: the cluster DNS Service %s unreachable under deny-all", p.Key(), dns)
			}
			// The API server, through default/kubernetes, as in-cluster clients reach it.
			api := netip.AddrPortFrom(kubernetesServiceIP(t, ctx), 443)
			if err := tcpConnect(p, api); err != nil {
				t.Errorf("%s: the API server at %s unreachable under deny-all: %v", p.Key(), api, err)
			}
			// A node's address is inside the cluster too: refused by the node, not dropped.
			if err := tcpConnect(p, node); err != nil && !strings.Contains(err.Error(), "refused") {
				t.Errorf("%s: node address %s dropped under deny-all: %v", p.Key(), node, err)
			}
		}
	})

	t.Run("DNS names", func(t *testing.T) {
		f.records.set("allowed.example.", f.extra[0])
		setPolicy(t, ctx, "fw", allowName("allowed.example"), deny("0.0.0.0/0"))
		// The agents resolved allowed.example to .48: a pod that resolves it otherwise (.49, from a
		// resolver of its own) reaches nothing more.
		f.expect(t, ctx, "allowed.example = .48", map[netip.AddrPort]bool{f.at(0): true, f.at(1): false, ext: false})
		// The record changes; the agents follow within its TTL (2 s).
		changed := time.Now()
		f.records.set("allowed.example.", f.extra[1])
		f.expect(t, ctx, "allowed.example = .49", map[netip.AddrPort]bool{f.at(0): false, f.at(1): true, ext: false})
		t.Logf("the rule followed the record within %v (TTL 2 s)", time.Since(changed).Round(100*time.Millisecond))
	})

	t.Run("two policies in one namespace", func(t *testing.T) {
		setPolicy(t, ctx, "fw", allow("0.0.0.0/0"))
		f.expect(t, ctx, "allow all", map[netip.AddrPort]bool{f.at(0): true, ext: true})
		setPolicy(t, ctx, "second", allow("0.0.0.0/0"))
		for _, name := range []string{"fw", "second"} {
			p, err := lc.Net.NetworkV1().EgressNetworkPolicies(fwNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c := meta.FindStatusCondition(p.Status.Conditions, networkv1.ConditionValid); c == nil || c.Reason != networkv1.ReasonEgressPolicyConflict {
				t.Errorf("%s: condition %+v, want Valid=False %s", name, c, networkv1.ReasonEgressPolicyConflict)
			}
		}
		waitEvent(t, ctx, fwNS, "second", networkv1.ReasonEgressPolicyConflict)
		// openshift-sdn's behaviour: neither is enforced and the namespace's traffic leaving the cluster is
		// dropped; inside the cluster nothing changes, and other namespaces are not touched.
		f.expect(t, ctx, "two policies: outside dropped", map[netip.AddrPort]bool{f.at(0): false, ext: false, inside: true})
		if err := lc.Net.NetworkV1().EgressNetworkPolicies(fwNS).Delete(ctx, "second", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.expect(t, ctx, "one policy again", map[netip.AddrPort]bool{f.at(0): true, ext: true})
	})
}

// clusterDNS makes a Service that stands for the cluster's DNS: UDP 53 to pod's port.
func clusterDNS(t *testing.T, ctx context.Context, pod *cluster.Pod) netip.AddrPort {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns", Namespace: pod.Namespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": pod.Name},
			Ports: []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(cluster.TestPort)}}}}
	created, err := lc.Client.CoreV1().Services(pod.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lc.Client.CoreV1().Services(pod.Namespace).Delete(context.Background(), "dns", metav1.DeleteOptions{})
	})
	dst := netip.AddrPortFrom(netip.MustParseAddr(created.Spec.ClusterIP), 53)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := proc.Until(wctx, 0, func() bool { return reach(wctx, pod, "udp", dst) }); err != nil {
		t.Fatalf("the DNS Service %s never answered: %v", dst, err)
	}
	return dst
}

func kubernetesServiceIP(t *testing.T, ctx context.Context) netip.Addr {
	t.Helper()
	svc, err := lc.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// tcpConnect opens (and closes) a TCP connection from the pod.
func tcpConnect(p *cluster.Pod, dst netip.AddrPort) error {
	var c net.Conn
	err := lab.InNetNS(p.NetNS, func() (err error) {
		c, err = net.DialTimeout("tcp4", dst.String(), 2*time.Second)
		return err
	})
	if err == nil {
		c.Close()
	}
	return err
}

// session is one TCP connection from a pod to the external server, asked one line at a time.
type session struct {
	c net.Conn
	r *bufio.Reader
	n int
}

func dialFrom(t *testing.T, p *cluster.Pod, dst netip.AddrPort) *session {
	t.Helper()
	var c net.Conn
	if err := lab.InNetNS(p.NetNS, func() (err error) {
		c, err = net.DialTimeout("tcp4", dst.String(), 3*time.Second)
		return err
	}); err != nil {
		t.Fatalf("%s → %s: %v", p.Key(), dst, err)
	}
	t.Cleanup(func() { c.Close() })
	s := &session{c: c, r: bufio.NewReader(c)}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := s.r.ReadString('\n'); err != nil { // the server's greeting
		t.Fatalf("%s → %s: greeting: %v", p.Key(), dst, err)
	}
	return s
}

// ask sends a line and waits a second for its echo.
func (s *session) ask() error {
	s.n++
	msg := fmt.Sprintf("%08d\n", s.n)
	_ = s.c.SetDeadline(time.Now().Add(time.Second))
	if _, err := s.c.Write([]byte(msg)); err != nil {
		return err
	}
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return err
		}
		if line == msg {
			return nil
		}
	}
}

// waitEvent waits for an Event with reason on the named object.
func waitEvent(t *testing.T, ctx context.Context, namespace, name, reason string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := proc.Until(wctx, 0, func() bool {
		evs, err := lc.Client.CoreV1().Events(namespace).List(wctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason {
				return true
			}
		}
		return false
	}); err != nil {
		t.Errorf("no Event %s on %s/%s: %v", reason, namespace, name, err)
	}
}

// udpResponder answers every datagram to at as ofsdn-testpod serve does ("<name> <client> <port>"),
// from at itself.
func udpResponder(t *testing.T, at netip.AddrPort) {
	t.Helper()
	serveExternalUDP(t, at, func(_ []byte, from netip.AddrPort) []byte {
		return []byte(fmt.Sprintf("external %s %d", from, at.Port()))
	})
}

// serveExternalUDP listens on at in the lab's external host and sends each datagram's answer (none
// if nil) back to its sender, until the test ends.
func serveExternalUDP(t *testing.T, at netip.AddrPort, answer func(req []byte, from netip.AddrPort) []byte) {
	t.Helper()
	var c *net.UDPConn
	if err := lab.InNetNS(lc.Lab.External.NetNS, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(at))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if out := answer(buf[:n], from); out != nil {
				_, _ = c.WriteToUDPAddrPort(out, from)
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
}

// dnsRecords is a small authoritative DNS server of the lab's own (UDP, A records only).
type dnsRecords struct {
	mu  sync.Mutex
	a   map[string][]netip.Addr
	ttl uint32
}

func (d *dnsRecords) set(name string, addrs ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = addrs
}

func (d *dnsRecords) serve(t *testing.T, at netip.AddrPort) {
	t.Helper()
	serveExternalUDP(t, at, d.answer)
}

// answer is the response to one query (nil: not a query of one question).
func (d *dnsRecords) answer(req []byte, _ netip.AddrPort) []byte {
	var m dnsmessage.Message
	if m.Unpack(req) != nil || len(m.Questions) != 1 {
		return nil
	}
	q := m.Questions[0]
	d.mu.Lock()
	addrs, ok := d.a[strings.ToLower(q.Name.String())]
	ttl := d.ttl
	d.mu.Unlock()
	resp := dnsmessage.Message{Header: dnsmessage.Header{ID: m.ID, Response: true, Authoritative: true}, Questions: m.Questions}
	if !ok {
		resp.RCode = dnsmessage.RCodeNameError
	}
	for _, a := range addrs {
		resp.Answers = append(resp.Answers, dnsmessage.Resource{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: ttl},
			Body:   &dnsmessage.AResource{A: a.As4()}})
	}
	out, err := resp.Pack()
	if err != nil {
		return nil
	}
	return out
}

// restartAgentServing restarts a node's agent, gracefully or as a crash (SIGKILL), and waits until it
// serves again.
func restartAgentServing(t *testing.T, ctx context.Context, n *cluster.Node, crash bool) time.Duration {
	t.Helper()
	// The log is appended to: the new agent's lines are those past its size now (a count over the
	// log's tail would miss them once the log outgrows the tail).
	var from int64
	if fi, err := os.Stat(n.AgentLog); err == nil {
		from = fi.Size()
	}
	start := time.Now()
	lc.StopAgent(n, crash)
	if err := lc.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := proc.Until(wctx, 0, func() bool { return logSince(n.AgentLog, from, `"agent running"`) }); err != nil {
		t.Fatalf("agent on %s did not come back: %v\n%s", n.Name, err, lc.AgentLogTail(n, 30))
	}
	return time.Since(start)
}

// logSince reports whether the file at path holds want past its first from bytes.
func logSince(path string, from int64, want string) bool {
	return len(logLinesSince(path, from, want)) > 0
}

// logLinesSince returns the lines of the file at path past its first from bytes that hold want.
func logLinesSince(path string, from int64, want string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return nil
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, want) {
			out = append(out, line)
		}
	}
	return out
}

// TestEgressAgentRestartNoLeak: while every node's agent restarts, gracefully and with kill -9, pods
// keep sending 100 datagrams a second each: a firewalled namespace's pods to a denied and to an
// allowed address, and the egress namespace's pods to the external host. The external host counts: not
// one datagram to the denied address, not one from a node's address; the allowed traffic flows on.
func TestEgressAgentRestartNoLeak(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	if err := lc.EnsureNamespace(ctx, fwNS); err != nil {
		t.Fatal(err)
	}
	eip := egressLab(t, ctx)
	if _, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	f := newFWLab(t, ctx)
	const port = 9304
	allowed := f.extra[0]
	setPolicy(t, ctx, "fw", allow(allowed.String()+"/32"), deny("0.0.0.0/0"))
	f.expect(t, ctx, "allow .48 only", map[netip.AddrPort]bool{f.at(0): true, netip.AddrPortFrom(f.ext, fwPort): false})
	egressPods := runPods(t, ctx, "rs", []string{egressNS}, lc.Nodes)
	capture := captureExternal(t, port)
	start := time.Now()
	var senders []*udpSender
	for _, p := range f.pods {
		senders = append(senders, startSender(t, p, netip.AddrPortFrom(f.ext, port), 10*time.Millisecond), // denied
			startSender(t, p, netip.AddrPortFrom(allowed, port), 10*time.Millisecond)) // allowed
	}
	for _, p := range egressPods {
		senders = append(senders, startSender(t, p, netip.AddrPortFrom(f.ext, port), 10*time.Millisecond))
	}
	time.Sleep(time.Second)
	var took []string
	for _, n := range lc.Nodes {
		for _, crash := range []bool{false, true} {
			d := restartAgentServing(t, ctx, n, crash)
			took = append(took, fmt.Sprintf("%s crash=%v %v", n.Name, crash, d.Round(100*time.Millisecond)))
			time.Sleep(time.Second)
		}
	}
	time.Sleep(time.Second)
	for _, s := range senders {
		s.stop()
	}
	end := time.Now()
	var denied, leaked, allowedGot, egressGot int
	fwNames := map[string]bool{}
	for _, p := range f.pods {
		fwNames[p.Key()] = true
	}
	for _, a := range capture.since(start) {
		switch {
		case fwNames[a.sender] && a.dst == f.ext:
			denied++
		case fwNames[a.sender] && a.dst == allowed:
			allowedGot++
		case strings.HasPrefix(a.sender, egressNS+"/"):
			egressGot++
			if a.src != eip {
				leaked++
			}
		}
	}
	sentAllowed, sentEgress := 0, 0
	for i, s := range senders {
		n := len(s.sentBetween(start, end))
		switch {
		case i < 2*len(f.pods) && i%2 == 1:
			sentAllowed += n
		case i >= 2*len(f.pods):
			sentEgress += n
		}
	}
	t.Logf("agent restarts %v over %v: denied destination received %d; allowed %d of %d; egress namespace %d of %d, %d not from %s",
		took, end.Sub(start).Round(time.Second), denied, allowedGot, sentAllowed, egressGot, sentEgress, leaked, eip)
	if denied > 0 {
		t.Errorf("%d datagrams reached the denied address during agent restarts", denied)
	}
	if leaked > 0 {
		t.Errorf("%d datagrams of the egress namespace left from an address other than its egress IP during agent restarts", leaked)
	}
	if allowedGot < sentAllowed*9/10 || egressGot < sentEgress/2 {
		t.Errorf("the allowed traffic did not flow on: %d of %d, egress %d of %d", allowedGot, sentAllowed, egressGot, sentEgress)
	}
}
