package debugapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// PathDrops streams the node's sampled drops as NDJSON (one Drop per line): the recent ones the agent
// keeps that match the query, oldest first, then, with follow=1, every new one as it comes, until the
// caller hangs up. Query: namespace, pod (source or destination), since (a Go duration), follow.
const PathDrops = Prefix + "drops"

// Drop is one sampled drop: a packet a flow with a cause dropped (or rejected), as the node's agent
// decoded it from the packet-in (flows/pipeline/drops.go).
type Drop struct {
	Time time.Time `json:"time"`
	Node string    `json:"node"`
	// Src and Dst are namespace/pod (namespace/pod@net1 on a Network) or the address; SrcIP and DstIP
	// the addresses themselves.
	Src     string     `json:"src"`
	Dst     string     `json:"dst"`
	SrcIP   netip.Addr `json:"srcIP,omitzero"`
	DstIP   netip.Addr `json:"dstIP,omitzero"`
	Proto   string     `json:"proto"`
	SrcPort uint16     `json:"srcPort,omitempty"`
	Port    uint16     `json:"port,omitempty"` // the destination port
	// Cause is the registry's name (tenant-isolation, policy-ingress, ...), Verdict the sentence,
	// Object the deciding object ("NetworkPolicy blue/deny-all", "tenant isolation 12 → 14"), and
	// Policies, for a drop by a pod's isolation, the policies that isolate it.
	Cause    string   `json:"cause"`
	Verdict  string   `json:"verdict"`
	Object   string   `json:"object,omitempty"`
	Policies []string `json:"policies,omitempty"`
	// Owner is the dropping flow's owner (its cookie), Table the table by name and number.
	Owner   string `json:"owner,omitempty"`
	Table   string `json:"table"`
	TableID uint8  `json:"tableID"`
}

// DropQuery selects drops; empty fields do not filter.
type DropQuery struct {
	Namespace string
	Pod       string
	Since     time.Duration
	Follow    bool
}

// Values encodes the query for PathDrops.
func (q DropQuery) Values() url.Values {
	v := url.Values{}
	if q.Namespace != "" {
		v.Set("namespace", q.Namespace)
	}
	if q.Pod != "" {
		v.Set("pod", q.Pod)
	}
	if q.Since > 0 {
		v.Set("since", q.Since.String())
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v
}

// ParseDropQuery reads a query of PathDrops.
func ParseDropQuery(v url.Values) (DropQuery, error) {
	q := DropQuery{Namespace: v.Get("namespace"), Pod: v.Get("pod")}
	if s := v.Get("since"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return q, fmt.Errorf("since: %q is not a duration", s)
		}
		q.Since = d
	}
	if s := v.Get("follow"); s != "" {
		f, err := strconv.ParseBool(s)
		if err != nil {
			return q, fmt.Errorf("follow: %q is not a boolean", s)
		}
		q.Follow = f
	}
	return q, nil
}

// Match says whether a drop passes the query (Since against now).
func (q DropQuery) Match(d Drop, now time.Time) bool {
	if q.Since > 0 && d.Time.Before(now.Add(-q.Since)) {
		return false
	}
	if q.Namespace == "" && q.Pod == "" {
		return true
	}
	for _, end := range []string{d.Src, d.Dst} {
		ns, name, ok := strings.Cut(end, "/")
		if !ok {
			continue // an address
		}
		name, _, _ = strings.Cut(name, "@")
		if (q.Namespace == "" || ns == q.Namespace) && (q.Pod == "" || name == q.Pod) {
			return true
		}
	}
	return false
}

// DropStreamer is a Backend that streams drops. each is called with the recent drops that match,
// oldest first, then (q.Follow) with new ones until ctx ends; an error of each ends the stream.
type DropStreamer interface {
	Drops(ctx context.Context, q DropQuery, each func(Drop) error) error
}

// ErrNoDropStream is what Client.Drops returns for an agent without PathDrops (an older agent).
var ErrNoDropStream = errors.New("the agent has no drop stream")

// serveDrops streams PathDrops.
func serveDrops(b DropStreamer, w http.ResponseWriter, r *http.Request) {
	q, err := ParseDropQuery(r.URL.Query())
	if err != nil {
		http.Error(w, "drops: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	sent := false
	err = b.Drops(r.Context(), q, func(d Drop) error {
		if err := enc.Encode(d); err != nil {
			return err
		}
		sent = true
		flush()
		return nil
	})
	if !sent {
		flush() // the headers at least, so a follower knows the stream is up
	}
	_ = err // the stream has started: an error can only end it
}

// Drops reads the node's drop stream, calling each per drop; with q.Follow it returns only when ctx
// ends, the stream breaks, or each fails. An agent without the stream gives ErrNoDropStream.
func (c *Client) Drops(ctx context.Context, q DropQuery, each func(Drop) error) error {
	req, err := c.request(ctx, http.MethodGet, PathDrops+"?"+q.Values().Encode(), nil)
	if err != nil {
		return err
	}
	hc := *c.http
	if q.Follow {
		hc.Timeout = 0 // a stream lasts as long as ctx
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("debug API of %s: %w", c.Where, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%s: %w", c.Where, ErrNoDropStream)
	}
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &ResponseError{URL: c.Where + " " + PathDrops, Status: resp.StatusCode, Body: strings.TrimSpace(string(data))}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var d Drop
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			return fmt.Errorf("debug API of %s: drops: %w", c.Where, err)
		}
		if err := each(d); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("debug API of %s: drops: %w", c.Where, err)
	}
	return nil
}
