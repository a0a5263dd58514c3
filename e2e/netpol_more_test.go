//go:build e2e

package e2e

// NetworkPolicy beyond the conformance matrix: through services, across agent restarts, and with input the
// agent cannot fully render. Each part's expectations come from e2e/netpolmodel.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/netpolmodel"
	"github.com/ofsdn/ofsdn/e2e/testpod"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// npServicesCase: a ClusterIP whose endpoints (x/a, x/b) are protected by policies is reachable exactly
// as the model says: the endpoint's ingress against the client's own address, the client's egress
// against the endpoint it is sent to — never against the ClusterIP.
func npServicesCase(t *testing.T, ctx context.Context, f *npFixture) {
	f.setPodLabels(t, ctx, "x/a", map[string]string{"pod": "a", "web": "yes"})
	f.setPodLabels(t, ctx, "x/b", map[string]string{"pod": "b", "web": "yes"})
	svc := createService(t, ctx, npNS("x"), "np-web", corev1.ServiceSpec{Selector: map[string]string{"web": "yes"}, Ports: []corev1.ServicePort{
		{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(80)},
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(80)},
		{Name: "named", Protocol: corev1.ProtocolTCP, Port: 8081, TargetPort: intstr.FromString("serve-81-tcp")}}})
	podA := npSel("pod", "a")
	f.createPolicy(t, ctx, "x", npPolicy("a-from-y", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y")))))))
	f.createPolicy(t, ctx, "x", npPolicy("b-from-c-on-80", npSel("pod", "b"), npIngress(npFrom(npPeers(npNSPodPeer(npAll, npSel("pod", "c"))), npPort(npTCP, 80)))))
	f.createPolicy(t, ctx, "y", npPolicy("c-to-x-a", npSel("pod", "c"), npEgress(npTo(npPeers(npNSPodPeer(npSel("ns", "x"), podA))))))
	f.createPolicy(t, ctx, "y", npPolicy("b-to-clusterip", npSel("pod", "b"), npEgress(npTo(npPeers(npCIDRPeer(svc.Spec.ClusterIP+"/32"))))))
	world, pods, err := f.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	model := netpolmodel.Service{Ports: svc.Spec.Ports, Endpoints: []*netpolmodel.Pod{pods["x/a"], pods["x/b"]}}
	type probe struct {
		proto string
		port  int32
	}
	probes := []probe{{"tcp", 80}, {"udp", 80}, {"tcp", 8081}}
	// want[client][probe]: the endpoints that may answer (a client's own hairpin connections are not judged).
	want := map[string]map[probe][]string{}
	why := map[string]string{}
	for _, c := range f.keys {
		want[c] = map[probe][]string{}
		for _, p := range probes {
			vs, err := world.ServiceVerdicts(netpolmodel.PodEndpoint(pods[c]), model, p.port, corev1.Protocol(strings.ToUpper(p.proto)))
			if err != nil {
				t.Fatal(err)
			}
			var eps []string
			for ep, v := range vs {
				short := npShortKey(ep)
				if short == c {
					continue
				}
				if v.Allowed {
					eps = append(eps, short)
				}
				why[fmt.Sprintf("%s %s/%d %s", c, p.proto, p.port, short)] = v.String()
			}
			sort.Strings(eps)
			want[c][p] = eps
		}
	}
	start := time.Now()
	for round := 1; ; round++ {
		var mu sync.Mutex
		var wrong []string
		var wg sync.WaitGroup
		for _, c := range f.keys {
			for _, p := range probes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					counts, err := spreadFrom(ctx, f.pods[c].NetNS, p.proto, clusterIP(svc, int(p.port)), 16, 8)
					var got []string
					for k := range counts {
						if name, _, ok := strings.Cut(k, ":"); ok && !strings.HasPrefix(k, "error") {
							if short := npShortKey(name); short != c {
								got = append(got, short)
							}
						}
					}
					sort.Strings(got)
					if err != nil || !slices.Equal(got, want[c][p]) {
						var reasons []string
						for _, ep := range []string{"x/a", "x/b"} {
							if r, ok := why[fmt.Sprintf("%s %s/%d %s", c, p.proto, p.port, ep)]; ok {
								reasons = append(reasons, ep+": "+r)
							}
						}
						mu.Lock()
						wrong = append(wrong, fmt.Sprintf("%s → %s %s/%d: answered by %v, expected exactly %v (%s) %v; counts %v",
							c, svc.Spec.ClusterIP, p.proto, p.port, got, want[c][p], strings.Join(reasons, "; "), err, counts))
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		if len(wrong) == 0 {
			t.Logf("27 client × service-port checks match the model (round %d, %s after the policies and the service were made)",
				round, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 45*time.Second {
			sort.Strings(wrong)
			t.Fatalf("%d client × service-port checks differ from the model:\n%s", len(wrong), strings.Join(wrong, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// npBadInputCase: policies the API accepts but that name what does not exist, cover the whole cluster
// network, or sit in a namespace without pods. Every pod's connectivity still matches the model, later
// changes still apply, the agents keep running, and the objects they cannot fully enforce are named in
// a Warning Event or the agent's log.
func npBadInputCase(t *testing.T, ctx context.Context, f *npFixture) {
	if err := lc.EnsureNamespace(ctx, npNS("empty")); err != nil {
		t.Fatal(err)
	}
	cn, err := lc.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterCIDR := string(cn.Spec.ClusterCIDRs[0])
	started := time.Now().Truncate(time.Second)
	f.createPolicy(t, ctx, "x", npPolicy("bad-named-port", npSel("pod", "a"), npIngress(npFrom(nil, npNamed("no-such-port", nil)))))
	f.createPolicy(t, ctx, "y", npPolicy("bad-cluster-cidr", npSel("pod", "b"), npIngress(npFrom(npPeers(npCIDRPeer(clusterCIDR)), npPort(npTCP, 81)))))
	f.createPolicy(t, ctx, "z", npPolicy("bad-egress-named-port", npSel("pod", "a"), npEgress(npTo(npPeers(npNSPeer(npAll)), npNamed("no-such-port", &npUDP)))))
	f.createPolicy(t, ctx, "empty", npPolicy("deny-nobody", npAll, npIngress(), npEgress()))
	f.createPolicy(t, ctx, "z", npPolicy("good", npSel("pod", "c"), npIngress()))
	f.check(t, ctx, "bad input beside a good policy")
	f.setPodLabels(t, ctx, "y/a", map[string]string{"pod": "b"}) // now selected by bad-cluster-cidr too
	f.check(t, ctx, "a pod relabelled into the bad policy's selection")
	f.createPolicy(t, ctx, "x", npPolicy("good-later", npSel("pod", "c"), npEgress()))
	f.check(t, ctx, "a good policy created after the bad ones")
	for _, n := range lc.Nodes {
		if n.AgentPID() == 0 {
			t.Errorf("the agent on %s is not running:\n%s", n.Name, lc.Logs(30))
		}
	}
	// Named somewhere an admin looks: a Warning Event on the policy, or the agent's log.
	for _, bad := range []struct{ ns, name string }{{"x", "bad-named-port"}, {"y", "bad-cluster-cidr"}, {"z", "bad-egress-named-port"}} {
		var found string
		deadline := time.Now().Add(15 * time.Second)
		for found == "" && time.Now().Before(deadline) {
			evs, err := lc.Client.CoreV1().Events(npNS(bad.ns)).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs.Items {
				// Created by the API server (whole seconds) since the policy was: not left by an earlier run.
				if e.InvolvedObject.Kind == "NetworkPolicy" && e.InvolvedObject.Name == bad.name && e.Type == corev1.EventTypeWarning &&
					!e.CreationTimestamp.Time.Before(started.Add(-time.Second)) {
					found = fmt.Sprintf("Warning Event %s from %s: %s", e.Reason, e.Source.Host, e.Message)
				}
			}
			for _, n := range lc.Nodes {
				if found != "" {
					break
				}
				if line := npLogLineNaming(n.AgentLog, npNS(bad.ns), bad.name); line != "" {
					found = "agent log on " + n.Name + ": " + line
				}
			}
			if found == "" {
				time.Sleep(250 * time.Millisecond)
			}
		}
		if found == "" {
			t.Errorf("policy %s/%s: no Warning Event and no agent log line names it", npNS(bad.ns), bad.name)
		} else {
			t.Logf("policy %s/%s: %s", npNS(bad.ns), bad.name, found)
		}
	}
}

// npLogLineNaming returns the last line of an agent's log that names both namespace and name.
func npLogLineNaming(path, namespace, name string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(data, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.Contains(lines[i], []byte(namespace)) && bytes.Contains(lines[i], []byte(name)) {
			return string(lines[i])
		}
	}
	return ""
}

// checkRestartRepeats waits for the repeats across an agent restart: each allowed one (TCP, a connection
// every 10 ms) made at least 500 connections and none failed, each denied one at least 100 attempts and
// none answered.
func checkRestartRepeats(t *testing.T, allowed, denied []*npRepeat) {
	t.Helper()
	for _, r := range allowed {
		st, err := r.wait()
		if err != nil || st.Failed > 0 || st.OK < 500 {
			t.Errorf("new TCP connections %s across the restart: %+v %v", r.what, st, err)
		} else {
			t.Logf("new TCP connections %s: %d, none failed", r.what, st.OK)
		}
	}
	for _, r := range denied {
		st, err := r.wait()
		if err != nil || st.OK > 0 || st.Failed < 100 {
			t.Errorf("denied %s across the restart: %d answered (at ms %v), %d did not %v", r.what, st.OK, st.OKAt, st.Failed, err)
		} else {
			t.Logf("denied %s: all %d attempts denied", r.what, st.Failed)
		}
	}
}

// npRepeat runs `ofsdn-testpod repeat` in a pod; wait returns its counts.
type npRepeat struct {
	what string
	cmd  *exec.Cmd
	out  bytes.Buffer
}

func startNPRepeat(t *testing.T, from *cluster.Pod, proto string, to *cluster.Pod, port int, interval, timeout, duration time.Duration) *npRepeat {
	t.Helper()
	r := &npRepeat{what: fmt.Sprintf("%s → %s %s/%d", npShort(from.Namespace, from.Name), npShort(to.Namespace, to.Name), proto, port)}
	r.cmd = exec.Command("ip", "netns", "exec", from.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "repeat", proto,
		netip.AddrPortFrom(to.IP, uint16(port)).String(), "--want", to.Key(), "--interval", interval.String(), "--timeout", timeout.String(),
		"--duration", duration.String())
	r.cmd.Stdout = &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	return r
}

func (r *npRepeat) wait() (testpod.RepeatStats, error) {
	var st testpod.RepeatStats
	if err := r.cmd.Wait(); err != nil {
		return st, fmt.Errorf("%s: %w", r.what, err)
	}
	return st, json.Unmarshal(r.out.Bytes(), &st)
}

// npRestartCase: agents restarted (SIGTERM, then SIGKILL) on the node that enforces both ingress and egress
// for the pairs watched, while allowed pairs ping 100 times a second and make 100 new TCP connections a
// second, and denied pairs are tried over TCP and UDP throughout: not one ping or connection of an allowed
// pair may be lost, not one of a denied pair may pass, and the flows afterwards are the flows before.
func npRestartCase(t *testing.T, ctx context.Context, f *npFixture) {
	needsStandIn(t, "stops and starts the agent's process at chosen moments; there kubelet restarts it on its own")
	f.createPolicy(t, ctx, "x", npPolicy("from-y", npAll, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y")))))))
	f.createPolicy(t, ctx, "z", npPolicy("b-out", npSel("pod", "b"), npEgress(npTo(npPeers(npNSPeer(npExpr("ns", metav1.LabelSelectorOpIn, "x", "y")))))))
	f.check(t, ctx, "policies in place for the restarts")
	node := lc.Node(f.pods["x/a"].Node)
	world, pods, err := f.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type pair struct{ from, to string }
	allowed := []pair{{"y/b", "x/a"}, {"z/b", "y/a"}, {"x/a", "y/b"}}
	denied := []pair{{"x/c", "x/a"}, {"z/b", "z/a"}, {"z/b", "x/a"}}
	touches := func(p pair) bool { return f.pods[p.from].Node == node.Name || f.pods[p.to].Node == node.Name }
	for _, p := range append(slices.Clone(allowed), denied...) {
		if !touches(p) {
			t.Fatalf("test design: %s → %s does not involve %s", p.from, p.to, node.Name)
		}
		wantAllowed := slices.Contains(allowed, p)
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, netpolmodel.ProtocolICMP} {
			v, err := world.Allowed(netpolmodel.PodEndpoint(pods[p.from]), netpolmodel.PodEndpoint(pods[p.to]), 80, proto)
			if err != nil || v.Allowed != wantAllowed {
				t.Fatalf("test design: the model says %s → %s %s is %v (%v), the test assumes allowed=%v", p.from, p.to, proto, v, err, wantAllowed)
			}
		}
	}
	const window = 15 * time.Second
	for _, crash := range []bool{false, true} {
		name := map[bool]string{false: "graceful", true: "kill -9"}[crash]
		t.Run(name, func(t *testing.T) {
			before := flowsButRound(t, ctx, node)
			roundBefore := round(t, ctx, node)
			var pingers []*pinger
			var repeats, leaks []*npRepeat
			for _, p := range allowed {
				from, to := f.pods[p.from], f.pods[p.to]
				pingers = append(pingers, startPinger(t, from, to, int(window/(10*time.Millisecond))))
				repeats = append(repeats, startNPRepeat(t, from, "tcp", to, 80, 10*time.Millisecond, 900*time.Millisecond, window))
			}
			for _, p := range denied {
				for _, proto := range []string{"tcp", "udp"} {
					leaks = append(leaks, startNPRepeat(t, f.pods[p.from], proto, f.pods[p.to], 80, 20*time.Millisecond, 300*time.Millisecond, window))
				}
			}
			time.Sleep(2 * time.Second)
			logFrom := npFileSize(node.AgentLog)
			stopped := time.Now()
			restartAgent(t, ctx, node, crash, roundBefore, window-3*time.Second)
			restart := time.Since(stopped)
			for i, pg := range pingers {
				sent, got, out := pg.wait()
				if sent < int(window/(10*time.Millisecond))*9/10 || got != sent {
					t.Errorf("ping %s → %s across the restart: %d sent, %d received\n%s", allowed[i].from, allowed[i].to, sent, got, out)
				} else {
					t.Logf("ping %s → %s: %d sent, %d received", allowed[i].from, allowed[i].to, sent, got)
				}
			}
			checkRestartRepeats(t, repeats, leaks)
			t.Logf("%s restart of the agent on %s: its new round was in place %s after it was stopped", name, node.Name, restart.Round(time.Millisecond))
			if t.Failed() {
				t.Logf("the agent's log since it was stopped (at %s):\n%s", stopped.Format("15:04:05.000"), npFileTail(node.AgentLog, logFrom, 80))
			}
			if after := flowsButRound(t, ctx, node); strings.Join(before, "\n") != strings.Join(after, "\n") {
				t.Errorf("flows differ after the restart:\n%s", npLineDiff(before, after))
			}
		})
	}
	f.check(t, ctx, "after the restarts")
}

// npLineDiff lists the lines only in a (-) and only in b (+).
func npLineDiff(a, b []string) string {
	in := func(s []string, l string) bool { return slices.Contains(s, l) }
	var out []string
	for _, l := range a {
		if !in(b, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range b {
		if !in(a, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

func npFileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// npFileTail returns at most the last n lines written to path after offset from.
func npFileTail(path string, from int64, n int) string {
	data, err := os.ReadFile(path)
	if err != nil || from > int64(len(data)) {
		return fmt.Sprint(err)
	}
	lines := strings.Split(strings.TrimRight(string(data[from:]), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// npSession is an `ofsdn-testpod session` running in a pod; its lines arrive on lines.
type npSession struct {
	what  string
	cmd   *exec.Cmd
	lines chan string
}

func startNPSession(t *testing.T, from *cluster.Pod, proto string, to *cluster.Pod, port int, duration time.Duration) *npSession {
	t.Helper()
	s := &npSession{what: fmt.Sprintf("%s session %s → %s:%d", proto, npShort(from.Namespace, from.Name), npShort(to.Namespace, to.Name), port),
		lines: make(chan string, 4096)}
	s.cmd = exec.Command("ip", "netns", "exec", from.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "session", proto,
		netip.AddrPortFrom(to.IP, uint16(port)).String(), "--interval", "100ms", "--timeout", "1s", "--duration", duration.String())
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	return s
}

// next waits up to d for the session's next answer: "ok", "timeout", or "" when none came.
func (s *npSession) next(d time.Duration) string {
	select {
	case l, ok := <-s.lines:
		if !ok {
			return ""
		}
		if f := strings.Fields(l); len(f) >= 2 {
			return f[1]
		}
		return l
	case <-time.After(d):
		return ""
	}
}

// npEstablishedCase: a policy change leaves an established connection alone while the new policy still
// allows it, and cuts it once it does not (ofsdn checks every original-direction packet against the
// policies of the moment; flows/pipeline/netpol.go), for TCP and UDP alike, across nodes and on one node.
func npEstablishedCase(t *testing.T, ctx context.Context, f *npFixture) {
	podA := npSel("pod", "a")
	allowY := npPolicy("from-y", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "y"))))))
	allowYZ := npPolicy("from-y", podA, npIngress(npFrom(npPeers(npNSPeer(npExpr("ns", metav1.LabelSelectorOpIn, "y", "z"))))))
	allowZ := npPolicy("from-y", podA, npIngress(npFrom(npPeers(npNSPeer(npSel("ns", "z"))))))
	f.createPolicy(t, ctx, "x", allowY)
	f.check(t, ctx, "x/a from ns=y")
	sessions := []*npSession{
		startNPSession(t, f.pods["y/b"], "tcp", f.pods["x/a"], 80, time.Minute),
		startNPSession(t, f.pods["y/c"], "udp", f.pods["x/a"], 81, time.Minute),
	}
	for _, s := range sessions {
		for i := 0; i < 10; i++ {
			if a := s.next(3 * time.Second); a != "ok" {
				t.Fatalf("%s: answer %d is %q before any change", s.what, i, a)
			}
		}
	}
	f.updatePolicy(t, ctx, "x", allowYZ)
	f.check(t, ctx, "x/a from ns In (y, z): y still allowed")
	for _, s := range sessions {
		for i := 0; i < 10; i++ {
			if a := s.next(3 * time.Second); a != "ok" {
				t.Errorf("%s: answer %d after a change that still allows it is %q", s.what, i, a)
				break
			}
		}
	}
	changed := time.Now()
	f.updatePolicy(t, ctx, "x", allowZ)
	for _, s := range sessions {
		cut := false
		for !cut && time.Since(changed) < npConverge {
			cut = s.next(3*time.Second) == "timeout"
		}
		if !cut {
			t.Errorf("%s: still answered %s after the policy stopped allowing it", s.what, npConverge)
			continue
		}
		t.Logf("%s: cut within %s of the change", s.what, time.Since(changed).Round(time.Millisecond))
		for i := 0; i < 5; i++ {
			if a := s.next(3 * time.Second); a != "timeout" {
				t.Errorf("%s: answer %d after the cut is %q: the denied connection leaks", s.what, i, a)
				break
			}
		}
	}
	f.check(t, ctx, "x/a from ns=z only")
	f.updatePolicy(t, ctx, "x", allowY)
	restored := time.Now()
	back := false
	for !back && time.Since(restored) < npConverge {
		back = sessions[1].next(3*time.Second) == "ok"
	}
	if !back {
		t.Errorf("%s: no answer within %s of allowing it again", sessions[1].what, npConverge)
	}
}
