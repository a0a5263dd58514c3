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

// fakeHost records what the job does to the node, in order.
type fakeHost struct {
	calls  []string
	uplink []netip.Addr
}

func (h *fakeHost) NodeIP() netip.Addr { return netip.MustParseAddr("198.51.100.11") }
func (h *fakeHost) EnsureSNAT(held []netip.Addr) error {
	h.calls = append(h.calls, fmt.Sprintf("snat %v", held))
	return nil
}
func (h *fakeHost) AddAddress(ip netip.Addr) error {
	h.calls = append(h.calls, "add "+ip.String())
	return nil
}
func (h *fakeHost) DelAddress(ip netip.Addr) error {
	h.calls = append(h.calls, "del "+ip.String())
	return nil
}
func (h *fakeHost) Announce(ip netip.Addr) error {
	h.calls = append(h.calls, "announce "+ip.String())
	return nil
}
func (h *fakeHost) UplinkAddresses() ([]netip.Addr, error) { return h.uplink, nil }
func (h *fakeHost) ListenUDP(netip.AddrPort) (*net.UDPConn, error) {
	return nil, fmt.Errorf("no network in this test")
}
func (h *fakeHost) UplinkMAC() (net.HardwareAddr, error) {
	return net.HardwareAddr{2, 0, 0, 0, 0, 1}, nil
}
func (h *fakeHost) SetTunnelNeighbor(netip.Addr, net.HardwareAddr) error { return nil }

type fakeFlows struct{ h *fakeHost }

func (f fakeFlows) SetHeld(_ context.Context, held []netip.Addr) error {
	f.h.calls = append(f.h.calls, fmt.Sprintf("flows %v", held))
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
