package hostnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/unixctl"
	"k8s.io/klog/v2"
)

// fakeKernel is a neighbour table: per peer its route and entry; Probe records the peer and, when
// resolveTo is set, makes the entry confirmed with that MAC, as a kernel's ARP would.
type fakeKernel struct {
	mu        sync.Mutex
	entries   map[netip.Addr]nodenet.Neighbor
	noRoute   map[netip.Addr]bool
	resolveTo net.HardwareAddr
	probes    []netip.Addr
	lookups   int
}

func (k *fakeKernel) PeerNeighbors(peers []netip.Addr) ([]nodenet.Neighbor, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lookups++
	var out []nodenet.Neighbor
	var errs []error
	for _, p := range peers {
		if k.noRoute[p] {
			errs = append(errs, fmt.Errorf("no route to %s", p))
			continue
		}
		out = append(out, k.entries[p])
	}
	return out, errors.Join(errs...)
}

func (k *fakeKernel) Probe(peer netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.probes = append(k.probes, peer)
	if k.resolveTo != nil {
		for p, e := range k.entries {
			if e.NextHop == k.entries[peer].NextHop {
				e.MAC, e.Confirmed = k.resolveTo, true
				k.entries[p] = e
			}
		}
	}
	return nil
}

type fakeSwitch struct {
	cache   []unixctl.TunnelNeighbor
	listErr error
	sets    []string
}

func (s *fakeSwitch) TunnelNeighbors(context.Context) ([]unixctl.TunnelNeighbor, error) {
	return slices.Clone(s.cache), s.listErr
}

func (s *fakeSwitch) SetTunnelNeighbor(_ context.Context, bridge string, ip netip.Addr, mac net.HardwareAddr) error {
	s.sets = append(s.sets, fmt.Sprintf("%s %s %s", bridge, ip, mac))
	for i, c := range s.cache {
		if c.Bridge == bridge && c.IP == ip {
			s.cache = slices.Delete(s.cache, i, i+1)
			break
		}
	}
	s.cache = append(s.cache, unixctl.TunnelNeighbor{IP: ip, MAC: mac, Bridge: bridge})
	return nil
}

var (
	peerA, peerB = netip.MustParseAddr("192.0.2.12"), netip.MustParseAddr("198.51.100.7")
	gateway      = netip.MustParseAddr("192.0.2.1")
	rightMAC, _  = net.ParseMAC("0a:58:c0:00:02:0c")
	wrongMAC, _  = net.ParseMAC("ee:ee:ee:00:00:01")
)

// kernelEntry: a peer on the segment; mac nil = no usable entry.
func kernelEntry(peer netip.Addr, mac net.HardwareAddr, confirmed bool) nodenet.Neighbor {
	return nodenet.Neighbor{Peer: peer, Link: "br-ul", NextHop: peer, MAC: mac, Confirmed: confirmed}
}

func ovsEntry(ip netip.Addr, mac net.HardwareAddr) unixctl.TunnelNeighbor {
	return unixctl.TunnelNeighbor{IP: ip, MAC: mac, Bridge: "br-ul"}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestNeighbors(k *fakeKernel, s *fakeSwitch, peers ...netip.Addr) (*TunnelNeighbors, *clock) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	tn := NewTunnelNeighbors(k, s, func() []netip.Addr { return peers }, klog.Background())
	tn.now = c.now
	return tn, c
}

// TestTunnelNeighborDecisions: one check, for each combination of what the kernel and OVS hold. The
// expected set/probe come from the rules in tunnelneigh.go's comment, written out by hand.
func TestTunnelNeighborDecisions(t *testing.T) {
	stale := ovsEntry(peerA, rightMAC)
	stale.Stale = true
	incomplete := unixctl.TunnelNeighbor{IP: peerA, Bridge: "br-ul", Incomplete: true}
	otherBridge := ovsEntry(peerA, rightMAC)
	otherBridge.Bridge = "br-ex"
	set := []string{"br-ul 192.0.2.12 " + rightMAC.String()}
	tests := []struct {
		name        string
		kernel      nodenet.Neighbor
		ovs         []unixctl.TunnelNeighbor
		wantSets    []string
		wantProbe   bool
		wantWaiting bool
	}{
		{"nothing anywhere: kernel resolves", kernelEntry(peerA, nil, false), nil, nil, true, true},
		{"only OVS knows: kept, verified", kernelEntry(peerA, nil, false), []unixctl.TunnelNeighbor{ovsEntry(peerA, wrongMAC)}, nil, true, false},
		{"confirmed, OVS missing: set", kernelEntry(peerA, rightMAC, true), nil, set, false, false},
		{"confirmed, OVS wrong: corrected", kernelEntry(peerA, rightMAC, true), []unixctl.TunnelNeighbor{ovsEntry(peerA, wrongMAC)}, set, false, false},
		{"confirmed, OVS right: nothing", kernelEntry(peerA, rightMAC, true), []unixctl.TunnelNeighbor{ovsEntry(peerA, rightMAC)}, nil, false, false},
		{"confirmed, OVS stale: refreshed", kernelEntry(peerA, rightMAC, true), []unixctl.TunnelNeighbor{stale}, set, false, false},
		{"confirmed, OVS incomplete: set", kernelEntry(peerA, rightMAC, true), []unixctl.TunnelNeighbor{incomplete}, set, false, false},
		{"confirmed, OVS has it on another bridge: set", kernelEntry(peerA, rightMAC, true), []unixctl.TunnelNeighbor{otherBridge}, set, false, false},
		{"unconfirmed, OVS missing: set and verified", kernelEntry(peerA, rightMAC, false), nil, set, true, false},
		{"unconfirmed, OVS right: verified", kernelEntry(peerA, rightMAC, false), []unixctl.TunnelNeighbor{ovsEntry(peerA, rightMAC)}, nil, true, false},
		{"unconfirmed, OVS differs: kernel confirms first", kernelEntry(peerA, rightMAC, false), []unixctl.TunnelNeighbor{ovsEntry(peerA, wrongMAC)}, nil, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: tc.kernel}}
			s := &fakeSwitch{cache: tc.ovs}
			tn, _ := newTestNeighbors(k, s, peerA)
			waiting, err := tn.check(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.sets, tc.wantSets) {
				t.Errorf("sets %q, want %q", s.sets, tc.wantSets)
			}
			if probed := len(k.probes) > 0; probed != tc.wantProbe {
				t.Errorf("probed %v (%v), want %v", probed, k.probes, tc.wantProbe)
			}
			if waiting != tc.wantWaiting {
				t.Errorf("waiting %v, want %v", waiting, tc.wantWaiting)
			}
		})
	}
}

func TestTunnelNeighborSharedGatewayAndErrors(t *testing.T) {
	t.Run("peers behind one gateway share one entry", func(t *testing.T) {
		viaGW := func(p netip.Addr) nodenet.Neighbor {
			return nodenet.Neighbor{Peer: p, Link: "br-ul", NextHop: gateway, MAC: rightMAC, Confirmed: true}
		}
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: viaGW(peerA), peerB: viaGW(peerB)}}
		s := &fakeSwitch{}
		tn, _ := newTestNeighbors(k, s, peerA, peerB)
		if _, err := tn.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if want := []string{"br-ul 192.0.2.1 " + rightMAC.String()}; !slices.Equal(s.sets, want) {
			t.Errorf("sets %q, want %q", s.sets, want)
		}
	})
	t.Run("OVS unreachable: an error, nothing done", func(t *testing.T) {
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, nil, false)}}
		s := &fakeSwitch{listErr: errors.New("no ovs-vswitchd")}
		tn, _ := newTestNeighbors(k, s, peerA)
		if _, err := tn.check(context.Background()); err == nil || len(k.probes)+len(s.sets) != 0 {
			t.Errorf("err %v, probes %v, sets %v: want an error and nothing done", err, k.probes, s.sets)
		}
	})
	t.Run("a peer without a route does not stop the others", func(t *testing.T) {
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, rightMAC, true)}, noRoute: map[netip.Addr]bool{peerB: true}}
		s := &fakeSwitch{}
		tn, _ := newTestNeighbors(k, s, peerB, peerA)
		if _, err := tn.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if want := []string{"br-ul 192.0.2.12 " + rightMAC.String()}; !slices.Equal(s.sets, want) {
			t.Errorf("sets %q, want %q", s.sets, want)
		}
	})
}

// TestTunnelNeighborPacing: probes are rate-limited per next hop, urgent ones (OVS has nothing usable)
// every few seconds, verifications once a minute; fast re-checks stop after a while.
func TestTunnelNeighborPacing(t *testing.T) {
	ctx := context.Background()
	t.Run("verification once a minute", func(t *testing.T) {
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, nil, false)}}
		tn, c := newTestNeighbors(k, &fakeSwitch{cache: []unixctl.TunnelNeighbor{ovsEntry(peerA, rightMAC)}}, peerA)
		var counts []int
		for _, step := range []time.Duration{0, 10 * time.Second, 40 * time.Second, 11 * time.Second, 10 * time.Second} {
			c.advance(step)
			if _, err := tn.check(ctx); err != nil {
				t.Fatal(err)
			}
			counts = append(counts, len(k.probes))
		}
		if want := []int{1, 1, 1, 2, 2}; !slices.Equal(counts, want) {
			t.Errorf("probes after each check %v, want %v", counts, want)
		}
	})
	t.Run("urgent probes every 3 s, fast checks for 15 s", func(t *testing.T) {
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, nil, false)}}
		tn, c := newTestNeighbors(k, &fakeSwitch{}, peerA)
		var counts []int
		var waits []bool
		for range 40 { // 20 s of checks every 500 ms
			w, err := tn.check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			counts, waits = append(counts, len(k.probes)), append(waits, w)
			c.advance(500 * time.Millisecond)
		}
		if counts[0] != 1 || counts[5] != 1 || counts[6] != 2 || counts[39] != 7 {
			t.Errorf("probes over time %v: want one at 0 s, 3 s, 6 s...", counts)
		}
		if !waits[0] || !waits[29] || waits[30] {
			t.Errorf("waiting over time %v: want true for the first 15 s only", waits)
		}
	})
	t.Run("resolution ends the wait and sets OVS", func(t *testing.T) {
		k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, nil, false)}, resolveTo: rightMAC}
		s := &fakeSwitch{}
		tn, c := newTestNeighbors(k, s, peerA)
		if w, _ := tn.check(ctx); !w || len(s.sets) != 0 {
			t.Fatalf("first check: waiting %v, sets %v", w, s.sets)
		}
		c.advance(neighborFastPeriod)
		if w, _ := tn.check(ctx); w || !slices.Equal(s.sets, []string{"br-ul 192.0.2.12 " + rightMAC.String()}) {
			t.Fatalf("after the kernel resolved: waiting %v, sets %v", w, s.sets)
		}
	})
}

func TestTunnelNeighborRun(t *testing.T) {
	var nilNeighbors *TunnelNeighbors
	nilNeighbors.Kick() // the kernel datapath has none: both are no-ops
	nilNeighbors.Run(context.Background())

	k := &fakeKernel{entries: map[netip.Addr]nodenet.Neighbor{peerA: kernelEntry(peerA, rightMAC, true)}}
	tn, _ := newTestNeighbors(k, &fakeSwitch{}, peerA)
	tn.now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tn.Run(ctx); close(done) }()
	lookups := func() int { k.mu.Lock(); defer k.mu.Unlock(); return k.lookups }
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitUntil("the first check", func() bool { return lookups() >= 1 })
	tn.Kick()
	waitUntil("a check after the kick", func() bool { return lookups() >= 2 })
	cancel()
	<-done
}
