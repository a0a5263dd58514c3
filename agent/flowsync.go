package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"k8s.io/klog/v2"
)

// flowSync renders the node view and applies exactly the owners whose flows changed, in one bundle
// per change. It is the only writer of the bridge's flows: CNI requests, informer events, resyncs
// after OVS reconnects and the periodic drift check all go through it, one at a time.
//
// An owner whose render fails, or whose new flows the reconciler refuses (a conflict, or OVS saying
// no), keeps its last good flows and is retried with back-off; it is reported (log, metric, a Warning
// Event on its API object) and every other owner keeps syncing.
type flowSync struct {
	mu       sync.Mutex // one sync at a time
	view     *nodeView
	r        *reconcile.Reconciler
	renderer pipeline.Renderer // remembers each service's render: one endpoint change renders one service
	log      klog.Logger
	// applied is what the reconciler accepted for each owner: a render equal to it needs nothing.
	applied map[reconcile.Owner]reconcile.OwnerState
	// failing are owners whose latest render could not be installed.
	failing map[reconcile.Owner]*ownerFailure
	synced  uint64 // view generation of the last successful sync
	kick    chan struct{}
	// resyncWanted asks the loop for a full resync from the switch (after a reconnect, periodically).
	resyncWanted chan resyncRequest
	// ping is answered by the loop between syncs: the liveness check (health.go) of a loop that is stuck.
	ping chan chan struct{}
	// onSynced, when set, observes each sync that sent something (metrics, convergence benchmarks).
	onSynced func(reconcile.SyncStats, time.Duration)
	// onFailure, when set, tells the rest of the agent that an owner failed (again).
	onFailure func(reconcile.Owner, *ownerFailure)
	// synced states go to the host side (port forwards, conntrack flushes) without waiting for it.
	host *hostSync
	// onIndexChanged, when set, is called after a sync that changed the set of owners (the agent saves
	// the owner index flowctl reads).
	onIndexChanged func(*reconcile.OwnerIndex)
	indexGen       uint64
	metrics        *Metrics // optional
	health         *health  // optional: CNI STATUS answers from it (health.go)
	clock          func() time.Time
	// injected owners are added to every render: tests use it to make an owner the switch refuses.
	injected map[reconcile.Owner]reconcile.OwnerState
}

// ownerFailure is one owner's failed state and its retry schedule.
type ownerFailure struct {
	state    reconcile.OwnerState // the render that failed (zero for a render error)
	err      error
	attempts int
	retryAt  time.Time
}

// Retry back-off of a failing owner: 1 s doubling to 5 minutes. An owner whose render changes is
// retried at once (the change may be the fix).
const (
	ownerRetryMin = time.Second
	ownerRetryMax = 5 * time.Minute
)

func newFlowSync(view *nodeView, r *reconcile.Reconciler, log klog.Logger) *flowSync {
	return &flowSync{view: view, r: r, log: log.WithName("flowsync"),
		applied: map[reconcile.Owner]reconcile.OwnerState{}, failing: map[reconcile.Owner]*ownerFailure{},
		kick: make(chan struct{}, 1), resyncWanted: make(chan resyncRequest, 1), ping: make(chan chan struct{}, 1), clock: time.Now}
}

// trigger asks the background loop for a sync; bursts of events coalesce into one.
func (f *flowSync) trigger() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// syncThrough returns once the view's generation gen is on the bridge (a CNI ADD returns only once its
// pod's flows are in). Concurrent callers coalesce: whoever gets the lock first renders the latest view,
// and callers whose change that sync already covered return without a sync of their own. When any of
// the given owners is failing, it says so: its flows are not what gen asked for.
func (f *flowSync) syncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) (reconcile.SyncStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st reconcile.SyncStats
	if f.synced < gen {
		var err error
		if st, err = f.syncLocked(ctx); err != nil {
			return st, err
		}
	}
	for _, o := range owners {
		if fail := f.failing[o]; fail != nil {
			return st, fmt.Errorf("flows of %s not installed: %w", o, fail.err)
		}
	}
	return st, nil
}

// syncNow renders and reconciles the latest view synchronously.
func (f *flowSync) syncNow(ctx context.Context) (reconcile.SyncStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncLocked(ctx)
}

func (f *flowSync) syncLocked(ctx context.Context) (reconcile.SyncStats, error) {
	if err := f.view.ready(); err != nil {
		return reconcile.SyncStats{}, err
	}
	start := f.clock()
	st, pending, gen := f.view.snapshot()
	owners, renderFailed, err := f.renderer.Render(st)
	if err != nil {
		return reconcile.SyncStats{}, err
	}
	for o, os := range f.injected {
		owners[o] = os
	}
	now := f.clock()
	changes := reconcile.Changes(f.applied, owners)
	for o := range f.failing {
		if _, changed := changes[o]; !changed {
			if _, rendered := owners[o]; rendered {
				delete(f.failing, o) // its input came back to what is installed
			}
		}
	}
	for o, os := range changes {
		switch fail := f.failing[o]; {
		case os == nil && renderFailed[o] != nil:
			delete(changes, o) // it failed to render: it keeps its last good flows
		case os != nil && fail != nil && now.Before(fail.retryAt) && reflect.DeepEqual(fail.state, *os):
			delete(changes, o) // the same state failed: wait for its retry
		}
	}
	for o := range f.failing {
		if _, still := owners[o]; !still && renderFailed[o] == nil {
			if _, applied := f.applied[o]; !applied {
				delete(f.failing, o) // a failed new owner that is gone again
			}
		}
	}
	var res reconcile.Result
	if len(changes) > 0 {
		if res, err = f.r.Apply(ctx, changes); err != nil {
			// Nothing of this sync is known to be installed: the next one tries all of it again.
			return res.Stats, err
		}
	}
	for o, os := range changes {
		if ferr := res.Failed[o]; ferr != nil {
			var state reconcile.OwnerState
			if os != nil {
				state = *os
			}
			f.fail(o, state, ferr, now)
			continue
		}
		delete(f.failing, o)
		if os == nil {
			delete(f.applied, o)
		} else {
			f.applied[o] = *os
		}
	}
	for o, rerr := range renderFailed {
		f.fail(o, reconcile.OwnerState{}, fmt.Errorf("render: %w", rerr), now)
	}
	f.synced = gen
	if f.metrics != nil {
		f.metrics.FailingOwners.Set(float64(len(f.failing)))
	}
	if f.host != nil {
		f.host.post(st)
	}
	if len(pending) > 0 {
		f.log.V(2).Info("pods wait for their namespace's VNID", "pods", pending)
	}
	for _, o := range res.Collisions {
		f.log.Info("owner hash collision: dumps name both owners; diffs stay exact", "owner", o.String())
	}
	if res.Rebuilt {
		f.log.Info("bridge rebuilt: it held flows of another pipeline version", "version", pipeline.PipelineVersion)
	}
	f.indexChanged()
	if len(changes) > 0 {
		f.log.V(2).Info("flows synced", "owners", len(changes), "failed", len(res.Failed), "stats", res.Stats.String(), "duration", f.clock().Sub(start))
		if f.onSynced != nil {
			f.onSynced(res.Stats, f.clock().Sub(start))
		}
		f.metrics.observeSync("apply", res.Stats, f.clock().Sub(start))
	}
	return res.Stats, nil
}

// fail records an owner's failure and schedules its retry.
func (f *flowSync) fail(o reconcile.Owner, state reconcile.OwnerState, err error, now time.Time) {
	prev := f.failing[o]
	fail := &ownerFailure{state: state, err: err, attempts: 1}
	if prev != nil {
		fail.attempts = prev.attempts + 1
	}
	backoff := ownerRetryMin << min(fail.attempts-1, 20)
	fail.retryAt = now.Add(min(backoff, ownerRetryMax))
	f.failing[o] = fail
	if f.metrics != nil {
		f.metrics.OwnerFailures.WithLabelValues(o.Category.String()).Inc()
	}
	if prev == nil || prev.err.Error() != err.Error() {
		f.log.Error(err, "owner's flows not installed; it keeps its last good flows and is retried", "owner", o.String(),
			"attempt", fail.attempts, "retryIn", fail.retryAt.Sub(now))
	} else {
		f.log.V(2).Info("owner still failing", "owner", o.String(), "attempt", fail.attempts, "err", err)
	}
	if f.onFailure != nil {
		f.onFailure(o, fail)
	}
}

// nextRetry is when the earliest failing owner is due again (zero: none is).
func (f *flowSync) nextRetry() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var next time.Time
	for _, fail := range f.failing {
		if next.IsZero() || fail.retryAt.Before(next) {
			next = fail.retryAt
		}
	}
	return next
}

// failingOwners lists the owners that are failing now.
func (f *flowSync) failingOwners() map[reconcile.Owner]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[reconcile.Owner]error, len(f.failing))
	for o, fail := range f.failing {
		out[o] = fail.err
	}
	return out
}

func (f *flowSync) indexChanged() {
	if g := f.r.IndexGeneration(); g != f.indexGen && f.onIndexChanged != nil {
		f.onIndexChanged(f.r.OwnerIndex())
		f.indexGen = g
	}
}

// Triggers of a full resync (drift check), as the metrics label them.
const (
	resyncPeriodic  = "periodic"
	resyncReconnect = "reconnect"
)

type resyncRequest struct {
	trigger string
	done    chan error
}

// resyncLocked re-reads the switch and repairs what differs from the desired state.
func (f *flowSync) resyncLocked(ctx context.Context, trigger string) error {
	start := f.clock()
	res, err := f.r.Resync(ctx)
	if f.metrics != nil {
		f.metrics.DriftChecks.WithLabelValues(trigger).Inc()
		f.metrics.DriftRepairs.WithLabelValues(trigger).Add(float64(res.Stats.Messages))
		f.metrics.observeSync("resync", res.Stats, f.clock().Sub(start))
	}
	if err != nil {
		return err
	}
	for o, ferr := range res.Failed {
		// An owner the switch now refuses (it accepted it before): retry it like any failure.
		f.fail(o, f.applied[o], ferr, f.clock())
		delete(f.applied, o)
	}
	if res.Stats.Changes() > 0 {
		f.log.Info("resync repaired drift", "trigger", trigger, "stats", res.Stats.String(), "owners", repairedOwners(res.Repaired))
	}
	f.indexChanged()
	return nil
}

// resync runs a full resync in the sync loop and waits for it (the session's reconnect hook, the
// periodic drift check).
func (f *flowSync) resync(ctx context.Context, trigger string) error {
	done := make(chan error, 1)
	select {
	case f.resyncWanted <- resyncRequest{trigger: trigger, done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run syncs on every trigger and resync request until ctx ends, retrying failures with back-off and
// failing owners when they are due.
func (f *flowSync) run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		case <-retry.C:
		case pong := <-f.ping:
			close(pong)
			continue
		case req := <-f.resyncWanted:
			f.mu.Lock()
			err := f.resyncLocked(ctx, req.trigger)
			f.mu.Unlock()
			req.done <- err
			if err != nil && ctx.Err() == nil {
				f.log.Error(err, "resync from the switch")
			}
		}
		if _, err := f.syncNow(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, errNotReady) {
				f.log.Info("flow sync failed; retrying", "err", err, "retryIn", backoff)
			}
			time.AfterFunc(backoff, f.trigger)
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if next := f.nextRetry(); !next.IsZero() {
			retry.Reset(max(time.Until(next), 10*time.Millisecond))
		}
	}
}

// resyncEvery asks the loop for a full resync every period (drift repair).
func (f *flowSync) resyncEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := f.resync(ctx, resyncPeriodic); err != nil && ctx.Err() == nil {
				f.log.Error(err, "periodic resync")
			}
		}
	}
}
