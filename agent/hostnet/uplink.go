package hostnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/loop"
	"github.com/ofsdn/ofsdn/ovsdb"
	"k8s.io/klog/v2"
)

// Encapsulation none (flows/pipeline/uplink.go says how the packets go): Uplink does the node's side
// of it — the OVS bridge that holds the node's address, the patch port pair between it and br0, which
// peers are on its segment — and records the outcome in the view; the renderer decides from there. It
// also keeps the view's copy of tun0's MAC, in every mode.
//
// It falls back to VXLAN rather than refusing: a node whose address is not on an OVS bridge of its
// ovs-vswitchd (or one of another datapath type) keeps tunnelling to every peer, with a Warning Event
// (EncapsulationFallback) on its Node that says why; a peer whose address is not on-link through the
// uplink bridge (the kernel routes it through a gateway, or out of another interface) gets VXLAN, and the
// agent logs which. Every node accepts VXLAN from every peer in every mode, so a mixed cluster works.
//
// After a change back to vxlan the uplink port stays Config.UplinkLinger longer (still accepting what
// peers that have not switched yet send through it), then goes. The deadline is kept in br0's
// external_ids (lingerKey), so an agent restarted in that window keeps the port until then too.

// UplinkView is the agent's view as the uplink job uses it.
type UplinkView interface {
	// Peers is the encapsulation, this node's address and the other nodes by address.
	Peers() (encap pipeline.Encapsulation, nodeIP netip.Addr, peers map[netip.Addr][]string)
	// SetUplink records the uplink bridge br0 is patched into ("" none), the peers (by node name) on
	// its segment and tun0's MAC (nil: unknown, keep the last); it reports whether anything changed.
	SetUplink(bridge string, onSegment map[string]bool, gatewayMAC net.HardwareAddr) bool
}

// Names of the patch port pair: br0's end (PortUplink) and the uplink bridge's end.
const (
	uplinkPort     = pipeline.PortNameUplink
	uplinkPeerPort = "patch-ofsdn-br0"
)

// DefaultUplinkLinger is how long the uplink port outlives encapsulation none by default; uplinkCheckPeriod
// how often the segment is looked at again without a reason.
const (
	DefaultUplinkLinger = 30 * time.Second
	uplinkCheckPeriod   = 30 * time.Second
)

// lingerKey is br0's external_ids key holding the lingering uplink port's deadline (RFC 3339; "" none).
const lingerKey = "ofsdn-uplink-linger-until"

// UplinkHost is what the uplink job asks the node (the real one: Node).
type UplinkHost interface {
	Uplink(nodeIP netip.Addr) (string, error)
	PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error)
	GatewayMAC() (net.HardwareAddr, error)
}

// Node is the node's network namespace ("" the agent's own), as the host jobs ask it.
type Node struct{ NetNS string }

func (n Node) Uplink(ip netip.Addr) (string, error) { return nodenet.Uplink(n.NetNS, ip) }
func (n Node) PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error) {
	return nodenet.PeerNeighbors(n.NetNS, peers)
}
func (n Node) GatewayMAC() (net.HardwareAddr, error) {
	return nodenet.LinkMAC(n.NetNS, pipeline.PortNameTun0)
}
func (n Node) Probe(peer netip.Addr) error { return nodenet.ProbeNeighbor(n.NetNS, peer) }

// UplinkOVS is the part of OVSDB the uplink job uses.
type UplinkOVS interface {
	BridgeDatapath(ctx context.Context, name string) (string, bool, error)
	EnsurePatchPair(ctx context.Context, aBridge, a string, aOFPort int, bBridge, b string) (int, error)
	DeletePort(ctx context.Context, bridge, name string) error
	BridgeExternalIDs(ctx context.Context, bridge string) (map[string]string, error)
	SetBridgeExternalIDs(ctx context.Context, bridge string, set map[string]string) error
}

var _ UplinkOVS = (*ovsdb.Client)(nil)

// Uplink keeps br0's uplink port for encapsulation none (see the top of this file).
type Uplink struct {
	view     UplinkView
	changed  func() // the view changed: a flow sync
	host     UplinkHost
	ovs      UplinkOVS
	bridge   string // br0
	datapath string // br0's datapath type
	linger   time.Duration
	log      klog.Logger
	// warn reports a problem on the Node (an Event); nil: log only.
	warn func(reason, message string)
	now  func() time.Time
	loop *loop.Loop

	mu          sync.Mutex
	lingerUntil time.Time // the uplink port stays until then although encapsulation is vxlan
	patched     string    // the uplink bridge the pair was last made to ("" none)
	told        string    // the last fallback reason reported
	offSegment  string    // the last list of peers off the segment that was logged
	swept       bool      // a pair left by an earlier run was looked for
	savedLinger string    // lingerKey's value in br0's external_ids, once read or written
	lingerRead  bool
}

// UplinkConfig configures the uplink job.
type UplinkConfig struct {
	Bridge   string        // br0
	Datapath string        // br0's datapath type: the uplink bridge must have the same
	Linger   time.Duration // DefaultUplinkLinger when 0
	Logger   klog.Logger
}

// UplinkDeps are what the uplink job talks to. Changed asks for a flow sync; Warn (optional) records a
// Warning Event on the Node.
type UplinkDeps struct {
	View    UplinkView
	Host    UplinkHost
	OVS     UplinkOVS
	Changed func()
	Warn    func(reason, message string)
}

// NewUplink makes the uplink job; Run runs it, Ensure does one check at once.
func NewUplink(cfg UplinkConfig, deps UplinkDeps) *Uplink {
	if cfg.Linger == 0 {
		cfg.Linger = DefaultUplinkLinger
	}
	u := &Uplink{view: deps.View, changed: deps.Changed, host: deps.Host, ovs: deps.OVS, bridge: cfg.Bridge, datapath: cfg.Datapath,
		linger: cfg.Linger, warn: deps.Warn, log: cfg.Logger.WithName("uplink"), now: time.Now}
	u.loop = loop.New(loop.Config{Name: "uplink", Period: uplinkCheckPeriod, Log: u.log}, u.pass)
	return u
}

// kick asks for a check now (encapsulation or peers changed, ovs-vswitchd reconnected); never blocks.
func (u *Uplink) Kick() {
	if u != nil {
		u.loop.Kick()
	}
}

// run checks on every kick and periodically until ctx ends.
func (u *Uplink) Run(ctx context.Context) { u.loop.Run(ctx) }

// pass is one check; while the uplink port lingers it asks to run again when the linger ends.
func (u *Uplink) pass(ctx context.Context) (time.Duration, error) {
	err := u.Ensure(ctx)
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.lingerUntil.IsZero() && u.patched != "" {
		return max(u.lingerUntil.Sub(u.now()), 10*time.Millisecond), err
	}
	return 0, err
}

// Ensure brings the uplink port and the view in line with the encapsulation; it asks for a flow sync
// when the view changed.
func (u *Uplink) Ensure(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	encap, nodeIP, peers := u.view.Peers()

	var errs []error
	gwMAC, err := u.host.GatewayMAC()
	if err != nil {
		errs = append(errs, fmt.Errorf("tun0's MAC: %w", err))
	}
	now := u.now()
	if !u.swept {
		// The first check: an earlier run may have left the pair (in none mode, or lingering when it
		// stopped); in vxlan it stays until that run's deadline, or goes now.
		u.swept = true
		if encap != pipeline.EncapNone {
			if name, why := u.findUplink(ctx, nodeIP); why == "" {
				u.patched = name
				if u.lingerUntil = u.loadLinger(ctx); u.lingerUntil.IsZero() {
					u.lingerUntil = now
				}
			}
		}
	}
	if encap == pipeline.EncapNone {
		u.lingerUntil = time.Time{}
	} else if u.patched != "" && u.lingerUntil.IsZero() {
		u.lingerUntil = now.Add(u.linger)
		u.log.Info("encapsulation vxlan: the uplink port stays a while for peers still sending through it", "for", u.linger)
	}
	keep := encap == pipeline.EncapNone || (u.patched != "" && now.Before(u.lingerUntil))

	var uplink string
	onSegment := map[string]bool{}
	if keep {
		name, why := u.findUplink(ctx, nodeIP)
		if why != "" {
			u.fallback(why)
		} else if _, err := u.ovs.EnsurePatchPair(ctx, u.bridge, uplinkPort, int(pipeline.PortUplink), name, uplinkPeerPort); err != nil {
			errs = append(errs, err)
			u.fallback(fmt.Sprintf("the patch port between %s and %s failed: %v", u.bridge, name, err))
		} else {
			uplink, u.patched = name, name
			u.fallback("")
			onSegment = u.segment(peers, name)
		}
	}
	if uplink == "" && u.patched != "" {
		if err := u.removePatch(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if !keep {
		u.lingerUntil = time.Time{}
	}
	if err := u.saveLinger(ctx); err != nil {
		errs = append(errs, err)
	}

	if u.view.SetUplink(uplink, onSegment, gwMAC) {
		u.log.Info("uplink", "encapsulation", encap, "uplinkBridge", uplink, "directPeers", len(onSegment), "gatewayMAC", gwMAC.String())
		u.changed()
	}
	return errors.Join(errs...)
}

// findUplink finds the OVS bridge holding the node's address, or says why there is none to use.
func (u *Uplink) findUplink(ctx context.Context, nodeIP netip.Addr) (string, string) {
	name, err := u.host.Uplink(nodeIP)
	if err != nil {
		return "", err.Error()
	}
	if name == u.bridge {
		return "", fmt.Sprintf("the node address %s is on %s itself", nodeIP, u.bridge)
	}
	dp, ok, err := u.ovs.BridgeDatapath(ctx, name)
	switch {
	case err != nil:
		return "", err.Error()
	case !ok:
		return "", fmt.Sprintf("the node address %s is on %s, which is not an Open vSwitch bridge of this ovs-vswitchd", nodeIP, name)
	case dp != u.datapath:
		return "", fmt.Sprintf("the node address %s is on OVS bridge %s of datapath %q, %s is %q: patch ports join bridges of one datapath only",
			nodeIP, name, dp, u.bridge, u.datapath)
	}
	return name, ""
}

// fallback reports (once per reason) that this node tunnels to every peer although encapsulation is
// none; "" clears it.
func (u *Uplink) fallback(why string) {
	if why == u.told {
		return
	}
	u.told = why
	if why == "" {
		return
	}
	msg := "encapsulation none: this node uses VXLAN to every peer: " + why
	u.log.Error(errors.New(why), "encapsulation none: this node uses VXLAN to every peer")
	if u.warn != nil {
		u.warn("EncapsulationFallback", msg)
	}
}

// segment tells which peers (by node name) are on-link through the uplink bridge; it logs the others
// when that list changes.
func (u *Uplink) segment(peers map[netip.Addr][]string, uplink string) map[string]bool {
	addrs := make([]netip.Addr, 0, len(peers))
	for a := range peers {
		addrs = append(addrs, a)
	}
	neigh, err := u.host.PeerNeighbors(addrs)
	if err != nil {
		u.log.V(2).Info("some peers have no route", "err", err)
	}
	on := onSegment(neigh, uplink)
	out := map[string]bool{}
	var off []string
	for a, names := range peers {
		for _, name := range names {
			if on[a] {
				out[name] = true
			} else {
				off = append(off, name)
			}
		}
	}
	sort.Strings(off)
	if list := strings.Join(off, ","); list != u.offSegment {
		u.offSegment = list
		if list != "" {
			u.log.Info("peers not on the uplink segment get VXLAN", "uplinkBridge", uplink, "peers", off)
		}
	}
	return out
}

// onSegment: a peer is on the segment when the kernel's route to it leaves by the uplink bridge's
// interface with the peer itself as the next hop (no gateway in between).
func onSegment(neigh []nodenet.Neighbor, uplink string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, n := range neigh {
		if n.Link == uplink && n.NextHop == n.Peer {
			out[n.Peer] = true
		}
	}
	return out
}

// loadLinger reads the deadline an earlier run left in br0's external_ids (zero: none, or unreadable).
func (u *Uplink) loadLinger(ctx context.Context) time.Time {
	ids, err := u.ovs.BridgeExternalIDs(ctx, u.bridge)
	if err != nil {
		return time.Time{}
	}
	u.savedLinger, u.lingerRead = ids[lingerKey], true // saveLinger need not read it again
	if ids[lingerKey] == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, ids[lingerKey])
	if err != nil {
		u.log.Info("ignoring an unreadable uplink linger deadline", "key", lingerKey, "value", ids[lingerKey])
		return time.Time{}
	}
	if t.After(u.now()) {
		u.log.Info("the uplink port keeps lingering after the restart", "until", t)
	}
	return t
}

// saveLinger writes the current deadline to br0's external_ids (no transaction when it is already there).
func (u *Uplink) saveLinger(ctx context.Context) error {
	v := ""
	if !u.lingerUntil.IsZero() {
		v = u.lingerUntil.UTC().Format(time.RFC3339Nano)
	}
	if !u.lingerRead {
		ids, err := u.ovs.BridgeExternalIDs(ctx, u.bridge)
		if err != nil {
			return fmt.Errorf("uplink linger deadline: %w", err)
		}
		u.savedLinger, u.lingerRead = ids[lingerKey], true
	}
	if v == u.savedLinger {
		return nil
	}
	if err := u.ovs.SetBridgeExternalIDs(ctx, u.bridge, map[string]string{lingerKey: v}); err != nil {
		return fmt.Errorf("uplink linger deadline: %w", err)
	}
	u.savedLinger = v
	return nil
}

func (u *Uplink) removePatch(ctx context.Context) error {
	if err := u.ovs.DeletePort(ctx, u.bridge, uplinkPort); err != nil {
		return err
	}
	if err := u.ovs.DeletePort(ctx, u.patched, uplinkPeerPort); err != nil {
		return err
	}
	u.log.V(1).Info("uplink port removed (if there was one)", "uplinkBridge", u.patched)
	u.patched = ""
	return nil
}
