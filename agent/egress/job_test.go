package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/internal/egressplan"
)

// fakeHost records what the job does to the node, in order. While busy is set, any change to the node
// is a test failure (what the membership's pass must never wait for).
type fakeHost struct {
	calls  []string
	uplink []netip.Addr
	busy   *testing.T
}

func (h *fakeHost) record(c string) {
	if h.busy != nil {
		h.busy.Errorf("the membership's pass itself did %q: its heartbeats wait for the node", c)
	}
	h.calls = append(h.calls, c)
}

func (h *fakeHost) NodeIP() netip.Addr { return netip.MustParseAddr("198.51.100.11") }
func (h *fakeHost) EnsureSNAT(held []netip.Addr) error {
	h.record(fmt.Sprintf("snat %v", held))
	return nil
}
func (h *fakeHost) AddAddress(ip netip.Addr) error {
	h.record("add " + ip.String())
	return nil
}
func (h *fakeHost) DelAddress(ip netip.Addr) error {
	h.record("del " + ip.String())
	return nil
}
func (h *fakeHost) Announce(ip netip.Addr) error {
	h.record("announce " + ip.String())
	return nil
}
func (h *fakeHost) UplinkAddresses() ([]netip.Addr, error) { return h.uplink, nil }
func (h *fakeHost) ListenUDP(netip.AddrPort) (*net.UDPConn, error) {
	return nil, fmt.Errorf("no network in this test")
}
func (h *fakeHost) UplinkMAC() (net.HardwareAddr, error) {
	return net.HardwareAddr{2, 0, 0, 0, 0, 1}, nil
}
func (h *fakeHost) SetTunnelNeighbor(ip netip.Addr, mac net.HardwareAddr) error {
	h.record(fmt.Sprintf("neigh %s %s", ip, mac))
	return nil
}

type fakeFlows struct{ h *fakeHost }

func (f fakeFlows) SetHeld(_ context.Context, held []netip.Addr) error {
	f.h.record(fmt.Sprintf("flows %v", held))
	return nil
}

type fakeCluster struct{ plan egressplan.Plan }

func (c fakeCluster) Egress() (egressplan.Plan, map[string]netip.Addr, map[netip.Addr]string) {
	return c.plan, map[string]netip.Addr{"n1": netip.MustParseAddr("198.51.100.11"), "n2": netip.MustParseAddr("198.51.100.12")}, nil
}

func testPlan() egressplan.Plan {
	nodes := []egressplan.Node{
		{Name: "n1", IP: netip.MustParseAddr("198.51.100.11"), EgressIPs: []netip.Addr{netip.MustParseAddr("198.51.100.40")}},
		{Name: "n2", IP: netip.MustParseAddr("198.51.100.12"), EgressIPs: []netip.Addr{netip.MustParseAddr("198.51.100.41")}},
	}
	return egressplan.Build([]egressplan.Namespace{{Name: "a", EgressIPs: []netip.Addr{netip.MustParseAddr("198.51.100.40"), netip.MustParseAddr("198.51.100.41")}}}, nodes, nil)
}

// TestRestore: after a restart the node keeps the egress IPs on its uplink that it may still hold
// (flows and SNAT first, so the first sync keeps them), removes the egress IPs it may not hold and those
// it recorded as its own, and leaves every other address alone.
func TestRestore(t *testing.T) {
	state := filepath.Join(t.TempDir(), "egress-held.json")
	if err := os.WriteFile(state, []byte(`["198.51.100.77"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{uplink: []netip.Addr{netip.MustParseAddr("198.51.100.40"), netip.MustParseAddr("198.51.100.41"),
		netip.MustParseAddr("198.51.100.77"), netip.MustParseAddr("198.51.100.88")}}
	j := New(Config{NodeName: "n1", StateFile: state, Logger: logr.Discard()}, fakeCluster{testPlan()}, fakeFlows{h}, h, nil)
	if err := j.Restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"del 198.51.100.41", "del 198.51.100.77", "flows [198.51.100.40]", "snat [198.51.100.40]"}
	if !slices.Equal(h.calls, want) {
		t.Errorf("calls %v, want %v", h.calls, want)
	}
	if got := j.Held(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("198.51.100.40")}) {
		t.Errorf("held after restore %v", got)
	}
	if b, _ := os.ReadFile(state); string(b) != `["198.51.100.40"]` {
		t.Errorf("state file %s", b)
	}
}

// TestApplyOrder: a claim installs the flows and the SNAT before the address goes on the uplink and is
// announced; a release takes the address off first, so no ARP answer attracts traffic the node would
// no longer SNAT.
func TestApplyOrder(t *testing.T) {
	h := &fakeHost{}
	j := New(Config{NodeName: "n1", Announcements: []time.Duration{0, time.Second}, Logger: logr.Discard()}, fakeCluster{testPlan()}, fakeFlows{h}, h, nil)
	now := time.Unix(1000, 0)
	e := netip.MustParseAddr("198.51.100.40")
	if err := j.apply(t.Context(), []netip.Addr{e}, Decision{Claim: []netip.Addr{e}, Quorum: true}, now); err != nil {
		t.Fatal(err)
	}
	j.sendAnnouncements(now)
	j.sendAnnouncements(now.Add(500 * time.Millisecond)) // nothing due
	j.sendAnnouncements(now.Add(time.Second))
	want := "snat [198.51.100.40]|flows [198.51.100.40]|add 198.51.100.40|announce 198.51.100.40|announce 198.51.100.40"
	if got := strings.Join(h.calls, "|"); got != want {
		t.Errorf("claim: %s\nwant   %s", got, want)
	}
	h.calls = nil
	if err := j.apply(t.Context(), nil, Decision{Release: []netip.Addr{e}, Quorum: true}, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(h.calls, "|"), "del 198.51.100.40|snat []|flows []"; got != want {
		t.Errorf("release: %s\nwant     %s", got, want)
	}
	// Nothing to do: nothing done.
	h.calls = nil
	if err := j.apply(t.Context(), nil, Decision{Quorum: true}, now.Add(3*time.Second)); err != nil || len(h.calls) > 0 {
		t.Errorf("idle pass: %v %v", h.calls, err)
	}
}

// TestPassNeverWaitsForTheNode: the membership's pass decides and sends the heartbeat, and leaves
// every change to the node (flows, SNAT, the address, announcements, the tunnels' next hops) to the
// claims loop: a claim that takes seconds under load must not silence the heartbeats, or the others
// would take this node for dead and move its IPs. The claims loop then carries the claim out in order.
func TestPassNeverWaitsForTheNode(t *testing.T) {
	h := &fakeHost{}
	j := New(Config{NodeName: "n1", DeadAfter: 400 * time.Millisecond, Announcements: []time.Duration{0}, Logger: logr.Discard()},
		fakeCluster{testPlan()}, fakeFlows{h}, h, nil)
	now := time.Unix(1000, 0)
	j.clock = func() time.Time { return now }
	j.member = NewMember("n1", 400*time.Millisecond, now, nil)
	e := netip.MustParseAddr("198.51.100.40")
	h.busy = t
	for i := range 12 {
		now = now.Add(50 * time.Millisecond)
		// n2 is live (a majority of two members needs both) and holds its own IP.
		hb := Heartbeat{Version: heartbeatVersion, Node: "n2", Incarnation: 1, Seq: uint64(i + 1), MAC: "02:00:00:00:00:02",
			Holds: []Hold{{IP: netip.MustParseAddr("198.51.100.41"), Epoch: 1}}}
		j.mu.Lock()
		_, err := j.member.Receive(hb, netip.MustParseAddr("198.51.100.12"), now)
		j.mu.Unlock()
		if err != nil && i > 0 { // the first pass has not made n2 a peer yet
			t.Fatal(err)
		}
		_, _ = j.pass(t.Context()) // its heartbeat cannot go out here (no network): that is all it fails at
	}
	h.busy = nil
	if got := j.Held(); !slices.Equal(got, []netip.Addr{e}) {
		t.Fatalf("n1 holds %v after its passes, want [%s]", got, e)
	}
	if len(h.calls) > 0 {
		t.Fatalf("changes before the claims loop ran: %v", h.calls)
	}
	if _, err := j.carryOut(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := "neigh 198.51.100.41 02:00:00:00:00:02|snat [198.51.100.40]|flows [198.51.100.40]|add 198.51.100.40|announce 198.51.100.40"
	if got := strings.Join(h.calls, "|"); got != want {
		t.Errorf("claims loop: %s\nwant        %s", got, want)
	}
}

// TestCarryOnlyFreshDecisions: the claims loop carries out nothing before the membership's first
// decision (a restarted agent keeps the IPs Restore kept), and after a stall of the whole agent it
// sends none of the announcements planned before it: the other nodes may have moved the IP meanwhile,
// and an announcement then would pull the outside's traffic back to this node.
func TestCarryOnlyFreshDecisions(t *testing.T) {
	e := netip.MustParseAddr("198.51.100.40")
	h := &fakeHost{uplink: []netip.Addr{e}}
	j := New(Config{NodeName: "n1", DeadAfter: 400 * time.Millisecond, Announcements: []time.Duration{0, time.Second}, Logger: logr.Discard()},
		fakeCluster{testPlan()}, fakeFlows{h}, h, nil)
	now := time.Unix(1000, 0)
	j.clock = func() time.Time { return now }
	if err := j.Restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.calls = nil
	if _, err := j.carryOut(t.Context()); err != nil || len(h.calls) > 0 {
		t.Fatalf("claims loop before any decision: %v %v", h.calls, err)
	}
	// A decision to hold e (what Restore kept) and one announcement planned for later.
	j.mu.Lock()
	j.want, j.decidedAt = []netip.Addr{e}, now
	j.mu.Unlock()
	j.announce[e] = []time.Time{now.Add(time.Second)}
	if _, err := j.carryOut(t.Context()); err != nil || len(h.calls) > 0 {
		t.Fatalf("claims loop, nothing due: %v %v", h.calls, err)
	}
	// The agent freezes for 2 s; the claims loop wakes first: the announcement is due, and dropped.
	now = now.Add(2 * time.Second)
	if _, err := j.carryOut(t.Context()); err != nil || len(h.calls) > 0 {
		t.Fatalf("claims loop after a stall: %v %v", h.calls, err)
	}
	if len(j.announce) > 0 {
		t.Errorf("announcements kept after a stall: %v", j.announce)
	}
}
