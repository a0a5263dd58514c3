//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
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

// pinger pings 10 times a second from a pod until stopped and reports what it sent and got back.
type pinger struct {
	cmd *exec.Cmd
	out strings.Builder
}

func startPinger(t *testing.T, from, to *cluster.Pod, count int) *pinger {
	p := &pinger{cmd: exec.Command("ip", "netns", "exec", from.NetNS, "ping", "-n", "-q", "-i", "0.1", "-W", "1", "-c", strconv.Itoa(count), to.IP.String())}
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

func TestAgentRestartLosesNothing(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pods := runPods(t, ctx, "rs", []string{"e2e-restart"}, lc.Nodes[:2])
	a, b := pods[0], pods[1]
	n := lc.Node(a.Node)
	for _, crash := range []bool{false, true} {
		name := map[bool]string{false: "graceful", true: "crash"}[crash]
		t.Run(name, func(t *testing.T) {
			before := flowsButRound(t, ctx, n)
			roundBefore := round(t, ctx, n)
			ab, ba := startPinger(t, a, b, 80), startPinger(t, b, a, 80)
			time.Sleep(2 * time.Second)
			lc.StopAgent(n, crash)
			if err := lc.StartAgent(n); err != nil {
				t.Fatal(err)
			}
			// The new agent is done once it recorded its round.
			deadline := time.Now().Add(time.Minute)
			for round(t, ctx, n) == roundBefore {
				if time.Now().After(deadline) {
					t.Fatalf("the restarted agent never finished its round:\n%s", lc.Logs(30))
				}
				time.Sleep(50 * time.Millisecond)
			}
			for _, p := range []*pinger{ab, ba} {
				sent, got, out := p.wait()
				if sent == 0 || got != sent {
					t.Errorf("pings across the restart: %d sent, %d received\n%s", sent, got, out)
				}
			}
			after := flowsButRound(t, ctx, n)
			if strings.Join(before, "\n") != strings.Join(after, "\n") {
				t.Errorf("flows differ after the restart (round %s → %s):\nbefore:\n%s\nafter:\n%s", roundBefore, round(t, ctx, n),
					strings.Join(before, "\n"), strings.Join(after, "\n"))
			}
		})
	}
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
