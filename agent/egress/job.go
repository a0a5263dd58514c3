package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/internal/atomicfile"
	"github.com/ofsdn/ofsdn/internal/egressplan"
	"github.com/ofsdn/ofsdn/internal/loop"
	"k8s.io/klog/v2"
)

// Defaults of the membership's timers: a dead holder's IPs move within DeadAfter plus a pass.
const (
	DefaultPort      = 9107
	DefaultInterval  = 50 * time.Millisecond
	DefaultDeadAfter = 400 * time.Millisecond
)

// Config configures the job.
type Config struct {
	NodeName string
	// Port is the membership's UDP port on every node's address.
	Port      int
	Interval  time.Duration
	DeadAfter time.Duration
	// StateFile records the egress IPs this node put on its uplink, so a restarted agent can tell them
	// from addresses that are not ofsdn's.
	StateFile string
	// Announcements are the offsets at which a claim is announced (nodenet.Announcements).
	Announcements []time.Duration
	Logger        klog.Logger
}

// Cluster is the job's view of the API: the plan of egress IPs, the nodes' addresses and the
// controller's placement of each IP.
type Cluster interface {
	Egress() (plan egressplan.Plan, nodes map[string]netip.Addr, placed map[netip.Addr]string)
}

// Flows makes br0 hand the held IPs' traffic to the host, and returns once the flows are installed.
type Flows interface {
	SetHeld(ctx context.Context, held []netip.Addr) error
}

// Host is the node's side of holding an IP (agent/nodenet).
type Host interface {
	NodeIP() netip.Addr
	EnsureSNAT(held []netip.Addr) error
	AddAddress(ip netip.Addr) error
	DelAddress(ip netip.Addr) error
	Announce(ip netip.Addr) error
	UplinkAddresses() ([]netip.Addr, error)
	ListenUDP(addr netip.AddrPort) (*net.UDPConn, error)
	// UplinkMAC is the MAC of the interface holding the node's address.
	UplinkMAC() (net.HardwareAddr, error)
	// SetTunnelNeighbor points the tunnels' next hop for ip at mac (the userspace datapath's own ARP
	// cache; a no-op where the kernel's neighbour table serves the tunnels).
	SetTunnelNeighbor(ip netip.Addr, mac net.HardwareAddr) error
}

// Reporter is told what the API should hear: the holder of each IP after a claim or release, and IPs
// no live node may hold.
type Reporter interface {
	Held(held []netip.Addr)
	Unheld(ips []netip.Addr)
}

// Job is the node's egress IP job.
type Job struct {
	cfg      Config
	log      klog.Logger
	cluster  Cluster
	flows    Flows
	host     Host
	reporter Reporter
	clock    func() time.Time

	mu       sync.Mutex // guards member
	member   *Member
	conn     *net.UDPConn
	applied  map[netip.Addr]bool // claims carried out on the host (address and SNAT)
	announce map[netip.Addr][]time.Time
	unheld   []netip.Addr // last reported
	// neigh is what the tunnels' next hop for each IP held elsewhere was set to, and when.
	neigh   map[netip.Addr]neighborSet
	holdsAt time.Time    // when the holds last went to the nodes that are not members
	lastOut []netip.Addr // the holds sent then

	// What the membership decided, for the carry loop to carry out (under mu): the IPs to hold, where
	// the others are, and whether to drop the announcements planned (a stall, no majority) or to
	// announce again (a node came back).
	want       []netip.Addr
	holders    map[netip.Addr]Holder
	quiet      bool
	reannounce bool
	decidedAt  time.Time // when the membership last decided (zero: not yet)

	// tick decides and sends the heartbeats; carry carries the decisions out on the node (flows, SNAT,
	// the address, announcements, the tunnels' next hops), which can take a while under load: in a loop
	// of its own, so a slow claim never silences this node's heartbeats and makes the others think it
	// dead.
	tick  *loop.Loop
	carry *loop.Loop
	recv  *loop.Loop
}

// New builds the job; Restore and Run start it.
func New(cfg Config, cluster Cluster, flows Flows, host Host, reporter Reporter) *Job {
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = DefaultDeadAfter
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	j := &Job{cfg: cfg, log: cfg.Logger.WithName("egress"), cluster: cluster, flows: flows, host: host, reporter: reporter, clock: time.Now,
		applied: map[netip.Addr]bool{}, announce: map[netip.Addr][]time.Time{}, neigh: map[netip.Addr]neighborSet{}}
	j.tick = loop.New(loop.Config{Name: "egress-membership", Period: cfg.Interval, Log: j.log, BackoffMin: cfg.Interval, BackoffMax: cfg.Interval},
		j.pass)
	j.carry = loop.New(loop.Config{Name: "egress-claims", Period: cfg.Interval, Log: j.log, BackoffMin: cfg.Interval, BackoffMax: time.Second},
		j.carryOut)
	j.recv = loop.New(loop.Config{Name: "egress-heartbeats", Log: j.log, BackoffMin: 100 * time.Millisecond, BackoffMax: 5 * time.Second}, j.receive)
	return j
}

// neighborSet is a tunnel next hop the job set.
type neighborSet struct {
	mac net.HardwareAddr
	at  time.Time
}

// Re-checks of the tunnels' next hops, and of the holds sent to nodes that only observe.
const (
	neighborRefresh = 5 * time.Second
	observerRefresh = time.Second
)

// Kick asks for a pass at once (the API's egress objects changed).
func (j *Job) Kick() { j.tick.Kick() }

// Restore takes back the egress IPs this node still has on its uplink from before a restart, when it may
// still hold them, and removes those it may not: the first flow sync then keeps their flows and no
// packet is lost. The membership decides from there (a peer that took an IP meanwhile keeps it).
func (j *Job) Restore(ctx context.Context) error {
	plan, _, _ := j.cluster.Egress()
	found, err := j.host.UplinkAddresses()
	if err != nil {
		return err
	}
	recorded := j.readState()
	var keep, drop []netip.Addr
	for _, a := range found {
		info := plan.IPs[a]
		switch {
		case info != nil && info.Usable() && slices.Contains(info.Eligible, j.cfg.NodeName):
			keep = append(keep, a)
		case info != nil || recorded[a]:
			drop = append(drop, a)
		}
	}
	for _, a := range drop {
		if err := j.host.DelAddress(a); err != nil {
			return err
		}
		j.log.Info("removed an egress IP this node may no longer hold", "ip", a)
	}
	if err := j.flows.SetHeld(ctx, keep); err != nil {
		return err
	}
	if err := j.host.EnsureSNAT(keep); err != nil {
		return err
	}
	j.mu.Lock()
	j.member = NewMember(j.cfg.NodeName, j.cfg.DeadAfter, j.clock(), keep)
	if mac, err := j.host.UplinkMAC(); err == nil {
		j.member.SetMAC(mac)
	}
	for _, a := range keep {
		j.applied[a] = true
	}
	j.mu.Unlock()
	j.writeState(keep)
	if len(keep) > 0 {
		j.log.Info("kept egress IPs found on the uplink", "ips", keep)
	}
	return nil
}

// Run runs the membership until ctx ends (after Restore).
func (j *Job) Run(ctx context.Context) {
	j.mu.Lock()
	if j.member == nil {
		j.member = NewMember(j.cfg.NodeName, j.cfg.DeadAfter, j.clock(), nil)
		if mac, err := j.host.UplinkMAC(); err == nil {
			j.member.SetMAC(mac)
		}
	}
	j.mu.Unlock()
	go j.recv.Run(ctx)
	go j.carry.Run(ctx)
	j.tick.Run(ctx)
}

// listen opens the membership's socket on the node's address.
func (j *Job) listen() (*net.UDPConn, error) {
	j.mu.Lock()
	c := j.conn
	j.mu.Unlock()
	if c != nil {
		return c, nil
	}
	ip := j.host.NodeIP()
	if !ip.IsValid() {
		return nil, errors.New("egress: no node address yet")
	}
	c, err := j.host.ListenUDP(netip.AddrPortFrom(ip, uint16(j.cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("egress: membership socket: %w", err)
	}
	j.mu.Lock()
	j.conn = c
	j.mu.Unlock()
	return c, nil
}

// receive reads heartbeats until the socket fails or ctx ends.
func (j *Job) receive(ctx context.Context) (time.Duration, error) {
	c, err := j.listen()
	if err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, maxHeartbeat+1)
	for ctx.Err() == nil {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil
			}
			j.mu.Lock()
			if j.conn == c {
				j.conn = nil
			}
			j.mu.Unlock()
			_ = c.Close()
			return 0, fmt.Errorf("egress: read heartbeats: %w", err)
		}
		h, err := ParseHeartbeat(buf[:n])
		if err != nil {
			j.log.V(2).Info("dropped a datagram", "from", from, "err", err)
			continue
		}
		j.mu.Lock()
		changed, err := j.member.Receive(h, from.Addr().Unmap(), j.clock())
		j.mu.Unlock()
		if err != nil {
			j.log.V(2).Info("dropped a heartbeat", "from", from, "err", err)
		}
		if changed {
			j.tick.Kick()
		}
	}
	return 0, nil
}

// pass is one round of the membership: heartbeats out, a decision, and carrying it out.
func (j *Job) pass(ctx context.Context) (time.Duration, error) {
	plan, nodes, placed := j.cluster.Egress()
	members := map[string]netip.Addr{}
	for _, ip := range plan.IPs {
		if !ip.Usable() {
			continue
		}
		for _, n := range ip.Eligible {
			if a, ok := nodes[n]; ok {
				members[n] = a
			}
		}
	}
	var observers []netip.Addr // the other nodes: they follow the holders, not the membership
	for n, a := range nodes {
		if _, ok := members[n]; !ok && n != j.cfg.NodeName {
			observers = append(observers, a)
		}
	}
	sortAddrs(observers)
	j.mu.Lock()
	_, member := members[j.cfg.NodeName]
	j.member.SetPeers(members)
	hb := j.member.Heartbeat()
	peers := j.member.Peers()
	now := j.clock()
	d := j.member.Decide(now, plan, placed)
	held := j.member.Held()
	live := j.member.Live()
	changed := !slices.Equal(held, j.want) || !holdersEqual(d.Holders, j.holders) || d.Reannounce
	j.want, j.holders, j.decidedAt = held, d.Holders, now
	j.quiet = j.quiet || d.Stalled || !d.Quorum
	j.reannounce = j.reannounce || d.Reannounce
	j.mu.Unlock()

	var errs []error
	if member || len(hb.Holds) > 0 {
		to := peers
		holds := make([]netip.Addr, 0, len(hb.Holds))
		for _, h := range hb.Holds {
			holds = append(holds, h.IP)
		}
		if len(observers) > 0 && (!slices.Equal(holds, j.lastOut) || now.Sub(j.holdsAt) >= observerRefresh) {
			to = append(slices.Clone(peers), observers...)
			j.lastOut, j.holdsAt = holds, now
		}
		if err := j.send(hb, to); err != nil {
			errs = append(errs, err)
		}
	}
	if changed {
		j.carry.Kick()
	}
	if d.Stalled {
		j.log.Info("membership passes stalled; listening before claiming anything", "deadAfter", j.cfg.DeadAfter)
	}
	if len(d.Returned) > 0 {
		j.mu.Lock()
		gaps := j.member.SlowGaps(now, d.Returned)
		j.mu.Unlock()
		j.log.Info("egress members heard again", "silentFor", gaps)
	}
	if len(d.Claim) > 0 || len(d.Release) > 0 {
		j.mu.Lock()
		silence := j.member.Silence(now)
		j.mu.Unlock()
		j.log.Info("egress IPs move", "claim", d.Claim, "release", d.Release, "live", live, "quorum", d.Quorum, "others", silence)
	}
	var again time.Duration
	if len(d.Claim) > 0 {
		again = time.Millisecond // the claim goes out in a heartbeat at once: the others' tunnels follow it
	}
	// One member tells the API of IPs nobody live may hold: the first live one by name.
	if j.reporter != nil && (len(live) == 0 || j.cfg.NodeName < live[0]) && !slices.Equal(d.Unheld, j.unheld) {
		j.unheld = slices.Clone(d.Unheld)
		if len(d.Unheld) > 0 {
			j.reporter.Unheld(d.Unheld)
		}
	}
	return again, errors.Join(errs...)
}

// carryOut carries the membership's last decision out on the node: the tunnels' next hops, the claims
// and releases, the announcements that are due. It carries out only a fresh decision: before the first
// pass there is none (the IPs Restore kept stay), and after a stall of the whole agent (frozen,
// starved) the last one may be stale — the other nodes may have moved its IPs meanwhile — so the
// announcements planned before are dropped, unsent, and the membership decides again first (both
// loops wake from a stall together, in no given order).
func (j *Job) carryOut(ctx context.Context) (time.Duration, error) {
	j.mu.Lock()
	if now := j.clock(); j.decidedAt.IsZero() || now.Sub(j.decidedAt) > j.cfg.DeadAfter {
		j.mu.Unlock()
		clear(j.announce)
		j.tick.Kick()
		return 0, nil
	}
	held, holders := slices.Clone(j.want), j.holders
	d := Decision{Quorum: !j.quiet, Reannounce: j.reannounce}
	j.quiet, j.reannounce = false, false
	j.mu.Unlock()
	j.followHolders(holders, j.clock())
	err := j.apply(ctx, held, d, j.clock())
	if err != nil && d.Reannounce {
		// apply may have stopped before planning the announcements again: the retry does.
		j.mu.Lock()
		j.reannounce = true
		j.mu.Unlock()
	}
	j.sendAnnouncements(j.clock())
	return 0, err
}

// holdersEqual reports whether two decisions place every IP held elsewhere on the same node.
func holdersEqual(a, b map[netip.Addr]Holder) bool {
	if len(a) != len(b) {
		return false
	}
	for ip, h := range a {
		o, ok := b[ip]
		if !ok || o.Node != h.Node || !bytes.Equal(o.MAC, h.MAC) {
			return false
		}
	}
	return true
}

// followHolders points the tunnels' next hop for every IP held elsewhere at its holder, when it
// changed and every neighborRefresh: the userspace datapath learns next hops by snooping ARP, which a
// cached datapath flow for an identical earlier announcement can keep from ever seeing a new one.
func (j *Job) followHolders(holders map[netip.Addr]Holder, now time.Time) {
	for ip, h := range holders {
		prev, ok := j.neigh[ip]
		if ok && bytes.Equal(prev.mac, h.MAC) && now.Sub(prev.at) < neighborRefresh {
			continue
		}
		if err := j.host.SetTunnelNeighbor(ip, h.MAC); err != nil {
			j.log.Error(err, "point the tunnels at an egress IP's holder", "ip", ip, "holder", h.Node)
			continue
		}
		if !ok || !bytes.Equal(prev.mac, h.MAC) {
			j.log.V(2).Info("tunnels follow an egress IP", "ip", ip, "holder", h.Node, "mac", h.MAC)
		}
		j.neigh[ip] = neighborSet{mac: h.MAC, at: now}
	}
	for ip := range j.neigh {
		if _, ok := holders[ip]; !ok {
			delete(j.neigh, ip)
		}
	}
}

// send sends a heartbeat to every peer.
func (j *Job) send(h Heartbeat, peers []netip.Addr) error {
	c, err := j.listen()
	if err != nil {
		return err
	}
	b, err := h.Marshal()
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range peers {
		if _, err := c.WriteToUDPAddrPort(b, netip.AddrPortFrom(p, uint16(j.cfg.Port))); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// A peer's address unreachable for a moment (no route, no neighbour yet) is the peer's problem.
		j.log.V(2).Info("heartbeats not sent", "errors", errs)
	}
	return nil
}

// apply carries the held set out, releases first: the address goes (no more ARP answers), then the
// SNAT (the host's drop rule then refuses what br0 still hands over), then the flows; claims in the
// other order: SNAT, flows, address, announcement. What fails stays unapplied and is retried next run.
func (j *Job) apply(ctx context.Context, held []netip.Addr, d Decision, now time.Time) error {
	var errs []error
	if d.Stalled || !d.Quorum {
		// Announcements planned before a stall, or while cut off from the majority, may name IPs that
		// moved meanwhile: never announce them; the membership decides again first. (Before this
		// pass's own claims: a decision that claims had a majority and no stall.)
		clear(j.announce)
	}
	want := map[netip.Addr]bool{}
	for _, a := range held {
		want[a] = true
	}
	var gone []netip.Addr
	for a := range j.applied {
		if !want[a] {
			gone = append(gone, a)
		}
	}
	changed := len(gone) > 0
	for _, a := range gone {
		if err := j.host.DelAddress(a); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(j.applied, a)
		delete(j.announce, a)
	}
	var fresh []netip.Addr
	for _, a := range held {
		if !j.applied[a] {
			fresh = append(fresh, a)
		}
	}
	if len(gone) > 0 || len(fresh) > 0 {
		if err := j.host.EnsureSNAT(held); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if err := j.flows.SetHeld(ctx, held); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	for _, a := range fresh {
		if err := j.host.AddAddress(a); err != nil {
			errs = append(errs, err)
			continue
		}
		j.applied[a] = true
		changed = true
		for _, off := range j.cfg.Announcements {
			j.announce[a] = append(j.announce[a], now.Add(off))
		}
	}
	if d.Reannounce {
		// A node came back: whatever it answered for on its way back, the holders announce again.
		for a := range j.applied {
			for _, off := range j.cfg.Announcements {
				j.announce[a] = append(j.announce[a], now.Add(off))
			}
		}
	}
	if changed {
		var applied []netip.Addr
		for a := range j.applied {
			applied = append(applied, a)
		}
		sortAddrs(applied)
		j.writeState(applied)
		if j.reporter != nil {
			j.reporter.Held(applied)
		}
	}
	return errors.Join(errs...)
}

// sendAnnouncements sends the announcements that are due.
func (j *Job) sendAnnouncements(now time.Time) {
	for a, times := range j.announce {
		var later []time.Time
		due := false
		for _, t := range times {
			if now.Before(t) {
				later = append(later, t)
			} else {
				due = true
			}
		}
		if due {
			if err := j.host.Announce(a); err != nil {
				j.log.Error(err, "announce egress IP", "ip", a)
			}
		}
		if len(later) == 0 {
			delete(j.announce, a)
		} else {
			j.announce[a] = later
		}
	}
}

// Held returns what the node holds as the membership decided (the claims loop carries it out).
func (j *Job) Held() []netip.Addr {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.member == nil {
		return nil
	}
	return j.member.Held()
}

// Status is the membership as the debug API shows it.
type Status struct {
	Held []netip.Addr `json:"held"`
	Live []string     `json:"live"`
}

// State returns the membership's current picture.
func (j *Job) State() Status {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.member == nil {
		return Status{}
	}
	return Status{Held: j.member.Held(), Live: j.member.Live()}
}

func (j *Job) readState() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	if j.cfg.StateFile == "" {
		return out
	}
	b, err := os.ReadFile(j.cfg.StateFile)
	if err != nil {
		return out
	}
	var ips []netip.Addr
	if json.Unmarshal(b, &ips) == nil {
		for _, a := range ips {
			out[a] = true
		}
	}
	return out
}

func (j *Job) writeState(held []netip.Addr) {
	if j.cfg.StateFile == "" {
		return
	}
	b, _ := json.Marshal(held)
	if err := atomicfile.Write(j.cfg.StateFile, b, 0o600); err != nil {
		j.log.Error(err, "recording the egress IPs held here")
	}
}
