//go:build e2e

package e2e

// The NetworkPolicy suite's fixture and probe matrix, in the style of Kubernetes' netpol e2e suite
// (test/e2e/network/netpol): namespaces x, y, z with pods a, b, c in each, spread over the 3 lab nodes so that
// every namespace and every pod name has a pod on every node; each serves ports 80 and 81 over TCP, UDP and
// SCTP. A check probes every ordered pair (81, loopback included) on every port and protocol, plus each pod's
// connection to a host outside the cluster, and compares with the verdicts of e2e/netpolmodel computed from
// the objects in the API server — never from what ofsdn renders.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
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
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

const (
	npNamespacePrefix = "e2e-np-"
	// npProbeTimeout bounds one probe: an allowed one answers in milliseconds, a denied one waits it out.
	npProbeTimeout = time.Second
	// npConverge bounds how long a check polls for the expected matrix after a change.
	npConverge = 10 * time.Second
	// npExternalName is how the server on the lab's external host answers.
	npExternalName = "external"
)

var (
	npShortNamespaces = []string{"x", "y", "z"}
	npShortPods       = []string{"a", "b", "c"}
)

// npProbe is one column set of the matrix: a protocol and a port.
type npProbe struct {
	proto string // tcp, udp, sctp
	port  int32
}

func (p npProbe) String() string { return fmt.Sprintf("%s/%d", p.proto, p.port) }

func (p npProbe) protocol() corev1.Protocol { return corev1.Protocol(strings.ToUpper(p.proto)) }

// npFixture is the suite's world: 9 pods, the external server, and what the checks measured.
type npFixture struct {
	pods    map[string]*cluster.Pod // by short key "x/a"
	home    map[string]string       // short key → the node the fixture puts it on
	keys    []string                // x/a … z/c
	probes  []npProbe
	ext     netip.Addr
	noSCTP  string // why SCTP is not probed ("" when it is)
	converg []time.Duration
}

func npNS(short string) string { return npNamespacePrefix + short }

func npShort(namespace, name string) string {
	return strings.TrimPrefix(namespace, npNamespacePrefix) + "/" + name
}

// npShortKey turns "e2e-np-x/a" into "x/a".
func npShortKey(key string) string { return strings.TrimPrefix(key, npNamespacePrefix) }

// npPodSpec: label pod=<name>; ports 80 and 81 over TCP, UDP and SCTP, named serve-<port>-<proto>, plus
// cluster.TestPort for the lab's readiness probe. Pods c name their TCP ports crosswise (serve-80-tcp is
// their port 81 and serve-81-tcp their port 80): a named port then resolves to different numbers on
// different pods, which an implementation that resolves a name once per policy gets wrong.
func npPodSpec(nsShort, name, node string) *corev1.Pod {
	spec := cluster.PodSpec(npNS(nsShort), name, node)
	spec.Labels = map[string]string{"pod": name}
	tcp80, tcp81 := "serve-80-tcp", "serve-81-tcp"
	if name == "c" {
		tcp80, tcp81 = tcp81, tcp80
	}
	spec.Spec.Containers[0].Ports = []corev1.ContainerPort{
		{Name: tcp80, ContainerPort: 80, Protocol: corev1.ProtocolTCP},
		{Name: tcp81, ContainerPort: 81, Protocol: corev1.ProtocolTCP},
		{Name: "serve-80-udp", ContainerPort: 80, Protocol: corev1.ProtocolUDP},
		{Name: "serve-81-udp", ContainerPort: 81, Protocol: corev1.ProtocolUDP},
		{Name: "serve-80-sctp", ContainerPort: 80, Protocol: corev1.ProtocolSCTP},
		{Name: "serve-81-sctp", ContainerPort: 81, Protocol: corev1.ProtocolSCTP},
		{ContainerPort: cluster.TestPort, Protocol: corev1.ProtocolTCP},
	}
	return spec
}

func npNamespaceLabels(short string) map[string]string { return map[string]string{"ns": short} }

// newNPFixture creates the namespaces, the pods and the external server (all removed when t ends).
func newNPFixture(t *testing.T, ctx context.Context) *npFixture {
	t.Helper()
	f := &npFixture{pods: map[string]*cluster.Pod{}, home: map[string]string{}, ext: lc.Lab.External.IP}
	for _, ns := range npShortNamespaces {
		if err := lc.EnsureNamespace(ctx, npNS(ns)); err != nil {
			t.Fatal(err)
		}
		f.setNamespaceLabels(t, ctx, ns, npNamespaceLabels(ns))
	}
	for i, ns := range npShortNamespaces {
		for j, name := range npShortPods {
			key := ns + "/" + name
			f.keys = append(f.keys, key)
			f.home[key] = lc.Nodes[(i+j)%len(lc.Nodes)].Name // a Latin square: every row and column on every node
		}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, key := range f.keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns, name, _ := strings.Cut(key, "/")
			p, err := lc.RunPod(ctx, npPodSpec(ns, name, f.home[key]))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			f.pods[key] = p
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, ns := range append(slices.Clone(npShortNamespaces), "empty") {
			_ = lc.Client.NetworkingV1().NetworkPolicies(npNS(ns)).DeleteCollection(cctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		}
		for _, key := range f.keys {
			ns, name, _ := strings.Cut(key, "/")
			_ = lc.Client.CoreV1().Pods(npNS(ns)).Delete(cctx, name, metav1.DeleteOptions{})
		}
		for _, key := range f.keys {
			ns, name, _ := strings.Cut(key, "/")
			_ = lc.DeletePod(cctx, npNS(ns), name)
		}
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	srv := exec.Command("ip", "netns", "exec", lc.Lab.External.NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "serve",
		"--name", npExternalName, "--tcp", "80,81", "--udp", "80,81", "--sctp", "80,81")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	f.probes = []npProbe{{"tcp", 80}, {"tcp", 81}, {"udp", 80}, {"udp", 81}, {"sctp", 80}, {"sctp", 81}}
	// The lab's nodes run OVS's userspace datapath, whose conntrack keys SCTP (like any protocol but
	// TCP, UDP and ICMP) on addresses alone: an allowed SCTP connection to port 80 makes a denied one
	// to port 81 between the same pods "established", and a denied one's entry answers for the next.
	// Measured: 152 SCTP cells differed from the model in one run, every TCP and UDP cell agreed. The
	// kernel datapath's conntrack keys SCTP by ports; SCTP policy flows are checked against a real
	// ovs-vswitchd by TestSCTPPolicyOnOVS (flows/pipeline).
	f.dropSCTP("the lab's userspace datapath (netdev) tracks SCTP without ports: its verdicts cannot be exact (README: SCTP)")
	return f
}

// dropSCTP stops probing SCTP, for the reason given.
func (f *npFixture) dropSCTP(why string) {
	f.noSCTP = why
	f.probes = slices.DeleteFunc(f.probes, func(p npProbe) bool { return p.proto == "sctp" })
}

func (f *npFixture) setNamespaceLabels(t *testing.T, ctx context.Context, short string, labels map[string]string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ns, err := lc.Client.CoreV1().Namespaces().Get(ctx, npNS(short), metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := maps.Clone(labels)
		want[corev1.LabelMetadataName] = ns.Name
		if maps.Equal(ns.Labels, want) {
			return nil
		}
		ns.Labels = want
		_, err = lc.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("label namespace %s: %v", short, err)
	}
}

func (f *npFixture) setPodLabels(t *testing.T, ctx context.Context, key string, labels map[string]string) {
	t.Helper()
	ns, name, _ := strings.Cut(key, "/")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := lc.Client.CoreV1().Pods(npNS(ns)).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if maps.Equal(p.Labels, labels) {
			return nil
		}
		p.Labels = maps.Clone(labels)
		_, err = lc.Client.CoreV1().Pods(npNS(ns)).Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("label pod %s: %v", key, err)
	}
}

// movePod deletes a pod and runs it again, with the same labels, on node.
func (f *npFixture) movePod(t *testing.T, ctx context.Context, key, node string) {
	t.Helper()
	ns, name, _ := strings.Cut(key, "/")
	cur, err := lc.Client.CoreV1().Pods(npNS(ns)).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.DeletePod(ctx, npNS(ns), name); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
	spec := npPodSpec(ns, name, node)
	spec.Labels = maps.Clone(cur.Labels)
	p, err := lc.RunPod(ctx, spec)
	if err != nil {
		t.Fatalf("run %s on %s: %v", key, node, err)
	}
	f.pods[key] = p
}

func (f *npFixture) createPolicy(t *testing.T, ctx context.Context, nsShort string, np *networkingv1.NetworkPolicy) {
	t.Helper()
	np = np.DeepCopy()
	np.Namespace = npNS(nsShort)
	if _, err := lc.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create policy %s/%s: %v", nsShort, np.Name, err)
	}
}

func (f *npFixture) updatePolicy(t *testing.T, ctx context.Context, nsShort string, np *networkingv1.NetworkPolicy) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := lc.Client.NetworkingV1().NetworkPolicies(npNS(nsShort)).Get(ctx, np.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec = *np.Spec.DeepCopy()
		_, err = lc.Client.NetworkingV1().NetworkPolicies(cur.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update policy %s/%s: %v", nsShort, np.Name, err)
	}
}

func (f *npFixture) deletePolicy(t *testing.T, ctx context.Context, nsShort, name string) {
	t.Helper()
	if err := lc.Client.NetworkingV1().NetworkPolicies(npNS(nsShort)).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete policy %s/%s: %v", nsShort, name, err)
	}
}

// reset brings the world back to the fixture's: no policies, base labels, every pod on its home node.
func (f *npFixture) reset(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, ns := range append(slices.Clone(npShortNamespaces), "empty") {
		err := lc.Client.NetworkingV1().NetworkPolicies(npNS(ns)).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete policies in %s: %v", ns, err)
		}
	}
	for _, ns := range npShortNamespaces {
		f.setNamespaceLabels(t, ctx, ns, npNamespaceLabels(ns))
	}
	for _, key := range f.keys {
		_, name, _ := strings.Cut(key, "/")
		f.setPodLabels(t, ctx, key, map[string]string{"pod": name})
		if f.pods[key].Node != f.home[key] {
			f.movePod(t, ctx, key, f.home[key])
		}
	}
}

// snapshot reads the model's inputs from the API server: every namespace, the fixture's pods, every policy.
func (f *npFixture) snapshot(ctx context.Context) (*netpolmodel.Cluster, map[string]*netpolmodel.Pod, error) {
	m := &netpolmodel.Cluster{}
	nss, err := lc.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, ns := range nss.Items {
		m.Namespaces = append(m.Namespaces, netpolmodel.Namespace{Name: ns.Name, Labels: ns.Labels})
	}
	pods := map[string]*netpolmodel.Pod{}
	for _, ns := range npShortNamespaces {
		list, err := lc.Client.CoreV1().Pods(npNS(ns)).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, err
		}
		for _, p := range list.Items {
			key := npShort(p.Namespace, p.Name)
			lp, ok := f.pods[key]
			if !ok || p.DeletionTimestamp != nil {
				continue // not the fixture's (another subtest's), or on its way out
			}
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || ip != lp.IP || p.Spec.NodeName != lp.Node {
				return nil, nil, fmt.Errorf("pod %s: the API says %s on %s, the fixture ran it as %s on %s", key, p.Status.PodIP, p.Spec.NodeName, lp.IP, lp.Node)
			}
			mp := &netpolmodel.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Node: p.Spec.NodeName, IP: ip,
				HostNetwork: p.Spec.HostNetwork}
			for _, c := range p.Spec.Containers {
				mp.Ports = append(mp.Ports, c.Ports...)
			}
			m.Pods = append(m.Pods, mp)
			pods[key] = mp
		}
	}
	for _, key := range f.keys {
		if pods[key] == nil {
			return nil, nil, fmt.Errorf("pod %s is missing from the API", key)
		}
	}
	nps, err := lc.Client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	m.Policies = nps.Items
	return m, pods, nil
}

// npMatrix holds one verdict per probe, source and destination; destinations are the 9 pods and then
// the external host.
type npMatrix struct {
	ok     map[npProbe][][]bool
	detail map[npProbe][][]string // the model's reason, or the probe's reply or error
}

func (f *npFixture) dsts() []string { return append(slices.Clone(f.keys), "ext") }

func newNPMatrix(probes []npProbe, rows, cols int) *npMatrix {
	m := &npMatrix{ok: map[npProbe][][]bool{}, detail: map[npProbe][][]string{}}
	for _, p := range probes {
		m.ok[p] = make([][]bool, rows)
		m.detail[p] = make([][]string, rows)
		for i := range rows {
			m.ok[p][i] = make([]bool, cols)
			m.detail[p][i] = make([]string, cols)
		}
	}
	return m
}

// expected is the model's matrix for the world in the API server now.
func (f *npFixture) expected(ctx context.Context) (*npMatrix, error) {
	world, pods, err := f.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return f.matrixOf(pods, func(src, dst netpolmodel.Endpoint, port int32, proto corev1.Protocol) (bool, string, error) {
		v, err := world.Allowed(src, dst, port, proto)
		return v.Allowed, v.String(), err
	})
}

// matrixOf is a model's matrix: allowed judges one connection (and says why).
func (f *npFixture) matrixOf(pods map[string]*netpolmodel.Pod,
	allowed func(src, dst netpolmodel.Endpoint, port int32, proto corev1.Protocol) (bool, string, error)) (*npMatrix, error) {
	dsts := f.dsts()
	m := newNPMatrix(f.probes, len(f.keys), len(dsts))
	for _, p := range f.probes {
		for i, src := range f.keys {
			for j, dst := range dsts {
				to := netpolmodel.AddressEndpoint(f.ext)
				if dst != "ext" {
					to = netpolmodel.PodEndpoint(pods[dst])
				}
				ok, why, err := allowed(netpolmodel.PodEndpoint(pods[src]), to, p.port, p.protocol())
				if err != nil {
					return nil, err
				}
				m.ok[p][i][j], m.detail[p][i][j] = ok, why
			}
		}
	}
	return m, nil
}

// observe probes the matrix: one probe-all process per source pod, every target at once.
func (f *npFixture) observe(ctx context.Context) *npMatrix {
	dsts := f.dsts()
	m := newNPMatrix(f.probes, len(f.keys), len(dsts))
	var wg sync.WaitGroup
	for i, src := range f.keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			type cell struct {
				p     npProbe
				j     int
				reply string // the name that must answer
			}
			var cells []cell
			args := []string{"netns", "exec", f.pods[src].NetNS, filepath.Join(lc.BinDir, "ofsdn-testpod"), "probe-all", "--timeout", npProbeTimeout.String()}
			for _, p := range f.probes {
				for j, dst := range dsts {
					ip, name := f.ext, npExternalName
					if dst != "ext" {
						ip, name = f.pods[dst].IP, f.pods[dst].Key()
					}
					cells = append(cells, cell{p, j, name})
					args = append(args, p.proto+"/"+netip.AddrPortFrom(ip, uint16(p.port)).String())
				}
			}
			out, err := exec.CommandContext(ctx, "ip", args...).Output()
			var results []testpod.Result
			if err == nil {
				err = json.Unmarshal(out, &results)
			}
			if err == nil && len(results) != len(cells) {
				err = fmt.Errorf("%d results for %d targets", len(results), len(cells))
			}
			for k, c := range cells {
				switch {
				case err != nil:
					m.detail[c.p][i][c.j] = "probe-all failed: " + err.Error()
				case results[k].Error != "":
					m.detail[c.p][i][c.j] = results[k].Error
				case !strings.HasPrefix(results[k].Reply, c.reply+" "):
					m.detail[c.p][i][c.j] = "answered by the wrong server: " + results[k].Reply
				default:
					m.ok[c.p][i][c.j] = true
					m.detail[c.p][i][c.j] = fmt.Sprintf("%s (%d ms)", results[k].Reply, results[k].Millis)
				}
			}
		}()
	}
	wg.Wait()
	return m
}

// mismatches lists where got differs from want, one line per cell.
func (f *npFixture) mismatches(want, got *npMatrix) []string {
	var out []string
	dsts := f.dsts()
	for _, p := range f.probes {
		for i, src := range f.keys {
			for j, dst := range dsts {
				if want.ok[p][i][j] != got.ok[p][i][j] {
					out = append(out, fmt.Sprintf("%s → %s %s: expected %s; got %s", src, dst, p, want.detail[p][i][j],
						map[bool]string{true: "allowed", false: "denied"}[got.ok[p][i][j]]+": "+got.detail[p][i][j]))
				}
			}
		}
	}
	return out
}

// format prints, for each probe with a mismatch, the expected and observed truth tables side by side and
// where they differ (as upstream's netpol suite does): rows are sources, columns destinations; X reaches,
// . does not.
func (f *npFixture) format(want, got *npMatrix) string {
	var b strings.Builder
	dsts := f.dsts()
	mark := func(ok bool) string {
		if ok {
			return "X"
		}
		return "."
	}
	header := func() {
		for _, d := range dsts {
			fmt.Fprintf(&b, "%-4s", d)
		}
	}
	for _, p := range f.probes {
		differ := false
		for i := range f.keys {
			for j := range dsts {
				differ = differ || want.ok[p][i][j] != got.ok[p][i][j]
			}
		}
		if !differ {
			continue
		}
		fmt.Fprintf(&b, "%-6s%-42s%-42s%s\n", p, "expected", "observed", "comparison (X differs)")
		b.WriteString("      ")
		header()
		b.WriteString("  ")
		header()
		b.WriteString("  ")
		header()
		b.WriteString("\n")
		for i, src := range f.keys {
			fmt.Fprintf(&b, "%-6s", src)
			for _, cell := range []func(j int) bool{
				func(j int) bool { return want.ok[p][i][j] },
				func(j int) bool { return got.ok[p][i][j] },
				func(j int) bool { return want.ok[p][i][j] != got.ok[p][i][j] },
			} {
				for j := range dsts {
					fmt.Fprintf(&b, "%-4s", mark(cell(j)))
				}
				b.WriteString("  ")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// firstLines keeps the first n lines of a list, saying how many it left out.
func firstLines(lines []string, n int) string {
	if len(lines) <= n {
		return strings.Join(lines, "\n")
	}
	return strings.Join(lines[:n], "\n") + fmt.Sprintf("\n… and %d more", len(lines)-n)
}

// check compares the lab with the model until they agree (then once more, so a flapping datapath fails)
// or npConverge passes; it records and logs how long convergence took.
func (f *npFixture) check(t *testing.T, ctx context.Context, step string) {
	t.Helper()
	f.checkWith(t, ctx, step, f.expected)
}

// checkWith is check against another model's matrix (ClusterNetworkPolicy's, cnp_test.go).
func (f *npFixture) checkWith(t *testing.T, ctx context.Context, step string, expected func(context.Context) (*npMatrix, error)) {
	t.Helper()
	want, err := expected(ctx)
	if err != nil {
		t.Fatalf("%s: the model: %v", step, err)
	}
	start := time.Now()
	for round := 1; ; round++ {
		began := time.Since(start)
		got := f.observe(ctx)
		diff := f.mismatches(want, got)
		if len(diff) == 0 {
			again := f.observe(ctx)
			if d := f.mismatches(want, again); len(d) > 0 {
				t.Errorf("%s: matched, then the next round differed in %d cells (flapping):\n%s%s", step, len(d), f.format(want, again), firstLines(d, 40))
				return
			}
			f.converg = append(f.converg, began)
			t.Logf("%s: the lab matches the model (%d cells) on round %d, which began %s after the change", step,
				len(f.probes)*len(f.keys)*len(f.dsts()), round, began.Round(time.Millisecond))
			return
		}
		if time.Since(start) > npConverge || ctx.Err() != nil {
			f.diagnose(t, ctx, want, got)
			t.Errorf("%s: %d cells still differ from the model after %s (%d rounds):\n%s%s", step, len(diff),
				time.Since(start).Round(time.Millisecond), round, f.format(want, got), firstLines(diff, 40))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// convergenceSummary describes the convergence times measured so far.
func (f *npFixture) convergenceSummary() string {
	if len(f.converg) == 0 {
		return "no checks"
	}
	d := slices.Clone(f.converg)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))].Round(time.Millisecond) }
	return fmt.Sprintf("%d checks: median %s, p90 %s, max %s (the start of the first matching probe round; a round takes up to %s)",
		len(d), at(0.5), at(0.9), d[len(d)-1].Round(time.Millisecond), npProbeTimeout)
}

// currentMode reads the cluster's pluginMode.
func currentMode(ctx context.Context) (networkv1.PluginMode, error) {
	cn, err := lc.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return cn.Spec.PluginMode, nil
}

// tenantCheck is the harness's self-test in multitenant mode: x, y and z are three tenants, so a pod
// reaches exactly its own namespace's pods and the outside. It proves the probe matrix sees denials as
// well as answers before any NetworkPolicy verdict is trusted, and finds out whether SCTP crosses br0.
func (f *npFixture) tenantCheck(t *testing.T, ctx context.Context) {
	t.Helper()
	dsts := f.dsts()
	want := newNPMatrix(f.probes, len(f.keys), len(dsts))
	for _, p := range f.probes {
		for i, src := range f.keys {
			for j, dst := range dsts {
				same := dst == "ext" || strings.Split(src, "/")[0] == strings.Split(dst, "/")[0]
				want.ok[p][i][j], want.detail[p][i][j] = same, map[bool]string{true: "same tenant or outside", false: "another tenant"}[same]
			}
		}
	}
	start := time.Now()
	var got *npMatrix
	var diff []string
	for time.Since(start) < npConverge {
		got = f.observe(ctx)
		if diff = f.mismatches(want, got); len(diff) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(diff) == 0 {
		t.Logf("multitenant mode: the probe matrix sees the 3 tenants exactly (%d cells, SCTP included)", len(f.probes)*len(f.keys)*len(dsts))
		return
	}
	// SCTP may not cross the lab at all; then it is left out, loudly. Anything else is a harness failure.
	var other []string
	sctpAnswered, sctpWanted := 0, 0
	for _, d := range diff {
		if !strings.Contains(d, " sctp/") {
			other = append(other, d)
		}
	}
	for _, p := range f.probes {
		if p.proto != "sctp" {
			continue
		}
		for i := range f.keys {
			for j := range dsts {
				if want.ok[p][i][j] && f.keys[i] != dsts[j] {
					sctpWanted++
					if got.ok[p][i][j] {
						sctpAnswered++
					}
				}
			}
		}
	}
	if len(other) > 0 {
		t.Fatalf("the probe matrix does not see multitenant isolation as it is (%d cells):\n%s%s", len(diff), f.format(want, got), firstLines(diff, 40))
	}
	why := fmt.Sprintf("SCTP does not cross this lab even between pods of one tenant (%d of %d SCTP pairs answered; one: %s)",
		sctpAnswered, sctpWanted, diff[0])
	f.dropSCTP(why)
	t.Logf("SCTP left out of every matrix: %s", why)
}

// runNPTestpod runs ofsdn-testpod in a namespace and decodes its JSON output into out.
func runNPTestpod(ctx context.Context, netns string, out any, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, filepath.Join(lc.BinDir, "ofsdn-testpod")}, args...)...)
	data, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("ofsdn-testpod %s in %s: %w", strings.Join(args, " "), netns, err)
	}
	return json.Unmarshal(data, out)
}

// diagnose logs, for a failed check, the policy tables of the nodes the first mismatches involve (the
// source's for egress, the destination's for ingress) and their conntrack entries between those pods.
func (f *npFixture) diagnose(t *testing.T, ctx context.Context, want, got *npMatrix) {
	t.Helper()
	dsts := f.dsts()
	nodes := map[string]bool{}
	pairs := map[[2]string]bool{}
	var clientPorts []string // of connections that passed though they should not have: their conntrack entries say why
	for _, p := range f.probes {
		for i, src := range f.keys {
			for j, dst := range dsts {
				if want.ok[p][i][j] == got.ok[p][i][j] || len(pairs) >= 6 {
					continue
				}
				if fields := strings.Fields(got.detail[p][i][j]); got.ok[p][i][j] && len(fields) > 1 && len(clientPorts) < 4 {
					if ap, err := netip.ParseAddrPort(fields[1]); err == nil {
						clientPorts = append(clientPorts, fmt.Sprintf("%s %s→%s: sport=%d", p.proto, src, dst, ap.Port()))
					}
				}
				dstIP := f.ext.String()
				nodes[f.pods[src].Node] = true
				if dst != "ext" {
					nodes[f.pods[dst].Node] = true
					dstIP = f.pods[dst].IP.String()
				}
				pairs[[2]string{f.pods[src].IP.String(), dstIP}] = true
			}
		}
	}
	for name := range nodes {
		n := lc.Node(name)
		for _, table := range []string{"50", "80"} {
			out, err := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "dump", "--rundir", n.Dir, "--bridge", "br0",
				"--table", table).CombinedOutput()
			t.Logf("flowctl dump --table %s on %s (%v):\n%s", table, name, err, out)
		}
		out, err := n.VswitchdAppctl(ctx, "dpctl/dump-conntrack", "netdev@ovs-netdev")
		for _, cp := range clientPorts {
			_, port, _ := strings.Cut(cp, "sport=")
			var hits []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "port="+port+",") || strings.Contains(l, "port="+port+")") {
					hits = append(hits, l)
				}
			}
			t.Logf("conntrack on %s for the wrongly allowed %s:\n%s", name, cp, firstLines(hits, 10))
		}
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			for pr := range pairs {
				if strings.Contains(l, "="+pr[0]+",") && strings.Contains(l, "="+pr[1]+",") {
					lines = append(lines, l)
					break
				}
			}
		}
		t.Logf("conntrack on %s between the first mismatched pairs (%v):\n%s", name, err, firstLines(lines, 30))
		// The datapath's cached flows between them: what packets really hit, whatever the tables say now.
		out, err = n.VswitchdAppctl(ctx, "dpctl/dump-flows", "netdev@ovs-netdev")
		lines = nil
		for _, l := range strings.Split(out, "\n") {
			for pr := range pairs {
				if strings.Contains(l, "dst="+pr[1]+",") || strings.Contains(l, "dst="+pr[1]+"/") {
					lines = append(lines, l)
					break
				}
			}
		}
		t.Logf("datapath flows on %s towards the first mismatched destinations (%v):\n%s", name, err, firstLines(lines, 30))
	}
}
