package nodenet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func egressMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0e, 0x45, b[0], b[1], b[2], b[3]}
}

// TestEgressSNATOnVeths: a node namespace whose tun0 (a veth) leads to a "pod" namespace sending with an
// egress IP's MAC, as br0 hands egress traffic over, and whose uplink leads to an "external" one. Not
// held: the traffic is dropped, never sent from the node's address. Held: the address is on the uplink
// (a secondary address in its subnet), the external side sees the connection from it and the replies
// come back; the announcement moves the external side's neighbour entry. Released: dropped again, and
// the node's own address stays.
func TestEgressSNATOnVeths(t *testing.T) {
	needRoot(t)
	node, pod, ext := newNetNS(t, "node"), newNetNS(t, "pod"), newNetNS(t, "ext")
	ip(t, "-n", node, "link", "add", "tun0", "type", "veth", "peer", "name", "eth0", "netns", pod)
	ip(t, "-n", node, "link", "add", "up0", "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", ext)
	ip(t, "-n", node, "addr", "add", "192.0.2.1/24", "dev", "up0")
	ip(t, "-n", node, "link", "set", "up0", "up")
	ip(t, "-n", ext, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	ip(t, "-n", ext, "link", "set", "eth0", "up")
	eip, outside := netip.MustParseAddr("192.0.2.40"), netip.MustParseAddr("198.51.100.40")
	ip(t, "-n", pod, "link", "set", "eth0", "address", egressMAC(eip).String())
	ip(t, "-n", pod, "addr", "add", "10.128.2.5/23", "dev", "eth0")
	ip(t, "-n", pod, "link", "set", "eth0", "up")
	ip(t, "-n", pod, "route", "add", "default", "via", "10.128.2.1")
	nodeIP := netip.MustParseAddr("192.0.2.1")
	cfg := goodConfig()
	cfg.HostNetNS, cfg.MTU, cfg.NodeIP = nsPath(node), 1450, nodeIP
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ecfg := EgressConfig{HostNetNS: nsPath(node), Tun0: "tun0", MAC: egressMAC, MACPrefix: [2]byte{0x0e, 0x45}, Logger: logr.Discard()}
	dial := func() error {
		var conn net.Conn
		var err error
		ln := listen(t, ext, "192.0.2.2:9100")
		defer ln.Close()
		inNS(t, pod, func() error {
			conn, err = (&net.Dialer{Timeout: 700 * time.Millisecond}).Dial("tcp4", "192.0.2.2:9100")
			return nil
		})
		if err == nil {
			conn.Close()
		}
		return err
	}

	// Nothing held: the table drops what carries an egress MAC (it would otherwise leave from the
	// node's address through ofsdn's own SNAT).
	if err := EnsureEgressSNAT(ecfg, nil); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err == nil {
		t.Fatal("an egress IP's traffic left while no egress IP is held here")
	}

	// Held.
	if err := AddEgressAddress(nsPath(node), nodeIP, eip); err != nil {
		t.Fatal(err)
	}
	if err := AddEgressAddress(nsPath(node), nodeIP, outside); err != nil { // outside the node's subnet
		t.Fatal(err)
	}
	if err := AddEgressAddress(nsPath(node), nodeIP, eip); err != nil { // idempotent
		t.Fatal(err)
	}
	link, addrs, err := UplinkAddresses(nsPath(node), nodeIP)
	if err != nil || link != "up0" {
		t.Fatalf("uplink %q, %v", link, err)
	}
	wantAddrs := []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.40/24"), netip.MustParsePrefix("198.51.100.40/32")}
	if !sameSet(addrs, wantAddrs) {
		t.Errorf("uplink addresses %v, want %v", addrs, wantAddrs)
	}
	if out, _ := exec.Command("ip", "-n", node, "-4", "-o", "addr", "show", "dev", "up0").CombinedOutput(); !regexp.MustCompile(`192\.0\.2\.40/24 .*secondary`).Match(out) {
		t.Errorf("the egress IP inside the node's subnet is not a secondary address (the kernel could pick it as a source):\n%s", out)
	}
	if err := EnsureEgressSNAT(ecfg, []netip.Addr{eip}); err != nil {
		t.Fatal(err)
	}
	if got := sourceSeen(t, pod, ext, netip.MustParseAddrPort("192.0.2.2:9000")); got != eip {
		t.Errorf("external saw the connection from %s, want the egress IP %s", got, eip)
	}
	// What the kernel holds, read back without the comments: SNAT by the MAC, the drop of the rest;
	// and the same set again rewrites nothing (the handles stay).
	list := func() string {
		out, err := exec.Command("ip", "netns", "exec", node, "nft", "-a", "list", "table", "ip", EgressNFTTable).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v\n%s", err, out)
		}
		var lines []string
		for _, l := range strings.Split(string(out), "\n") {
			rule, _, _ := strings.Cut(l, " comment ")
			lines = append(lines, rule)
		}
		return strings.Join(lines, "\n")
	}
	before := list()
	// nft prints the link-layer source as raw payload (@ll,offset,bits) in an ip-family table.
	macHex := fmt.Sprintf("0x%x", []byte(egressMAC(eip)))
	for _, want := range []string{`iifname "tun0" @ll,48,48 ` + strings.Replace(macHex, "0x0", "0x", 1) + ` counter packets \d+ bytes \d+ snat to ` + eip.String(),
		`iifname "tun0" @ll,48,16 0xe45 counter packets \d+ bytes \d+ drop`,
		`type nat hook postrouting priority srcnat - 1`} {
		if !regexp.MustCompile(want).MatchString(before) {
			t.Errorf("nf_tables lacks %q:\n%s", want, before)
		}
	}
	if err := EnsureEgressSNAT(ecfg, []netip.Addr{eip}); err != nil {
		t.Fatal(err)
	}
	handles := regexp.MustCompile(`# handle \d+`)
	if a, b := handles.FindAllString(before, -1), handles.FindAllString(list(), -1); !slices.Equal(a, b) {
		t.Errorf("the same held set rewrote the table: handles %v, then %v", a, b)
	}

	// The announcement moves the external side's neighbour entry for the egress IP.
	ip(t, "-n", ext, "neigh", "replace", eip.String(), "lladdr", "02:00:00:00:00:01", "dev", "eth0", "nud", "stale")
	if err := AnnounceAddress(nsPath(node), nodeIP, eip); err != nil {
		t.Fatal(err)
	}
	up0, err := LinkMAC(nsPath(node), "up0")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		out, _ := exec.Command("ip", "-n", ext, "neigh", "show", eip.String()).CombinedOutput()
		if strings.Contains(string(out), up0.String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("external's neighbour entry for %s did not move to %s: %s", eip, up0, out)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Released.
	if err := DelEgressAddress(nsPath(node), nodeIP, eip); err != nil {
		t.Fatal(err)
	}
	if err := DelEgressAddress(nsPath(node), nodeIP, eip); err != nil { // gone already
		t.Fatal(err)
	}
	if err := DelEgressAddress(nsPath(node), nodeIP, nodeIP); err == nil {
		t.Error("DelEgressAddress removed the node's own address")
	}
	if err := EnsureEgressSNAT(ecfg, nil); err != nil {
		t.Fatal(err)
	}
	if err := dial(); err == nil {
		t.Error("an egress IP's traffic left after the IP was released")
	}
	_, addrs, _ = UplinkAddresses(nsPath(node), nodeIP)
	if !slices.Contains(addrs, netip.MustParsePrefix("192.0.2.1/24")) || slices.Contains(addrs, netip.MustParsePrefix("192.0.2.40/24")) {
		t.Errorf("after release: %v", addrs)
	}
	if err := DeleteEgressSNAT(nsPath(node)); err != nil {
		t.Fatal(err)
	}
}

func listen(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	inNS(t, ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln
}

func sameSet(a, b []netip.Prefix) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	cmp := func(x, y netip.Prefix) int { return strings.Compare(x.String(), y.String()) }
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	return slices.Equal(a, b)
}

func TestGratuitousARP(t *testing.T) {
	mac := net.HardwareAddr{0x0a, 0x58, 1, 2, 3, 4}
	ipa := netip.MustParseAddr("198.51.100.40")
	for _, tc := range []struct {
		op  uint16
		tha string
	}{{1, "000000000000"}, {2, "ffffffffffff"}} {
		f := GratuitousARP(mac, ipa, tc.op)
		hex := func(b []byte) string { return strings.ReplaceAll(net.HardwareAddr(b).String(), ":", "") }
		if len(f) != 42 || hex(f[0:6]) != "ffffffffffff" || hex(f[6:12]) != "0a5801020304" || hex(f[12:14]) != "0806" ||
			hex(f[14:22]) != "000108000604000"+string(rune('0'+tc.op)) || hex(f[22:28]) != "0a5801020304" ||
			netip.AddrFrom4([4]byte(f[28:32])) != ipa || hex(f[32:38]) != tc.tha || netip.AddrFrom4([4]byte(f[38:42])) != ipa {
			t.Errorf("op %d: % x", tc.op, f)
		}
	}
}
