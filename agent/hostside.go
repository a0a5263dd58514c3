package agent

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/unixctl"
	"k8s.io/klog/v2"
)

// hostSide owns the node's host networking (nodenet): tun0, routes, forwarding and ofsdn's nf_tables
// table. It re-applies the whole of it after ovs-vswitchd restarts, and only the table when the
// NodePorts or hostPorts change.
type hostSide struct {
	mu  sync.Mutex
	cfg *nodenet.Config // nil until the node is set up
}

func (h *hostSide) set(cfg nodenet.Config) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cfg = &cfg
}

// ensure re-applies everything (a restarted vswitchd recreated tun0 bare).
func (h *hostSide) ensure(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg == nil {
		return nil
	}
	return nodenet.Ensure(ctx, *h.cfg)
}

// setForwards rewrites the port forwarding when it changed.
func (h *hostSide) setForwards(nodePorts []nodenet.NodePort, hostPorts []nodenet.HostPort) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg == nil {
		return nil
	}
	if reflect.DeepEqual(h.cfg.Forwards.NodePorts, nodePorts) && reflect.DeepEqual(h.cfg.Forwards.HostPorts, hostPorts) {
		return nil
	}
	next := *h.cfg
	next.Forwards.NodePorts, next.Forwards.HostPorts = nodePorts, hostPorts
	if err := nodenet.EnsureFirewall(next); err != nil {
		return err
	}
	h.cfg = &next
	return nil
}

// nodePortsOf lists the node ports the services use, one per protocol and port. The host forwards them
// into br0 with the client's address; br0 masquerades after choosing the endpoint where
// externalTrafficPolicy Cluster needs it.
func nodePortsOf(services []pipeline.ServiceState) []nodenet.NodePort {
	seen := map[[2]uint16]bool{}
	var out []nodenet.NodePort
	for _, s := range services {
		for _, p := range s.Ports {
			k := [2]uint16{uint16(p.Protocol), p.NodePort}
			if p.NodePort == 0 || seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, nodenet.NodePort{Protocol: p.Protocol, Port: p.NodePort})
		}
	}
	slices.SortFunc(out, func(a, b nodenet.NodePort) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	return out
}

// hostSync carries synced node states to the host side — UDP/SCTP conntrack flushes for endpoints
// services stopped using, NodePort and hostPort forwards in nf_tables, hostPort conflict Events — in
// a loop of its own, so a slow netlink rewrite never holds up a flow sync (and a CNI ADD waiting on
// one). States coalesce: only the latest is applied, but the conntrack entries every intermediate
// state made stale are all flushed.
type hostSync struct {
	mu      sync.Mutex
	last    *pipeline.NodeState // the last posted state, to find what the next one makes stale
	pending *pipeline.NodeState
	// problems are the NetworkPolicy problems of the last posted state, for the apply to report.
	problems map[string][]policy.Problem
	stale    []openflow.ConntrackFlush
	loop     *loop.Loop
	// apply does the work; an error makes the loop try the latest state again after a pause.
	apply func(ctx context.Context, st pipeline.NodeState, problems map[string][]policy.Problem, stale []openflow.ConntrackFlush) error
	// heldStale, when set, finds the stale entries of the first state from what conntrack holds: at
	// start there is no previous state, and endpoints removed while no agent ran would keep their UDP
	// clients forever. Until it succeeds it is asked again with each state.
	heldStale func(ctx context.Context, st pipeline.NodeState) ([]openflow.ConntrackFlush, error)
	heldDone  bool
	// After a flush, conntrack is read again verifyAfter, 2×, 4× … later (verifyChecks times, until
	// nothing stale is held) and what is still stale flushed again: in the lab a flushed UDP session
	// was now and then DNATed to its deleted endpoint again at once, though no table led there any
	// more (cause not found in OVS); a later flush moved it.
	verifyAfter  time.Duration
	verifyChecks int
	verifyLeft   int
	verifyAt     time.Time // when the next check is due (zero: none is)
	log          klog.Logger
}

// newHostSync makes the host loop: apply does the work; heldStale (nil: none) reads conntrack.
func newHostSync(log klog.Logger, apply func(context.Context, pipeline.NodeState, map[string][]policy.Problem, []openflow.ConntrackFlush) error,
	heldStale func(context.Context, pipeline.NodeState) ([]openflow.ConntrackFlush, error)) *hostSync {
	h := &hostSync{apply: apply, heldStale: heldStale, log: log.WithName("hostsync"), verifyAfter: time.Second, verifyChecks: 4}
	// A failed apply is tried again with the latest state, from a second on.
	h.loop = loop.New(loop.Config{Name: "hostsync", BackoffMin: time.Second, BackoffMax: 30 * time.Second, Log: h.log}, h.pass)
	return h
}

// post hands over a synced state and its policy problems; it never blocks.
func (h *hostSync) post(st pipeline.NodeState, problems map[string][]policy.Problem) {
	h.mu.Lock()
	if h.last != nil {
		h.stale = append(h.stale, pipeline.StaleConntrack(*h.last, st)...)
	}
	h.last, h.pending, h.problems = &st, &st, problems
	h.mu.Unlock()
	h.loop.Kick()
}

// run applies posted states until ctx ends.
func (h *hostSync) run(ctx context.Context) { h.loop.Run(ctx) }

// pass applies the latest posted state (with the conntrack entries every state since made stale), and
// when a verification of a flush is due, reads conntrack again. It asks to run again when the next
// verification is due.
func (h *hostSync) pass(ctx context.Context) (time.Duration, error) {
	verifying := !h.verifyAt.IsZero() && !time.Now().Before(h.verifyAt)
	if verifying {
		h.verifyAt = time.Time{}
	}
	h.mu.Lock()
	st, stale, problems := h.pending, h.stale, h.problems
	h.pending, h.stale = nil, nil
	recheck := st == nil && verifying // only the check: nothing new to apply unless it finds some
	if recheck {
		st = h.last
	}
	h.mu.Unlock()
	if st == nil {
		return h.untilVerify(), nil
	}
	if h.heldStale != nil && (!h.heldDone || verifying) {
		held, err := h.heldStale(ctx, *st)
		switch {
		case err != nil:
			h.log.Error(err, "reading conntrack for stale service entries; asking again with the next state")
		case verifying:
			if len(held) == 0 {
				h.verifyLeft = 0 // nothing stale is held: no more checks
			} else {
				h.log.Info("flushing again conntrack entries a flush left leading to removed endpoints", "entries", held)
			}
		default:
			h.heldDone = true
			if len(held) > 0 {
				h.log.Info("flushing conntrack entries of endpoints removed while no agent ran", "entries", len(held))
			}
		}
		stale = append(stale, held...)
	}
	if h.heldStale != nil && h.heldDone {
		// A flush (re)starts the checks; each check that still found some (or could not read
		// conntrack) uses one up and arms the next, later one. Nothing else moves the deadline: states
		// posted without a flush must not put a pending check off.
		switch {
		case !verifying && len(stale) > 0:
			h.verifyLeft = h.verifyChecks
			h.verifyAt = time.Now().Add(h.verifyAfter)
		case verifying && h.verifyLeft > 0:
			h.verifyLeft--
			if h.verifyLeft > 0 {
				h.verifyAt = time.Now().Add(h.verifyAfter << (h.verifyChecks - h.verifyLeft))
			}
		}
	}
	if recheck && len(stale) == 0 {
		return h.untilVerify(), nil
	}
	if err := h.apply(ctx, *st, problems, stale); err != nil {
		h.mu.Lock()
		if h.pending == nil {
			h.pending = st
		}
		h.mu.Unlock()
		return h.untilVerify(), fmt.Errorf("host side of a synced state: %w", err)
	}
	return h.untilVerify(), nil
}

// untilVerify is how long until the next verification (0: none is due).
func (h *hostSync) untilVerify() time.Duration {
	if h.verifyAt.IsZero() {
		return 0
	}
	return max(time.Until(h.verifyAt), time.Millisecond)
}

// applyHost carries a synced state to the host: conntrack flushes, forwards, hostPort conflicts; and
// reports the NetworkPolicy problems the sync found.
func (a *Agent) applyHost(ctx context.Context, st pipeline.NodeState, problems map[string][]policy.Problem, stale []openflow.ConntrackFlush) error {
	a.policyProblems.Report(problems)
	// UDP and SCTP entries towards endpoints a service no longer uses would keep their clients on
	// them: flush them in br0's service zone.
	if len(stale) > 0 && a.sess != nil {
		msgs := make([][]byte, 0, len(stale))
		for _, c := range stale {
			msgs = append(msgs, openflow.EncodeConntrackFlush(pipeline.ZoneService, c))
		}
		if err := a.sess.Send(ctx, msgs); err != nil {
			a.log.Error(err, "flush stale service conntrack entries", "entries", len(stale))
		} else {
			a.log.V(2).Info("flushed stale service conntrack entries", "entries", stale)
		}
	}
	if a.purger != nil {
		if purged, err := a.purger.Synced(ctx, st); err != nil {
			a.log.Error(err, "policy verdicts may lag in the datapath cache")
		} else if purged {
			a.log.V(2).Info("purged the datapath flow cache after a policy change")
		}
	}
	hostPorts, found := a.view.resolvedHostPorts()
	a.conflicts.Report(found)
	if err := a.host.setForwards(nodePortsOf(st.Services), hostPorts); err != nil {
		return fmt.Errorf("NodePort and hostPort forwarding: %w", err)
	}
	// A port another process holds is told, and tried again at the next sync; it fails no flow sync.
	if err := a.healthChecks.Sync(a.view.healthChecks()); err != nil {
		a.log.Error(err, "health check node ports")
	}
	return nil
}

// staleHeld reads what br0's conntrack holds in the service zone and returns the DNATed UDP and SCTP
// entries st no longer DNATs to (the start-up half of the stale-entry flush; hostSync does the rest).
func (a *Agent) staleHeld(ctx context.Context, st pipeline.NodeState) ([]openflow.ConntrackFlush, error) {
	entries, err := unixctl.New(a.cfg.OVSRunDir, "ovs-vswitchd").Conntrack(ctx, pipeline.ZoneService)
	if err != nil {
		return nil, err
	}
	held := make([]openflow.ConntrackFlush, 0, len(entries))
	for _, e := range entries {
		held = append(held, openflow.ConntrackFlush{Protocol: e.Protocol, Dst: e.Orig.Dst, DstPort: e.Orig.DstPort, ReplySrc: e.Reply.Src})
	}
	return pipeline.StaleConntrackHeld(st, held), nil
}
