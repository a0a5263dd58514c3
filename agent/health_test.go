package agent

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/metrics"
	"github.com/ofsdn/ofsdn/cni"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestHealthChecks: liveness holds during start-up, then follows the flow loop's answers and the OVS
// sessions (with a grace period for a reconnecting session); readiness needs the first sync, the CNI
// server, the node's subnet and both sessions — and CNI STATUS says the same as /readyz.
func TestHealthChecks(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	loop := chanPinger(make(chan chan struct{}, 1))
	h := newHealth(nil, loop)
	h.clock = clock.Now
	h.watchEvery = 20 * time.Millisecond // the test waits for the next ping after a stuck period
	var ofUp, dbUp = true, true
	var mu sync.Mutex
	up := func(p *bool) func() bool { return func() bool { mu.Lock(); defer mu.Unlock(); return *p } }
	set := func(p *bool, v bool) { mu.Lock(); *p = v; mu.Unlock() }
	viewErr := errors.New("no HostSubnet for node n1 yet")
	h.viewReady = func() error { mu.Lock(); defer mu.Unlock(); return viewErr }
	pods := attach.New(attach.Config{}, attach.Deps{Node: testView(), Flows: &flowSync{}, Readiness: h.Ready})

	if err := failed(h.liveness()); err != nil {
		t.Fatalf("not live during start-up: %v", err)
	}
	if err := h.Ready(); err == nil || !strings.Contains(err.Error(), "first full sync not done") {
		t.Fatalf("ready before the first sync: %v", err)
	}
	var ce *types.Error
	if err := pods.Status(context.Background()); !errors.As(err, &ce) || ce.Code != cni.ErrPluginNotAvailable ||
		!strings.Contains(ce.Msg, h.Ready().Error()) {
		t.Fatalf("CNI STATUS %v; want code 50 with the readiness error %v", err, h.Ready())
	}

	h.openflowUp, h.ovsdbUp = up(&ofUp), up(&dbUp)
	mu.Lock()
	viewErr = nil
	mu.Unlock()
	h.setFirstSync()
	h.setCNIListening(true)
	if err := h.Ready(); err != nil {
		t.Fatalf("not ready with everything done: %v", err)
	}
	if err := pods.Status(context.Background()); err != nil {
		t.Fatalf("CNI STATUS: %v", err)
	}

	// The loops start; the watchdog pings the flow loop, which answers.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.watch(ctx)
	answer := func() {
		t.Helper()
		select {
		case p := <-loop:
			close(p)
		case <-time.After(5 * time.Second):
			t.Fatal("the watchdog sent no ping")
		}
		waitUntil(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.loopAnswered.Equal(clock.Now()) })
	}
	answer()
	if err := failed(h.liveness()); err != nil {
		t.Fatalf("not live with the loop answering: %v", err)
	}
	// The loop stops answering: live until loopStuckAfter, then not.
	clock.add(loopStuckAfter - time.Second)
	if err := failed(h.liveness()); err != nil {
		t.Fatalf("not live %s after the last answer: %v", loopStuckAfter-time.Second, err)
	}
	clock.add(2 * time.Second)
	if err := failed(h.liveness()); err == nil || !strings.Contains(err.Error(), "flow sync loop has not answered") {
		t.Fatalf("a stuck loop is live: %v", err)
	}
	answer()
	if err := failed(h.liveness()); err != nil {
		t.Fatalf("not live once the loop answers again: %v", err)
	}

	// OVSDB goes down: not ready at once; live during the grace period, then not.
	set(&dbUp, false)
	h.mu.Lock()
	h.ovsDownSince = clock.Now()
	h.loopAnswered = clock.Now()
	h.mu.Unlock()
	if err := h.Ready(); err == nil || !strings.Contains(err.Error(), "ovsdb: session down") {
		t.Fatalf("ready with OVSDB down: %v", err)
	}
	if err := pods.Status(context.Background()); !errors.As(err, &ce) || ce.Code != cni.ErrPluginNotAvailable || !strings.Contains(ce.Msg, "ovsdb") {
		t.Fatalf("CNI STATUS with OVSDB down: %v", err)
	}
	clock.add(ovsDownGrace - time.Second)
	h.mu.Lock()
	h.loopAnswered = clock.Now()
	h.mu.Unlock()
	if err := failed(h.liveness()); err != nil {
		t.Fatalf("not live while OVSDB reconnects within the grace period: %v", err)
	}
	clock.add(2 * time.Second)
	if err := failed(h.liveness()); err == nil || !strings.Contains(err.Error(), "ovsdb: session down for") {
		t.Fatalf("live with OVSDB down past the grace period: %v", err)
	}
	set(&dbUp, true)
	if err := h.Ready(); err != nil {
		t.Fatalf("not ready with OVSDB back: %v", err)
	}

	// The HTTP endpoints say the same, with Kubernetes' check lines.
	a := &Agent{health: h, metrics: metrics.New(nil)}
	srv := httptest.NewServer(a.metricsHandler())
	defer srv.Close()
	for path, want := range map[string]int{"/readyz": 200, "/metrics": 200} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: HTTP %d, want %d", path, resp.StatusCode, want)
		}
	}
	h.setCNIListening(false)
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := new(strings.Builder)
	_, _ = io.Copy(body, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body.String(), "[-]cni-server failed") ||
		!strings.Contains(body.String(), "[+]first-sync ok") {
		t.Errorf("/readyz with the CNI server down: HTTP %d\n%s", resp.StatusCode, body)
	}
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// chanPinger is a flow loop whose answers the test gives: each ping arrives on the channel, and is
// answered when the test closes it.
type chanPinger chan chan struct{}

func (c chanPinger) Ping(ctx context.Context) error {
	pong := make(chan struct{})
	select {
	case c <- pong:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-pong:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestWatchdogPingsOncePerPeriod: a flow loop that answers at once is pinged once per watchdog period,
// not again at once (the two loops once played ping-pong, burning a core).
func TestWatchdogPingsOncePerPeriod(t *testing.T) {
	loop := chanPinger(make(chan chan struct{}))
	h := newHealth(nil, loop)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); h.watch(ctx) }()
	pings := 0
	window := time.After(300 * time.Millisecond) // far shorter than watchdogEvery
	for collecting := true; collecting; {
		select {
		case p := <-loop:
			pings++
			close(p)
		case <-window:
			collecting = false
		}
	}
	cancel()
	<-done
	if pings < 1 || pings > 2 {
		t.Errorf("the loop was pinged %d times in 300ms (watchdog period %s), want once", pings, watchdogEvery)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.loopAnswered.IsZero() {
		t.Error("the loop's answer was not recorded")
	}
}

// TestProfilingIsOptIn: /debug/pprof/ is served on the metrics address only with --profiling.
func TestProfilingIsOptIn(t *testing.T) {
	for _, tc := range []struct {
		profiling bool
		want      int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		a := &Agent{cfg: Config{Profiling: tc.profiling}, health: newHealth(nil, nil), metrics: metrics.New(nil)}
		srv := httptest.NewServer(a.metricsHandler())
		resp, err := http.Get(srv.URL + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("profiling=%v: /debug/pprof/ answered HTTP %d, want %d", tc.profiling, resp.StatusCode, tc.want)
		}
	}
}
