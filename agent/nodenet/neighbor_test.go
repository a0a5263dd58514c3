package nodenet

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// neighborLab: a node with uplink up0 (192.0.2.1/24) and a peer on the same segment (192.0.2.2, a fixed
// MAC) that is also the gateway to 198.51.100.0/24, where a routed peer lives.
func neighborLab(t *testing.T) (node string, peerMAC net.HardwareAddr) {
	t.Helper()
	needRoot(t)
	node, peer := newNetNS(t, "node"), newNetNS(t, "peer")
	peerMAC, _ = net.ParseMAC("0a:58:c0:00:02:02")
	ip(t, "-n", node, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", peer)
	ip(t, "-n", node, "addr", "add", "192.0.2.1/24", "dev", "up0")
	ip(t, "-n", node, "link", "set", "up0", "up")
	ip(t, "-n", node, "route", "add", "198.51.100.0/24", "via", "192.0.2.2")
	ip(t, "-n", peer, "link", "set", "eth0", "address", peerMAC.String())
	ip(t, "-n", peer, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	ip(t, "-n", peer, "link", "set", "eth0", "up")
	// Quicker neighbour timers, in the node's own namespace only: a stale entry is probed after 1 s
	// instead of 5, and each probe waits 200 ms.
	inNS(t, node, func() error {
		for file, v := range map[string]string{"delay_first_probe_time": "1", "retrans_time_ms": "200"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/neigh/up0/"+file, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	return node, peerMAC
}

func lookupOne(t *testing.T, node string, peer netip.Addr) Neighbor {
	t.Helper()
	got, err := PeerNeighbors(nsPath(node), []netip.Addr{peer})
	if err != nil || len(got) != 1 {
		t.Fatalf("PeerNeighbors(%s) = %+v, %v", peer, got, err)
	}
	return got[0]
}

// waitNeighbor polls until ok holds for the peer's entry; every sample is also passed to each, so a test
// can check that something holds all along.
func waitNeighbor(t *testing.T, node string, peer netip.Addr, d time.Duration, each func(Neighbor), ok func(Neighbor) bool) Neighbor {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		n := lookupOne(t, node, peer)
		if each != nil {
			each(n)
		}
		if ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("neighbour of %s after %s: %+v", peer, d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPeerNeighborsAndProbe(t *testing.T) {
	node, peerMAC := neighborLab(t)
	direct, routed := netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("198.51.100.7")
	gw := direct

	t.Run("next hops before any resolution", func(t *testing.T) {
		got, err := PeerNeighbors(nsPath(node), []netip.Addr{direct, routed})
		if err != nil {
			t.Fatal(err)
		}
		want := []Neighbor{{Peer: direct, Link: "up0", NextHop: direct}, {Peer: routed, Link: "up0", NextHop: gw}}
		if len(got) != 2 || got[0].String() != want[0].String() || got[1].String() != want[1].String() {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	})

	t.Run("probe resolves the gateway of a routed peer", func(t *testing.T) {
		if err := ProbeNeighbor(nsPath(node), routed); err != nil {
			t.Fatal(err)
		}
		n := waitNeighbor(t, node, routed, 5*time.Second, nil, func(n Neighbor) bool { return n.Confirmed })
		if n.MAC.String() != peerMAC.String() || n.NextHop != gw {
			t.Fatalf("after probing: %+v, want %s at %s", n, peerMAC, gw)
		}
	})

	t.Run("probing a stale entry keeps it while it is confirmed", func(t *testing.T) {
		ip(t, "-n", node, "neigh", "replace", "192.0.2.2", "lladdr", peerMAC.String(), "nud", "stale", "dev", "up0")
		if n := lookupOne(t, node, direct); n.Confirmed || n.MAC.String() != peerMAC.String() {
			t.Fatalf("stale entry reads %+v", n)
		}
		if err := ProbeNeighbor(nsPath(node), direct); err != nil {
			t.Fatal(err)
		}
		waitNeighbor(t, node, direct, 5*time.Second, func(n Neighbor) {
			if n.MAC.String() != peerMAC.String() {
				t.Fatalf("the working entry went away while being confirmed: %+v", n)
			}
		}, func(n Neighbor) bool { return n.Confirmed })
	})

	t.Run("a wrong stale entry is corrected by probing, never replaced blindly", func(t *testing.T) {
		ip(t, "-n", node, "neigh", "replace", "192.0.2.2", "lladdr", "02:00:00:00:00:99", "nud", "stale", "dev", "up0")
		if err := ProbeNeighbor(nsPath(node), direct); err != nil {
			t.Fatal(err)
		}
		// The unicast probes to the wrong MAC go unanswered and the entry fails; a probe then
		// resolves it afresh.
		waitNeighbor(t, node, direct, 10*time.Second, nil, func(n Neighbor) bool {
			if n.MAC == nil || n.MAC.String() != peerMAC.String() {
				_ = ProbeNeighbor(nsPath(node), direct)
			}
			return n.Confirmed && n.MAC.String() == peerMAC.String()
		})
	})

	t.Run("a permanent entry is confirmed and kept", func(t *testing.T) {
		ip(t, "-n", node, "neigh", "replace", "192.0.2.2", "lladdr", "02:00:00:00:00:42", "nud", "permanent", "dev", "up0")
		if err := ProbeNeighbor(nsPath(node), direct); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		if n := lookupOne(t, node, direct); !n.Confirmed || n.MAC.String() != "02:00:00:00:00:42" {
			t.Fatalf("permanent entry reads %+v", n)
		}
	})

	t.Run("peers without a usable route", func(t *testing.T) {
		got, err := PeerNeighbors(nsPath(node), []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("192.0.2.1"), direct})
		if err == nil || !strings.Contains(err.Error(), "203.0.113.9") || !strings.Contains(err.Error(), "address of this node") {
			t.Errorf("err = %v, want one naming the unroutable peer and the local address", err)
		}
		if len(got) != 1 || got[0].Peer != direct {
			t.Errorf("got %+v, want the routable peer still", got)
		}
		if err := ProbeNeighbor(nsPath(node), netip.MustParseAddr("203.0.113.9")); err == nil {
			t.Error("probing an unroutable peer succeeded")
		}
	})
}

func (n Neighbor) String() string {
	return n.Peer.String() + " via " + n.NextHop.String() + " dev " + n.Link + " lladdr " + n.MAC.String() + map[bool]string{true: " confirmed"}[n.Confirmed]
}
