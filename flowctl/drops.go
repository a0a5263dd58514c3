package flowctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/debugapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// dropsUsage lists the causes from the drop registry (ui_drops.go's dropCauseWords).
var dropsUsage = `usage: flowctl drops [-f] [--namespace N] [--pod P] [--since D] [--node NAME] [-o text|json]

The cluster's recent drops with their causes, merged over the nodes, oldest first: every packet a
flow with a cause dropped or rejected, as each node's agent sampled it (at most 100 per second per
cause and node), with the pods or addresses, protocol and port, the verdict, the deciding object and
the table. A pod on another node than the one that dropped is named from the API server's pods (an
address when it cannot be). -f keeps following new drops until interrupted. Each node's agent is
asked through the API server's node proxy (as --node does for the other commands); a node whose
agent does not answer is named on stderr.

The causes:
` + dropCauseList() + `
`

// dropCauseList is the causes' words, one a line.
func dropCauseList() string {
	var b strings.Builder
	for _, w := range dropCauseWords() {
		fmt.Fprintf(&b, "  %s\n", w)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// RunDrops is flowctl drops.
func RunDrops(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCmdLine("drops", dropsUsage, stdout, stderr)
	var nf nodeFlags
	nf.register(c.fs, true)
	follow := c.fs.Bool("f", false, "follow: keep printing new drops")
	ns := c.fs.String("namespace", "", "only drops from or to pods of this namespace")
	pod := c.fs.String("pod", "", "only drops from or to this pod (in --namespace when given)")
	since := c.fs.Duration("since", 0, "only drops of the last `duration` (e.g. 5m; default: all the agents keep)")
	output := c.outputFlag()
	rest, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return c.usageErrorf("drops takes no arguments (got %q)", rest)
	}
	var warnOnce sync.Once // a cluster whose pods cannot be listed is told once, not every few seconds
	src, err := newDropClient(&nf, func(err error) {
		warnOnce.Do(func() {
			fmt.Fprintf(stderr, "flowctl drops: other nodes' pods are shown as addresses: %v\n", err)
		})
	})
	if err != nil {
		return err
	}
	q := debugapi.DropQuery{Namespace: *ns, Pod: *pod, Since: *since}
	print := func(d debugapi.Drop) error {
		if output.value == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetEscapeHTML(false)
			return enc.Encode(d)
		}
		_, err := fmt.Fprintln(stdout, DropLine(d))
		return err
	}
	start := time.Now()
	batch, unanswered, err := src.recent(ctx, q)
	if err != nil {
		return err
	}
	reportUnanswered(stderr, unanswered)
	for _, d := range batch {
		if err := print(d); err != nil {
			return err
		}
	}
	if !*follow {
		return nil
	}
	var mu sync.Mutex
	after := lastTimes(batch)
	after[""] = start
	return src.follow(ctx, q, after, func(d debugapi.Drop) error {
		mu.Lock()
		defer mu.Unlock()
		if err := print(d); err != nil {
			return printError{err}
		}
		return nil
	}, func(node string, err error) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stderr, "flowctl drops: node %s: %v\n", node, err)
	})
}

// DropLine is a drop on one line: time, node, verdict's parts.
func DropLine(d debugapi.Drop) string {
	l4 := d.Proto
	if d.Port != 0 {
		l4 = fmt.Sprintf("%s/%d", d.Proto, d.Port)
	}
	return fmt.Sprintf("%s %s %s → %s %s %s [%s] table %d %s: %s", d.Time.UTC().Format("15:04:05.000"), d.Node, d.Src, d.Dst, l4,
		dropVerb(d), d.Object, d.TableID, d.Table, d.Verdict)
}

func dropVerb(d debugapi.Drop) string {
	if strings.HasPrefix(d.Verdict, "rejected") {
		return "REJECTED"
	}
	return "DROPPED"
}

func reportUnanswered(w io.Writer, unanswered map[string]string) {
	for _, n := range slices.Sorted(maps.Keys(unanswered)) {
		fmt.Fprintf(w, "flowctl drops: node %s: %s\n", n, unanswered[n])
	}
}

func lastTimes(ds []debugapi.Drop) map[string]time.Time {
	out := map[string]time.Time{}
	for _, d := range ds {
		if d.Time.After(out[d.Node]) {
			out[d.Node] = d.Time
		}
	}
	return out
}

// dropClient asks every node's agent for its drops (or the one --node names, or the local agent
// when there is no kubeconfig).
type dropClient struct {
	nodes  func(ctx context.Context) ([]string, error)
	client func(node string) (*debugapi.Client, error)
	// names names the far ends that nodes give as addresses (podnames.go); nil: none is named. With
	// it the agents are asked without the namespace and pod filter, which their names alone would
	// decide, and the drops are filtered here once named.
	names *podNames
}

// agentQuery is what the agents are asked for q, and the filter applied here afterwards.
func (s *dropClient) agentQuery(q debugapi.DropQuery) (asked debugapi.DropQuery, here func(debugapi.Drop) bool) {
	if s.names == nil || (q.Namespace == "" && q.Pod == "") {
		return q, func(debugapi.Drop) bool { return true }
	}
	local := debugapi.DropQuery{Namespace: q.Namespace, Pod: q.Pod} // Since: the agents applied it
	q.Namespace, q.Pod = "", ""
	return q, func(d debugapi.Drop) bool { return local.Match(d, d.Time) }
}

func newDropClient(nf *nodeFlags, warn func(error)) (*dropClient, error) {
	if nf.node == "" {
		if cfg, err := restConfig(nf.kubeconfig); err == nil {
			kube, netc, err := clientsOf(cfg)
			if err != nil {
				return nil, err
			}
			if err := nf.initTokens(cfg); err != nil { // before the nodes are asked side by side
				return nil, err
			}
			return clusterDropClient(cfg, kube, netc, nf, warn), nil
		}
	}
	c, err := nf.agent()
	if err != nil {
		return nil, err
	}
	name := nf.node
	if name == "" {
		name = "local"
	}
	dc := &dropClient{
		nodes:  func(context.Context) ([]string, error) { return []string{name}, nil },
		client: func(string) (*debugapi.Client, error) { return c, nil },
	}
	if nf.node != "" { // through the API server: it names the other nodes' pods too
		cfg, err := restConfig(nf.kubeconfig)
		if err != nil {
			return nil, err
		}
		kube, netc, err := clientsOf(cfg)
		if err != nil {
			return nil, err
		}
		dc.names = newPodNames(kube, netc, warn)
	}
	return dc, nil
}

// clusterDropClient asks every Node's agent through the API server's node proxy, and names the far
// ends of drops from the API server's pods (warn is told when they cannot be listed).
func clusterDropClient(cfg *rest.Config, kube kubernetes.Interface, netc networkclient.Interface, nf *nodeFlags, warn func(error)) *dropClient {
	var mu sync.Mutex
	clients := map[string]*debugapi.Client{}
	return &dropClient{
		names: newPodNames(kube, netc, warn),
		nodes: func(ctx context.Context) ([]string, error) {
			list, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("list nodes: %w", err)
			}
			var out []string
			for _, n := range list.Items {
				out = append(out, n.Name)
			}
			return out, nil
		},
		client: func(node string) (*debugapi.Client, error) {
			mu.Lock()
			defer mu.Unlock()
			if c, ok := clients[node]; ok {
				return c, nil
			}
			c, err := nf.remote(cfg, node)
			if err == nil {
				clients[node] = c
			}
			return c, err
		},
	}
}

// recent returns the drops of every node that match q, oldest first, and the nodes that did not
// answer with why.
func (s *dropClient) recent(ctx context.Context, q debugapi.DropQuery) ([]debugapi.Drop, map[string]string, error) {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	primed := make(chan struct{}) // the pods are listed beside the agents' answers
	go func() { defer close(primed); s.names.prime(ctx) }()
	q.Follow = false
	q, keep := s.agentQuery(q)
	var mu sync.Mutex
	var all []debugapi.Drop
	unanswered := map[string]string{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var got []debugapi.Drop
			c, err := s.client(n)
			if err == nil {
				err = c.Drops(ctx, q, func(d debugapi.Drop) error { got = append(got, d); return nil })
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				unanswered[n] = err.Error()
				return
			}
			all = append(all, got...)
		}()
	}
	wg.Wait()
	<-primed
	kept := all[:0]
	for _, d := range all {
		s.names.enrich(&d)
		if keep(d) {
			kept = append(kept, d)
		}
	}
	all = kept
	sort.SliceStable(all, func(i, j int) bool { return all[i].Time.Before(all[j].Time) })
	if len(nodes) > 0 && len(unanswered) == len(nodes) {
		for _, why := range unanswered {
			if strings.Contains(why, debugapi.ErrNoDropStream.Error()) {
				return nil, unanswered, ErrDropsUnavailable
			}
		}
	}
	return all, unanswered, nil
}

// follow streams every node's new drops (those after after[node]) to each until ctx ends; a node
// whose stream breaks is told to failed and asked again a second later.
func (s *dropClient) follow(ctx context.Context, q debugapi.DropQuery, after map[string]time.Time, each func(debugapi.Drop) error,
	failed func(node string, err error)) error {
	nodes, err := s.nodes(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q.Follow, q.Since = true, time.Minute
	q, keep := s.agentQuery(q)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := after[n]
			if last.IsZero() {
				last = after[""] // "": every node without a time of its own
			}
			for ctx.Err() == nil {
				c, err := s.client(n)
				if err == nil {
					err = c.Drops(ctx, q, func(d debugapi.Drop) error {
						if !d.Time.After(last) {
							return nil
						}
						last = d.Time
						s.names.enrich(&d)
						if !keep(d) {
							return nil
						}
						return each(d)
					})
				}
				if ctx.Err() != nil {
					return
				}
				var pe printError
				if errors.As(err, &pe) {
					select {
					case errc <- err:
					default:
					}
					cancel()
					return
				}
				if err != nil {
					failed(n, err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// printError is an error of the caller's each, which ends a follow.
type printError struct{ error }

// agentDrops is the console's DropSource over the agents' drop streams.
type agentDrops struct{ c *dropClient }

// on is the client narrowed to the filter's node, when it names one: only that agent is asked (and
// only its silence reported); a name that is not a node's asks none.
func (a agentDrops) on(node string) *dropClient {
	if node == "" {
		return a.c
	}
	return &dropClient{client: a.c.client, names: a.c.names, nodes: func(ctx context.Context) ([]string, error) {
		nodes, err := a.c.nodes(ctx)
		if err != nil || !slices.Contains(nodes, node) {
			return nil, err
		}
		return []string{node}, nil
	}}
}

func (a agentDrops) Recent(ctx context.Context, f DropFilter) (DropBatch, error) {
	all, unanswered, err := a.on(f.Node).recent(ctx, debugapi.DropQuery{Namespace: f.Namespace, Pod: f.Pod, Since: f.Since})
	if err != nil {
		return DropBatch{}, err
	}
	b := DropBatch{Unanswered: unanswered}
	for i := len(all) - 1; i >= 0; i-- { // newest first
		b.Drops = append(b.Drops, dropRecordOf(all[i]))
	}
	return b, nil
}

func (a agentDrops) Follow(ctx context.Context, f DropFilter, each func(DropRecord) error) error {
	return a.on(f.Node).follow(ctx, debugapi.DropQuery{Namespace: f.Namespace, Pod: f.Pod}, map[string]time.Time{"": time.Now()}, func(d debugapi.Drop) error {
		if err := each(dropRecordOf(d)); err != nil {
			return printError{err}
		}
		return nil
	}, func(string, error) {})
}

func dropRecordOf(d debugapi.Drop) DropRecord {
	return DropRecord{Time: d.Time, Node: d.Node, Src: d.Src, Dst: d.Dst, Proto: d.Proto, Port: d.Port, Verdict: d.Verdict,
		Object: d.Object, Table: fmt.Sprintf("%d %s", d.TableID, d.Table)}
}
