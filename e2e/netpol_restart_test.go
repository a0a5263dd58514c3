//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAgentRestartKeepsPolicies: in networkpolicy mode, the agent of the node that enforces a pod's
// ingress policy restarts (gracefully, then kill -9) while an allowed pod pings it and a denied one
// tries to: not one allowed ping is lost, not one denied ping gets through, and the node's flows are
// the same afterwards. (A restarted agent that rendered before its informers' handlers had seen every
// policy would drop the policy's flows with the previous round, and let the denied pod in.)
func TestAgentRestartKeepsPolicies(t *testing.T) {
	needsStandIn(t, "stops and starts the agent's process at chosen moments; there kubelet restarts it on its own")
	ctx := ctxT(t, 5*time.Minute)
	const ns = "e2e-np-restart"
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	run := func(name string, node *cluster.Node) *cluster.Pod {
		p, err := lc.RunPod(ctx, cluster.PodSpec(ns, name, node.Name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lc.DeletePod(context.Background(), ns, name) })
		return p
	}
	allowed, denied, target := run("allowed", lc.Nodes[0]), run("denied", lc.Nodes[0]), run("target", lc.Nodes[1])
	if err := lc.SetMode(ctx, networkv1.PluginModeNetworkPolicy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lc.SetMode(context.Background(), networkv1.PluginModeMultitenant); err != nil {
			t.Error(err)
		}
	})
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "target-from-allowed"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "allowed"}}}}}}}}
	if _, err := lc.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = lc.Client.NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), np.Name, metav1.DeleteOptions{})
	})
	// Enforced: the denied pod no longer reaches the target, the allowed one does.
	deadline := time.Now().Add(30 * time.Second)
	for denied.Ping(ctx, target.IP) || !allowed.Ping(ctx, target.IP) {
		if time.Now().After(deadline) {
			t.Fatal("the policy never took effect")
		}
		time.Sleep(100 * time.Millisecond)
	}
	n := lc.Node(target.Node)
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "graceful", true: "crash"}[crash], func(t *testing.T) {
			before := flowsButRound(t, ctx, n)
			roundBefore := round(t, ctx, n)
			ok, leak := startPinger(t, allowed, target, 80), startPinger(t, denied, target, 80)
			time.Sleep(2 * time.Second)
			restartAgent(t, ctx, n, crash, roundBefore, time.Minute)
			if sent, got, out := ok.wait(); sent == 0 || got != sent {
				t.Errorf("allowed pings across the restart: %d sent, %d received\n%s", sent, got, out)
			}
			if sent, got, out := leak.wait(); sent == 0 || got != 0 {
				t.Errorf("denied pings across the restart: %d sent, %d got through\n%s", sent, got, out)
			}
			if after := flowsButRound(t, ctx, n); strings.Join(before, "\n") != strings.Join(after, "\n") {
				t.Errorf("flows differ after the restart:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
			}
		})
	}
}
