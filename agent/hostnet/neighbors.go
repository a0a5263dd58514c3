package hostnet

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/unixctl"
	"k8s.io/klog/v2"
)

// Tunnel neighbours (userspace datapath only). ovs-vswitchd's netdev datapath does not use the kernel's
// neighbour table: it keeps its own cache of tunnel next hops, learnt by snooping ARP on the bridge that
// holds the node's address, and sends every VXLAN packet to the MAC it holds there. A wrong MAC
// black-holes the tunnel to that peer until OVS snoops a better one, which may be never, since OVS
// does not re-ask for an entry in use (issue 10: an ARP answered from two interfaces left it with the
// wrong one for 30–60 s). The kernel's neighbour table is the reference: the kernel confirms its
// entries itself (unicast probes, replies) and keeps them across agent and ovs-vswitchd restarts.
//
// TunnelNeighbors compares the two for the next hop of every peer and corrects OVS (tnl/neigh/set):
//   - kernel confirmed (REACHABLE, PERMANENT): OVS must hold the same MAC, else it is set;
//   - kernel usable but unconfirmed (STALE...): a missing OVS entry gets it (better than dropping);
//     a different one is left until the kernel has re-confirmed (it is asked to, and checked again soon);
//   - kernel has nothing: a missing OVS entry makes the kernel resolve now; an OVS entry is kept and
//     verified at a slow pace (the kernel is asked to resolve once a minute).
//
// The kernel's entries are never deleted (the agent used to drop them and force a fresh ARP on every
// start; issue 10), only "used" (nodenet.ProbeNeighbor), which confirms what works.
type TunnelNeighbors struct {
	kernel NeighborKernel
	ovs    NeighborSwitch
	peers  func() []netip.Addr
	log    klog.Logger
	now    func() time.Time
	loop   *loop.Loop

	// Per next hop: when the kernel was last asked to resolve it, and since when OVS has been
	// waiting on it (missing, or disagreeing with an unconfirmed kernel entry).
	lastProbe map[netip.Addr]time.Time
	waiting   map[netip.Addr]time.Time
}

// Timing of the checks: all are cheap (one netlink dump, one route lookup per peer, one unixctl call).
const (
	neighborCheckPeriod = 10 * time.Second
	// While OVS waits on the kernel, checks come this often, for at most neighborWaitFast.
	neighborFastPeriod = 500 * time.Millisecond
	neighborWaitFast   = 15 * time.Second
	// An urgent probe (OVS missing or disagreeing) is repeated at most this often: the kernel's own
	// resolution takes up to 3 s (mcast_solicit × retrans_time).
	neighborUrgentProbe = 3 * time.Second
	// A next hop whose OVS entry the kernel cannot vouch for is re-verified this often.
	neighborVerify = time.Minute
)

type NeighborKernel interface {
	PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error)
	Probe(peer netip.Addr) error
}

type NeighborSwitch interface {
	TunnelNeighbors(ctx context.Context) ([]unixctl.TunnelNeighbor, error)
	SetTunnelNeighbor(ctx context.Context, bridge string, ip netip.Addr, mac net.HardwareAddr) error
}

// NewTunnelNeighbors keeps the tunnel neighbours of peers right: kernel is the node's neighbour table
// (nodeKernel), ovs the node's ovs-vswitchd (unixctl).
func NewTunnelNeighbors(kernel NeighborKernel, ovs NeighborSwitch, peers func() []netip.Addr, log klog.Logger) *TunnelNeighbors {
	t := &TunnelNeighbors{kernel: kernel, ovs: ovs, peers: peers,
		log: log.WithName("tunnel-neighbors"), now: time.Now,
		lastProbe: map[netip.Addr]time.Time{}, waiting: map[netip.Addr]time.Time{}}
	t.loop = loop.New(loop.Config{Name: "tunnel-neighbors", Period: neighborCheckPeriod, Log: t.log}, t.pass)
	return t
}

// Kick asks for a check now (a new peer, ovs-vswitchd reconnected). Never blocks; nil-safe for the
// kernel datapath, which has no tunnel neighbour cache of its own.
func (t *TunnelNeighbors) Kick() {
	if t != nil {
		t.loop.Kick()
	}
}

// Run checks at once, then on every kick and periodically, until ctx ends.
func (t *TunnelNeighbors) Run(ctx context.Context) {
	if t != nil {
		t.loop.Run(ctx)
	}
}

// pass is one check; while OVS waits on the kernel somewhere, the next comes soon.
func (t *TunnelNeighbors) pass(ctx context.Context) (time.Duration, error) {
	waiting, err := t.check(ctx)
	if waiting {
		return neighborFastPeriod, err
	}
	return 0, err
}

// check compares OVS's entry with the kernel's for the next hop of every peer, corrects OVS and asks the
// kernel to resolve where needed. It reports whether OVS still waits on the kernel somewhere (so the
// next check should come soon). Not safe for concurrent use: only run calls it.
func (t *TunnelNeighbors) check(ctx context.Context) (waiting bool, _ error) {
	peers := t.peers()
	if len(peers) == 0 {
		return false, nil
	}
	kernel, kerr := t.kernel.PeerNeighbors(peers)
	if kerr != nil {
		t.log.V(2).Info("some tunnel peers have no route", "err", kerr)
	}
	cached, err := t.ovs.TunnelNeighbors(ctx)
	if err != nil {
		return false, err
	}
	type key struct {
		bridge string
		ip     netip.Addr
	}
	inOVS := make(map[key]unixctl.TunnelNeighbor, len(cached))
	for _, c := range cached {
		inOVS[key{c.Bridge, c.IP}] = c
	}
	now := t.now()
	done := map[netip.Addr]bool{}
	for _, k := range kernel {
		if done[k.NextHop] { // peers behind one gateway share its entry
			continue
		}
		done[k.NextHop] = true
		o, found := inOVS[key{k.Link, k.NextHop}]
		usable := found && o.MAC != nil && !o.Stale && !o.Incomplete
		var set, urgent, verify bool
		switch {
		case k.MAC == nil && !usable:
			urgent = true
		case k.MAC == nil:
			verify = true
		case !usable:
			set, verify = true, !k.Confirmed
		case bytes.Equal(o.MAC, k.MAC):
			verify = !k.Confirmed
		case k.Confirmed:
			set = true
		default: // they differ and the kernel's entry is unconfirmed: let the kernel confirm first
			urgent = true
		}
		if set {
			var was net.HardwareAddr
			if found {
				was = o.MAC
			}
			if err := t.ovs.SetTunnelNeighbor(ctx, k.Link, k.NextHop, k.MAC); err != nil {
				return false, err
			}
			t.log.Info("set ovs-vswitchd's tunnel neighbour from the kernel's", "peer", k.Peer, "nextHop", k.NextHop,
				"bridge", k.Link, "mac", k.MAC.String(), "was", was.String(), "kernelConfirmed", k.Confirmed)
		}
		if urgent {
			if _, ok := t.waiting[k.NextHop]; !ok {
				t.waiting[k.NextHop] = now
			}
			waiting = waiting || now.Sub(t.waiting[k.NextHop]) < neighborWaitFast
		} else {
			delete(t.waiting, k.NextHop)
		}
		interval := neighborVerify
		if urgent {
			interval = neighborUrgentProbe
		}
		if last, ok := t.lastProbe[k.NextHop]; (urgent || verify) && (!ok || now.Sub(last) >= interval) {
			t.lastProbe[k.NextHop] = now
			if err := t.kernel.Probe(k.Peer); err != nil {
				t.log.V(2).Info("kernel neighbour probe failed", "peer", k.Peer, "nextHop", k.NextHop, "err", err)
			} else {
				t.log.V(4).Info("asked the kernel to confirm a tunnel next hop", "peer", k.Peer, "nextHop", k.NextHop, "urgent", urgent)
			}
		}
	}
	// Forget next hops no peer uses any more.
	for nh := range t.lastProbe {
		if !done[nh] {
			delete(t.lastProbe, nh)
		}
	}
	for nh := range t.waiting {
		if !done[nh] {
			delete(t.waiting, nh)
		}
	}
	return waiting, nil
}
