package egress

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/egressplan"
)

// sim runs members against each other on a simulated network and clock: each tick every running
// member sends its heartbeat to the members it can reach and then decides; what it claims and releases
// is recorded as the job would carry it out.
type sim struct {
	t       *testing.T
	now     time.Time
	tick    time.Duration
	addrs   map[string]netip.Addr
	members map[string]*Member
	frozen  map[string]bool // runs nothing, hears nothing
	cut     map[string]bool // runs, but its heartbeats neither leave nor arrive
	plan    egressplan.Plan
	holders map[netip.Addr][]string // who holds each IP now, by the members' actions
	log     []string                // claims and releases, in order
	events  map[string][]Decision
	last    map[string]Decision
}

func newSim(t *testing.T, nodes []string, ips ...string) *sim {
	s := &sim{t: t, now: time.Unix(1000, 0), tick: 50 * time.Millisecond, addrs: map[string]netip.Addr{}, members: map[string]*Member{},
		frozen: map[string]bool{}, cut: map[string]bool{}, holders: map[netip.Addr][]string{}, events: map[string][]Decision{},
		last: map[string]Decision{}}
	hs := make([]egressplan.Node, 0, len(nodes))
	for i, n := range nodes {
		s.addrs[n] = netip.AddrFrom4([4]byte{198, 51, 100, byte(11 + i)})
		hs = append(hs, egressplan.Node{Name: n, IP: s.addrs[n], EgressCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.32/27")}})
	}
	var eips []netip.Addr
	for _, a := range ips {
		eips = append(eips, netip.MustParseAddr(a))
	}
	s.plan = egressplan.Build([]egressplan.Namespace{{Name: "ns", EgressIPs: eips}}, hs, nil)
	for _, n := range nodes {
		s.start(n, nil)
	}
	return s
}

// start (re)starts a member, as a restarted agent: a new incarnation, holding what it finds on its uplink.
func (s *sim) start(n string, uplink []netip.Addr) {
	m := NewMember(n, 400*time.Millisecond, s.now, uplink)
	m.SetPeers(s.addrs)
	m.SetMAC(macOf(s.addrs[n]))
	s.members[n] = m
}

func (s *sim) run(d time.Duration) {
	s.t.Helper()
	for end := s.now.Add(d); s.now.Before(end); {
		s.now = s.now.Add(s.tick)
		names := slices.Sorted(maps.Keys(s.members))
		for _, n := range names {
			if s.frozen[n] || s.cut[n] {
				continue
			}
			h := s.members[n].Heartbeat()
			for _, to := range names {
				if to == n || s.frozen[to] || s.cut[to] {
					continue
				}
				// Through the wire format, as the job sends it.
				b, err := h.Marshal()
				if err != nil {
					s.t.Fatal(err)
				}
				got, err := ParseHeartbeat(b)
				if err != nil {
					s.t.Fatal(err)
				}
				if _, err := s.members[to].Receive(got, s.addrs[n], s.now); err != nil {
					s.t.Fatal(err)
				}
			}
		}
		for _, n := range names {
			if s.frozen[n] {
				continue
			}
			d := s.members[n].Decide(s.now, s.plan, nil)
			s.last[n] = d
			for _, ip := range d.Claim {
				s.holders[ip] = append(s.holders[ip], n)
				s.log = append(s.log, fmt.Sprintf("%s claims %s", n, ip))
			}
			for _, ip := range d.Release {
				s.holders[ip] = slices.DeleteFunc(s.holders[ip], func(x string) bool { return x == n })
				s.log = append(s.log, fmt.Sprintf("%s releases %s", n, ip))
			}
			if len(d.Returned) > 0 || len(d.Unheld) > 0 || d.Stalled || d.Reannounce {
				s.events[n] = append(s.events[n], d)
			}
		}
	}
}

// holder is the one node holding ip ("" none; fails on two).
func (s *sim) holder(ip string) string {
	s.t.Helper()
	h := s.holders[netip.MustParseAddr(ip)]
	switch len(h) {
	case 0:
		return ""
	case 1:
		return h[0]
	}
	s.t.Fatalf("%s held by %v at once\n%s", ip, h, strings.Join(s.log, "\n"))
	return ""
}

func (s *sim) takeLog() []string {
	out := s.log
	s.log = nil
	return out
}

const eip = "198.51.100.40"

func macOf(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

func rankOf(ip string, nodes ...string) []string {
	return egressplan.Rank(netip.MustParseAddr(ip), nodes)
}

func TestMemberAgreesOnOneHolder(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	s := newSim(t, nodes, eip, "198.51.100.41", "198.51.100.42")
	s.run(300 * time.Millisecond)
	if got := s.takeLog(); len(got) != 0 {
		t.Fatalf("claims before the members listened for DeadAfter: %v", got)
	}
	s.run(300 * time.Millisecond)
	for _, ip := range []string{eip, "198.51.100.41", "198.51.100.42"} {
		if got, want := s.holder(ip), rankOf(ip, nodes...)[0]; got != want {
			t.Errorf("%s held by %q, want the ranking's first %q", ip, got, want)
		}
	}
	if got := s.takeLog(); len(got) != 3 {
		t.Errorf("claims %v, want one per IP", got)
	}
	s.run(2 * time.Second)
	if got := s.takeLog(); len(got) != 0 {
		t.Errorf("a steady membership moved IPs: %v", got)
	}
}

// TestMemberFailoverAndReturn: the holder freezes; once it is dead (DeadAfter) the next live node of the
// ranking claims, and nothing else moves. When it thaws it finds a higher epoch and lets go: no
// second move, and the new holder is told to announce again.
func TestMemberFailoverAndReturn(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	for _, how := range []string{"frozen", "cut off"} {
		t.Run(how, func(t *testing.T) {
			s := newSim(t, nodes, eip)
			s.run(time.Second)
			first := s.holder(eip)
			s.takeLog()
			if how == "frozen" {
				s.frozen[first] = true
			} else {
				s.cut[first] = true
			}
			start := s.now
			var moved time.Duration
			for moved == 0 && s.now.Sub(start) < 2*time.Second {
				s.run(s.tick)
				for _, n := range nodes {
					if n != first && slices.Contains(s.holders[netip.MustParseAddr(eip)], n) {
						moved = s.now.Sub(start)
					}
				}
			}
			rest := slices.DeleteFunc(slices.Clone(rankOf(eip, nodes...)), func(n string) bool { return n == first })
			if moved == 0 || moved > 500*time.Millisecond {
				t.Fatalf("moved after %v\n%v", moved, s.log)
			}
			now := slices.DeleteFunc(slices.Clone(s.holders[netip.MustParseAddr(eip)]), func(n string) bool { return n == first })
			if len(now) != 1 || now[0] != rest[0] {
				t.Fatalf("held by %v after %s died, want %s (the next of %v)", s.holders[netip.MustParseAddr(eip)], first, rest[0], rankOf(eip, nodes...))
			}
			// Every other live node points its tunnels at the new holder's MAC once it heard the claim.
			s.run(s.tick)
			for _, n := range nodes {
				if n == first || n == rest[0] {
					continue
				}
				if h := s.last[n].Holders[netip.MustParseAddr(eip)]; h.Node != rest[0] || !bytes.Equal(h.MAC, macOf(s.addrs[rest[0]])) {
					t.Errorf("%s follows %+v for %s, want %s at %s", n, h, eip, rest[0], macOf(s.addrs[rest[0]]))
				}
			}
			if _, ok := s.last[rest[0]].Holders[netip.MustParseAddr(eip)]; ok {
				t.Errorf("the holder %s points its tunnels for its own IP elsewhere", rest[0])
			}
			if how == "cut off" && !slices.Contains(s.holders[netip.MustParseAddr(eip)], first) {
				t.Errorf("a node cut off from the others let go without a majority taking over")
			}
			s.takeLog()
			// Back: the returning node lets go, nothing else moves.
			delete(s.frozen, first)
			delete(s.cut, first)
			s.run(2 * time.Second)
			if got := s.holder(eip); got != rest[0] {
				t.Errorf("after %s returned: held by %q, want %q", first, got, rest[0])
			}
			log := s.takeLog()
			if len(log) > 1 || (how == "cut off" && (len(log) != 1 || log[0] != first+" releases "+eip)) {
				t.Errorf("the return moved: %v", log)
			}
			reannounce := false
			for _, d := range s.events[rest[0]] {
				reannounce = reannounce || (slices.Contains(d.Returned, first) && d.Reannounce)
			}
			if !reannounce {
				t.Errorf("the new holder was not told to announce again when %s came back", first)
			}
			// The returning node must not announce what it held: its claim is stale.
			for _, d := range s.events[first] {
				if d.Reannounce {
					t.Errorf("the returning node %s was told to announce again (%+v)", first, d)
				}
			}
		})
	}
}

// TestMemberNoQuorumNoClaim: a node that sees no majority claims nothing new, however long it waits.
func TestMemberNoQuorumNoClaim(t *testing.T) {
	s := newSim(t, []string{"n1", "n2", "n3"}, eip)
	for n := range s.members {
		s.cut[n] = true
	}
	s.run(3 * time.Second)
	if got := s.takeLog(); len(got) != 0 {
		t.Errorf("members without a majority claimed: %v", got)
	}
}

// TestMemberRestart: an agent that restarts quickly finds its IP on the uplink and keeps it; one that
// restarts after its IP moved finds a higher epoch and lets go of the address it found.
func TestMemberRestart(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	s := newSim(t, nodes, eip)
	s.run(time.Second)
	first := s.holder(eip)
	s.takeLog()
	ip := netip.MustParseAddr(eip)
	s.start(first, []netip.Addr{ip})
	s.run(2 * time.Second)
	if got, log := s.holder(eip), s.takeLog(); got != first || len(log) != 0 {
		t.Errorf("after a quick restart: held by %q, moves %v", got, log)
	}
	// A slow restart: the others moved it meanwhile.
	s.frozen[first] = true
	s.run(time.Second)
	s.takeLog()
	others := slices.DeleteFunc(slices.Clone(s.holders[ip]), func(n string) bool { return n == first })
	if len(others) != 1 {
		t.Fatalf("while %s is down: held by %v", first, s.holders[ip])
	}
	second := others[0]
	delete(s.frozen, first)
	s.start(first, []netip.Addr{ip}) // the address is still on its uplink
	s.run(time.Second)
	if got, log := s.holder(eip), s.takeLog(); got != second || !slices.Equal(log, []string{first + " releases " + eip}) {
		t.Errorf("after a slow restart: held by %q, moves %v", got, log)
	}
}

// TestMemberUnheld: with every node that may hold an IP dead, it is reported unheld.
func TestMemberUnheld(t *testing.T) {
	s := newSim(t, []string{"n1", "n2", "n3"}, eip)
	s.run(time.Second)
	// Only n1 may hold the IP now.
	s.plan.IPs[netip.MustParseAddr(eip)].Eligible = []string{"n1"}
	s.frozen["n1"] = true
	s.run(time.Second)
	unheld := false
	for _, d := range s.events["n2"] {
		unheld = unheld || slices.Contains(d.Unheld, netip.MustParseAddr(eip))
	}
	if !unheld {
		t.Error("n2 did not report the IP unheld with its only node dead")
	}
}

func TestReceiveRefusesForgeries(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMember("n1", 400*time.Millisecond, now, nil)
	m.SetPeers(map[string]netip.Addr{"n1": netip.MustParseAddr("198.51.100.11"), "n2": netip.MustParseAddr("198.51.100.12")})
	h := Heartbeat{Version: heartbeatVersion, Node: "n2", Incarnation: 5, Seq: 1}
	for _, tc := range []struct {
		name string
		h    Heartbeat
		src  string
		ok   bool
	}{
		{"from n2's address", h, "198.51.100.12", true},
		{"n2's name from another address", h, "198.51.100.13", false},
		{"a stranger", Heartbeat{Version: heartbeatVersion, Node: "n9", Incarnation: 5, Seq: 1}, "198.51.100.19", false},
		{"this node's own name", Heartbeat{Version: heartbeatVersion, Node: "n1", Incarnation: 5, Seq: 1}, "198.51.100.11", false},
	} {
		if _, err := m.Receive(tc.h, netip.MustParseAddr(tc.src), now); (err == nil) != tc.ok {
			t.Errorf("%s: err %v", tc.name, err)
		}
	}
	for _, bad := range []string{`{"v":2,"n":"n2"}`, `{"v":1}`, `{"v":1,"n":"n2","h":[{"ip":"2001:db8::1","e":1}]}`, `nonsense`} {
		if _, err := ParseHeartbeat([]byte(bad)); err == nil {
			t.Errorf("parsed %s", bad)
		}
	}
}

// TestMemberRemembersSlowGaps: the longest wait between a peer's heartbeats is kept for gapWindow (the
// logs of a move and of a return say how long the peer was silent), then forgotten.
func TestMemberRemembersSlowGaps(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewMember("n1", 400*time.Millisecond, now, nil)
	m.SetPeers(map[string]netip.Addr{"n1": netip.MustParseAddr("198.51.100.11"), "n2": netip.MustParseAddr("198.51.100.12")})
	seq := uint64(0)
	hear := func(after time.Duration) {
		now = now.Add(after)
		seq++
		if _, err := m.Receive(Heartbeat{Version: heartbeatVersion, Node: "n2", Incarnation: 7, Seq: seq}, netip.MustParseAddr("198.51.100.12"), now); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		gaps []time.Duration
		want string
	}{
		{[]time.Duration{0, 50 * time.Millisecond, 60 * time.Millisecond}, "60ms"},
		{[]time.Duration{700 * time.Millisecond, 50 * time.Millisecond}, "700ms"},
		{[]time.Duration{9 * time.Second}, "9s"},                             // a longer one replaces it
		{slices.Repeat([]time.Duration{time.Second}, 11), "1s"},              // 9 s forgotten after gapWindow
		{slices.Repeat([]time.Duration{50 * time.Millisecond}, 300), "50ms"}, // and so is 1 s
	}
	for i, st := range steps {
		for _, g := range st.gaps {
			hear(g)
		}
		if got := m.SlowGaps(now, []string{"n2"})["n2"]; got != st.want {
			t.Errorf("step %d: slowest gap %s, want %s", i, got, st.want)
		}
	}
}
