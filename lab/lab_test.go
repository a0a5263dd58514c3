package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

func TestOptionsDefaultsAndValidation(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "zero value", opts: Options{}},
		{name: "other documentation range", opts: Options{UnderlayCIDR: netip.MustParsePrefix("198.51.100.0/24")}},
		{name: "subset of a documentation range", opts: Options{UnderlayCIDR: netip.MustParsePrefix("198.51.100.128/25"), Nodes: 5}},
		{name: "TEST-NET-3 refused (the machine's mirrors live there)", opts: Options{UnderlayCIDR: netip.MustParsePrefix("203.0.113.0/24")}, wantErr: "documentation range"},
		{name: "private range refused", opts: Options{UnderlayCIDR: netip.MustParsePrefix("10.0.0.0/24")}, wantErr: "documentation range"},
		{name: "supernet of a documentation range refused", opts: Options{UnderlayCIDR: netip.MustParsePrefix("192.0.0.0/16")}, wantErr: "documentation range"},
		{name: "IPv6 refused", opts: Options{UnderlayCIDR: netip.MustParsePrefix("2001:db8::/64")}, wantErr: "IPv4"},
		{name: "too small for the nodes", opts: Options{UnderlayCIDR: netip.MustParsePrefix("192.0.2.0/28"), Nodes: 5}, wantErr: "too small"},
		{name: "too many nodes", opts: Options{Nodes: 500}, wantErr: "nodes"},
		{name: "negative nodes", opts: Options{Nodes: -1}, wantErr: "nodes"},
		{name: "bad prefix", opts: Options{Prefix: "a/b"}, wantErr: "prefix"},
		{name: "long prefix", opts: Options{Prefix: strings.Repeat("x", 41)}, wantErr: "prefix"},
		{name: "small MTU", opts: Options{MTU: 1000}, wantErr: "MTU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.opts.withDefaults()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.opts.Nodes == 0 && o.Nodes != DefaultNodes || o.MTU != DefaultMTU || o.Logger == nil {
				t.Errorf("defaults not filled: %+v", o)
			}
			if tc.opts.Prefix == "" && !regexp.MustCompile(`^ofsdn-lab-\d+-\d+$`).MatchString(o.Prefix) {
				t.Errorf("default prefix %q", o.Prefix)
			}
		})
	}
}

func TestAddressPlan(t *testing.T) {
	tests := []struct {
		cidr                  string
		root, node1, node3, x string
	}{
		{"192.0.2.0/24", "192.0.2.1", "192.0.2.11", "192.0.2.13", "192.0.2.254"},
		{"198.51.100.64/26", "198.51.100.65", "198.51.100.75", "198.51.100.77", "198.51.100.126"},
	}
	for _, tc := range tests {
		p := netip.MustParsePrefix(tc.cidr)
		got := []string{rootAddr(p).String(), nodeAddr(p, 1).String(), nodeAddr(p, 3).String(), externalAddr(p).String()}
		want := []string{tc.root, tc.node1, tc.node3, tc.x}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: got %v, want %v", tc.cidr, got, want)
		}
	}
	if got := macFor(netip.MustParseAddr("192.0.2.11")).String(); got != "0a:58:c0:00:02:0b" {
		t.Errorf("mac %s", got)
	}
	if n := rootLinkName("ofsdn-lab-123456-1"); len(n) > 15 || !strings.HasPrefix(n, "ol") {
		t.Errorf("root link name %q", n)
	}
}

func TestPrefixesClash(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"ofsdn-lab-1-1", "ofsdn-lab-1-1", true},
		{"ofsdn-lab-1", "ofsdn-lab-1-a", true},
		{"ofsdn-lab-1-a", "ofsdn-lab-1", true},
		{"ofsdn-lab-1-1", "ofsdn-lab-1-10", false},
		{"ofsdn-lab-12", "ofsdn-lab-1", false},
	}
	for _, tc := range tests {
		if got := prefixesClash(tc.a, tc.b); got != tc.want {
			t.Errorf("prefixesClash(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}

// TestLab is the proof that the lab is fit for an agent: an underlay where every node reaches every
// other node, the external host and the root link (ICMP and TCP); routes limited to connected ones;
// and a VXLAN tunnel between two nodes' br0, set up by hand, that carries full-size pod packets.
func TestLab(t *testing.T) {
	l := StartT(t, Options{RootLink: true})
	ctx := context.Background()
	if len(l.Nodes) != 3 || l.External == nil || l.Root == nil {
		t.Fatalf("lab shape: %d nodes, external %v, root %v", len(l.Nodes), l.External, l.Root)
	}
	t.Logf("underlay %s, root link %s %s", l.Underlay, l.Root.Name, l.Root.Addr)

	t.Run("underlay mesh", func(t *testing.T) {
		type host struct{ ns, name string }
		var srcs []host
		var dsts []netip.Addr
		for _, n := range l.Nodes {
			srcs = append(srcs, host{n.NetNS, n.Name})
			dsts = append(dsts, n.IP)
		}
		srcs = append(srcs, host{l.External.NetNS, "external"})
		dsts = append(dsts, l.External.IP, l.Root.IP)
		var wg sync.WaitGroup
		for _, s := range srcs {
			for _, d := range dsts {
				wg.Go(func() {
					if err := pingWarm(ctx, s.ns, d, 56); err != nil {
						t.Errorf("%s → %s: %v", s.name, d, err)
					}
				})
			}
		}
		wg.Wait()
	})

	t.Run("routes", func(t *testing.T) {
		for _, ns := range []string{l.Nodes[0].NetNS, l.External.NetNS} {
			out, err := output(ctx, nil, "ip", "-n", ns, "-4", "route", "show")
			if err != nil {
				t.Fatal(err)
			}
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], l.Underlay.String()) {
				t.Errorf("%s routes: want only the connected %s:\n%s", ns, l.Underlay, out)
			}
		}
		out, err := output(ctx, nil, "ip", "-4", "route", "show", "dev", l.Root.Name)
		if err != nil {
			t.Fatal(err)
		}
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 || !strings.Contains(lines[0], l.Underlay.String()+" proto kernel scope link") {
			t.Errorf("root namespace routes over %s: want only the connected one:\n%s", l.Root.Name, out)
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil {
			t.Logf("root namespace ip_forward=%s (the lab never changes it)", strings.TrimSpace(string(b)))
		}
	})

	t.Run("tcp", func(t *testing.T) {
		// Nodes reach a server bound to the root link (the API server's place); the external host
		// reaches a server in a node. 1 MiB each way: checksums and segmentation must be right.
		for _, n := range l.Nodes {
			tcpEcho(t, "", netip.AddrPortFrom(l.Root.IP, 0), n.NetNS)
		}
		tcpEcho(t, l.Nodes[0].NetNS, netip.AddrPortFrom(l.Nodes[0].IP, 0), l.External.NetNS)
	})

	t.Run("vxlan node1 to node2", func(t *testing.T) {
		n1, n2 := l.Nodes[0], l.Nodes[1]
		podA := addTunnelPod(t, l, n1, "pa", netip.MustParsePrefix("10.128.0.2/14"), n2.IP)
		podB := addTunnelPod(t, l, n2, "pb", netip.MustParsePrefix("10.129.0.2/14"), n1.IP)
		// The first packets towards a new tunnel neighbour die while OVS resolves its ARP (LAB.md).
		if err := pingWarm(ctx, podA, netip.MustParseAddr("10.129.0.2"), 56); err != nil {
			t.Fatalf("pod a → pod b: %v", err)
		}
		for _, size := range []int{56, 1400, l.PodMTU() - 28} { // 1422: a 1450-byte IP packet, 1500 outside
			if got, err := ping(ctx, podA, netip.MustParseAddr("10.129.0.2"), 5, size); err != nil || got != 5 {
				t.Errorf("pod a → pod b, %d-byte payload, DF: %d/5 received (%v)", size, got, err)
			}
			if got, err := ping(ctx, podB, netip.MustParseAddr("10.128.0.2"), 5, size); err != nil || got != 5 {
				t.Errorf("pod b → pod a, %d-byte payload, DF: %d/5 received (%v)", size, got, err)
			}
		}
		tcpEcho(t, podB, netip.MustParseAddrPort("10.129.0.2:0"), podA)
		// The packets really went through the tunnel: node2's decap flow counted them.
		out, err := n2.Ofctl(ctx, "dump-flows", "br0", "in_port=1")
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(`n_packets=(\d+)`).FindStringSubmatch(out); m == nil || m[1] == "0" {
			t.Errorf("node2 decap flow saw no packets:\n%s", out)
		}
	})
}

// addTunnelPod makes br0 with vxlan0 (OpenFlow port 1, as in flows/) on the node and a veth "pod" at
// port 3, with two hand-written flows: the pod's packets go to remote with VNID 5, VNID 5 from the
// tunnel goes to the pod. Test code: it execs ovs-vsctl and ovs-ofctl.
func addTunnelPod(t *testing.T, l *Lab, n *Node, name string, ip netip.Prefix, remote netip.Addr) (podNS string) {
	t.Helper()
	ctx := context.Background()
	podNS = l.NetNSName(n.Name + "-" + name)
	port := "v" + name
	if _, err := n.Vsctl(ctx, "--may-exist", "add-br", "br0", "--", "set", "Bridge", "br0",
		"datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure",
		"--", "add-port", "br0", "vxlan0", "--", "set", "Interface", "vxlan0", "type=vxlan",
		"options:remote_ip=flow", "options:key=flow", "options:dst_port=4789", "ofport_request=1"); err != nil {
		t.Fatal(err)
	}
	steps := [][]string{
		{"ip", "netns", "add", podNS},
		{"ip", "-n", n.NetNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", podNS},
		{"ip", "-n", n.NetNS, "link", "set", port, "up"},
		{"ip", "-n", podNS, "link", "set", "eth0", "mtu", strconv.Itoa(l.PodMTU())},
		{"ip", "-n", podNS, "addr", "add", ip.String(), "dev", "eth0"},
		{"ip", "-n", podNS, "link", "set", "eth0", "up"},
		{"ip", "-n", podNS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", podNS, "ethtool", "-K", "eth0", "tx", "off"},
	}
	if err := runAll(ctx, steps); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Vsctl(ctx, "add-port", "br0", port, "--", "set", "Interface", port, "ofport_request=3"); err != nil {
		t.Fatal(err)
	}
	out, err := n.Vsctl(ctx, "--columns=name,ofport,error", "--format=csv", "--data=bare", "--no-headings", "list", "Interface", "vxlan0", port)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("vxlan0,1,\n%s,3,", port); strings.TrimSpace(out) != want {
		t.Fatalf("br0 ports on %s: got\n%s\nwant\n%s", n.Name, out, want)
	}
	if err := proc.Until(ctx, 10*time.Second, func() bool { _, err := os.Stat(n.MgmtSocket("br0")); return err == nil }); err != nil {
		t.Fatal(err)
	}
	flows := "priority=100,in_port=3 actions=set_field:5->tun_id,set_field:" + remote.String() + "->tun_dst,output:1\n" +
		"priority=100,in_port=1,tun_id=5 actions=output:3\n"
	f := filepath.Join(t.TempDir(), "flows")
	if err := os.WriteFile(f, []byte(flows), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Ofctl(ctx, "add-flows", "br0", f); err != nil {
		t.Fatal(err)
	}
	return podNS
}

// ping sends count pings with the given payload and DF set, and returns how many came back.
func ping(ctx context.Context, ns string, dst netip.Addr, count, size int) (int, error) {
	out, err := output(ctx, nil, "ip", "netns", "exec", ns, "ping", "-n", "-q", "-M", "do", "-s", strconv.Itoa(size),
		"-c", strconv.Itoa(count), "-i", "0.1", "-W", "2", dst.String())
	m := regexp.MustCompile(`(\d+) received`).FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("ping %s from %s: %v: %s", dst, ns, err, out)
	}
	return strconv.Atoi(m[1])
}

// pingWarm retries single pings until one is answered, then wants three out of three.
func pingWarm(ctx context.Context, ns string, dst netip.Addr, size int) error {
	for i := 0; ; i++ {
		if got, _ := ping(ctx, ns, dst, 1, size); got == 1 {
			break
		}
		if i == 10 {
			return fmt.Errorf("no answer in %d tries", i+1)
		}
	}
	got, err := ping(ctx, ns, dst, 3, size)
	if err == nil && got != 3 {
		err = fmt.Errorf("%d/3 received after warm-up", got)
	}
	return err
}

// tcpEcho listens on srv (port 0: any) inside srvNS, dials it from cliNS, and checks that 1 MiB comes
// back unchanged.
func tcpEcho(t *testing.T, srvNS string, srv netip.AddrPort, cliNS string) {
	t.Helper()
	var ln net.Listener
	if err := InNetNS(srvNS, func() (err error) {
		ln, err = net.Listen("tcp", srv.String())
		return err
	}); err != nil {
		t.Fatalf("listen %s in %q: %v", srv, srvNS, err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.Copy(c, c)
	}()
	var c net.Conn
	if err := InNetNS(cliNS, func() (err error) {
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err = d.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", ln.Addr(), cliNS, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	go func() {
		_, _ = c.Write(data)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("tcp %s → %s (%s): got %d bytes back, equal=%v, err %v", cliNS, ln.Addr(), srvNS, len(got), bytes.Equal(got, data), err)
	}
}

// snapshot is what a lab leaves on the machine: namespaces, prefixed temp dirs, root links, daemons.
type snapshot struct {
	netns, dirs, links []string
	pids               []int
}

func (s snapshot) empty() bool {
	return len(s.netns)+len(s.dirs)+len(s.links)+len(s.pids) == 0
}

func leftovers(prefix string, pids []int) snapshot {
	var s snapshot
	for _, ns := range listNetNS() {
		if ns == prefix || strings.HasPrefix(ns, prefix+"-") {
			s.netns = append(s.netns, ns)
		}
	}
	s.dirs, _ = filepath.Glob(filepath.Join(os.TempDir(), prefix+"-*"))
	for name, alias := range rootLinkAliases() {
		if alias == rootAliasPrefix+prefix {
			s.links = append(s.links, name)
		}
	}
	for _, pid := range pids {
		if proc.Alive(pid) {
			s.pids = append(s.pids, pid)
		}
	}
	return s
}

func labPIDs(l *Lab) []int {
	var pids []int
	for _, n := range l.Nodes {
		pids = append(pids, n.VswitchdPID(), n.OVSDBPID())
	}
	return pids
}

func TestStopLeavesNothing(t *testing.T) {
	Require(t)
	l, err := Start(context.Background(), Options{Nodes: 2, RootLink: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Stop() })
	pids := labPIDs(l)
	for i, pid := range pids {
		if pid == 0 {
			t.Fatalf("daemon %d has no PID", i)
		}
	}
	// A namespace other code made under the lab's prefix (a pod's) goes too, with its process.
	podNS := l.NetNSName("node1-pod")
	if err := run(context.Background(), "ip", "netns", "add", podNS); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("ip", "netns", "exec", podNS, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sleeper.Wait() }()
	pids = append(pids, sleeper.Process.Pid)
	if s := leftovers(l.Prefix, pids); len(s.netns) != 5 || len(s.dirs) != 1 || len(s.links) != 1 || len(s.pids) != 5 {
		t.Fatalf("before Stop: %+v", s)
	}
	if err := l.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("stop took %s", l.StopDuration().Round(time.Millisecond))
	if s := leftovers(l.Prefix, pids); !s.empty() {
		t.Errorf("after Stop: %+v", s)
	}
	if err := l.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// startTwoLabs starts two labs with opts at once; both are stopped when the test ends, whichever failed.
func startTwoLabs(t *testing.T, opts Options) [2]*Lab {
	t.Helper()
	var labs [2]*Lab
	var errs [2]error
	var wg sync.WaitGroup
	for i := range labs {
		wg.Go(func() { labs[i], errs[i] = Start(context.Background(), opts) })
	}
	wg.Wait()
	for _, l := range labs {
		if l != nil {
			t.Cleanup(func() { _ = l.Stop() })
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("lab %d: %v", i, err)
		}
	}
	return labs
}

// TestParallelLabs shows that two labs on the same 192.0.2.0/24 do not see each other: their
// segments live in different namespaces. Taking lab A's node2 off its segment breaks A only.
func TestParallelLabs(t *testing.T) {
	Require(t)
	labs := startTwoLabs(t, Options{Nodes: 2})
	a, b := labs[0], labs[1]
	if a.Underlay != b.Underlay || a.Nodes[1].IP != b.Nodes[1].IP {
		t.Fatalf("want the same addresses in both labs: %s %s", a.Underlay, b.Underlay)
	}
	if a.UnderlayNetNS == b.UnderlayNetNS {
		t.Fatalf("shared underlay namespace %s", a.UnderlayNetNS)
	}
	ctx := context.Background()
	for _, l := range labs {
		if err := pingWarm(ctx, l.Nodes[0].NetNS, l.Nodes[1].IP, 56); err != nil {
			t.Fatalf("%s: node1 → node2: %v", l.Prefix, err)
		}
	}
	if err := run(ctx, "ip", "-n", a.UnderlayNetNS, "link", "set", "node2", "down"); err != nil {
		t.Fatal(err)
	}
	if got, _ := ping(ctx, a.Nodes[0].NetNS, a.Nodes[1].IP, 3, 56); got != 0 {
		t.Errorf("lab A node2 is off its segment, yet %d/3 pings came back (from lab B?)", got)
	}
	if got, err := ping(ctx, b.Nodes[0].NetNS, b.Nodes[1].IP, 3, 56); got != 3 {
		t.Errorf("lab B node1 → node2 while A's node2 is down: %d/3 (%v)", got, err)
	}
	if err := run(ctx, "ip", "-n", a.UnderlayNetNS, "link", "set", "node2", "up"); err != nil {
		t.Fatal(err)
	}
	if err := pingWarm(ctx, a.Nodes[0].NetNS, a.Nodes[1].IP, 56); err != nil {
		t.Errorf("lab A after node2 is back: %v", err)
	}
	// A prefix that would make one lab's Stop remove the other's namespaces is refused.
	l, err := Start(ctx, Options{Nodes: 1, Prefix: a.Prefix + "-x"})
	if err == nil || !strings.Contains(err.Error(), "clashes") {
		t.Errorf("clashing prefix: err = %v", err)
	}
	if l != nil {
		_ = l.Stop()
	}
	if s := leftovers(a.Prefix+"-x", nil); !s.empty() {
		t.Errorf("refused start left %+v", s)
	}
}

// TestStartCancelled cancels Start at several points: whatever it had built is gone afterwards.
func TestStartCancelled(t *testing.T) {
	Require(t)
	for _, after := range []time.Duration{0, 30 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 250 * time.Millisecond, time.Minute} {
		t.Run(after.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), after)
			defer cancel()
			l, err := Start(ctx, Options{Nodes: 2, RootLink: true})
			if l == nil {
				t.Fatalf("no lab returned: %v", err)
			}
			var pids []int
			if err == nil {
				t.Logf("Start finished before the cancellation")
				pids = labPIDs(l)
			} else {
				t.Logf("start: %v", err)
			}
			if err := l.Stop(); err != nil {
				t.Errorf("stop: %v", err)
			}
			if s := leftovers(l.Prefix, pids); !s.empty() {
				t.Errorf("left %+v (start err %v)", s, err)
			}
			// Daemons that were starting when Start was cancelled have no PID we know: look for any
			// OVS daemon still naming the lab's directory.
			if procs := procsMentioning(l.Prefix); len(procs) > 0 {
				t.Errorf("processes left: %v", procs)
			}
		})
	}
}

func procsMentioning(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !proc.Alive(pid) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(b, []byte(s)) {
			out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// TestSweepKilledRun starts a lab in a child process, kills the child with SIGKILL (nothing of its
// teardown runs), and shows that Sweep removes what it left.
func TestSweepKilledRun(t *testing.T) {
	Require(t)
	prefix := fmt.Sprintf("%s%d-sweep", DefaultPrefixBase, os.Getpid())
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLabProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "OFSDN_LAB_HELPER_PREFIX="+prefix)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); Sweep(prefix) })
	var pids []int
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "LAB-READY "); ok {
			for _, f := range strings.Fields(rest) {
				pid, _ := strconv.Atoi(f)
				pids = append(pids, pid)
			}
			break
		}
	}
	if len(pids) == 0 {
		t.Fatal("helper never reported a running lab")
	}
	// Sweep leaves a lab alone while its owner runs.
	Sweep(prefix)
	if s := leftovers(prefix, pids); len(s.pids) != len(pids) || len(s.netns) == 0 {
		t.Fatalf("Sweep touched a live lab: %+v", s)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	before := leftovers(prefix, pids)
	if len(before.netns) != 4 || len(before.dirs) != 1 || len(before.links) != 1 || len(before.pids) != len(pids) {
		t.Fatalf("after the kill, want the whole lab left behind: %+v", before)
	}
	t0 := time.Now()
	Sweep(prefix)
	t.Logf("sweep of a killed 2-node lab took %s", time.Since(t0).Round(time.Millisecond))
	if s := leftovers(prefix, pids); !s.empty() {
		t.Errorf("after Sweep: %+v", s)
	}
}

// TestHelperLabProcess is the child of TestSweepKilledRun: it starts a lab and waits to be killed.
func TestHelperLabProcess(t *testing.T) {
	prefix := os.Getenv("OFSDN_LAB_HELPER_PREFIX")
	if prefix == "" {
		t.Skip("helper process for TestSweepKilledRun")
	}
	l, err := Start(context.Background(), Options{Nodes: 2, Prefix: prefix, RootLink: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LAB-READY %s\n", strings.Trim(fmt.Sprint(labPIDs(l)), "[]"))
	time.Sleep(10 * time.Minute)
	_ = l.Stop()
}

// BenchmarkStartStop reports how long a lab takes to start and to stop.
func BenchmarkStartStop(b *testing.B) {
	Require(b)
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			var start, stop time.Duration
			for i := 0; i < b.N; i++ {
				l, err := Start(context.Background(), Options{Nodes: nodes, RootLink: true})
				if err != nil {
					if l != nil {
						_ = l.Stop()
					}
					b.Fatal(err)
				}
				if err := l.Stop(); err != nil {
					b.Fatal(err)
				}
				start += l.StartDuration
				stop += l.StopDuration()
			}
			b.ReportMetric(float64(start.Milliseconds())/float64(b.N), "start-ms/op")
			b.ReportMetric(float64(stop.Milliseconds())/float64(b.N), "stop-ms/op")
		})
	}
}

// TestRootLinksGetDistinctRanges: the root namespace can hold only one connected route per range, so a
// second lab with a root link moves to the next free documentation range, and an explicit clash fails.
func TestRootLinksGetDistinctRanges(t *testing.T) {
	Require(t)
	labs := startTwoLabs(t, Options{Nodes: 1, RootLink: true})
	if labs[0].Underlay.Overlaps(labs[1].Underlay) {
		t.Fatalf("root-linked labs share %s", labs[0].Underlay)
	}
	for _, l := range labs {
		t.Logf("%s: underlay %s, root link %s", l.Prefix, l.Underlay, l.Root.Addr)
		tcpEcho(t, "", netip.AddrPortFrom(l.Root.IP, 0), l.Nodes[0].NetNS)
	}
	l, err := Start(context.Background(), Options{Nodes: 1, RootLink: true, UnderlayCIDR: labs[0].Underlay})
	if l != nil {
		_ = l.Stop()
	}
	if err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Errorf("explicit clashing range: err = %v", err)
	}
}
