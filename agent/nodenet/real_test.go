package nodenet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// nsPrefix starts the name of every network namespace these tests create; the pid after it lets a later
// run sweep what a killed one left.
const nsPrefix = "ofsdn-t-nodenet-"

var nsSeq atomic.Int32

func needRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("real network namespaces: skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	sweep()
}

// sweep deletes namespaces left by test processes that no longer exist.
func sweep() {
	names, _ := filepath.Glob("/var/run/netns/" + nsPrefix + "*")
	for _, path := range names {
		rest := strings.TrimPrefix(filepath.Base(path), nsPrefix)
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		_ = exec.Command("ip", "netns", "del", filepath.Base(path)).Run()
	}
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNetNS makes a named namespace (loopback up) that is removed when the test ends, pass or fail; the
// links inside go with it.
func newNetNS(t *testing.T, role string) string {
	t.Helper()
	name := fmt.Sprintf("%s%d-%d-%s", nsPrefix, os.Getpid(), nsSeq.Add(1), role)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ip(t, "netns", "add", name)
	ip(t, "-n", name, "link", "set", "lo", "up")
	return name
}

func nsPath(name string) string { return "/var/run/netns/" + name }

// inNS runs fn with sockets created in the named namespace.
func inNS(t *testing.T, name string, fn func() error) {
	t.Helper()
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := inNetNS(ns, fn); err != nil {
		t.Fatal(err)
	}
}

// sourceSeen makes a TCP connection from namespace from to dst, listened on in namespace to, and returns
// the source address the listener saw.
func sourceSeen(t *testing.T, from, to string, dst netip.AddrPort) netip.Addr {
	t.Helper()
	var ln net.Listener
	inNS(t, to, func() (err error) { ln, err = net.Listen("tcp4", dst.String()); return err })
	defer ln.Close()
	seen := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- netip.Addr{}
			return
		}
		defer c.Close()
		seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		_, _ = c.Write([]byte("ok"))
	}()
	var conn net.Conn
	inNS(t, from, func() (err error) {
		conn, err = (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp4", dst.String())
		return err
	})
	defer conn.Close()
	// Read the reply too: the way back (un-SNAT, routes into tun0) must work as well.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "ok" {
		t.Fatalf("%s → %s: no reply: %v", from, dst, err)
	}
	select {
	case a := <-seen:
		return a
	case <-time.After(5 * time.Second):
		t.Fatalf("%s → %s: listener saw nothing", from, dst)
		return netip.Addr{}
	}
}

// hostState is what Ensure controls in a namespace, read back through netlink, /proc/sys and nf_tables.
type hostState struct {
	Addrs   []string // IPv4 on tun0
	MTU     int
	Up      bool
	Routes  []string // nodenet's routes on tun0
	Forward string
	Table   bool     // ofsdn's table exists
	Chain   string   // its chain: name type hook priority
	Chains  []string // every chain of the table
	Rules   []string // "handle N: comment | expressions"
}

func (s hostState) String() string {
	return fmt.Sprintf("addrs %v mtu %d up %v\nroutes %v\nip_forward %s\ntable %v chain %q\nrules\n  %s",
		s.Addrs, s.MTU, s.Up, s.Routes, s.Forward, s.Table, s.Chain, strings.Join(s.Rules, "\n  "))
}

func readState(t *testing.T, ns, tun0 string) hostState {
	t.Helper()
	h, nsh, err := handleAt(nsPath(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer nsh.Close()
	var s hostState
	if link, err := h.LinkByName(tun0); err == nil {
		s.MTU, s.Up = link.Attrs().MTU, link.Attrs().Flags&net.FlagUp != 0
		addrs, err := h.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			s.Addrs = append(s.Addrs, a.IPNet.String())
		}
		routes, err := ownedRoutes(h, link)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			s.Routes = append(s.Routes, fmt.Sprintf("%s src %s scope %s mtu %d", r.Dst, r.Src, r.Scope, r.MTU))
		}
	}
	inNS(t, ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		s.Forward = strings.TrimSpace(string(b))
		return err
	})
	c, err := nftables.New(nftables.WithNetNSFd(int(nsh)))
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := c.ListTableOfFamily(NFTTable, nftables.TableFamilyIPv4)
	if err != nil {
		return s // no table
	}
	s.Table = true
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != NFTTable {
			continue
		}
		s.Chains = append(s.Chains, ch.Name)
		if ch.Name != NFTChain {
			continue // the port-forwarding chains have tests of their own
		}
		s.Chain = fmt.Sprintf("%s %s hook %d prio %d", ch.Name, ch.Type, *ch.Hooknum, *ch.Priority)
		rules, err := c.GetRules(tbl, ch)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			comment, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			s.Rules = append(s.Rules, fmt.Sprintf("handle %d: %s | %s", r.Handle, comment, exprText(r.Exprs)))
		}
	}
	return s
}

// snatPackets reads the SNAT rules' counters.
func snatPackets(t *testing.T, ns string) uint64 {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	tbl := table()
	rules, err := c.GetRules(tbl, &nftables.Chain{Name: NFTChain, Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				n += ctr.Packets
			}
		}
	}
	return n
}

// checkEnsured asserts what one Ensure must leave behind.
func checkEnsured(t *testing.T, s hostState, cfg Config) {
	t.Helper()
	gw := netip.PrefixFrom(cfg.Gateway(), cfg.LocalSubnet.Bits())
	if len(s.Addrs) != 1 || s.Addrs[0] != gw.String() {
		t.Errorf("tun0 addresses %v, want just %s", s.Addrs, gw)
	}
	if s.MTU != cfg.MTU || !s.Up {
		t.Errorf("tun0 MTU %d up %v, want %d and up", s.MTU, s.Up, cfg.MTU)
	}
	var want []string
	for _, p := range cfg.routed() {
		want = append(want, fmt.Sprintf("%s src %s scope link mtu %d", p, cfg.Gateway(), cfg.MTU))
	}
	if strings.Join(s.Routes, "\n") != strings.Join(want, "\n") {
		t.Errorf("routes on tun0:\n%s\nwant\n%s", strings.Join(s.Routes, "\n"), strings.Join(want, "\n"))
	}
	if s.Forward != "1" {
		t.Errorf("ip_forward %q", s.Forward)
	}
	if wantChain := fmt.Sprintf("%s nat hook %d prio %d", NFTChain, *nftables.ChainHookPostrouting, *nftables.ChainPriorityNATSource); s.Chain != wantChain {
		t.Errorf("chain %q, want %q", s.Chain, wantChain)
	}
	rules := snatRules(cfg)
	if len(s.Rules) != len(rules) {
		t.Fatalf("%d rules installed, want %d:\n%s", len(s.Rules), len(rules), s)
	}
	for i, r := range rules {
		// Comment and expressions read back from the kernel must both say the rule's text.
		if _, got, _ := strings.Cut(s.Rules[i], ": "); got != r.Text+" | "+r.Text {
			t.Errorf("rule %d: %q, want %q", i, got, r.Text)
		}
	}
}

// TestEnsureOnVeths: a node namespace whose tun0 (a veth here) leads to a "pod" namespace and whose uplink
// leads to an "external" one. Ensure sets address, MTU, routes, forwarding and SNAT, and a second Ensure
// changes nothing; the external side sees the pod's connection come from the node's IP, while traffic to
// a cluster address keeps the pod's; a changed config converges; Cleanup removes it all.
func TestEnsureOnVeths(t *testing.T) {
	needRoot(t)
	node, pod, ext := newNetNS(t, "node"), newNetNS(t, "pod"), newNetNS(t, "ext")
	ip(t, "-n", node, "link", "add", "tun0", "type", "veth", "peer", "name", "eth0", "netns", pod)
	ip(t, "-n", node, "link", "add", "up0", "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", ext)
	ip(t, "-n", node, "addr", "add", "192.0.2.1/24", "dev", "up0")
	ip(t, "-n", node, "link", "set", "up0", "up")
	ip(t, "-n", ext, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	// An address inside the cluster network behind the uplink, routed there by a more specific route:
	// stands in for a remote pod, to prove traffic to the cluster network is not NATed.
	ip(t, "-n", ext, "addr", "add", "10.130.0.9/32", "dev", "eth0")
	ip(t, "-n", ext, "link", "set", "eth0", "up")
	ip(t, "-n", ext, "route", "add", "10.128.0.0/14", "via", "192.0.2.1")
	ip(t, "-n", node, "route", "add", "10.130.0.9/32", "via", "192.0.2.2")
	ip(t, "-n", pod, "addr", "add", "10.128.2.5/23", "dev", "eth0")
	ip(t, "-n", pod, "link", "set", "eth0", "up")
	ip(t, "-n", pod, "route", "add", "default", "via", "10.128.2.1")
	// Stale state Ensure must remove: an old address on tun0.
	ip(t, "-n", node, "addr", "add", "10.99.0.1/24", "dev", "tun0")

	nodeIP := netip.MustParseAddr("192.0.2.1")
	mtu, err := UplinkMTU(nsPath(node), nodeIP)
	if err != nil || mtu != 1500 {
		t.Fatalf("UplinkMTU: %d, %v", mtu, err)
	}
	if _, err := UplinkMTU(nsPath(node), netip.MustParseAddr("192.0.2.77")); err == nil || !strings.Contains(err.Error(), "no interface") {
		t.Errorf("UplinkMTU of an absent address: %v", err)
	}
	cfg := goodConfig()
	cfg.HostNetNS, cfg.MTU, cfg.NodeIP = nsPath(node), mtu-50, nodeIP
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	first := readState(t, node, "tun0")
	checkEnsured(t, first, cfg)
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if again := readState(t, node, "tun0"); again.String() != first.String() {
		t.Errorf("a second Ensure changed the host (rule handles included):\n%s\nthen\n%s", first, again)
	}

	// Real packets, both ways.
	if got := sourceSeen(t, pod, ext, netip.MustParseAddrPort("192.0.2.2:9000")); got != nodeIP {
		t.Errorf("external saw the pod's connection from %s, want the node's %s", got, nodeIP)
	}
	if n := snatPackets(t, node); n == 0 {
		t.Error("the SNAT rule counted no packet")
	}
	if got := sourceSeen(t, pod, ext, netip.MustParseAddrPort("10.130.0.9:9001")); got != netip.MustParseAddr("10.128.2.5") {
		t.Errorf("a cluster address saw the pod's connection from %s, want the pod's own 10.128.2.5", got)
	}
	if got := sourceSeen(t, node, pod, netip.MustParseAddrPort("10.128.2.5:9002")); got != cfg.Gateway() {
		t.Errorf("the pod saw the host's connection from %s, want the gateway %s", got, cfg.Gateway())
	}

	// A changed config converges: another service network, a second cluster network, a new MTU.
	changed := cfg
	changed.ServiceNetwork = netip.MustParsePrefix("172.31.0.0/16")
	changed.ClusterNetworks = append(changed.ClusterNetworks, netip.MustParsePrefix("10.132.0.0/14"))
	changed.MTU = 1400
	if err := Ensure(ctx, changed); err != nil {
		t.Fatal(err)
	}
	checkEnsured(t, readState(t, node, "tun0"), changed)
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	checkEnsured(t, readState(t, node, "tun0"), cfg)

	if err := Cleanup(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	after := readState(t, node, "tun0")
	if len(after.Routes) != 0 || after.Table {
		t.Errorf("Cleanup left:\n%s", after)
	}
	if err := Cleanup(ctx, cfg); err != nil {
		t.Errorf("a second Cleanup: %v", err)
	}
	// Other routes in the namespace are not nodenet's to remove.
	h, nsh, err := handleAt(nsPath(node))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	defer nsh.Close()
	if rs, err := h.RouteGet(net.ParseIP("10.130.0.9")); err != nil || len(rs) == 0 || !rs[0].Gw.Equal(net.ParseIP("192.0.2.2")) {
		t.Errorf("the namespace's own route to 10.130.0.9 is gone: %v %v", rs, err)
	}
}

// TestEnsureWithOVSTun0: production's shape. tun0 is an internal port of a userspace OVS bridge (a tap
// that appears after OVSDB has the port), br0 forwards NORMAL, the pod is an OVS port; the pod reaches
// the external namespace through tun0 and the node's SNAT.
func TestEnsureWithOVSTun0(t *testing.T) {
	needRoot(t)
	inst := ovstest.Start(t)
	inst.AddBridge("br0")
	if _, err := inst.Ofctl("add-flow", "br0", "priority=0,actions=NORMAL"); err != nil {
		t.Fatal(err)
	}
	node := inst.NetNS
	ext := newNetNS(t, "ext")
	ip(t, "-n", node, "link", "add", "up0", "mtu", "1500", "type", "veth", "peer", "name", "eth0", "netns", ext)
	ip(t, "-n", node, "addr", "add", "192.0.2.1/24", "dev", "up0")
	ip(t, "-n", node, "link", "set", "up0", "up")
	ip(t, "-n", ext, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	ip(t, "-n", ext, "link", "set", "eth0", "up")

	cfg := goodConfig()
	cfg.HostNetNS, cfg.NodeIP = nsPath(node), netip.MustParseAddr("192.0.2.1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Ensure starts before tun0 exists and waits for OVS to create it.
	done := make(chan error, 1)
	go func() { done <- Ensure(ctx, cfg) }()
	time.Sleep(100 * time.Millisecond)
	if _, err := inst.Vsctl("add-port", "br0", "tun0", "--", "set", "Interface", "tun0", "type=internal", "mtu_request=1450"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("0a:58:0a:80:02:05")
	p := inst.AddPod("br0", "p1", netip.MustParsePrefix("10.128.2.5/23"), mac, 10)
	ip(t, "-n", p.NetNS, "route", "add", "default", "via", "10.128.2.1")
	checkEnsured(t, readState(t, node, "tun0"), cfg)

	if got := sourceSeen(t, p.NetNS, ext, netip.MustParseAddrPort("192.0.2.2:9000")); got != cfg.NodeIP {
		t.Errorf("external saw the pod's connection from %s, want the node's %s", got, cfg.NodeIP)
	}
	if got := sourceSeen(t, node, p.NetNS, netip.MustParseAddrPort("10.128.2.5:9001")); got != cfg.Gateway() {
		t.Errorf("the pod saw the host's connection from %s, want the gateway %s", got, cfg.Gateway())
	}
	if err := Cleanup(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if s := readState(t, node, "tun0"); len(s.Routes) != 0 || s.Table {
		t.Errorf("Cleanup left:\n%s", s)
	}
}

func TestEnsureWaitsForTun0(t *testing.T) {
	needRoot(t)
	node := newNetNS(t, "wait")
	cfg := goodConfig()
	cfg.HostNetNS = nsPath(node)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := Ensure(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "tun0 never appeared") {
		t.Fatalf("Ensure without tun0: %v", err)
	}
	// It appears late: Ensure picks it up.
	go func() {
		time.Sleep(200 * time.Millisecond)
		// A tap, as userspace OVS makes (this kernel has no dummy links).
		_ = exec.Command("ip", "-n", node, "tuntap", "add", "tun0", "mode", "tap").Run()
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := Ensure(ctx2, cfg); err != nil {
		t.Fatal(err)
	}
	checkEnsured(t, readState(t, node, "tun0"), cfg)
	if err := Cleanup(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
}

func TestBadNamespaceAndConfig(t *testing.T) {
	needRoot(t)
	cfg := goodConfig()
	cfg.HostNetNS = "/var/run/netns/" + nsPrefix + "does-not-exist"
	ctx := context.Background()
	if err := Ensure(ctx, cfg); err == nil || !strings.Contains(err.Error(), "does-not-exist") {
		t.Errorf("Ensure in a missing namespace: %v", err)
	}
	if err := Cleanup(ctx, cfg); err == nil || !strings.Contains(err.Error(), "does-not-exist") {
		t.Errorf("Cleanup in a missing namespace: %v", err)
	}
	if _, err := UplinkMTU(cfg.HostNetNS, cfg.NodeIP); err == nil {
		t.Error("UplinkMTU in a missing namespace: no error")
	}
	cfg.MTU = 0
	if err := Ensure(ctx, cfg); err == nil || !strings.Contains(err.Error(), "MTU 0") {
		t.Errorf("Ensure with MTU 0: %v", err)
	}
	if err := Cleanup(ctx, Config{Tun0: "bad/name"}); err == nil {
		t.Error("Cleanup with a bad link name: no error")
	}
}

// TestFirewallForwards: NodePorts, hostPorts and the reject ports load into the kernel as rendered, and
// an unchanged EnsureFirewall leaves every rule (handles, counters) alone.
func TestFirewallForwards(t *testing.T) {
	needRoot(t)
	node := newNetNS(t, "fw")
	ip(t, "-n", node, "tuntap", "add", "tun0", "mode", "tap")
	cfg := goodConfig()
	cfg.HostNetNS = nsPath(node)
	cfg.Forwards = Forwards{NodePortTarget: netip.MustParseAddr("169.254.169.3"), RejectPorts: [2]uint16{65400, 65499},
		NodePorts: []NodePort{{Protocol: unix.IPPROTO_TCP, Port: 30080}, {Protocol: unix.IPPROTO_UDP, Port: 30053}},
		HostPorts: []HostPort{{Protocol: unix.IPPROTO_TCP, HostPort: 8080, PodIP: netip.MustParseAddr("10.128.2.5"), PodPort: 80, Pod: "a/web"},
			{Protocol: unix.IPPROTO_UDP, HostIP: netip.MustParseAddr("192.0.2.10"), HostPort: 5353, PodIP: netip.MustParseAddr("10.128.2.6"), PodPort: 53, Pod: "a/dns"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	list := func() string {
		out, err := exec.Command("ip", "netns", "exec", node, "nft", "-a", "list", "table", "ip", NFTTable).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	first := list()
	for _, want := range []string{
		"tcp dport 30080", "dnat to 169.254.169.3", "ip saddr 10.128.0.0/14 ip daddr 169.254.169.3 counter packets 0 bytes 0 masquerade",
		"dnat to 10.128.2.5:80", "ip daddr 192.0.2.10 udp dport 5353", "dnat to 10.128.2.6:53",
		"reject with tcp reset", "65400-65499",
	} {
		if !strings.Contains(first, want) {
			t.Errorf("table lacks %q:\n%s", want, first)
		}
	}
	if err := EnsureFirewall(cfg); err != nil {
		t.Fatal(err)
	}
	if again := list(); again != first {
		t.Errorf("an unchanged EnsureFirewall rewrote the table:\n%s\nthen\n%s", first, again)
	}
	cfg.Forwards.NodePorts = cfg.Forwards.NodePorts[1:]
	if err := EnsureFirewall(cfg); err != nil {
		t.Fatal(err)
	}
	if now := list(); strings.Contains(now, "30080") {
		t.Errorf("a removed NodePort stayed:\n%s", now)
	}
}

// TestEphemeralPortsOverlapReported: a node whose ip_local_port_range overlaps the ports br0 masquerades
// to is reported (an error in the log), one with the default range is not, and neither is changed.
func TestEphemeralPortsOverlapReported(t *testing.T) {
	needRoot(t)
	node := newNetNS(t, "ports")
	ip(t, "-n", node, "tuntap", "add", "tun0", "mode", "tap")
	for _, tc := range []struct {
		portRange string
		reported  bool
	}{{"1024 65000", true}, {"32768 60999", false}} {
		if out, err := exec.Command("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_local_port_range="+tc.portRange).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var mu sync.Mutex
		var errs []string
		cfg := goodConfig()
		cfg.HostNetNS = nsPath(node)
		cfg.MasqueradePorts = [2]uint16{1024, 29999}
		cfg.Logger = funcr.New(func(prefix, args string) {
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(args, `"error"`) {
				errs = append(errs, args)
			}
		}, funcr.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := Ensure(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := strings.Join(errs, "\n")
		mu.Unlock()
		if reported := strings.Contains(got, "ip_local_port_range "+strings.ReplaceAll(tc.portRange, " ", "-")); reported != tc.reported {
			t.Errorf("range %s: reported=%v, want %v; errors logged:\n%s", tc.portRange, reported, tc.reported, got)
		}
		out, _ := exec.Command("ip", "netns", "exec", node, "sysctl", "-n", "net.ipv4.ip_local_port_range").Output()
		if strings.Join(strings.Fields(string(out)), " ") != tc.portRange {
			t.Errorf("the range was changed: %q", out)
		}
	}
}
