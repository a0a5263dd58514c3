package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/ofswitch"
	"github.com/ofsdn/ofsdn/ovsdb"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Liveness and readiness, as /healthz, /readyz and the CNI STATUS verb report them.
//
// Live (/healthz, the DaemonSet's liveness probe): the flow sync loop answers a ping between syncs
// (a loop wedged on a lock or a call that never returns stops answering), and the OpenFlow and OVSDB
// sessions are up, or have been down for less than ovsDownGrace (ovs-vswitchd restarting is normal:
// the sessions reconnect and replay on their own). While the start-up steps run there is no loop to
// ask yet, and the agent is live.
//
// Ready (/readyz, the readiness probe, and CNI STATUS): the first full sync is done (this round's
// flows installed, the previous round's removed), the CNI server listens, both OVS sessions are up
// and the node knows its subnet. Until then an ADD could not be served.
const (
	// loopStuckAfter: a flow sync loop that has not answered for this long is stuck.
	loopStuckAfter = 2 * time.Minute
	// ovsDownGrace: OVS sessions down this long make the agent not live.
	ovsDownGrace = 60 * time.Second
	// watchdogEvery is how often the loops are pinged and the sessions looked at.
	watchdogEvery = 5 * time.Second
)

type health struct {
	clock      func() time.Time
	watchEvery time.Duration // watchdogEvery; tests shorten it

	// What the checks read: the view and the flow loop from the start, the sessions once the bridge
	// is open (nil: not yet).
	viewReady  func() error
	flowLoop   pinger
	openflowUp func() bool
	ovsdbUp    func() bool

	mu           sync.Mutex
	sess         *ofswitch.Session // set once the bridge is open (setSession)
	recon        *reconcile.Reconciler
	db           *ovsdb.Client
	step         string // the start-up step running, "" once every step is done
	firstSync    bool
	cniListening bool
	loopsRunning time.Time // when the loops started (zero: not yet)
	loopAnswered time.Time // the flow sync loop's last answer
	ovsDownSince time.Time // zero while both sessions are up
}

// pinger is a loop the watchdog pings (loop.Loop).
type pinger interface {
	Ping(ctx context.Context) error
}

func newHealth(viewReady func() error, flowLoop pinger) *health {
	return &health{clock: time.Now, watchEvery: watchdogEvery, step: "starting", viewReady: viewReady, flowLoop: flowLoop}
}

func (h *health) setStep(step string) {
	h.mu.Lock()
	h.step = step
	h.mu.Unlock()
}

func (h *health) currentStep() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.step
}

func (h *health) setFirstSync() {
	h.mu.Lock()
	h.firstSync = true
	h.mu.Unlock()
}

func (h *health) setCNIListening(on bool) {
	h.mu.Lock()
	h.cniListening = on
	h.mu.Unlock()
}

// check is one line of a health report.
type check struct {
	name string
	err  error
}

func (h *health) ovsChecks() []check {
	h.mu.Lock()
	openflowUp, ovsdbUp := h.openflowUp, h.ovsdbUp
	h.mu.Unlock()
	var out []check
	for _, s := range []struct {
		name string
		up   func() bool
	}{{"openflow", openflowUp}, {"ovsdb", ovsdbUp}} {
		var err error
		if s.up == nil {
			err = errors.New("not connected yet")
		} else if !s.up() {
			err = errors.New("session down")
		}
		out = append(out, check{s.name, err})
	}
	return out
}

// liveness reports the liveness checks.
func (h *health) liveness() []check {
	h.mu.Lock()
	started, answered, downSince, step := h.loopsRunning, h.loopAnswered, h.ovsDownSince, h.step
	h.mu.Unlock()
	now := h.clock()
	if started.IsZero() {
		return []check{{"start-up", nil}, {"step: " + step, nil}}
	}
	var loop error
	last := started
	if answered.After(last) {
		last = answered
	}
	if now.Sub(last) > loopStuckAfter {
		loop = fmt.Errorf("the flow sync loop has not answered for %s", now.Sub(last).Round(time.Second))
	}
	out := []check{{"flow-sync-loop", loop}}
	for _, c := range h.ovsChecks() {
		if c.err != nil && !downSince.IsZero() && now.Sub(downSince) < ovsDownGrace {
			c.err = nil // reconnecting: give it the grace period
		} else if c.err != nil && !downSince.IsZero() {
			c.err = fmt.Errorf("%w for %s", c.err, now.Sub(downSince).Round(time.Second))
		}
		out = append(out, c)
	}
	return out
}

// readiness reports the readiness checks.
func (h *health) readiness() []check {
	h.mu.Lock()
	firstSync, listening, step := h.firstSync, h.cniListening, h.step
	h.mu.Unlock()
	var syncErr, cniErr, viewErr error
	if !firstSync {
		syncErr = fmt.Errorf("first full sync not done (start-up step: %s)", step)
	}
	if !listening {
		cniErr = errors.New("CNI server not listening")
	}
	if h.viewReady != nil {
		viewErr = h.viewReady()
	} else {
		viewErr = errors.New("no node view yet")
	}
	return append([]check{{"first-sync", syncErr}, {"cni-server", cniErr}, {"node", viewErr}}, h.ovsChecks()...)
}

// failed joins the errors of a report (nil: every check passed).
func failed(checks []check) error {
	var errs []error
	for _, c := range checks {
		if c.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, c.err))
		}
	}
	return errors.Join(errs...)
}

// Ready is nil when the agent can serve ADDs: what /readyz and CNI STATUS say.
func (h *health) Ready() error { return failed(h.readiness()) }

// watch runs the watchdog until ctx ends: every watchEvery it looks at the OVS sessions and, when
// the last ping was answered, pings the flow loop again. One ping at a time: a stuck loop is not sent a
// pile of them, and a loop that answers at once is not pinged again at once (ping-pong between the two
// loops once burned a whole core and tripled CNI ADD latency).
func (h *health) watch(ctx context.Context) {
	h.mu.Lock()
	h.loopsRunning = h.clock()
	h.mu.Unlock()
	var pinging atomic.Bool
	loop.New(loop.Config{Name: "watchdog", Period: h.watchEvery}, func(ctx context.Context) (time.Duration, error) {
		if h.flowLoop != nil && pinging.CompareAndSwap(false, true) {
			go func() {
				defer pinging.Store(false)
				if h.flowLoop.Ping(ctx) == nil {
					h.mu.Lock()
					h.loopAnswered = h.clock()
					h.mu.Unlock()
				}
			}()
		}
		down := failed(h.ovsChecks()) != nil
		h.mu.Lock()
		switch {
		case down && h.ovsDownSince.IsZero():
			h.ovsDownSince = h.clock()
		case !down:
			h.ovsDownSince = time.Time{}
		}
		h.mu.Unlock()
		return 0, nil
	}).Run(ctx)
}

// serveChecks writes a report as Kubernetes components do ("[+]name ok" / "[-]name failed: why").
func serveChecks(w http.ResponseWriter, what string, checks []check) {
	var b strings.Builder
	err := failed(checks)
	for _, c := range checks {
		if c.err != nil {
			fmt.Fprintf(&b, "[-]%s failed: %v\n", c.name, c.err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", c.name)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(&b, "%s check failed\n", what)
	} else {
		fmt.Fprintf(&b, "%s check passed\n", what)
	}
	_, _ = w.Write([]byte(b.String()))
}

// metricsHandler serves /metrics, /healthz and /readyz, and /debug/pprof/ with Config.Profiling.
func (a *Agent) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { serveChecks(w, "healthz", a.health.liveness()) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { serveChecks(w, "livez", a.health.liveness()) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { serveChecks(w, "readyz", a.health.readiness()) })
	if a.cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// setSession gives health and the state gauges the bridge's sessions once they exist.
func (h *health) setSession(sess *ofswitch.Session, r *reconcile.Reconciler, db *ovsdb.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sess, h.recon, h.db = sess, r, db
	h.openflowUp = sess.Connected
	if db != nil {
		h.ovsdbUp = db.Connected
	}
}

// parts returns what setSession gave (nil before).
func (h *health) parts() (*ofswitch.Session, *reconcile.Reconciler, *ovsdb.Client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sess, h.recon, h.db
}
