package debugapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/go-logr/logr"
)

// Backend answers the API; the agent implements it over its own state, OVSDB, OpenFlow session and
// ovs-vswitchd's control socket.
type Backend interface {
	Node(ctx context.Context) (*NodeInfo, error)
	Desired(ctx context.Context) (*Desired, error)
	Diff(ctx context.Context) (*Diff, error)
	Dump(ctx context.Context) (*Dump, error)
	Trace(ctx context.Context, req TraceRequest) (*TraceResponse, error)
}

// ErrUnavailable wraps what a backend cannot answer yet (the agent is still starting).
var ErrUnavailable = errors.New("not available yet")

// maxRequest bounds a request body (a trace request is a few hundred bytes).
const maxRequest = 64 << 10

// traceWait bounds how long a trace waits for the one running before it (a variable for tests).
var traceWait = 10 * time.Second

// Handler serves the API from a backend. Traces run one at a time.
func Handler(b Backend, log logr.Logger) http.Handler {
	mux := http.NewServeMux()
	traceSlot := make(chan struct{}, 1)
	get := func(path string, f func(ctx context.Context) (any, error)) {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			v, err := f(r.Context())
			reply(w, log, r, v, err)
		})
	}
	get(PathNode, func(ctx context.Context) (any, error) { return b.Node(ctx) })
	get(PathDesired, func(ctx context.Context) (any, error) { return b.Desired(ctx) })
	get(PathDiff, func(ctx context.Context) (any, error) { return b.Diff(ctx) })
	get(PathDump, func(ctx context.Context) (any, error) { return b.Dump(ctx) })
	if ds, ok := b.(DropStreamer); ok {
		mux.HandleFunc("GET "+PathDrops, func(w http.ResponseWriter, r *http.Request) { serveDrops(ds, w, r) })
	}
	mux.HandleFunc("POST "+PathTrace, func(w http.ResponseWriter, r *http.Request) {
		var req TraceRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, maxRequest))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "trace request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := req.Packet.Validate(); err != nil {
			http.Error(w, "trace request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(req.CtNext) > 16 {
			http.Error(w, "trace request: more than 16 --ct-next", http.StatusBadRequest)
			return
		}
		wait := time.NewTimer(traceWait)
		defer wait.Stop()
		select {
		case traceSlot <- struct{}{}:
			defer func() { <-traceSlot }()
		case <-wait.C:
			http.Error(w, "another trace is running on this node; try again", http.StatusTooManyRequests)
			return
		case <-r.Context().Done():
			return
		}
		resp, err := b.Trace(r.Context(), req)
		reply(w, log, r, resp, err)
	})
	return mux
}

func reply(w http.ResponseWriter, log logr.Logger, r *http.Request, v any, err error) {
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, ErrUnavailable) {
			code = http.StatusServiceUnavailable
		}
		log.V(2).Info("debug API request failed", "path", r.URL.Path, "err", err)
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	if err := enc.Encode(v); err != nil {
		log.V(2).Info("debug API answer not delivered", "path", r.URL.Path, "err", err)
	}
}

// ResponseError is a non-2xx answer of the API (or of the API server's proxy in front of it).
type ResponseError struct {
	URL    string
	Status int
	Body   string
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.URL, e.Status, e.Body)
}
