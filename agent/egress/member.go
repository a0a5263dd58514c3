// Package egress is the agent's egress IP job: the nodes that may hold egress IPs watch each other with
// heartbeats over the node network, agree without the API server on which node holds each IP, and the
// holder claims it (flows, SNAT, the address on its uplink, gratuitous ARP); the API status follows.
//
// Agreement. Every member computes the same answer from the same inputs (egressplan: which nodes may
// hold an IP, and a rendezvous ranking): a live node that claims an IP keeps it — the claim with the
// highest epoch wins, ties by the ranking — and an IP nobody live claims goes to the controller's
// placement if that node is live, else to the first live node of the ranking. Only the winner acts, so
// members that momentarily disagree make at most two claims, which the epochs then settle: a new claim
// takes the highest epoch it has seen plus one, so a node that comes back after its IPs moved finds
// higher epochs and lets them go (no second move), and an agent that restarts claims with epoch 0 and
// never takes an IP from a live holder.
//
// Liveness. Members send a heartbeat to each other every Interval, naming the IPs they hold and their
// epochs; a member not heard for DeadAfter is dead. New claims need a quorum (a majority of the members
// live, the member itself included), so a node cut off from the others keeps what it holds but takes
// nothing: when it comes back its IPs have moved with higher epochs. A member whose own passes stalled
// longer than DeadAfter (frozen, starved) takes nothing until it has listened for DeadAfter.
//
// Heartbeats are plain UDP to the node addresses, from the node's address (checked against the
// HostSubnet): pods cannot send to the port (it is in the tunnel guard's ports, flows/pipeline/guard.go)
// and the node network is trusted, as for VXLAN.
//
// The agent runs it as a Node (node.go): the informers' handlers fill the Inputs (inputs.go) the
// agent's view snapshots for the flows, and the Job claims through the view, the flow loop and nodenet.
package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/ofsdn/ofsdn/internal/egressplan"
)

// Heartbeat is what a member sends every Interval.
type Heartbeat struct {
	Version int    `json:"v"`
	Node    string `json:"n"`
	// Incarnation is the sender's start time (Unix ns): a restarted agent is a new incarnation.
	Incarnation int64  `json:"i"`
	Seq         uint64 `json:"s"`
	// Holds are the IPs the sender holds, with their epochs.
	Holds []Hold `json:"h,omitempty"`
	// MAC is the sender's uplink MAC: where the IPs it holds are (nodes on the userspace datapath set
	// their tunnels' next hop for them from it; see Decision.Holders).
	MAC string `json:"m,omitempty"`
}

// Hold is one IP a member holds.
type Hold struct {
	IP    netip.Addr `json:"ip"`
	Epoch uint64     `json:"e"`
}

// heartbeatVersion is the heartbeat format's version; a member ignores others'.
const heartbeatVersion = 1

// Marshal encodes a heartbeat.
func (h Heartbeat) Marshal() ([]byte, error) { return json.Marshal(h) }

// ParseHeartbeat decodes a heartbeat, refusing other versions and nonsense.
func ParseHeartbeat(b []byte) (Heartbeat, error) {
	var h Heartbeat
	if len(b) > maxHeartbeat {
		return h, fmt.Errorf("heartbeat of %d bytes", len(b))
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("heartbeat: %w", err)
	}
	if h.Version != heartbeatVersion || h.Node == "" {
		return h, fmt.Errorf("heartbeat version %d from %q: want version %d from a named node", h.Version, h.Node, heartbeatVersion)
	}
	for _, hd := range h.Holds {
		if !hd.IP.Is4() {
			return h, fmt.Errorf("heartbeat from %s holds %v", h.Node, hd.IP)
		}
	}
	if h.MAC != "" {
		if mac, err := net.ParseMAC(h.MAC); err != nil || len(mac) != 6 {
			return h, fmt.Errorf("heartbeat from %s: MAC %q", h.Node, h.MAC)
		}
	}
	return h, nil
}

// maxHeartbeat bounds a heartbeat datagram (a member holding hundreds of IPs still fits).
const maxHeartbeat = 60000

// peer is what a member knows of another.
type peer struct {
	ip          netip.Addr
	heard       time.Time // zero: never
	incarnation int64
	seq         uint64
	holds       map[netip.Addr]uint64
	mac         net.HardwareAddr
	live        bool // as of the last Decide
	// slowGap is the longest wait between two of its heartbeats seen at slowAt, within gapWindow.
	slowGap time.Duration
	slowAt  time.Time
}

// gapWindow is how long a peer's slowest heartbeat gap is remembered.
const gapWindow = 10 * time.Second

// recentSlowGap is the longest gap between p's heartbeats within gapWindow of now.
func (p *peer) recentSlowGap(now time.Time) time.Duration {
	if now.Sub(p.slowAt) > gapWindow {
		return 0
	}
	return p.slowGap
}

// Member is one node's view of the membership and its claims. It is not safe for concurrent use; the
// job serialises it.
type Member struct {
	name      string
	deadAfter time.Duration
	peers     map[string]*peer
	// held are this node's claims and their epochs; seen the highest epoch seen per IP.
	held map[netip.Addr]uint64
	seen map[netip.Addr]uint64
	// holdDown: no new claim before it (after a start or a stall, listen first).
	holdDown time.Time
	lastPass time.Time
	// hadQuorum: the last pass saw a majority live.
	hadQuorum bool
	seq       uint64
	inc       int64
	mac       net.HardwareAddr // this node's uplink MAC, sent in heartbeats
}

// NewMember makes a member that listens for deadAfter before its first claim. held are the IPs the node
// holds already (found on its uplink after a restart), at epoch 0.
func NewMember(name string, deadAfter time.Duration, now time.Time, held []netip.Addr) *Member {
	m := &Member{name: name, deadAfter: deadAfter, peers: map[string]*peer{}, held: map[netip.Addr]uint64{}, seen: map[netip.Addr]uint64{},
		holdDown: now.Add(deadAfter), lastPass: now, inc: now.UnixNano()}
	for _, ip := range held {
		m.held[ip] = 0
	}
	return m
}

// SetPeers sets the other members and their addresses (the nodes that may hold an egress IP).
func (m *Member) SetPeers(nodes map[string]netip.Addr) {
	for name := range m.peers {
		if _, ok := nodes[name]; !ok {
			delete(m.peers, name)
		}
	}
	for name, ip := range nodes {
		if name == m.name {
			continue
		}
		if p := m.peers[name]; p != nil {
			p.ip = ip
			continue
		}
		m.peers[name] = &peer{ip: ip, holds: map[netip.Addr]uint64{}}
	}
}

// Peers returns the other members' addresses, sorted by name.
func (m *Member) Peers() []netip.Addr {
	names := make([]string, 0, len(m.peers))
	for n := range m.peers {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]netip.Addr, 0, len(names))
	for _, n := range names {
		out = append(out, m.peers[n].ip)
	}
	return out
}

// Receive takes a heartbeat that arrived from src. It reports whether it changed what Decide may
// answer (a peer came back, or its claims changed), so the job can decide at once.
func (m *Member) Receive(h Heartbeat, src netip.Addr, now time.Time) (changed bool, err error) {
	p := m.peers[h.Node]
	switch {
	case h.Node == m.name:
		return false, fmt.Errorf("heartbeat from %s with this node's name %s", src, h.Node)
	case p == nil:
		return false, fmt.Errorf("heartbeat from %s (%s), not a member", src, h.Node)
	case src != p.ip:
		return false, fmt.Errorf("heartbeat naming %s came from %s, not its address %s", h.Node, src, p.ip)
	case h.Incarnation < p.incarnation || (h.Incarnation == p.incarnation && h.Seq <= p.seq && !p.heard.IsZero()):
		return false, nil // late or repeated
	}
	changed = !p.live
	holds := make(map[netip.Addr]uint64, len(h.Holds))
	for _, hd := range h.Holds {
		holds[hd.IP] = hd.Epoch
		m.seen[hd.IP] = max(m.seen[hd.IP], hd.Epoch)
	}
	if !mapsEqual(holds, p.holds) {
		changed = true
	}
	if !p.heard.IsZero() && h.Incarnation == p.incarnation {
		if gap := now.Sub(p.heard); gap > p.recentSlowGap(now) {
			p.slowGap, p.slowAt = gap, now
		}
	}
	p.heard, p.incarnation, p.seq, p.holds = now, h.Incarnation, h.Seq, holds
	if mac, err := net.ParseMAC(h.MAC); err == nil && !bytes.Equal(mac, p.mac) {
		p.mac, changed = mac, true
	}
	return changed, nil
}

func mapsEqual(a, b map[netip.Addr]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Silence describes the peers that are not live: how long each has been silent, and the longest gap
// between its heartbeats before (for logs).
func (m *Member) Silence(now time.Time) map[string]string {
	out := map[string]string{}
	for name, p := range m.peers {
		if p.live {
			continue
		}
		if p.heard.IsZero() {
			out[name] = "never heard"
			continue
		}
		out[name] = fmt.Sprintf("silent %v, slowest gap before %v", now.Sub(p.heard).Round(time.Millisecond), p.recentSlowGap(now).Round(time.Millisecond))
	}
	return out
}

// SlowGaps returns the named peers' longest recent gaps between heartbeats (for logs: how long a peer
// that came back was silent).
func (m *Member) SlowGaps(now time.Time, names []string) map[string]string {
	out := map[string]string{}
	for _, n := range names {
		if p := m.peers[n]; p != nil {
			out[n] = p.recentSlowGap(now).Round(time.Millisecond).String()
		}
	}
	return out
}

// Heartbeat is this member's next heartbeat.
func (m *Member) Heartbeat() Heartbeat {
	m.seq++
	h := Heartbeat{Version: heartbeatVersion, Node: m.name, Incarnation: m.inc, Seq: m.seq}
	if len(m.mac) == 6 {
		h.MAC = m.mac.String()
	}
	for ip, e := range m.held {
		h.Holds = append(h.Holds, Hold{IP: ip, Epoch: e})
	}
	slices.SortFunc(h.Holds, func(a, b Hold) int { return a.IP.Compare(b.IP) })
	return h
}

// Decision is what a member should do after a pass.
type Decision struct {
	Claim   []netip.Addr // newly won
	Release []netip.Addr // lost, or no longer usable here
	// Returned are peers that came back to life.
	Returned []string
	// Reannounce: a peer came back while this member was in the majority, so what it holds is still
	// its own: it announces it again (the returned node may have answered for an IP on its way back).
	// A member that was itself cut off or stalled does not: its claims may be stale.
	Reannounce bool
	// Unheld are usable IPs that no live member may hold (the namespace's traffic through them is dropped).
	Unheld []netip.Addr
	// Quorum says whether a majority of the members is live.
	Quorum bool
	// Holders are the other nodes' claims as this member last heard them, the best claim per IP (the
	// highest epoch, ties by the ranking), with the holder's uplink MAC: a node on the userspace
	// datapath points its tunnels' next hop for the IP there at once, whatever ARP it snooped.
	Holders map[netip.Addr]Holder
	// Stalled: this member's own passes stopped for longer than DeadAfter.
	Stalled bool
}

// Holder is a node holding an IP, and its uplink MAC.
type Holder struct {
	Node string
	MAC  net.HardwareAddr
}

// SetMAC sets this node's uplink MAC, sent in its heartbeats.
func (m *Member) SetMAC(mac net.HardwareAddr) { m.mac = slices.Clone(mac) }

// Decide runs a pass at now over plan: who is live, who wins each usable IP, and what this member must
// claim or release. It records claims and releases as done: the job carries them out (and retries on
// failure by running the pass again).
func (m *Member) Decide(now time.Time, plan egressplan.Plan, preferred map[netip.Addr]string) Decision {
	var d Decision
	if now.Sub(m.lastPass) > m.deadAfter {
		d.Stalled = true
		m.holdDown = now.Add(m.deadAfter) // others may have moved our IPs: listen before claiming
	}
	m.lastPass = now
	members := 1
	liveCount := 1
	for name, p := range m.peers {
		members++
		was := p.live
		p.live = !p.heard.IsZero() && now.Sub(p.heard) < m.deadAfter
		if p.live {
			liveCount++
			if !was {
				d.Returned = append(d.Returned, name)
			}
		}
	}
	slices.Sort(d.Returned)
	d.Quorum = 2*liveCount > members
	d.Reannounce = len(d.Returned) > 0 && m.hadQuorum && !d.Stalled
	m.hadQuorum = d.Quorum
	live := func(n string) bool {
		if n == m.name {
			return true
		}
		p := m.peers[n]
		return p != nil && p.live
	}
	want := map[netip.Addr]bool{}
	for ip, info := range plan.IPs {
		if !info.Usable() {
			continue
		}
		rank := egressplan.Rank(ip, info.Eligible)
		pos := func(n string) int {
			if i := slices.Index(rank, n); i >= 0 {
				return i
			}
			return len(rank)
		}
		type claim struct {
			node  string
			epoch uint64
		}
		var best *claim
		consider := func(c claim) {
			if !slices.Contains(info.Eligible, c.node) {
				return
			}
			if best == nil || c.epoch > best.epoch || (c.epoch == best.epoch && pos(c.node) < pos(best.node)) {
				best = &c
			}
		}
		if e, ok := m.held[ip]; ok {
			consider(claim{m.name, e})
		}
		for name, p := range m.peers {
			if e, ok := p.holds[ip]; ok && p.live {
				consider(claim{name, e})
			}
		}
		winner := ""
		switch {
		case best != nil:
			winner = best.node
		case d.Quorum && !now.Before(m.holdDown):
			winner = egressplan.Choose(ip, info.Eligible, live, "", preferred[ip])
			if winner == "" {
				d.Unheld = append(d.Unheld, ip)
			}
		}
		if winner == m.name {
			want[ip] = true
		}
	}
	for ip := range want {
		if _, ok := m.held[ip]; !ok {
			e := m.seen[ip] + 1
			m.held[ip], m.seen[ip] = e, e
			d.Claim = append(d.Claim, ip)
		}
	}
	for ip := range m.held {
		if !want[ip] {
			delete(m.held, ip)
			d.Release = append(d.Release, ip)
		}
	}
	d.Holders = m.holders(plan)
	sortAddrs(d.Claim)
	sortAddrs(d.Release)
	sortAddrs(d.Unheld)
	return d
}

// holders is the best claim of another node per usable IP, from what each last announced (live or
// not: a newer claim has a higher epoch anyway).
func (m *Member) holders(plan egressplan.Plan) map[netip.Addr]Holder {
	out := map[netip.Addr]Holder{}
	best := map[netip.Addr]uint64{}
	for name, p := range m.peers {
		if len(p.mac) != 6 {
			continue
		}
		for ip, e := range p.holds {
			info := plan.IPs[ip]
			if info == nil || !info.Usable() {
				continue
			}
			cur, ok := out[ip]
			if ok && (e < best[ip] || (e == best[ip] && rankBefore(ip, info.Eligible, cur.Node, name))) {
				continue
			}
			out[ip], best[ip] = Holder{Node: name, MAC: p.mac}, e
		}
	}
	for ip := range m.held {
		delete(out, ip) // held here: no tunnel to it
	}
	return out
}

// rankBefore reports whether a comes before b in ip's ranking.
func rankBefore(ip netip.Addr, eligible []string, a, b string) bool {
	r := egressplan.Rank(ip, eligible)
	ia, ib := slices.Index(r, a), slices.Index(r, b)
	if ia < 0 {
		ia = len(r)
	}
	if ib < 0 {
		ib = len(r)
	}
	return ia < ib || (ia == ib && a < b)
}

// Held returns the IPs this member holds, sorted.
func (m *Member) Held() []netip.Addr {
	out := make([]netip.Addr, 0, len(m.held))
	for ip := range m.held {
		out = append(out, ip)
	}
	sortAddrs(out)
	return out
}

// Live returns the live peers' names, sorted (as of the last Decide).
func (m *Member) Live() []string {
	var out []string
	for name, p := range m.peers {
		if p.live {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func sortAddrs(a []netip.Addr) { slices.SortFunc(a, netip.Addr.Compare) }
