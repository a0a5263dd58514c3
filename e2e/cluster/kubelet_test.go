package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeletsRunOfsdnFromDeploy: three lab nodes with real containerd and kubelet; deploy/'s agent
// DaemonSet and controller Deployment run from the image, started by the kubelets; pods of two
// tenants and default on every node, each started by kubelet through the CNI plugin the agent
// installed, reach each other as multitenant mode promises.
func TestKubeletsRunOfsdnFromDeploy(t *testing.T) {
	c, ctx := startKubelets(t, Options{Kubelets: true, Mode: networkv1.PluginModeMultitenant})
	checkAgentsAndMatrix(t, ctx, c)
}

// TestKubeletsWithOVSDaemonSet: nodes without Open vSwitch (the lab starts none); deploy/ applied as it
// is, but for the lab's image and the userspace datapath, brings Open vSwitch in its DaemonSet from the
// image make image-ovs builds, which moves each node's address onto its uplink bridge; the agents find
// it and the multitenant matrix holds.
func TestKubeletsWithOVSDaemonSet(t *testing.T) {
	c, ctx := startKubelets(t, Options{Kubelets: true, ContainerOVS: true, Mode: networkv1.PluginModeMultitenant})
	for _, n := range c.Nodes {
		if pid := n.VswitchdPID(); pid != 0 {
			t.Errorf("node %s runs an ovs-vswitchd of the lab's (PID %d)", n.Name, pid)
		}
		pods, err := c.Client.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name,
			LabelSelector: "app.kubernetes.io/name=ofsdn-ovs"})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("node %s: Open vSwitch pods %v, %v", n.Name, pods, err)
		}
		var comms []string
		for _, pid := range n.Kube.PodPIDs(string(pods.Items[0].UID)) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			comms = append(comms, strings.TrimSpace(string(b)))
		}
		if !slices.Contains(comms, "ovs-vswitchd") || !slices.Contains(comms, "ovsdb-server") {
			t.Errorf("node %s: the Open vSwitch pod runs %v, want ovsdb-server and ovs-vswitchd", n.Name, comms)
		}
		// The node's address moved onto the uplink bridge, as the userspace datapath's VXLAN needs.
		out, err := n.Exec(ctx, "ip", "-br", "-4", "addr", "show", "dev", lab.UnderlayBridge)
		if err != nil || !strings.Contains(out, n.Addr.String()) {
			t.Errorf("node %s: %s: %q, %v; want %s on it", n.Name, lab.UnderlayBridge, out, err, n.Addr)
		}
	}
	checkAgentsAndMatrix(t, ctx, c)
}

func startKubelets(t testing.TB, opts Options) (*Cluster, context.Context) {
	t.Helper()
	lab.Require(t)
	if _, err := kubelab.BinDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	t.Cleanup(cancel)
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
		c.Stop()
	})
	return c, ctx
}

// checkAgentsAndMatrix: an agent pod from the lab's image runs on every node, and pods of two tenants
// and default on every node reach each other as multitenant mode says.
func checkAgentsAndMatrix(t *testing.T, ctx context.Context, c *Cluster) {
	t.Helper()
	// The agents and controllers are pods kubelet runs from the image.
	pods, err := c.Client.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agents := 0
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "ofsdn-agent-") && p.Status.Phase == corev1.PodRunning {
			agents++
			if img := p.Spec.Containers[0].Image; !strings.Contains(c.Image, strings.TrimPrefix(img, "docker.io/")) {
				t.Errorf("agent %s runs %s, not the lab's image %s", p.Name, img, c.Image)
			}
		}
	}
	if agents != len(c.Nodes) {
		t.Errorf("%d agent pods running, want one per node (%d)", agents, len(c.Nodes))
	}
	namespaces := []string{"blue", "red", "default"}
	var all []*Pod
	for _, ns := range namespaces {
		if err := c.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			p, err := c.RunPod(ctx, PodSpec(ns, "web-"+n.Name, n.Name))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, p)
		}
	}
	netids, err := c.NetIDs(ctx, namespaces...)
	if err != nil {
		t.Fatal(err)
	}
	want := Expected(all, netids, networkv1.PluginModeMultitenant)
	got, diff, _ := c.WaitMatrix(ctx, all, want, 10*time.Second)
	if len(diff) > 0 {
		t.Errorf("reachability differs from multitenant mode's:\n%s\n%s", strings.Join(diff, "\n"), got.Format(all))
	}
}
