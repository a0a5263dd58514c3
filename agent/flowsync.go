package agent

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/flows"
	"k8s.io/klog/v2"
)

// flowSync renders the node view and reconciles exactly the owners whose flows changed, in one bundle
// per change. It is the only writer of the bridge's flows.
type flowSync struct {
	mu       sync.Mutex // one sync at a time: CNI requests and informer events serialise here
	view     *nodeView
	r        *flows.Reconciler
	renderer flows.Renderer // remembers each service's render: one endpoint change renders one service
	log      klog.Logger
	rendered map[flows.Owner]flows.OwnerState // what the reconciler was last given, per owner
	synced   uint64                           // view generation of the last successful sync
	kick     chan struct{}
	// onSynced, when set, observes each successful sync (metrics, convergence benchmarks).
	onSynced func(flows.SyncStats, time.Duration)
	// afterSync, when set, carries a synced state to the rest of the node (port forwarding, conntrack
	// flushes); prev is the state of the sync before.
	afterSync func(ctx context.Context, prev, cur flows.NodeState)
	last      flows.NodeState
}

func newFlowSync(view *nodeView, r *flows.Reconciler, log klog.Logger) *flowSync {
	return &flowSync{view: view, r: r, log: log.WithName("flowsync"), rendered: map[flows.Owner]flows.OwnerState{},
		kick: make(chan struct{}, 1)}
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
// and callers whose change that sync already covered return without a sync of their own.
func (f *flowSync) syncThrough(ctx context.Context, gen uint64) (flows.SyncStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.synced >= gen {
		return flows.SyncStats{}, nil
	}
	return f.syncLocked(ctx)
}

// syncNow renders and reconciles the latest view synchronously.
func (f *flowSync) syncNow(ctx context.Context) (flows.SyncStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncLocked(ctx)
}

func (f *flowSync) syncLocked(ctx context.Context) (flows.SyncStats, error) {
	if err := f.view.ready(); err != nil {
		return flows.SyncStats{}, err
	}
	start := time.Now()
	st, pending, gen := f.view.snapshot()
	owners, err := f.renderer.Render(st)
	if err != nil {
		return flows.SyncStats{}, err
	}
	var changed []flows.Owner
	for o, os := range owners {
		if prev, ok := f.rendered[o]; !ok || !reflect.DeepEqual(prev, os) {
			changed = append(changed, o)
		}
	}
	for o := range f.rendered {
		if _, still := owners[o]; !still {
			changed = append(changed, o)
		}
	}
	// Clear every changed owner before setting any: a flow may move between owners in one change
	// (a deleted pod's IP given to a new pod), and the reconciler refuses two owners for one flow.
	for _, o := range changed {
		f.r.DeleteOwner(o)
	}
	for _, o := range changed {
		if os, ok := owners[o]; ok {
			if err := f.r.SetDesired(o, os.Flows, os.Groups); err != nil {
				f.rendered = map[flows.Owner]flows.OwnerState{}
				return flows.SyncStats{}, err
			}
		}
	}
	if len(changed) == 0 {
		f.synced = gen
		f.after(ctx, st)
		return flows.SyncStats{}, nil
	}
	stats, err := f.r.SyncOwners(ctx, changed...)
	if err != nil {
		// The reconciler's desired state is set; forget what we rendered so the next sync retries all.
		f.rendered = map[flows.Owner]flows.OwnerState{}
		return stats, err
	}
	f.rendered = owners
	f.synced = gen
	f.after(ctx, st)
	if len(pending) > 0 {
		f.log.V(2).Info("pods wait for their namespace's VNID", "pods", pending)
	}
	f.log.V(2).Info("flows synced", "owners", len(changed), "stats", stats.String(), "duration", time.Since(start))
	if f.onSynced != nil {
		f.onSynced(stats, time.Since(start))
	}
	return stats, nil
}

func (f *flowSync) after(ctx context.Context, st flows.NodeState) {
	if f.afterSync != nil {
		f.afterSync(ctx, f.last, st)
	}
	f.last = st
}

// run syncs on every trigger until ctx ends, retrying failures with backoff.
func (f *flowSync) run(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		if _, err := f.syncNow(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			f.log.Info("flow sync failed; retrying", "err", err, "retryIn", backoff)
			time.AfterFunc(backoff, f.trigger)
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
	}
}
