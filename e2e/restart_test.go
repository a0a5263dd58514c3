//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flows/pipeline"
)

var cookieRE = regexp.MustCompile(`cookie=0x([0-9a-f]+)`)

// flowsButRound dumps a node's flows with the round (the cookie's top 16 bits) zeroed and no counters.
func flowsButRound(t *testing.T, ctx context.Context, n *cluster.Node) []string {
	t.Helper()
	out, err := n.Ofctl(ctx, "dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatalf("dump-flows on %s: %v", n.Name, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		l = cookieRE.ReplaceAllStringFunc(l, func(m string) string {
			v, err := strconv.ParseUint(strings.TrimPrefix(m, "cookie=0x"), 16, 64)
			if err != nil {
				return m
			}
			return "cookie=" + strconv.FormatUint(v&(1<<48-1), 16)
		})
		lines = append(lines, strings.TrimSpace(l))
	}
	sort.Strings(lines)
	return lines
}

func round(t *testing.T, ctx context.Context, n *cluster.Node) string {
	out, err := n.Vsctl(ctx, "br-get-external-id", "br0", "ofsdn-round")
	if err != nil {
		t.Fatalf("round of %s: %v", n.Name, err)
	}
	return strings.TrimSpace(out)
}

// pingInterval: every restart test pings at 100 packets/s each way, so a gap of 10 ms shows.
const pingInterval = "0.01"

// pinger pings from a pod 100 times a second for a fixed count and reports what it sent and got back.
// A fixed count (not a signal) ends it, so no packet is still in flight when it stops.
type pinger struct {
	name string
	cmd  *exec.Cmd
	out  strings.Builder
}

func startPinger(t *testing.T, from, to *cluster.Pod, count int) *pinger {
	p := &pinger{name: from.Name + " → " + to.Name,
		cmd: exec.Command("ip", "netns", "exec", from.NetNS, "ping", "-n", "-q", "-i", pingInterval, "-W", "1", "-c", strconv.Itoa(count), to.IP.String())}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

func (p *pinger) wait() (sent, got int, out string) {
	_ = p.cmd.Wait()
	m := pingStats.FindStringSubmatch(p.out.String())
	if m == nil {
		return 0, 0, p.out.String()
	}
	sent, _ = strconv.Atoi(m[1])
	got, _ = strconv.Atoi(m[2])
	return sent, got, p.out.String()
}

// TestAgentRestartLosesNothing restarts agents, gracefully and with SIGKILL, three times each, while pods
// ping each other at 100 packets/s both ways, across nodes and on one node: not one packet may be lost
// (issue 10: a restart used to re-ARP the tunnel peers, and a wrong MAC left in ovs-vswitchd's tunnel
// neighbour cache cut cross-node traffic for 30-60 s). Every round alternates the node, and the flows
// after each restart must equal those before it but for the round.
func TestAgentRestartLosesNothing(t *testing.T) {
	needsStandIn(t, "stops and starts the agent's process at chosen moments; there kubelet restarts it on its own")
	ctx := ctxT(t, 10*time.Minute)
	nodes := lc.Nodes[:2]
	pairs := restartPairs(t, ctx, "rs", "e2e-restart", nodes)
	for i := range 6 {
		restartRound(t, ctx, nodes[i%2], pairs, i >= 3, i%3+1, true)
	}
}

// TestAgentRestartInEncapsulationNone does the same in encapsulation none, graceful and kill -9 on
// each node: the restarted agent must take over the uplink port, its flows and its lingering state
// without cutting the bare (unencapsulated) traffic between nodes for one packet.
func TestAgentRestartInEncapsulationNone(t *testing.T) {
	needsStandIn(t, "stops and starts the agent's process at chosen moments; there kubelet restarts it on its own")
	ctx := ctxT(t, 10*time.Minute)
	t.Cleanup(func() {
		if _, err := lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN); err != nil {
			t.Errorf("back to vxlan: %v", err)
		}
	})
	if _, err := lc.SetEncapsulation(ctx, networkv1.EncapsulationNone); err != nil {
		t.Fatal(err)
	}
	nodes := lc.Nodes[:2]
	// Each node sends to the other's subnet out of the uplink port, not through VXLAN; every round
	// then checks the flows are what they were before the restart.
	uplink := fmt.Sprintf("output:%d", pipeline.PortUplink)
	for i, n := range nodes {
		peer, err := lc.Subnet(ctx, nodes[1-i].Name)
		if err != nil {
			t.Fatal(err)
		}
		if flows, err := n.Ofctl(ctx, "dump-flows", "br0", "table=90"); err != nil || !directTo(flows, peer.String(), uplink) {
			t.Fatalf("%s does not send to %s out of the uplink port (%v):\n%s", n.Name, peer, err, flows)
		}
	}
	pairs := restartPairs(t, ctx, "rn", "e2e-restart-none", nodes)
	for i := range 4 {
		restartRound(t, ctx, nodes[i%2], pairs, i >= 2, 1, false) // each node once of each kind
	}
}

// restartPairs runs two pods on each of two nodes and returns the pairs the restart tests ping:
// across the nodes both ways for both pods, and on each node; each pair already reaches its peer.
func restartPairs(t *testing.T, ctx context.Context, prefix, namespace string, nodes []*cluster.Node) [][2]*cluster.Pod {
	first := runPods(t, ctx, prefix+"1", []string{namespace}, nodes)
	second := runPods(t, ctx, prefix+"2", []string{namespace}, nodes)
	onNode := func(pods []*cluster.Pod, n *cluster.Node) *cluster.Pod {
		for _, p := range pods {
			if p.Node == n.Name {
				return p
			}
		}
		t.Fatalf("no pod on %s", n.Name)
		return nil
	}
	a1, a2, b1, b2 := onNode(first, nodes[0]), onNode(second, nodes[0]), onNode(first, nodes[1]), onNode(second, nodes[1])
	pairs := [][2]*cluster.Pod{{a1, b1}, {b1, a1}, {a2, b2}, {b2, a2}, {a1, a2}, {b2, b1}}
	// Each pair must work before the restarts; the first packet to a new tunnel peer may be dropped
	// while OVS resolves it (shared/LAB.md), which is not what these tests are about.
	for _, pr := range pairs {
		deadline := time.Now().Add(10 * time.Second)
		for !pr[0].Ping(ctx, pr[1].IP) {
			if time.Now().After(deadline) {
				t.Fatalf("%s cannot reach %s before any restart", pr[0].Name, pr[1].Name)
			}
		}
	}
	return pairs
}

// restartAgent stops n's agent (crash: kill -9) and starts it again, and returns once the new agent
// recorded its round (roundBefore is the old agent's), failing the test after within.
func restartAgent(t *testing.T, ctx context.Context, n *cluster.Node, crash bool, roundBefore string, within time.Duration) {
	t.Helper()
	stopped := time.Now()
	lc.StopAgent(n, crash)
	if err := lc.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	for round(t, ctx, n) == roundBefore {
		if time.Since(stopped) > within {
			t.Fatalf("the restarted agent on %s did not finish its round within %s:\n%s", n.Name, within, lc.Logs(30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restartRound restarts n's agent (crash: kill -9) in a subtest while every pair pings at 100/s both
// ways for a 15 s window: not one packet may be lost, and the flows after must equal those before but
// for the round. vxlan: also check ovs-vswitchd's tunnel neighbours.
func restartRound(t *testing.T, ctx context.Context, n *cluster.Node, pairs [][2]*cluster.Pod, crash bool, nth int, vxlan bool) {
	const window = 15 * time.Second // each round pings this long: 1,500 packets each way per pair
	count := int(window / (10 * time.Millisecond))
	name := fmt.Sprintf("%s-%d-%s", map[bool]string{false: "graceful", true: "crash"}[crash], nth, n.Name)
	t.Run(name, func(t *testing.T) {
		before := flowsButRound(t, ctx, n)
		roundBefore := round(t, ctx, n)
		var pingers []*pinger
		for _, pr := range pairs {
			pingers = append(pingers, startPinger(t, pr[0], pr[1], count))
		}
		began := time.Now()
		time.Sleep(time.Second)
		restartAgent(t, ctx, n, crash, roundBefore, time.Minute)
		restarted := time.Since(began)
		// The neighbour checks of the new agent run right after its start; leave them time inside
		// the window too.
		if restarted > window-5*time.Second {
			t.Fatalf("the restart took %s: too long for the %s ping window", restarted, window)
		}
		lost := 0
		for _, p := range pingers {
			sent, got, out := p.wait()
			if sent != count || got != sent {
				t.Errorf("%s: %d sent, %d received (want %d of %d)\n%s", p.name, sent, got, count, count, out)
			}
			lost += sent - got
		}
		t.Logf("restart of %s's agent finished %s into the window; %d packets lost over %d pairs at 100/s", n.Name,
			restarted.Round(time.Millisecond), lost, len(pairs))
		// The restarted agent left ovs-vswitchd's tunnel neighbours right: each peer's br-ul MAC.
		if vxlan {
			if wrong := wrongNeighbours(t, ctx, n); len(wrong) > 0 {
				t.Errorf("tunnel neighbours of %s after the restart: %v", n.Name, wrong)
			}
		}
		after := flowsButRound(t, ctx, n)
		if strings.Join(before, "\n") != strings.Join(after, "\n") {
			t.Errorf("flows differ after the restart (round %s → %s):\nbefore:\n%s\nafter:\n%s", roundBefore, round(t, ctx, n),
				strings.Join(before, "\n"), strings.Join(after, "\n"))
		}
	})
}

func TestOVSRestart(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pods := runPods(t, ctx, "ovs", []string{"e2e-ovs"}, lc.Nodes[1:3])
	a, b := pods[0], pods[1]
	n := lc.Node(a.Node)
	before := flowsButRound(t, ctx, n)
	began := time.Now()
	if err := n.RestartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	for {
		if a.Ping(ctx, b.IP) && b.Ping(ctx, a.IP) {
			took = time.Since(began)
			break
		}
		if time.Since(began) > time.Minute {
			t.Fatalf("pods on %s unreachable a minute after ovs-vswitchd restarted:\n%s", n.Name, lc.Logs(30))
		}
	}
	t.Logf("pods reachable again %s after ovs-vswitchd was killed and restarted", took.Round(time.Millisecond))
	// The acceptance bound of the issue; generous against the figure measured on these machines (see the log).
	if took > 5*time.Second {
		t.Errorf("pods reachable again only after %s, want within 5s", took)
	}
	if after := flowsButRound(t, ctx, n); strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("flows after the OVS restart differ:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
	if !a.Ping(ctx, b.IP) {
		t.Error("lost connectivity again")
	}
}
