package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/ovsdb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Encapsulation none (flows/pipeline/uplink.go says how the packets go): uplinkSync does the node's side
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

// uplinkHost is what uplinkSync asks the node (the real one: uplinkNode).
type uplinkHost interface {
	Uplink(nodeIP netip.Addr) (string, error)
	PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error)
	GatewayMAC() (net.HardwareAddr, error)
}

type uplinkNode struct{ netns string }

func (n uplinkNode) Uplink(ip netip.Addr) (string, error) { return nodenet.Uplink(n.netns, ip) }
func (n uplinkNode) PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error) {
	return nodenet.PeerNeighbors(n.netns, peers)
}
func (n uplinkNode) GatewayMAC() (net.HardwareAddr, error) {
	return nodenet.LinkMAC(n.netns, pipeline.PortNameTun0)
}

// uplinkOVS is the part of OVSDB uplinkSync uses.
type uplinkOVS interface {
	BridgeDatapath(ctx context.Context, name string) (string, bool, error)
	EnsurePatchPair(ctx context.Context, aBridge, a string, aOFPort int, bBridge, b string) (int, error)
	DeletePort(ctx context.Context, bridge, name string) error
	BridgeExternalIDs(ctx context.Context, bridge string) (map[string]string, error)
	SetBridgeExternalIDs(ctx context.Context, bridge string, set map[string]string) error
}

var _ uplinkOVS = (*ovsdb.Client)(nil)

type uplinkSync struct {
	view     *nodeView
	trigger  func() // a flow sync
	host     uplinkHost
	ovs      uplinkOVS
	bridge   string // br0
	datapath string // br0's datapath type
	linger   time.Duration
	log      klog.Logger
	// warn reports a problem on the Node (an Event); nil: log only.
	warn  func(reason, message string)
	now   func() time.Time
	kicks chan struct{}

	mu          sync.Mutex
	lingerUntil time.Time // the uplink port stays until then although encapsulation is vxlan
	patched     string    // the uplink bridge the pair was last made to ("" none)
	told        string    // the last fallback reason reported
	offSegment  string    // the last list of peers off the segment that was logged
	swept       bool      // a pair left by an earlier run was looked for
	savedLinger string    // lingerKey's value in br0's external_ids, once read or written
	lingerRead  bool
}

func newUplinkSync(view *nodeView, trigger func(), host uplinkHost, ovs uplinkOVS, bridge, datapath string, linger time.Duration, log klog.Logger) *uplinkSync {
	return &uplinkSync{view: view, trigger: trigger, host: host, ovs: ovs, bridge: bridge, datapath: datapath, linger: linger,
		log: log.WithName("uplink"), now: time.Now, kicks: make(chan struct{}, 1)}
}

// kick asks for a check now (encapsulation or peers changed, ovs-vswitchd reconnected); never blocks.
func (u *uplinkSync) kick() {
	if u == nil {
		return
	}
	select {
	case u.kicks <- struct{}{}:
	default:
	}
}

// run checks on every kick and periodically until ctx ends.
func (u *uplinkSync) run(ctx context.Context) {
	for {
		if err := u.ensure(ctx); err != nil && ctx.Err() == nil {
			u.log.Error(err, "uplink port")
		}
		wait := uplinkCheckPeriod
		u.mu.Lock()
		if !u.lingerUntil.IsZero() && u.patched != "" {
			wait = min(wait, max(u.lingerUntil.Sub(u.now()), 10*time.Millisecond))
		}
		u.mu.Unlock()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-u.kicks:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// ensure brings the uplink port and the view in line with the encapsulation; it triggers a flow sync
// when the view changed.
func (u *uplinkSync) ensure(ctx context.Context) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.view.mu.Lock()
	encap, nodeIP := u.view.encap, u.view.nodeIP
	peers := make(map[netip.Addr][]string, len(u.view.remote))
	for name, n := range u.view.remote {
		if name != u.view.nodeName && n.NodeIP.IsValid() {
			peers[n.NodeIP] = append(peers[n.NodeIP], name)
		}
	}
	u.view.mu.Unlock()

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

	changed := false
	u.view.update(func(v *nodeView) {
		if v.uplink != uplink || !maps.Equal(v.onSegment, onSegment) || (len(gwMAC) > 0 && !slices.Equal(v.gatewayMAC, gwMAC)) {
			changed = true
			v.uplink, v.onSegment = uplink, onSegment
			if len(gwMAC) > 0 {
				v.gatewayMAC = gwMAC
			}
		}
	})
	if changed {
		u.log.Info("uplink", "encapsulation", encap, "uplinkBridge", uplink, "directPeers", len(onSegment), "gatewayMAC", gwMAC.String())
		u.trigger()
	}
	return errors.Join(errs...)
}

// findUplink finds the OVS bridge holding the node's address, or says why there is none to use.
func (u *uplinkSync) findUplink(ctx context.Context, nodeIP netip.Addr) (string, string) {
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
func (u *uplinkSync) fallback(why string) {
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
func (u *uplinkSync) segment(peers map[netip.Addr][]string, uplink string) map[string]bool {
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
func (u *uplinkSync) loadLinger(ctx context.Context) time.Time {
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
func (u *uplinkSync) saveLinger(ctx context.Context) error {
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

func (u *uplinkSync) removePatch(ctx context.Context) error {
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

// nodeEvent records a Warning Event on this node's Node object.
func (a *Agent) nodeEvent(reason, message string) {
	if a.events == nil {
		return
	}
	a.events.Eventf(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: a.cfg.NodeName}, corev1.EventTypeWarning, reason, "%s", message)
}
