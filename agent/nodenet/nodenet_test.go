package nodenet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

func TestValidate(t *testing.T) {
	good := Config{Tun0: "tun0", LocalSubnet: netip.MustParsePrefix("10.128.2.0/23"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}, MTU: 1450, NodeIP: netip.MustParseAddr("192.0.2.10")}
	tests := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"good", func(*Config) {}, ""},
		{"no tun0", func(c *Config) { c.Tun0 = "" }, "tun0"},
		{"no subnet", func(c *Config) { c.LocalSubnet = netip.Prefix{} }, "node subnet"},
		{"/31 subnet", func(c *Config) { c.LocalSubnet = netip.MustParsePrefix("10.128.2.0/31") }, "node subnet"},
		{"IPv6 cluster network", func(c *Config) { c.ClusterNetworks = []netip.Prefix{netip.MustParsePrefix("fd00::/64")} }, "cluster network"},
		{"no cluster network", func(c *Config) { c.ClusterNetworks = nil }, "no cluster networks"},
		{"tiny MTU", func(c *Config) { c.MTU = 100 }, "MTU"},
		{"no node IP", func(c *Config) { c.NodeIP = netip.Addr{} }, "node IP"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("validate: %v, want an error about %q", err, tc.want)
			}
		})
	}
	if g := good.Gateway(); g != netip.MustParseAddr("10.128.2.1") {
		t.Errorf("gateway %s", g)
	}
	want := []string{"ip daddr 10.128.0.0/14 return", "ip daddr 172.30.0.0/16 return", "ip saddr 10.128.0.0/14 snat to 192.0.2.10"}
	good.ServiceNetwork = netip.MustParsePrefix("172.30.0.0/16")
	if got := SNATRules(good); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("SNATRules:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNetNS makes a named namespace removed at the end of the test.
func newNetNS(t *testing.T, role string) string {
	name := fmt.Sprintf("ofsdn-t-nodenet-%d-%s", os.Getpid(), role)
	_ = exec.Command("ip", "netns", "del", name).Run()
	ip(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// inNS runs fn with sockets created in the named namespace.
func inNS(t *testing.T, name string, fn func()) {
	t.Helper()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := inNetNS(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestEnsureOnRealNamespaces: a node namespace whose tun0 leads to a "pod" namespace and whose uplink
// leads to an "external" one. Ensure sets address, MTU, routes, forwarding and SNAT, twice without change;
// the external side sees the pod's connection come from the node's IP; Cleanup removes it all.
func TestEnsureOnRealNamespaces(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and network namespaces")
	}
	node, pod, ext := newNetNS(t, "node"), newNetNS(t, "pod"), newNetNS(t, "ext")
	// tun0 is a veth here: its far end is the pod (in production it is br0's internal port).
	ip(t, "-n", node, "link", "add", "tun0", "type", "veth", "peer", "name", "eth0", "netns", pod)
	ip(t, "-n", node, "link", "add", "up0", "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", ext)
	ip(t, "-n", node, "addr", "add", "198.18.0.1/24", "dev", "up0")
	ip(t, "-n", node, "link", "set", "up0", "up")
	ip(t, "-n", ext, "addr", "add", "198.18.0.2/24", "dev", "eth0")
	ip(t, "-n", ext, "link", "set", "eth0", "up")
	ip(t, "-n", pod, "addr", "add", "10.128.2.5/23", "dev", "eth0")
	ip(t, "-n", pod, "link", "set", "eth0", "up")
	ip(t, "-n", pod, "route", "add", "default", "via", "10.128.2.1")

	nodeIP := netip.MustParseAddr("198.18.0.1")
	mtu, err := UplinkMTU("/var/run/netns/"+node, nodeIP)
	if err != nil || mtu != 1500 {
		t.Fatalf("UplinkMTU: %d, %v", mtu, err)
	}
	cfg := Config{HostNetNS: "/var/run/netns/" + node, Tun0: "tun0", LocalSubnet: netip.MustParsePrefix("10.128.2.0/23"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}, ServiceNetwork: netip.MustParsePrefix("172.30.0.0/16"),
		MTU: mtu - 50, NodeIP: nodeIP}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state := func() string {
		out, _ := exec.Command("ip", "-n", node, "-o", "addr", "show", "dev", "tun0").CombinedOutput()
		routes, _ := exec.Command("ip", "-n", node, "route", "show", "dev", "tun0").CombinedOutput()
		link, _ := exec.Command("ip", "-n", node, "-o", "link", "show", "tun0").CombinedOutput()
		fwd, _ := exec.Command("ip", "netns", "exec", node, "cat", "/proc/sys/net/ipv4/ip_forward").CombinedOutput()
		return string(out) + string(routes) + strings.Fields(string(link))[4] + " forward=" + string(fwd) + strings.Join(nftRules(t, node), "\n")
	}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	first := state()
	for _, want := range []string{"inet 10.128.2.1/23", "10.128.0.0/14 proto static scope link src 10.128.2.1 mtu 1450",
		"172.30.0.0/16 proto static scope link src 10.128.2.1 mtu 1450", "1450", "forward=1"} {
		if !strings.Contains(first, want) {
			t.Errorf("after Ensure, no %q in:\n%s", want, first)
		}
	}
	if n := len(nftRules(t, node)); n != 3 {
		t.Errorf("%d nf_tables rules, want 3", n)
	}
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if again := state(); again != first {
		t.Errorf("a second Ensure changed the host:\n%s\nthen\n%s", first, again)
	}

	// Real packets: the pod connects to the external host, which sees the node's address.
	var ln net.Listener
	inNS(t, ext, func() { ln, err = net.Listen("tcp4", "198.18.0.2:9000") })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- err.Error()
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	}()
	var conn net.Conn
	inNS(t, pod, func() { conn, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", "198.18.0.2:9000") })
	if err != nil {
		t.Fatalf("pod → external: %v", err)
	}
	conn.Close()
	if got := <-seen; got != nodeIP.String() {
		t.Errorf("external saw the connection from %s, want the node's %s", got, nodeIP)
	}

	if err := Cleanup(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	after := state()
	if strings.Contains(after, "10.128.0.0/14") || strings.Contains(after, "172.30.0.0/16") || len(nftRules(t, node)) != 0 {
		t.Errorf("Cleanup left:\n%s", after)
	}
	if err := Cleanup(ctx, cfg); err != nil {
		t.Errorf("a second Cleanup: %v", err)
	}
}

func TestEnsureWaitsForTun0(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and network namespaces")
	}
	node := newNetNS(t, "wait")
	cfg := Config{HostNetNS: "/var/run/netns/" + node, Tun0: "tun0", LocalSubnet: netip.MustParsePrefix("10.128.2.0/23"),
		ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")}, MTU: 1450, NodeIP: netip.MustParseAddr("198.18.0.1")}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := Ensure(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "tun0 never appeared") {
		t.Fatalf("Ensure without tun0: %v", err)
	}
	// It appears late: Ensure picks it up.
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = exec.Command("ip", "-n", node, "link", "add", "tun0", "type", "veth", "peer", "name", "tun0peer").Run()
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := Ensure(ctx2, cfg); err != nil {
		t.Fatal(err)
	}
	h, ns, err := handleAt(cfg.HostNetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer ns.Close()
	link, err := h.LinkByName("tun0")
	if err != nil || link.Attrs().MTU != 1450 {
		t.Fatalf("tun0: %v %v", link, err)
	}
	if err := Cleanup(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
}

// nftRules lists the rules of ofsdn's chain in a namespace, as nf_tables holds them.
func nftRules(t *testing.T, name string) []string {
	t.Helper()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := c.ListTableOfFamily(NFTTable, nftables.TableFamilyIPv4)
	if err != nil || tbl == nil {
		return nil
	}
	rules, err := c.GetRules(tbl, &nftables.Chain{Name: "postrouting", Table: tbl})
	if err != nil {
		return nil
	}
	var out []string
	for _, r := range rules {
		out = append(out, fmt.Sprintf("%d exprs", len(r.Exprs)))
	}
	return out
}
