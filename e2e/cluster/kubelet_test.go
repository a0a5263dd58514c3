package cluster

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/kubelab"
	"github.com/ofsdn/ofsdn/e2e/lab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeletsRunOfsdnFromDeploy: three lab nodes with real containerd and kubelet; deploy/'s agent
// DaemonSet and controller Deployment run from the image, started by the kubelets; pods of two
// tenants and default on every node, each started by kubelet through the CNI plugin the agent
// installed, reach each other as multitenant mode promises.
func TestKubeletsRunOfsdnFromDeploy(t *testing.T) {
	lab.Require(t)
	if _, err := kubelab.BinDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := Start(ctx, Options{Kubelets: true, Mode: networkv1.PluginModeMultitenant, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	defer func() {
		if t.Failed() {
			t.Log(c.Logs(40))
		}
	}()
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
