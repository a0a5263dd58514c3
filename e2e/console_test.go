//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/browser"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestConsole runs `flowctl ui` as an administrator does (the binary, with the lab's kubeconfig, on
// loopback of the root namespace: it reaches the cluster only through the API server) and reads it in
// headless Chromium: the lab's tenants with the NETIDs the API holds (a join included), its nodes
// with every agent answering, its policies with what they select, its Network, and a trace run
// through the form whose verdict is the one the pipeline intends. Every page passes the accessibility
// check and leaves a screenshot in _output/ui-screenshots/lab-*.png.
func TestConsole(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	exe := browser.Require(t)
	cn, err := lc.Net.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cn.Spec.PluginMode != networkv1.PluginModeMultitenant {
		t.Fatalf("the lab runs in %s mode: this test's expectations (tenants isolate, policies are not enforced) are multitenant's, as TestMain starts it", cn.Spec.PluginMode)
	}
	const blue, red, green = "e2e-ui-blue", "e2e-ui-red", "e2e-ui-green"
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	for _, ns := range []string{blue, red, green} {
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	labelNamespace(t, ctx, blue, map[string]string{"e2e-ui": "yes"})
	run := func(ns, name string, node string) *cluster.Pod {
		p, err := lc.RunPod(ctx, cluster.PodSpec(ns, name, node))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lc.DeletePod(context.Background(), p.Namespace, p.Name) })
		return p
	}
	podA := run(blue, "a", n1.Name)
	run(blue, "c", n2.Name)
	podB := run(red, "b", n1.Name)
	if _, err := lc.ChangeNetwork(ctx, green, "join:"+blue); err != nil {
		t.Fatal(err)
	}
	netids, err := lc.NetIDs(ctx, blue, red, green)
	if err != nil {
		t.Fatal(err)
	}
	tcp, port := corev1.ProtocolTCP, intstr.FromInt32(8080)
	policy := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: blue, Name: "web-8080"}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}}}}
	if _, err := lc.Client.NetworkingV1().NetworkPolicies(blue).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lc.Client.NetworkingV1().NetworkPolicies(blue).Delete(context.Background(), policy.Name, metav1.DeleteOptions{})
	})
	const netName = "e2e-ui-net"
	nw := &networkv1.Network{ObjectMeta: metav1.ObjectMeta{Name: netName}, Spec: networkv1.NetworkSpec{CIDR: "10.211.0.0/16", HostSubnetLength: 8,
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"e2e-ui": "yes"}}}}
	if _, err := lc.Net.NetworkV1().Networks().Create(ctx, nw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lc.Net.NetworkV1().Networks().Delete(context.Background(), netName, metav1.DeleteOptions{})
	})
	vni := waitNetwork(t, ctx, netName, lc.Nodes).Status.VNI

	base := startConsole(t, ctx)
	b, err := browser.Start(t.Context(), exe, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	root, err := kubelab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shots := filepath.Join(root, "_output", "ui-screenshots")

	// visit shows a page, checks its accessibility, saves its screenshot and returns its text.
	visit := func(t *testing.T, name, path string, steps ...chromedp.Action[chromedp.Void]) string {
		t.Helper()
		tctx, cancel := b.Tab()
		defer cancel()
		tctx, cancel2 := context.WithTimeout(tctx, 3*time.Minute)
		defer cancel2()
		all := append([]chromedp.Action[chromedp.Void]{chromedp.Navigate(base + path), chromedp.WaitVisible(chromedp.CSS("footer"))}, steps...)
		if err := chromedp.Do(tctx, all...); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r, err := chromedp.Run(tctx, browser.CheckAccessibility())
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Violations) > 0 {
			t.Errorf("%s: accessibility:\n%s", path, r)
		}
		if err := chromedp.Do(tctx, browser.Screenshot(filepath.Join(shots, "lab-"+name+".png"))); err != nil {
			t.Error(err)
		}
		txt, err := chromedp.Run(tctx, chromedp.Text(chromedp.ID("main")))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(txt), " ")
	}
	says := func(t *testing.T, page string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(page, w) {
				t.Errorf("the page does not say %q:\n%s", w, page)
			}
		}
	}

	t.Run("overview", func(t *testing.T) {
		page := visit(t, "overview", "/")
		says(t, page, fmt.Sprintf("%d / %d agents answering", len(lc.Nodes), len(lc.Nodes)), "Plugin mode multitenant", "Valid: True")
	})
	t.Run("tenants", func(t *testing.T) {
		page := visit(t, "tenants", "/tenants")
		says(t, page, fmt.Sprintf("%d shared by 2 %s %s", netids[blue], blue, green), fmt.Sprintf("%d isolated %s", netids[red], red),
			"0 global", "NetIDChanged")
	})
	t.Run("nodes", func(t *testing.T) {
		page := visit(t, "nodes", "/nodes")
		for _, n := range lc.Nodes {
			says(t, page, fmt.Sprintf("%s Ready %s", n.Name, n.IP))
		}
		if got := strings.Count(page, " answers "); got != len(lc.Nodes) {
			t.Errorf("%d agents answer on the page, want %d:\n%s", got, len(lc.Nodes), page)
		}
		says(t, page, fmt.Sprintf("reads pipeline version %d", pipeline.PipelineVersion))
		visit(t, "node", "/nodes/"+n1.Name)
	})
	t.Run("policies", func(t *testing.T) {
		page := visit(t, "policies", "/policies")
		says(t, page, blue+"/web-8080", fmt.Sprintf("Selects pods app=a in %s: %s/a", blue, blue), "everyone", "tcp/8080",
			"NetworkPolicies are not enforced")
	})
	t.Run("networks", func(t *testing.T) {
		page := visit(t, "networks", "/networks")
		says(t, page, netName, "10.211.0.0/16", fmt.Sprint(vni), "namespaces e2e-ui=yes: "+blue)
		page = visit(t, "network", "/networks/"+netName)
		for _, n := range lc.Nodes {
			says(t, page, n.Name+" "+n.IP.String())
		}
	})
	t.Run("trace", func(t *testing.T) {
		var verdict string
		page := visit(t, "trace", "/trace",
			chromedp.SendKeys(chromedp.ID("src"), red+"/b"), chromedp.SendKeys(chromedp.ID("dst"), blue+"/a"),
			chromedp.SendKeys(chromedp.ID("port"), "8080"), chromedp.Click(chromedp.CSS("#trace-form button[type=submit]")),
			chromedp.WaitVisible(chromedp.ID("verdict")),
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				var err error
				verdict, err = chromedp.Text(chromedp.ID("verdict"))(ctx, tg)
				return err
			}))
		// blue and green share a VNID since the join: the verdict names both.
		want := fmt.Sprintf("dropped at table 80 ingress-isolation: tenant VNID %d (%s) may not reach VNID %d (%s, %s)", netids[red], red, netids[blue], blue, green)
		if !strings.Contains(verdict, want) {
			t.Errorf("verdict %q, want %q\n%s", verdict, want, page)
		}
		says(t, page, "Node "+n1.Name, "pod-ingress", "pod/"+red+"/b")
		page = visit(t, "trace-delivered", "/trace?src="+blue+"%2Fa&dst="+blue+"%2Fc&port=8080")
		says(t, page, fmt.Sprintf("delivered to %s/c via node %s", blue, n2.Name), "Node "+n2.Name)
	})
	t.Run("drops", func(t *testing.T) {
		// A drop the test causes: red/b to blue/a, tenant isolation on n1.
		if _, err := podB.Probe(ctx, "tcp", netip.AddrPortFrom(podA.IP, cluster.TestPort), 0); err == nil {
			t.Fatalf("%s reached %s across tenants", podB.Key(), podA.Key())
		}
		page := visit(t, "drops", "/drops?namespace="+red)
		says(t, page, podB.Key(), podA.Key(), fmt.Sprintf("tenant isolation %d → %d", netids[red], netids[blue]), "80 ingress-isolation")
		if strings.Contains(page, "not available") {
			t.Errorf("the drops page says drops are not available:\n%s", page)
		}
	})
}

// startConsole runs flowctl ui on a free loopback port and returns its address.
func startConsole(t *testing.T, ctx context.Context) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "ui", "--address", "127.0.0.1:0", "--kubeconfig", lc.API.KubeconfigPath())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case line <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-line:
		m := regexp.MustCompile(`at (http://127\.0\.0\.1:\d+)/`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("flowctl ui says %q, not where it serves", l)
		}
		return m[1]
	case <-time.After(time.Minute):
		t.Fatal("flowctl ui did not start within a minute")
	}
	return ""
}
