//go:build e2e

package e2e

// ClusterNetworkPolicy on the 3-node lab: random policies of both tiers mixed with NetworkPolicies
// (networkpolicy mode) and with tenants joined, isolated and made global (multitenant mode), on the
// NetworkPolicy suite's fixture (namespaces x, y, z × pods a, b, c, spread over the nodes; TCP and UDP
// on ports 80 and 81, and the external host). After every random change the whole truth table is
// compared with e2e/cnpmodel, written from the API's text; how long the datapath took to follow is
// measured on the cells the change flipped, from inside the pods. Then agents restart with policies in
// place.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/e2e/cnpmodel"
	"github.com/ofsdn/ofsdn/e2e/netpolmodel"
	"github.com/ofsdn/ofsdn/e2e/testpod"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// cnpFixture is the NetworkPolicy fixture with ClusterNetworkPolicies.
type cnpFixture struct {
	*npFixture
	dyn  dynamic.Interface
	mode networkv1.PluginMode
	// converge are the measured convergence times of flipped cells, over every change.
	converge []time.Duration
}

// dynamicClient is the lab's administrator's dynamic client (ClusterNetworkPolicies are read through it).
func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(lc.API.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

func newCNPFixture(t *testing.T, ctx context.Context) *cnpFixture {
	t.Helper()
	f := &cnpFixture{npFixture: newNPFixture(t, ctx), dyn: dynamicClient(t)}
	f.dropSCTP("the ClusterNetworkPolicy suite probes TCP and UDP")
	t.Cleanup(func() { f.deleteAll(t, context.Background()) })
	return f
}

func (f *cnpFixture) policies() dynamic.ResourceInterface { return f.dyn.Resource(cnp.Resource) }

func (f *cnpFixture) apply(t *testing.T, ctx context.Context, p *cnp.ClusterNetworkPolicy) {
	t.Helper()
	p.APIVersion, p.Kind = cnp.Group+"/"+cnp.Version, cnp.Kind
	u, err := cnp.ToUnstructured(p)
	if err != nil {
		t.Fatal(err)
	}
	u.SetResourceVersion("")
	if old, err := f.policies().Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
		u.SetResourceVersion(old.GetResourceVersion())
		_, err = f.policies().Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update ClusterNetworkPolicy %s: %v", p.Name, err)
		}
		return
	}
	if _, err := f.policies().Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterNetworkPolicy %s: %v", p.Name, err)
	}
}

func (f *cnpFixture) remove(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := f.policies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete ClusterNetworkPolicy %s: %v", name, err)
	}
}

func (f *cnpFixture) list(ctx context.Context) ([]cnp.ClusterNetworkPolicy, error) {
	l, err := f.policies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []cnp.ClusterNetworkPolicy
	for i := range l.Items {
		p, err := cnp.FromUnstructured(&l.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, nil
}

// deleteAll removes every ClusterNetworkPolicy and the NetworkPolicy fixture's changes.
func (f *cnpFixture) deleteAll(t *testing.T, ctx context.Context) {
	if err := f.policies().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete ClusterNetworkPolicies: %v", err)
	}
}

// world is the model's world as the API server holds it now.
func (f *cnpFixture) world(ctx context.Context) (*cnpmodel.World, map[string]*netpolmodel.Pod, error) {
	c, pods, err := f.snapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	w := &cnpmodel.World{Mode: cnpmodel.Mode(f.mode), Cluster: c, VNIDs: map[string]uint32{}}
	nns, err := lc.Net.NetworkV1().NetNamespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, nn := range nns.Items {
		w.VNIDs[nn.Name] = nn.NetID
	}
	if w.Policies, err = f.list(ctx); err != nil {
		return nil, nil, err
	}
	return w, pods, nil
}

// expected is the model's truth table now.
func (f *cnpFixture) expected(ctx context.Context) (*npMatrix, error) {
	w, pods, err := f.world(ctx)
	if err != nil {
		return nil, err
	}
	return f.matrixOf(pods, func(src, dst netpolmodel.Endpoint, port int32, proto corev1.Protocol) (bool, string, error) {
		v, err := w.Allowed(src, dst, port, proto)
		return v.Allowed, v.String(), err
	})
}

func (f *cnpFixture) check(t *testing.T, ctx context.Context, step string) {
	t.Helper()
	f.checkWith(t, ctx, step, f.expected)
}

// cnpSeed is the random test's seed: OFSDN_CNP_SEED, or the time (logged, so a failure can be replayed).
func cnpSeed(t *testing.T) uint64 {
	if s := os.Getenv("OFSDN_CNP_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OFSDN_CNP_SEED: %v", err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// cnpRounds is how many random changes each mode gets: OFSDN_CNP_ROUNDS, default 10.
func cnpRounds(t *testing.T) int {
	if s := os.Getenv("OFSDN_CNP_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("OFSDN_CNP_ROUNDS=%q", s)
		}
		return n
	}
	return 10
}

func TestClusterNetworkPolicy(t *testing.T) {
	ctx := ctxT(t, 30*time.Minute)
	began := time.Now()
	f := newCNPFixture(t, ctx)
	mode, err := currentMode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lc.SetMode(context.Background(), mode); err != nil {
			t.Errorf("restore pluginMode %s: %v", mode, err)
		}
	})
	seed := cnpSeed(t)
	t.Logf("seed %d (OFSDN_CNP_SEED replays it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x0f5d))
	rounds := cnpRounds(t)
	for _, m := range []networkv1.PluginMode{networkv1.PluginModeNetworkPolicy, networkv1.PluginModeMultitenant} {
		t.Run(string(m), func(t *testing.T) {
			if err := lc.SetMode(ctx, m); err != nil {
				t.Fatal(err)
			}
			f.mode = m
			f.check(t, ctx, "no ClusterNetworkPolicy")
			g := &cnpGen{f: f, rng: rng}
			for i := range rounds {
				what := g.change(t, ctx)
				f.check(t, ctx, fmt.Sprintf("round %d: %s", i+1, what))
				if t.Failed() {
					t.Fatalf("round %d failed: replay with OFSDN_CNP_SEED=%d; the changes so far:\n%s", i+1, seed, strings.Join(g.trail, "\n"))
				}
			}
			g.resetAll(t, ctx)
			f.check(t, ctx, "all policies gone")
		})
	}
	t.Logf("convergence of the flipped cells sampled (up to 6 a change; to a new allow: up to 30 ms late, one denied attempt): %s", cnpPercentiles(f.converge))
	// The target (p99 < 250 ms) is a figure to read on a quiet machine, not a test's threshold: CI's 2
	// shared cores put single cells at ~500 ms while the lab's own agents compete for them. A cell that
	// takes seconds is a missed sync, not noise: that fails.
	p99 := cnpPercentile(f.converge, 0.99)
	t.Logf("convergence p99 %s (target < 250 ms on a quiet machine)", p99)
	if p99 >= 2*time.Second {
		t.Errorf("convergence p99 %s: a flipped cell waited for seconds (a missed flow sync?)", p99)
	}
	t.Run("agent restarts", func(t *testing.T) { cnpRestartCase(t, ctx, f) })
	t.Logf("suite took %s", time.Since(began).Round(time.Second))
}

func cnpPercentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func cnpPercentiles(d []time.Duration) string {
	return fmt.Sprintf("%d cells: p50 %s, p90 %s, p99 %s, max %s", len(d), cnpPercentile(d, 0.5).Round(time.Millisecond),
		cnpPercentile(d, 0.9).Round(time.Millisecond), cnpPercentile(d, 0.99).Round(time.Millisecond), cnpPercentile(d, 1).Round(time.Millisecond))
}

// cnpGen makes random changes.
type cnpGen struct {
	f     *cnpFixture
	rng   *rand.Rand
	n     int
	live  []string // ClusterNetworkPolicy names
	nps   []string // ns/name of NetworkPolicies
	pols  map[string]*cnp.ClusterNetworkPolicy
	trail []string
}

func (g *cnpGen) pick(xs []string) string { return xs[g.rng.IntN(len(xs))] }

// change makes one random change, measuring how long the cells it flips take to follow, and says what
// it did.
func (g *cnpGen) change(t *testing.T, ctx context.Context) string {
	t.Helper()
	if g.pols == nil {
		g.pols = map[string]*cnp.ClusterNetworkPolicy{}
	}
	before, err := g.f.expected(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var what string
	start := time.Now()
	switch r := g.rng.IntN(100); {
	case r < 40 || len(g.live) == 0:
		p := g.policy()
		g.f.apply(t, ctx, p)
		g.live, g.pols[p.Name] = append(g.live, p.Name), p
		what = "create " + describeCNP(p)
	case r < 55:
		name := g.pick(g.live)
		start = time.Now()
		g.f.remove(t, ctx, name)
		g.live = slices.DeleteFunc(g.live, func(s string) bool { return s == name })
		delete(g.pols, name)
		what = "delete ClusterNetworkPolicy " + name
	case r < 70:
		name := g.pick(g.live)
		p := g.pols[name]
		p.Spec.Priority = int32(g.rng.IntN(6))
		start = time.Now()
		g.f.apply(t, ctx, p)
		what = fmt.Sprintf("move ClusterNetworkPolicy %s to priority %d", name, p.Spec.Priority)
	case r < 95 && g.f.mode == networkv1.PluginModeMultitenant:
		ns := g.pick([]string{"y", "z"})
		req := g.pick([]string{"join:" + npNS("x"), "isolate", "global", "join:" + npNS("y")})
		if req == "join:"+npNS(ns) {
			req = "isolate"
		}
		start = time.Now()
		if _, err := lc.ChangeNetwork(ctx, npNS(ns), req); err != nil {
			t.Fatal(err)
		}
		what = fmt.Sprintf("tenant %s: %s", ns, req)
	case r < 95:
		what = g.networkPolicy(t, ctx)
	default:
		key := g.pick(g.f.keys)
		_, name, _ := strings.Cut(key, "/")
		labels := map[string]string{"pod": name}
		if g.rng.IntN(2) == 0 {
			labels["role"] = "db"
		}
		start = time.Now()
		g.f.setPodLabels(t, ctx, key, labels)
		what = fmt.Sprintf("pod %s labels %v", key, labels)
	}
	g.trail = append(g.trail, what)
	after, err := g.f.expected(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g.f.converge = append(g.f.converge, g.measure(t, ctx, before, after, start)...)
	return what
}

// networkPolicy creates or deletes a random NetworkPolicy.
func (g *cnpGen) networkPolicy(t *testing.T, ctx context.Context) string {
	t.Helper()
	if len(g.nps) > 0 && g.rng.IntN(3) == 0 {
		key := g.pick(g.nps)
		ns, name, _ := strings.Cut(key, "/")
		g.f.deletePolicy(t, ctx, ns, name)
		g.nps = slices.DeleteFunc(g.nps, func(s string) bool { return s == key })
		return "delete NetworkPolicy " + key
	}
	g.n++
	ns := g.pick(npShortNamespaces)
	name := fmt.Sprintf("np%d", g.n)
	from := g.pick(npShortNamespaces)
	var np *networkingv1.NetworkPolicy
	switch g.rng.IntN(3) {
	case 0:
		np = npPolicy(name, npSel("pod", g.pick(npShortPods)), npIngress(npFrom(npPeers(npNSPeer(npSel("ns", from))), npPort(corev1.ProtocolTCP, 80))))
	case 1:
		np = npPolicy(name, &metav1.LabelSelector{}, npIngress())
	default:
		np = npPolicy(name, npSel("pod", g.pick(npShortPods)), npEgress(npTo(npPeers(npNSPeer(npSel("ns", from))))))
	}
	g.f.createPolicy(t, ctx, ns, np)
	g.nps = append(g.nps, ns+"/"+name)
	return fmt.Sprintf("create NetworkPolicy %s/%s", ns, name)
}

// resetAll removes the generator's policies and NetworkPolicies and brings tenants back.
func (g *cnpGen) resetAll(t *testing.T, ctx context.Context) {
	g.f.deleteAll(t, ctx)
	g.f.reset(t, ctx)
	if g.f.mode == networkv1.PluginModeMultitenant {
		for _, ns := range npShortNamespaces {
			if _, err := lc.ChangeNetwork(ctx, npNS(ns), "isolate"); err != nil {
				t.Fatal(err)
			}
		}
	}
	g.live, g.nps, g.pols = nil, nil, nil
}

// policy is a random ClusterNetworkPolicy.
func (g *cnpGen) policy() *cnp.ClusterNetworkPolicy {
	g.n++
	p := &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e2e-cnp-%d", g.n)}}
	p.Spec.Tier = []cnp.Tier{cnp.AdminTier, cnp.BaselineTier}[g.rng.IntN(2)]
	p.Spec.Priority = int32(g.rng.IntN(6))
	switch g.rng.IntN(3) {
	case 0:
		p.Spec.Subject.Namespaces = npSel("ns", g.pick(npShortNamespaces))
	case 1:
		p.Spec.Subject.Namespaces = &metav1.LabelSelector{}
	default:
		p.Spec.Subject.Pods = &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", g.pick(npShortNamespaces)), PodSelector: *npSel("pod", g.pick(npShortPods))}
	}
	for range 1 + g.rng.IntN(2) {
		if g.rng.IntN(2) == 0 {
			r := cnp.IngressRule{Name: fmt.Sprintf("in%d", len(p.Spec.Ingress)), Action: g.action()}
			for range 1 + g.rng.IntN(2) {
				e := g.peer(false)
				r.From = append(r.From, cnp.IngressPeer{Namespaces: e.Namespaces, Pods: e.Pods})
			}
			r.Protocols = g.protocols(true)
			p.Spec.Ingress = append(p.Spec.Ingress, r)
		} else {
			r := cnp.EgressRule{Name: fmt.Sprintf("out%d", len(p.Spec.Egress)), Action: g.action()}
			named := true
			for range 1 + g.rng.IntN(2) {
				e := g.peer(true)
				named = named && len(e.Networks) == 0
				r.To = append(r.To, e)
			}
			r.Protocols = g.protocols(named)
			p.Spec.Egress = append(p.Spec.Egress, r)
		}
	}
	return p
}

func (g *cnpGen) action() cnp.Action {
	return []cnp.Action{cnp.Accept, cnp.Deny, cnp.Pass}[g.rng.IntN(3)]
}

func (g *cnpGen) peer(egress bool) cnp.EgressPeer {
	n := 3
	if egress {
		n = 5
	}
	switch g.rng.IntN(n) {
	case 0:
		return cnp.EgressPeer{Namespaces: npSel("ns", g.pick(npShortNamespaces))}
	case 1:
		return cnp.EgressPeer{Namespaces: &metav1.LabelSelector{}}
	case 2:
		return cnp.EgressPeer{Pods: &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", g.pick(npShortNamespaces)), PodSelector: *npSel("pod", g.pick(npShortPods))}}
	case 3:
		return cnp.EgressPeer{Networks: []string{netip.PrefixFrom(g.f.ext, 32).String()}}
	default: // a pod's address as a network: networks match pod traffic too
		return cnp.EgressPeer{Networks: []string{netip.PrefixFrom(g.f.pods[g.pick(g.f.keys)].IP, 32).String()}}
	}
}

func (g *cnpGen) protocols(named bool) []cnp.Protocol {
	if g.rng.IntN(2) == 0 {
		return nil
	}
	port := func(n int32) *cnp.ProtocolPort { return &cnp.ProtocolPort{DestinationPort: &cnp.Port{Number: n}} }
	choices := []cnp.Protocol{
		{TCP: port(80)}, {UDP: port(81)}, {UDP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Range: &cnp.PortRange{Start: 1, End: 65535}}}},
		{TCP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Range: &cnp.PortRange{Start: 80, End: 81}}}},
	}
	if named {
		// Pods c name their TCP ports crosswise: serve-80-tcp is their port 81.
		choices = append(choices, cnp.Protocol{DestinationNamedPort: "serve-80-tcp"}, cnp.Protocol{DestinationNamedPort: "serve-81-udp"})
	}
	var out []cnp.Protocol
	for range 1 + g.rng.IntN(2) {
		out = append(out, choices[g.rng.IntN(len(choices))])
	}
	return out
}

func describeCNP(p *cnp.ClusterNetworkPolicy) string {
	return fmt.Sprintf("%s (%s %d, %d ingress and %d egress rules)", p.Name, p.Spec.Tier, p.Spec.Priority, len(p.Spec.Ingress), len(p.Spec.Egress))
}

// cnpCell is one flipped cell of the truth table.
type cnpCell struct {
	p        npProbe
	src, dst string
	allowed  bool // after the change
}

// measure polls up to 6 of the cells the change flipped, from inside their source pods, until each
// shows its new verdict, and returns how long after start each did. A cell that never follows counts
// as 5 s (the full check after it says what is wrong).
func (g *cnpGen) measure(t *testing.T, ctx context.Context, before, after *npMatrix, start time.Time) []time.Duration {
	t.Helper()
	var cells []cnpCell
	dsts := g.f.dsts()
	for _, p := range g.f.probes {
		for i, src := range g.f.keys {
			for j, dst := range dsts {
				if before.ok[p][i][j] != after.ok[p][i][j] && src != dst {
					cells = append(cells, cnpCell{p, src, dst, after.ok[p][i][j]})
				}
			}
		}
	}
	g.rng.Shuffle(len(cells), func(i, j int) { cells[i], cells[j] = cells[j], cells[i] })
	cells = cells[:min(len(cells), 6)]
	out := make([]time.Duration, len(cells))
	var wg sync.WaitGroup
	for k, c := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr := netip.AddrPortFrom(g.f.ext, uint16(c.p.port))
			if c.dst != "ext" {
				addr = netip.AddrPortFrom(g.f.pods[c.dst].IP, uint16(c.p.port))
			}
			out[k] = followFrom(ctx, g.f.pods[c.src].NetNS, c.p.proto, addr.String(), c.allowed, start, 5*time.Second)
		}()
	}
	wg.Wait()
	return out
}

// followFrom tries proto connections to addr from inside a network namespace, one at a time, each
// waiting at most 30 ms for an answer, until the new verdict holds: for allowed, when the first attempt
// that connects began; for denied, when the first of 3 attempts in a row that got no answer began (a
// slow answer is not taken for a drop). It returns that time after start (limit when it never held).
func followFrom(ctx context.Context, ns, proto, addr string, allowed bool, start time.Time, limit time.Duration) time.Duration {
	const attempt = 30 * time.Millisecond
	runtime.LockOSThread() // the thread enters the pod's namespace and is thrown away afterwards
	orig, err := netns.Get()
	if err != nil {
		return limit
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		return limit
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return limit
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	var firstDrop time.Duration
	drops := 0
	for time.Since(start) < limit && ctx.Err() == nil {
		began := time.Since(start)
		actx, cancel := context.WithTimeout(ctx, attempt)
		var err error
		if proto == "udp" {
			_, err = udpOnce(actx, addr)
		} else {
			_, err = testpod.ProbeTCP(actx, addr, 0)
		}
		cancel()
		switch {
		case allowed && err == nil:
			return began
		case !allowed && err != nil:
			if drops == 0 {
				firstDrop = began
			}
			if drops++; drops == 3 {
				return firstDrop
			}
		default:
			drops = 0
		}
		if d := 5*time.Millisecond - (time.Since(start) - began); d > 0 { // answered or refused at once: do not spin
			time.Sleep(d)
		}
	}
	return limit
}

// udpOnce sends one datagram and waits for the answer.
func udpOnce(ctx context.Context, addr string) (string, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte("probe")); err != nil {
		return "", err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// cnpRestartCase: multitenant, with an Admin Accept across tenants, an Admin Deny inside a tenant and
// a Baseline Deny in place, the agent of the node that enforces them restarts (SIGTERM, then SIGKILL)
// while allowed pairs make 100 new TCP connections a second and denied pairs are tried over TCP and
// UDP: not one allowed connection may fail, not one denied attempt may pass, and the flows afterwards
// are the flows before.
func cnpRestartCase(t *testing.T, ctx context.Context, f *cnpFixture) {
	if err := lc.SetMode(ctx, networkv1.PluginModeMultitenant); err != nil {
		t.Fatal(err)
	}
	f.mode = networkv1.PluginModeMultitenant
	node := lc.Node(f.pods["x/a"].Node)
	var zt, zs string // a z pod on node, and another z pod
	for _, name := range npShortPods {
		if key := "z/" + name; f.pods[key].Node == node.Name {
			zt = key
		} else {
			zs = key
		}
	}
	if zt == "" {
		t.Fatalf("test design: no z pod on %s", node.Name)
	}
	_, ztName, _ := strings.Cut(zt, "/")
	f.apply(t, ctx, &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "restart-admin"}, Spec: cnp.Spec{
		Tier: cnp.AdminTier, Priority: 1,
		Subject: cnp.Subject{Pods: &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", "x"), PodSelector: *npSel("pod", "a")}},
		Ingress: []cnp.IngressRule{
			{Name: "y-b-web", Action: cnp.Accept, From: []cnp.IngressPeer{{Pods: &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", "y"), PodSelector: *npSel("pod", "b")}}},
				Protocols: []cnp.Protocol{{TCP: &cnp.ProtocolPort{DestinationPort: &cnp.Port{Number: 80}}}}},
			{Name: "not-x-c", Action: cnp.Deny, From: []cnp.IngressPeer{{Pods: &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", "x"), PodSelector: *npSel("pod", "c")}}}},
		}}})
	f.apply(t, ctx, &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "restart-baseline"}, Spec: cnp.Spec{
		Tier: cnp.BaselineTier, Priority: 0,
		Subject: cnp.Subject{Pods: &cnp.NamespacedPod{NamespaceSelector: *npSel("ns", "z"), PodSelector: *npSel("pod", ztName)}},
		Ingress: []cnp.IngressRule{{Name: "z-closed", Action: cnp.Deny, From: []cnp.IngressPeer{{Namespaces: npSel("ns", "z")}}}}}})
	t.Cleanup(func() {
		f.remove(t, context.Background(), "restart-admin")
		f.remove(t, context.Background(), "restart-baseline")
	})
	f.check(t, ctx, "policies in place for the restarts")
	w, pods, err := f.world(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type pair struct{ from, to string }
	allowed := []pair{{"y/b", "x/a"}, {"x/b", "x/a"}}
	denied := []pair{{"x/c", "x/a"}, {"y/c", "x/a"}, {zs, zt}}
	for _, p := range append(slices.Clone(allowed), denied...) {
		want := slices.Contains(allowed, p)
		protos := []corev1.Protocol{corev1.ProtocolTCP}
		if !want {
			protos = append(protos, corev1.ProtocolUDP)
		}
		for _, proto := range protos {
			v, err := w.Allowed(netpolmodel.PodEndpoint(pods[p.from]), netpolmodel.PodEndpoint(pods[p.to]), 80, proto)
			if err != nil || v.Allowed != want {
				t.Fatalf("test design: the model says %s → %s %s is %v (%v), the test assumes allowed=%v", p.from, p.to, proto, v, err, want)
			}
		}
	}
	const window = 15 * time.Second
	for _, crash := range []bool{false, true} {
		name := map[bool]string{false: "graceful", true: "kill -9"}[crash]
		t.Run(name, func(t *testing.T) {
			before := flowsButRound(t, ctx, node)
			roundBefore := round(t, ctx, node)
			var repeats, leaks []*npRepeat
			for _, p := range allowed {
				repeats = append(repeats, startNPRepeat(t, f.pods[p.from], "tcp", f.pods[p.to], 80, 10*time.Millisecond, 900*time.Millisecond, window))
			}
			for _, p := range denied {
				for _, proto := range []string{"tcp", "udp"} {
					leaks = append(leaks, startNPRepeat(t, f.pods[p.from], proto, f.pods[p.to], 80, 20*time.Millisecond, 300*time.Millisecond, window))
				}
			}
			time.Sleep(2 * time.Second)
			stopped := time.Now()
			restartAgent(t, ctx, node, crash, roundBefore, window-3*time.Second)
			checkRestartRepeats(t, repeats, leaks)
			t.Logf("%s restart of the agent on %s: in place %s after it was stopped", name, node.Name, time.Since(stopped).Round(time.Millisecond))
			if after := flowsButRound(t, ctx, node); strings.Join(before, "\n") != strings.Join(after, "\n") {
				t.Errorf("flows differ after the restart:\n%s", npLineDiff(before, after))
			}
		})
	}
}
