//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/testpod"
	"github.com/ofsdn/ofsdn/internal/stats"
	"github.com/ofsdn/ofsdn/lab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Session affinity and NodePorts as many distinct clients see them: pods on every node, host-network
// clients in every node's namespace, and the external host through the NodePort of every node, each
// with addresses of its own (added to the lab's namespaces for the test). Every expectation comes
// from a model (a uniform choice, binomial bounds) or from what the client saw first, never from the
// flows.

const affNS = "e2e-aff"

// affAlpha is the chance that a correct implementation fails one spread check: the bounds are exact
// binomial quantiles at this level, split over the endpoints.
const affAlpha = 1e-4

// runClients runs ofsdn-testpod clients in a namespace: count connections from each source (none:
// the kernel's choice) to dsts in turn.
func runClients(ctx context.Context, netns, proto string, dsts []string, sources []netip.Addr, count int) (map[string]*testpod.ClientResult, error) {
	var srcs []string
	for _, s := range sources {
		srcs = append(srcs, s.String())
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, filepath.Join(lc.BinDir, "ofsdn-testpod"), "clients", proto,
		strings.Join(dsts, ","), "--sources", strings.Join(srcs, ","), "--count", fmt.Sprint(count), "--parallel", "16", "--timeout", "5s").Output()
	if err != nil {
		return nil, fmt.Errorf("clients %s %v from %s: %w", proto, dsts, netns, err)
	}
	res := map[string]*testpod.ClientResult{}
	return res, json.Unmarshal(out, &res)
}

// affClient is one client namespace and the source addresses it connects from.
type affClient struct {
	netns   string
	sources []netip.Addr
	dsts    func(svc *corev1.Service, proto string) []string
	gateway netip.Addr // host-network clients: their node's gateway, which a masqueraded connection shows
	kind    string     // pod, node (host network) or external
}

// addLabAddresses adds /32 addresses to a lab namespace's interface and removes them after the test.
func addLabAddresses(t *testing.T, netns, dev string, addrs []netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		if out, err := exec.Command("ip", "-n", netns, "addr", "add", a.String()+"/32", "dev", dev).CombinedOutput(); err != nil {
			t.Fatalf("add %s to %s: %v: %s", a, netns, err, out)
		}
	}
	t.Cleanup(func() {
		for _, a := range addrs {
			_ = exec.Command("ip", "-n", netns, "addr", "del", a.String()+"/32", "dev", dev).Run()
		}
	})
}

func setLabel(ctx context.Context, t *testing.T, pod, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"svc":%q}}}`, value)
	if _, err := lc.Client.CoreV1().Pods(affNS).Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// stickyRun runs every client against svc and returns each source's one endpoint; a source that saw
// errors or more than one endpoint fails the test. It also checks the address the endpoints saw.
func stickyRun(ctx context.Context, t *testing.T, clients []affClient, svc *corev1.Service, proto string, count int) map[string]string {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	chosen := map[string]string{}
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runClients(ctx, c.netns, proto, c.dsts(svc, proto), c.sources, count)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			for key, r := range res {
				if len(r.Endpoints) != 1 {
					t.Errorf("%s %s client %s → %s: %d connections reached %v, want one endpoint and no error", proto, c.kind, key, svc.Name, count, r.Endpoints)
					continue
				}
				for ep, n := range r.Endpoints {
					if n != count {
						t.Errorf("%s client %s: %d of %d connections answered", c.kind, key, n, count)
					}
					chosen[key] = ep
				}
				for seen := range r.Seen {
					switch {
					case c.kind == "external" && !slices.Contains(gateways(ctx, t), netip.MustParseAddr(seen)):
						t.Errorf("%s %s client %s through a NodePort (externalTrafficPolicy Cluster): the endpoint saw %s, not a node's gateway", proto, c.kind, key, seen)
					case c.kind == "node" && seen != c.gateway.String():
						t.Errorf("%s %s client %s: the endpoint saw %s, want its node's gateway %s (masqueraded after the choice)", proto, c.kind, key, seen, c.gateway)
					case c.kind == "pod" && seen != key:
						t.Errorf("%s pod client %s: the endpoint saw %s (nothing is NATed inside the cluster)", proto, key, seen)
					}
				}
			}
		}()
	}
	wg.Wait()
	return chosen
}

var (
	gatewaysOnce sync.Once
	gatewayList  []netip.Addr
)

// gateways are the nodes' tun0 addresses.
func gateways(ctx context.Context, t *testing.T) []netip.Addr {
	gatewaysOnce.Do(func() {
		for _, n := range lc.Nodes {
			p, err := lc.Subnet(ctx, n.Name)
			if err != nil {
				t.Error(err)
				return
			}
			gatewayList = append(gatewayList, p.Masked().Addr().Next())
		}
	})
	return gatewayList
}

// spreadOf counts the chosen endpoints and checks they spread as a uniform choice over n would.
func spreadOf(t *testing.T, what string, chosen map[string]string, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, ep := range chosen {
		counts[ep]++
	}
	line, err := stats.Spread(counts, n, affAlpha)
	t.Logf("%s: %s", what, line)
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
	return counts
}

func TestServiceAffinityFromManyClients(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	if err := lc.EnsureNamespace(ctx, affNS); err != nil {
		t.Fatal(err)
	}
	// Four endpoints (two on the first node), a fifth that joins later, and three client pods per node.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var clientPods []*cluster.Pod
	for i, node := range []int{0, 1, 2, 0, 1} {
		label := "aff"
		if i == 4 {
			label = "aff-later"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			svcPod(t, ctx, affNS, fmt.Sprintf("aff-%d", i), lc.Nodes[node].Name, label, nil)
		}()
	}
	for _, n := range lc.Nodes {
		for j := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := svcPod(t, ctx, affNS, fmt.Sprintf("cl-%s-%d", n.Name, j), n.Name, "client", nil)
				mu.Lock()
				clientPods = append(clientPods, p)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ports := func(tcpNode, udpNode int32) []corev1.ServicePort {
		return []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: tcpNode},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: udpNode}}
	}
	affinity := func(seconds int32) *corev1.SessionAffinityConfig {
		return &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(seconds)}}
	}
	const briefTimeout = 30
	sticky := createService(t, ctx, affNS, "sticky", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"svc": "aff"},
		Ports: ports(30180, 30181), SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: affinity(3600)})
	brief := createService(t, ctx, affNS, "brief", corev1.ServiceSpec{Selector: map[string]string{"svc": "aff"},
		Ports: ports(0, 0), SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: affinity(briefTimeout)})
	plain := createService(t, ctx, affNS, "plain", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"svc": "aff"},
		Ports: ports(30182, 30183)})

	// Clients: the pods; 30 addresses on each node's loopback (host-network clients of the ClusterIP);
	// up to 60 free addresses of the underlay (after the nodes', before the external host's) on the
	// external host (outside clients of the NodePort of every node).
	ext := lc.Lab.External
	var extSources []netip.Addr
	under := lc.Lab.Underlay.Masked()
	for a := under.Addr(); under.Contains(a) && len(extSources) < 60; a = a.Next() {
		taken := a == ext.IP || a == under.Addr() || !under.Contains(a.Next()) // network, external, broadcast
		if lc.Lab.Root != nil {
			taken = taken || a == lc.Lab.Root.IP
		}
		for _, n := range lc.Nodes {
			taken = taken || !n.IP.Less(a) // the nodes' addresses and those below them
		}
		if !taken {
			extSources = append(extSources, a)
		}
	}
	addLabAddresses(t, ext.NetNS, "eth0", extSources)
	nodePortDsts := func(svc *corev1.Service, proto string) []string {
		var out []string
		for _, n := range lc.Nodes {
			for _, p := range svc.Spec.Ports {
				if strings.EqualFold(string(p.Protocol), proto) {
					out = append(out, netip.AddrPortFrom(n.IP, uint16(p.NodePort)).String())
				}
			}
		}
		return out
	}
	clusterIPDsts := func(svc *corev1.Service, proto string) []string {
		return []string{clusterIP(svc, map[string]int{"tcp": 80, "udp": 53}[proto])}
	}
	clients := []affClient{{netns: ext.NetNS, sources: extSources, dsts: nodePortDsts, kind: "external"}}
	// Host-network client addresses: a documentation range the lab's underlay does not use, on each
	// node namespace's loopback only (nothing routes them outside the node).
	var hostRange netip.Prefix
	for _, r := range lab.DocumentationRanges {
		if !r.Overlaps(under) {
			hostRange = r
		}
	}
	if !hostRange.IsValid() {
		t.Fatalf("no documentation range left for host-network client addresses beside the underlay %s", under)
	}
	for k, n := range lc.Nodes {
		var srcs []netip.Addr
		for i := range 30 {
			a := hostRange.Addr().As4()
			a[3] = byte(40*k + 1 + i)
			srcs = append(srcs, netip.AddrFrom4(a))
		}
		addLabAddresses(t, n.NetNS, "lo", srcs)
		clients = append(clients, affClient{netns: n.NetNS, sources: srcs, dsts: clusterIPDsts, gateway: gateways(ctx, t)[k], kind: "node"})
	}
	for _, p := range clientPods {
		clients = append(clients, affClient{netns: p.NetNS, sources: []netip.Addr{p.IP}, dsts: clusterIPDsts, kind: "pod"})
	}
	distinct := 0
	for _, c := range clients {
		distinct += len(c.sources)
	}
	t.Logf("%d distinct client addresses: %d pods, %d host-network on the nodes (%s), %d outside (%s)", distinct, len(clientPods), 90, hostRange,
		len(extSources), under)
	if distinct < 100 {
		t.Fatalf("only %d distinct clients", distinct)
	}

	// Every node serves the four endpoints (the plain NodePort, from outside), and the affinity services
	// answer every kind of client on every node.
	for _, n := range lc.Nodes {
		waitEndpoints(t, ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30182).String(), 4, time.Minute)
	}
	waitAnswer := func(netns, proto, addr string) {
		deadline := time.Now().Add(time.Minute)
		for {
			_, err := lc.ProbeFrom(ctx, netns, proto, netip.MustParseAddrPort(addr))
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s %s from %s: %v", proto, addr, netns, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, proto := range []string{"tcp", "udp"} {
		for _, svc := range []*corev1.Service{sticky, brief} {
			for _, c := range clients {
				if c.kind != "external" {
					waitAnswer(c.netns, proto, c.dsts(svc, proto)[0])
				}
			}
		}
		for _, d := range nodePortDsts(sticky, proto) {
			waitAnswer(ext.NetNS, proto, d)
		}
	}

	chosen := map[string]map[string]string{}
	t.Run("spread and sticky over 50 connections, TCP and UDP", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			start := time.Now()
			chosen[proto] = stickyRun(ctx, t, clients, sticky, proto, 50)
			t.Logf("%s: %d clients × 50 connections in %s", proto, len(chosen[proto]), time.Since(start).Round(time.Millisecond))
			if len(chosen[proto]) != distinct {
				t.Fatalf("%s: %d of %d clients answered", proto, len(chosen[proto]), distinct)
			}
			spreadOf(t, proto+", every client", chosen[proto], 4)
		}
		// For the record, per kind (too few pods for a test of their own).
		for _, kind := range []string{"pod", "node", "external"} {
			counts := map[string]int{}
			for _, c := range clients {
				if c.kind != kind {
					continue
				}
				for _, s := range c.sources {
					counts[chosen["tcp"][s.String()]]++
				}
			}
			t.Logf("tcp, %s clients: %v", kind, counts)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("NodePort externalTrafficPolicy Cluster: one outside client spreads over every endpoint", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			res, err := runClients(ctx, ext.NetNS, proto, nodePortDsts(plain, proto), nil, 300)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				line, err := stats.Spread(r.Endpoints, 4, affAlpha)
				t.Logf("%s from %s through the NodePort of every node: %s; seen %v", proto, ext.IP, line, r.Seen)
				if err != nil {
					t.Error(err)
				}
				for seen := range r.Seen {
					if !slices.Contains(gateways(ctx, t), netip.MustParseAddr(seen)) {
						t.Errorf("the endpoints saw %s, not the gateway of the node the client came in by", seen)
					}
				}
			}
		}
	})

	// brief learns every host-network and pod client now; its timeout is checked at the end.
	var briefClients []affClient
	for _, c := range clients {
		if c.kind != "external" {
			briefClients = append(briefClients, c)
		}
	}
	briefBefore := stickyRun(ctx, t, briefClients, brief, "tcp", 3)
	learned := time.Now()

	var newcomer string
	t.Run("stickiness survives an endpoint joining", func(t *testing.T) {
		setLabel(ctx, t, "aff-4", "aff")
		for _, n := range lc.Nodes {
			waitEndpoints(t, ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30182).String(), 5, time.Minute)
		}
		t.Logf("aff-4 joined, served by every node %s after brief's clients were learned", time.Since(learned).Round(time.Millisecond))
		for _, proto := range []string{"tcp", "udp"} {
			now := stickyRun(ctx, t, clients, sticky, proto, 10)
			for src, ep := range chosen[proto] {
				if now[src] != ep {
					t.Errorf("%s client %s was on %s, after aff-4 joined it reached %s", proto, src, ep, now[src])
				}
			}
		}
		if since := time.Since(learned); since > (briefTimeout-5)*time.Second {
			t.Fatalf("the endpoint change took %s, too close to brief's timeout of %ds to check it", since, briefTimeout)
		}
		now := stickyRun(ctx, t, briefClients, brief, "tcp", 3)
		for src, ep := range briefBefore {
			if now[src] != ep {
				t.Errorf("within timeoutSeconds, brief's client %s moved from %s to %s", src, ep, now[src])
			}
			if strings.Contains(now[src], "/aff-4:") {
				newcomer = now[src]
			}
		}
	})
	checked := time.Now()

	t.Run("stickiness survives an unrelated endpoint leaving", func(t *testing.T) {
		gone := affNS + "/aff-2:8080"
		setLabel(ctx, t, "aff-2", "aff-gone")
		defer setLabel(ctx, t, "aff-2", "aff")
		for _, n := range lc.Nodes {
			waitEndpoints(t, ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30182).String(), 4, time.Minute)
		}
		for _, proto := range []string{"tcp", "udp"} {
			now := stickyRun(ctx, t, clients, sticky, proto, 10)
			moved := 0
			for src, ep := range chosen[proto] {
				switch {
				case ep == gone && now[src] == gone:
					t.Errorf("%s client %s still reaches the removed %s", proto, src, gone)
				case ep == gone:
					moved++
				case now[src] != ep:
					t.Errorf("%s client %s was on %s, after aff-2 left it reached %s", proto, src, ep, now[src])
				}
			}
			t.Logf("%s: the %d clients of aff-2 each moved to one other endpoint; the others stayed", proto, moved)
		}
	})

	t.Run("timeoutSeconds honoured", func(t *testing.T) {
		if newcomer != "" {
			t.Fatalf("a client of brief reached %s within its timeout", newcomer)
		}
		for _, n := range lc.Nodes { // aff-2 is back
			waitEndpoints(t, ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30182).String(), 5, time.Minute)
		}
		wait := time.Until(checked.Add((briefTimeout + 5) * time.Second))
		t.Logf("brief's clients idle for %s (timeoutSeconds %d)", wait.Round(time.Second), briefTimeout)
		time.Sleep(wait)
		after := stickyRun(ctx, t, briefClients, brief, "tcp", 3)
		// Released, every client chooses again among the five endpoints (aff-2 is back): as a uniform
		// choice would, so about a fifth land on aff-4, where none was before the timeout. (The whole
		// population, not a part picked by its earlier choice: each client's hash is the same as before.)
		counts := spreadOf(t, "brief's clients after the timeout", after, 5)
		if t.Failed() {
			if esl, err := lc.Client.DiscoveryV1().EndpointSlices(affNS).List(ctx, metav1.ListOptions{}); err == nil {
				for _, es := range esl.Items {
					var eps []string
					for _, e := range es.Endpoints {
						eps = append(eps, fmt.Sprintf("%s ready=%v", e.Addresses[0], e.Conditions.Ready != nil && *e.Conditions.Ready))
					}
					t.Logf("EndpointSlice %s: %v", es.Name, eps)
				}
			}
			for _, table := range []string{"41", "43"} {
				out, _ := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "dump", "--rundir", lc.Nodes[0].Dir, "--bridge", "br0", "--table", table).CombinedOutput()
				t.Logf("%s table %s:\n%s", lc.Nodes[0].Name, table, out)
			}
		}
		if counts[affNS+"/aff-4:8080"] == 0 {
			t.Errorf("no client of brief moved to aff-4 after its timeout: %v", counts)
		}
	})
}

// TestNodePortWithoutEndpointsRefuses: an outside client of a NodePort whose service has no endpoint is
// refused at once through every node, TCP and UDP, now that br0 sees it by its own address (the refusal
// is hairpinned back through br0 and the host's un-DNAT).
func TestNodePortWithoutEndpointsRefuses(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	if err := lc.EnsureNamespace(ctx, affNS); err != nil {
		t.Fatal(err)
	}
	svc := createService(t, ctx, affNS, "np-empty", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"svc": "nothing"},
		Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: 30184},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: 30185}}})
	ext := lc.Lab.External
	for _, n := range lc.Nodes {
		for _, p := range svc.Spec.Ports {
			proto := strings.ToLower(string(p.Protocol))
			dst := netip.AddrPortFrom(n.IP, uint16(p.NodePort))
			deadline := time.Now().Add(time.Minute)
			var err error
			for time.Now().Before(deadline) {
				start := time.Now()
				if _, err = lc.ProbeFrom(ctx, ext.NetNS, proto, dst); err != nil && strings.Contains(err.Error(), "refused") {
					t.Logf("%s %s refused after %s", proto, dst, time.Since(start).Round(time.Millisecond))
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Errorf("%s %s without endpoints: want connection refused, last %v", proto, dst, err)
			}
		}
	}
}
