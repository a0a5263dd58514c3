package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ofsdn/ofsdn/agent/adminpolicy"
	"github.com/ofsdn/ofsdn/agent/metrics"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/atomicfile"
	"github.com/ofsdn/ofsdn/internal/loop"
	corev1 "k8s.io/api/core/v1"
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
	// policies resolves NetworkPolicy from what the informers saw, here, outside the view's lock.
	policies *policy.Index
	// admin resolves ClusterNetworkPolicy likewise (adminpolicy.Watch fills the view's changes); onAdmin, when set, is told
	// each sync's ClusterNetworkPolicy problems on this node.
	admin   *adminpolicy.Index
	onAdmin func(adminpolicy.Report)
	// last is the last state synced and the policy problems found with it (the debug API reads it).
	last atomic.Pointer[syncedState]
	log  klog.Logger
	// applied is what the reconciler accepted for each owner: a render equal to it needs nothing.
	applied map[reconcile.Owner]reconcile.OwnerState
	// failing are owners whose latest render could not be installed.
	failing map[reconcile.Owner]*ownerFailure
	synced  uint64 // view generation of the last successful sync
	// loop runs syncs: on every trigger, when a failing owner is due, after a failed sync with back-off;
	// between syncs it answers the watchdog's pings (health.go).
	loop *loop.Loop
	// resyncs are the full resyncs from the switch asked of the loop (after a reconnect, periodically).
	resyncMu sync.Mutex
	resyncs  []resyncRequest
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
	metrics        *metrics.Metrics // optional
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

// syncedState is a state the flow loop synced, with its policies' problems.
type syncedState struct {
	state    pipeline.NodeState
	problems map[string][]policy.Problem
}

// flowSyncHooks are the parts of the agent a flow sync reports to; each is optional.
type flowSyncHooks struct {
	metrics *metrics.Metrics
	// host receives every synced state (port forwards, conntrack flushes) without the sync waiting.
	host *hostSync
	// onFailure is told that an owner failed (again).
	onFailure func(reconcile.Owner, *ownerFailure)
	// onIndexChanged is called after a sync that changed the set of owners (the agent saves the owner
	// index flowctl reads).
	onIndexChanged func(*reconcile.OwnerIndex)
	// onAdmin is told each sync's ClusterNetworkPolicy problems on this node.
	onAdmin func(adminpolicy.Report)
}

// newFlowSync makes the flow sync of view. r is the bridge's reconciler; an agent gets it only once
// it opened the bridge and hands it over with useBridge (nil until then: no sync runs).
func newFlowSync(view *nodeView, r *reconcile.Reconciler, hooks flowSyncHooks, log klog.Logger) *flowSync {
	f := &flowSync{view: view, r: r, log: log.WithName("flowsync"), policies: policy.NewIndex(view.nodeName),
		admin: adminpolicy.NewIndex(view.nodeName), onAdmin: hooks.onAdmin, metrics: hooks.metrics, host: hooks.host, onFailure: hooks.onFailure, onIndexChanged: hooks.onIndexChanged,
		applied: map[reconcile.Owner]reconcile.OwnerState{}, failing: map[reconcile.Owner]*ownerFailure{}, clock: time.Now}
	f.loop = loop.New(loop.Config{Name: "flowsync", Log: f.log, Quiet: func(err error) bool { return errors.Is(err, errNotReady) }}, f.pass)
	return f
}

// useBridge hands over the reconciler of the bridge the agent opened (Agent.openBridge).
func (f *flowSync) useBridge(r *reconcile.Reconciler) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.r = r
}

// Trigger asks the background loop for a sync; bursts of events coalesce into one (the informer
// watchers' Sync).
func (f *flowSync) Trigger() { f.loop.Kick() }

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

// SyncThrough is syncThrough for attachments and egress claims (attach.Flows, egress.Sync): they wait
// for their owners' flows, not for the statistics.
func (f *flowSync) SyncThrough(ctx context.Context, gen uint64, owners ...reconcile.Owner) error {
	_, err := f.syncThrough(ctx, gen, owners...)
	return err
}

// syncNow renders and reconciles the latest view synchronously.
func (f *flowSync) syncNow(ctx context.Context) (reconcile.SyncStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncLocked(ctx)
}

func (f *flowSync) syncLocked(ctx context.Context) (reconcile.SyncStats, error) {
	if err := f.view.Ready(); err != nil {
		return reconcile.SyncStats{}, err
	}
	start := f.clock()
	snap := f.view.takeSnapshot()
	st, gen := snap.state, snap.generation
	problems := f.resolvePolicies(&st, snap.policies)
	f.resolveAdmin(&st, snap.policies)
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
	f.last.Store(&syncedState{state: st, problems: problems})
	f.reportAdmin(renderFailed)
	if f.host != nil {
		f.host.post(st, problems)
	}
	if len(snap.waiting) > 0 {
		f.log.V(2).Info("pods wait for their namespace's VNID", "pods", snap.waiting)
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
		f.metrics.ObserveSync("apply", res.Stats, f.clock().Sub(start))
	}
	return res.Stats, nil
}

// resolvePolicies brings the policy index up to date with the snapshot's changes and, in networkpolicy
// mode, resolves the policies into st with each local pod's isolation; it returns the policies'
// problems (none outside networkpolicy mode, where nothing is enforced).
func (f *flowSync) resolvePolicies(st *pipeline.NodeState, in policyInput) map[string][]policy.Problem {
	f.policies.Apply(in.changes)
	if st.Mode != pipeline.ModeNetworkPolicy {
		return nil
	}
	f.policies.SetLocal(in.local)
	f.policies.SetNodes(in.nodeAddrs, st.ClusterNetworks)
	st.Policies = f.policies.Resolve()
	iso := policy.Isolation(st.Policies)
	for i := range st.Pods {
		p := &st.Pods[i]
		p.IngressIsolated, p.EgressIsolated = iso[p.OFPort][0], iso[p.OFPort][1]
	}
	return f.policies.Problems()
}

// lastSynced returns the last state synced (false before the first sync).
func (f *flowSync) lastSynced() (syncedState, bool) {
	s := f.last.Load()
	if s == nil {
		return syncedState{}, false
	}
	return *s, true
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
	resyncPeriodic  = metrics.DriftPeriodic
	resyncReconnect = metrics.DriftReconnect
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
		f.metrics.ObserveSync("resync", res.Stats, f.clock().Sub(start))
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
	f.resyncMu.Lock()
	f.resyncs = append(f.resyncs, resyncRequest{trigger: trigger, done: done})
	f.resyncMu.Unlock()
	f.loop.Kick()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run syncs until ctx ends (see loop).
func (f *flowSync) run(ctx context.Context) { f.loop.Run(ctx) }

// pass is one pass of the loop: the resyncs asked for, then a sync of the latest view. It asks to run
// again when the earliest failing owner is due.
func (f *flowSync) pass(ctx context.Context) (time.Duration, error) {
	f.resyncMu.Lock()
	resyncs := f.resyncs
	f.resyncs = nil
	f.resyncMu.Unlock()
	for _, req := range resyncs {
		f.mu.Lock()
		err := f.resyncLocked(ctx, req.trigger)
		f.mu.Unlock()
		req.done <- err
		if err != nil && ctx.Err() == nil {
			f.log.Error(err, "resync from the switch", "trigger", req.trigger)
		}
	}
	if _, err := f.syncNow(ctx); err != nil {
		return 0, err
	}
	if next := f.nextRetry(); !next.IsZero() {
		return max(next.Sub(f.clock()), 10*time.Millisecond), nil
	}
	return 0, nil
}

// driftChecks asks the loop for a full resync every period (drift repair).
func (f *flowSync) driftChecks(period time.Duration) *loop.Loop {
	return loop.New(loop.Config{Name: "drift-check", Period: period, FirstAfter: period, Log: f.log},
		func(ctx context.Context) (time.Duration, error) { return 0, f.resync(ctx, resyncPeriodic) })
}

// resolveAdmin brings the ClusterNetworkPolicy index up to date and resolves the policies into st
// (every mode).
func (f *flowSync) resolveAdmin(st *pipeline.NodeState, in policyInput) {
	f.admin.Apply(in.admin)
	f.admin.SetLocal(in.local)
	st.AdminPolicies = f.admin.Resolve()
}

// reportAdmin tells onAdmin the problems of every policy that selects a local pod, its flows' render or
// install failures among them.
func (f *flowSync) reportAdmin(renderFailed map[reconcile.Owner]error) {
	if f.onAdmin == nil {
		return
	}
	rep := adminpolicy.Report{}
	for name, ps := range f.admin.Problems() {
		if !f.admin.Selects(name) {
			continue
		}
		ps = slices.Clone(ps)
		o := pipeline.AdminPolicyOwner(name)
		if fail := f.failing[o]; fail != nil {
			ps = append(ps, adminpolicy.Problem{Reason: adminpolicy.ReasonRenderFailed, Message: fmt.Sprintf("its flows are not installed: %v", fail.err)})
		} else if err := renderFailed[o]; err != nil {
			ps = append(ps, adminpolicy.Problem{Reason: adminpolicy.ReasonRenderFailed, Message: fmt.Sprintf("its flows cannot be rendered: %v", err)})
		}
		rep[name] = ps
	}
	f.onAdmin(rep)
}

// repairedOwners lists the owners a resync repaired with what it sent each, for the log.
func repairedOwners(m map[reconcile.Owner]reconcile.SyncStats) []string {
	out := make([]string, 0, len(m))
	for _, o := range reconcile.SortedOwnerKeys(m) {
		st := m[o]
		var parts []string
		for _, c := range []struct {
			n    int
			what string
		}{{st.FlowAdds, "+%d flows"}, {st.FlowModifies, "~%d flows"}, {st.FlowDeletes, "-%d flows"},
			{st.GroupAdds, "+%d groups"}, {st.GroupModifies, "~%d groups"}, {st.GroupDeletes, "-%d groups"}} {
			if c.n > 0 {
				parts = append(parts, fmt.Sprintf(c.what, c.n))
			}
		}
		out = append(out, o.String()+" ("+strings.Join(parts, ", ")+")")
	}
	return out
}

// saveOwnerIndex writes the owner index flowctl names flows' owners with.
func (a *Agent) saveOwnerIndex(x *reconcile.OwnerIndex) {
	data, err := json.Marshal(x)
	if err == nil {
		err = atomicfile.Write(filepath.Join(a.cfg.OVSRunDir, a.cfg.Bridge+".owners.json"), data, 0o644)
	}
	if err != nil {
		a.log.Error(err, "saving the owner index (flowctl shows owner hashes instead of names meanwhile)")
	}
}

// ownerFailed reports an owner that keeps its last good flows with a Warning Event on the API object
// it renders, if it has one (flowSync logs it and counts it in the metrics).
func (a *Agent) ownerFailed(o reconcile.Owner, fail *ownerFailure) {
	if fail.attempts > 1 || a.events == nil {
		return // one Event per failure, not per retry
	}
	if ref := ownerObject(o); ref != nil {
		a.events.Eventf(ref, corev1.EventTypeWarning, "FlowsNotInstalled",
			"ofsdn could not install this object's flows on node %s; it keeps its previous flows and retries: %v", a.cfg.NodeName, fail.err)
	}
}

// ownerObject is the API object an owner's flows render, when there is one.
func ownerObject(o reconcile.Owner) *corev1.ObjectReference {
	obj, ok := pipeline.ObjectOf(o)
	if !ok {
		return nil
	}
	return &corev1.ObjectReference{Kind: string(obj.Kind), APIVersion: obj.Kind.APIVersion(), Namespace: obj.Namespace, Name: obj.Name}
}
