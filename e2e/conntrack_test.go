//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// udpSession runs ofsdn-testpod udp-session (one socket, one conntrack entry, a question every 200 ms)
// from netns to addr and returns a function that waits for a given line of its output.
func udpSession(t *testing.T, ctx context.Context, netns, addr string, d time.Duration) func(want string, within time.Duration) bool {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	cmd := exec.CommandContext(sctx, "ip", "netns", "exec", netns, filepath.Join(lc.BinDir, "ofsdn-testpod"), "udp-session",
		addr, "--interval", "200ms", "--duration", d.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	lines := make(chan string, 4096)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	return func(want string, within time.Duration) bool {
		timer := time.After(within)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return false
				}
				if l == want {
					return true
				}
			case <-timer:
				return false
			}
		}
	}
}

// TestUDPEndpointRemovedWhileAgentDown: a UDP client keeps asking a service through one conntrack
// entry in its node's br0; while that node's agent is down the endpoint is replaced. The restarted
// agent has no previous state to compare with, so it compares what conntrack holds with the services
// it finds, and flushes the entry: the client moves to the new endpoint instead of asking the deleted
// one forever.
func TestUDPEndpointRemovedWhileAgentDown(t *testing.T) {
	needsStandIn(t, "keeps the agent's process down while endpoints change; there kubelet restarts it on its own")
	ctx := ctxT(t, 5*time.Minute)
	const ns = "e2e-ct"
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	clientNode := lc.Nodes[0]
	cl := svcPod(t, ctx, ns, "client", clientNode.Name, "client", nil)
	svcPod(t, ctx, ns, "u1", lc.Nodes[1].Name, "ct", nil)
	svc := createService(t, ctx, ns, "ct", corev1.ServiceSpec{Selector: map[string]string{"svc": "ct"},
		Ports: []corev1.ServicePort{{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(cluster.TestPort)}}})
	waitEndpoints(t, ctx, cl.NetNS, "udp", clusterIP(svc, 53), 1, time.Minute)
	waitLine := udpSession(t, ctx, cl.NetNS, clusterIP(svc, 53), 3*time.Minute)
	if !waitLine(fmt.Sprintf("ok %s/u1:%d", ns, cluster.TestPort), 10*time.Second) {
		t.Fatal("the UDP session never reached u1")
	}

	lc.StopAgent(clientNode, false)
	t.Cleanup(func() {
		if clientNode.AgentPID() == 0 {
			_ = lc.StartAgent(clientNode)
			_ = lc.WaitAgentsReady(context.Background())
		}
	})
	svcPod(t, ctx, ns, "u2", lc.Nodes[2].Name, "ct", nil)
	if err := lc.DeletePod(ctx, ns, "u1"); err != nil {
		t.Fatal(err)
	}
	// Let the EndpointSlice follow before the agent comes back.
	if err := waitSlice(ctx, ns, "ct", "u2"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := lc.StartAgent(clientNode); err != nil {
		t.Fatal(err)
	}
	if err := lc.WaitAgentsReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !waitLine(fmt.Sprintf("ok %s/u2:%d", ns, cluster.TestPort), 60*time.Second) {
		t.Errorf("the UDP session never moved to u2: its conntrack entry still leads to the deleted u1\n%s", lc.AgentLogTail(clientNode, 40))
		// What the client's node really does with the session: its conntrack entries, and the datapath's
		// cached flows for them (whatever the tables say now).
		for _, cmd := range []string{"dpctl/dump-conntrack", "dpctl/dump-flows"} {
			out, err := clientNode.VswitchdAppctl(ctx, cmd, "netdev@ovs-netdev")
			t.Logf("%s on %s (%v):\n%s", cmd, clientNode.Name, err, grepLines(out, svc.Spec.ClusterIP, cl.IP.String()))
		}
		t.FailNow()
	}
	t.Logf("the UDP session reached the new endpoint %s after the agent was started again", time.Since(start).Round(time.Millisecond))
}

// waitSlice waits until the service's EndpointSlices list exactly one endpoint, the pod named pod.
func waitSlice(ctx context.Context, ns, service, pod string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		list, err := lc.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err == nil {
			var names []string
			for _, s := range list.Items {
				for _, e := range s.Endpoints {
					if e.TargetRef != nil {
						names = append(names, e.TargetRef.Name)
					}
				}
			}
			if len(names) == 1 && names[0] == pod {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("EndpointSlices of %s/%s never listed only %s: %w", ns, service, pod, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// grepLines keeps the lines of out that contain any of subs.
func grepLines(out string, subs ...string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				keep = append(keep, l)
				break
			}
		}
	}
	return strings.Join(keep, "\n")
}
