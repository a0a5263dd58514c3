package flowctl

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/drops"
	"github.com/ofsdn/ofsdn/debugapi"
)

// dropAgent is a fake agent with a drop stream: the agent's own ring behind the debug API.
type dropAgent struct {
	fakeAgent
	ring *drops.Ring
}

func (a dropAgent) Drops(ctx context.Context, q debugapi.DropQuery, each func(debugapi.Drop) error) error {
	return a.ring.Stream(ctx, q, time.Now, each)
}

func TestDropsMergeOverNodes(t *testing.T) {
	// Minutes apart, an hour ago: a slow run cannot move a record across --since.
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	at := func(m int) time.Time { return base.Add(time.Duration(m) * time.Minute) }
	rec := func(node string, s int, src, dst string) debugapi.Drop {
		return debugapi.Drop{Time: at(s), Node: node, Src: src, Dst: dst, Proto: "tcp", Port: 8080, Cause: "tenant-isolation",
			Verdict: "dropped by tenant isolation", Object: "tenant isolation 12 → 14", Table: "ingress-isolation", TableID: 80}
	}
	agents := map[string]debugapi.Backend{}
	for node, recs := range map[string][]debugapi.Drop{
		"n1": {rec("n1", 1, "blue/a", "red/b"), rec("n1", 3, "blue/a", "10.0.0.9")},
		"n2": {rec("n2", 2, "green/c", "red/d")},
	} {
		r := drops.NewRing(8)
		for _, d := range recs {
			r.Add(d)
		}
		agents[node] = dropAgent{ring: r}
	}
	agents["old"] = fakeAgent{} // an agent without the stream
	clients := map[string]*debugapi.Client{}
	for n, b := range agents {
		clients[n] = debugapi.NewSocketClient(serveAgent(t, b))
	}
	src := func(nodes ...string) *dropClient {
		return &dropClient{nodes: func(context.Context) ([]string, error) { return nodes, nil },
			client: func(n string) (*debugapi.Client, error) { return clients[n], nil }}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		nodes      []string
		q          debugapi.DropQuery
		want       []string // node@second, oldest first
		unanswered []string
		err        error
	}{
		{"merged oldest first", []string{"n1", "n2"}, debugapi.DropQuery{}, []string{"n1@1", "n2@2", "n1@3"}, nil, nil},
		{"by namespace", []string{"n1", "n2"}, debugapi.DropQuery{Namespace: "red"}, []string{"n1@1", "n2@2"}, nil, nil},
		{"by pod", []string{"n1", "n2"}, debugapi.DropQuery{Namespace: "blue", Pod: "a"}, []string{"n1@1", "n1@3"}, nil, nil},
		{"since", []string{"n1", "n2"}, debugapi.DropQuery{Since: time.Hour - 150*time.Second}, []string{"n1@3"}, nil, nil},
		{"an agent without the stream", []string{"n1", "old"}, debugapi.DropQuery{}, []string{"n1@1", "n1@3"}, []string{"old"}, nil},
		{"no agent with the stream", []string{"old"}, debugapi.DropQuery{}, nil, []string{"old"}, ErrDropsUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unanswered, err := src(tc.nodes...).recent(ctx, tc.q)
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			var names []string
			for _, d := range got {
				names = append(names, d.Node+"@"+strconv.Itoa(int(d.Time.Sub(base).Round(time.Minute)/time.Minute)))
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got %v, want %v", names, tc.want)
			}
			if len(unanswered) != len(tc.unanswered) {
				t.Errorf("unanswered %v, want %v", unanswered, tc.unanswered)
			}
			for _, n := range tc.unanswered {
				if !strings.Contains(unanswered[n], "no drop stream") {
					t.Errorf("node %s: %q does not say it has no drop stream", n, unanswered[n])
				}
			}
		})
	}

	// The console's node filter asks that node's agent alone: another's silence is not reported.
	b, err := agentDrops{src("n1", "n2", "old")}.Recent(ctx, DropFilter{Node: "n2"})
	if err != nil || len(b.Drops) != 1 || b.Drops[0].Node != "n2" || len(b.Unanswered) != 0 {
		t.Errorf("console, node n2: %+v %v, want n2's one drop and no unanswered node", b, err)
	}
	if b, err := (agentDrops{src("n1", "n2")}).Recent(ctx, DropFilter{Node: "n9"}); err != nil || len(b.Drops) != 0 || len(b.Unanswered) != 0 {
		t.Errorf("console, no such node: %+v %v, want nothing", b, err)
	}

	// Following: a record added after the follow began arrives once, and nothing older.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan debugapi.Drop, 8)
	done := make(chan error, 1)
	go func() {
		done <- src("n1", "n2").follow(fctx, debugapi.DropQuery{}, map[string]time.Time{"": at(3)}, func(d debugapi.Drop) error {
			got <- d
			return nil
		}, func(string, error) {})
	}()
	ring := agents["n2"].(dropAgent).ring
	var first debugapi.Drop
	for first.Node == "" {
		ring.Add(rec("n2", 4, "green/c", "red/d"))
		select {
		case first = <-got:
		case <-time.After(100 * time.Millisecond): // the stream may not be up yet: add another
		case err := <-done:
			t.Fatalf("follow ended: %v", err)
		}
	}
	if first.Node != "n2" || !first.Time.Equal(at(4)) {
		t.Errorf("followed %s@%v, want n2's new record", first.Node, first.Time)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if line := DropLine(first); !strings.Contains(line, "n2 green/c → red/d tcp/8080 DROPPED [tenant isolation 12 → 14] table 80 ingress-isolation") {
		t.Errorf("DropLine: %q", line)
	}
}
