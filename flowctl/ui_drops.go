package flowctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/flows/pipeline"
)

// The drops view. Drops come from the agents' drop stream (debugapi.PathDrops): the page and its live
// stream are written against DropSource, and flowctl ui's wiring passes agentDrops (drops.go), a
// DropSource over flowctl drops' client that gives ErrDropsUnavailable when no agent has the stream.
// Tests drive the page and the stream with a recorded source.

// ErrDropsUnavailable is the answer of a source whose cluster cannot tell its drops.
var ErrDropsUnavailable = errors.New("drops are not available from this cluster's agents: their debug API has no drop stream")

// DropFilter narrows the drops asked for; empty fields do not filter.
type DropFilter struct {
	Namespace string        // the source's or the destination's namespace
	Pod       string        // a pod's name (in Namespace, when given), source or destination
	Node      string        // the node that dropped
	Since     time.Duration // how far back Recent looks; 0: all the agents keep
}

// DropRecord is one sampled drop as the console shows it: what issue 25's records carry.
type DropRecord struct {
	Time time.Time `json:"time"`
	Node string    `json:"node"`
	// Src and Dst are namespace/pod (namespace/pod@net1 on a Network) or an address.
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Proto string `json:"proto"`
	Port  uint16 `json:"port,omitempty"`
	// Verdict says why, in words; Object names the deciding object ("NetworkPolicy blue/deny-all",
	// "tenant isolation 12 → 14") and Table the table that dropped.
	Verdict string `json:"verdict"`
	Object  string `json:"object,omitempty"`
	Table   string `json:"table,omitempty"`
}

// DropBatch is recent drops merged over nodes, newest first; Unanswered are the nodes whose agent did
// not answer, with why.
type DropBatch struct {
	Drops      []DropRecord
	Unanswered map[string]string
}

// DropSource is where the console reads drops.
type DropSource interface {
	// Recent returns the drops that match f, newest first, merged over the nodes.
	Recent(ctx context.Context, f DropFilter) (DropBatch, error)
	// Follow calls each with every new drop that matches f, until ctx ends or each fails.
	Follow(ctx context.Context, f DropFilter, each func(DropRecord) error) error
}

type uiDrops struct {
	// Causes are what the page's introduction lists: every cause of the drop registry, in its words.
	Causes     []string
	Filter     DropFilter
	Form       map[string]string
	FormError  string
	Available  bool
	Why        string
	Drops      []DropRecord
	Unanswered []string
	StreamURL  string
}

// maxDropRows bounds the page's table (the live view keeps as many).
const maxDropRows = 500

// dropCauseWords lists the sampled drop causes in the registry's words (flows/pipeline/drops.go), so
// the Drops page names every cause the agents can report, and one added later with them.
func dropCauseWords() []string {
	out := make([]string, 0, len(pipeline.DropCauses))
	for _, c := range pipeline.DropCauses {
		out = append(out, c.Words)
	}
	return out
}

func parseDropFilter(q url.Values) (DropFilter, error) {
	f := DropFilter{Namespace: strings.TrimSpace(q.Get("namespace")), Pod: strings.TrimSpace(q.Get("pod")), Node: strings.TrimSpace(q.Get("node"))}
	if s := strings.TrimSpace(q.Get("since")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return f, fmt.Errorf("since: %q is not a duration such as 30s, 5m or 1h", s)
		}
		f.Since = d
	}
	return f, nil
}

func (s *uiServer) dropsPage(ctx context.Context, r *http.Request, p *uiPage) {
	p.Title = "Drops"
	q := r.URL.Query()
	v := &uiDrops{Causes: dropCauseWords(), Form: map[string]string{"namespace": q.Get("namespace"), "pod": q.Get("pod"), "node": q.Get("node"), "since": q.Get("since")}}
	if v.Form["since"] == "" {
		v.Form["since"] = "5m"
		q.Set("since", "5m")
	}
	p.Data = v
	f, err := parseDropFilter(q)
	if err != nil {
		v.FormError, p.status = err.Error(), http.StatusBadRequest
		return
	}
	v.Filter = f
	ctx, cancel := s.apiCtx(ctx)
	defer cancel()
	batch, err := s.src.drops.Recent(ctx, f)
	if errors.Is(err, ErrDropsUnavailable) {
		v.Why = err.Error()
		return
	}
	v.Available = true
	if err != nil {
		p.problem("reading the cluster's drops", err)
		return
	}
	v.Drops = batch.Drops
	if len(v.Drops) > maxDropRows {
		v.Drops = v.Drops[:maxDropRows]
	}
	for n, why := range batch.Unanswered {
		v.Unanswered = append(v.Unanswered, n+": "+why)
	}
	sort.Strings(v.Unanswered)
	v.StreamURL = "/drops/stream?" + q.Encode()
}

// dropsStream follows the drops as server-sent events, which the page's script adds to its table: an
// event "drop" per record, "failed" when the source stops, and a comment now and then so that proxies
// keep the connection.
func (s *uiServer) dropsStream(w http.ResponseWriter, r *http.Request) {
	f, err := parseDropFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	records := make(chan DropRecord, 64)
	done := make(chan error, 1)
	go func() {
		done <- s.src.drops.Follow(ctx, f, func(d DropRecord) error {
			select {
			case records <- d:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, "retry: 5000\n: following drops\n\n")
	flusher.Flush()
	send := func(d DropRecord) error {
		b, err := json.Marshal(d)
		if err != nil {
			return nil
		}
		if _, err := fmt.Fprintf(w, "event: drop\ndata: %s\n\n", b); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	heartbeat := time.NewTicker(s.limits.heartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case d := <-records:
			if send(d) != nil {
				return
			}
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": still following\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case err := <-done:
			// The source has stopped; what it sent before is still in records (select picks either
			// ready case), and goes out before the end is told.
			for len(records) > 0 {
				if send(<-records) != nil {
					return
				}
			}
			if ctx.Err() == nil {
				msg := "the drop stream ended"
				if err != nil {
					msg = err.Error()
				}
				b, _ := json.Marshal(msg)
				_, _ = fmt.Fprintf(w, "event: failed\ndata: %s\n\n", b)
				flusher.Flush()
			}
			return
		case <-ctx.Done():
			return
		}
	}
}
