//go:build e2e

package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/lab"
	"golang.org/x/sys/unix"
)

// Encapsulation none on the lab: the same connectivity and tenant checks as VXLAN (forEachEncapsulation
// runs them in both), what the underlay carries, a live change under traffic, and a peer off the
// segment.

var encapsulations = []networkv1.Encapsulation{networkv1.EncapsulationVXLAN, networkv1.EncapsulationNone}

// forEachEncapsulation runs body as a subtest per encapsulation, switching the shared cluster live
// (pods keep running), and leaves the cluster at vxlan.
func forEachEncapsulation(t *testing.T, ctx context.Context, body func(t *testing.T)) {
	t.Helper()
	forEachEncapsulationOf(t, ctx, func(t *testing.T, _ networkv1.Encapsulation) { body(t) })
}

// forEachEncapsulationOf is forEachEncapsulation for a body that needs to know which one it runs in.
func forEachEncapsulationOf(t *testing.T, ctx context.Context, body func(t *testing.T, e networkv1.Encapsulation)) {
	t.Helper()
	t.Cleanup(func() {
		if _, err := lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN); err != nil {
			t.Errorf("back to vxlan: %v", err)
		}
	})
	for _, e := range encapsulations {
		t.Run(string(e), func(t *testing.T) {
			took, err := lc.SetEncapsulation(ctx, e)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("encapsulation %s on every node's br0 %s after the change", e, took.Round(time.Millisecond))
			body(t, e)
		})
	}
}

// forEachMode runs body as a subtest in multitenant, then networkpolicy mode, switching the shared
// cluster live, and leaves it in multitenant.
func forEachMode(t *testing.T, ctx context.Context, body func(t *testing.T, mode networkv1.PluginMode)) {
	t.Helper()
	for _, mode := range []networkv1.PluginMode{networkv1.PluginModeMultitenant, networkv1.PluginModeNetworkPolicy} {
		t.Run(string(mode), func(t *testing.T) {
			if mode != networkv1.PluginModeMultitenant {
				if err := lc.SetMode(ctx, mode); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := lc.SetMode(context.Background(), networkv1.PluginModeMultitenant); err != nil {
						t.Error(err)
					}
				})
			}
			body(t, mode)
		})
	}
}

// wire is what crossed the underlay: VXLAN datagrams, and bare IPv4 packets between two addresses by
// source MAC.
type wire struct {
	vxlan  int
	direct map[string]int // source MAC → packets
	// vxlanFrom counts VXLAN datagrams by outer source address.
	vxlanFrom map[netip.Addr]int
}

func (w wire) directTotal() int {
	n := 0
	for _, c := range w.direct {
		n += c
	}
	return n
}

// captureUnderlay reads every frame on every port of the lab's underlay bridge (a raw packet socket in
// the underlay's namespace) while during runs, and counts what it saw. Each frame is seen on the port it
// enters by and the port it leaves by: counts are of sightings.
func captureUnderlay(t *testing.T, a, b netip.Addr, during func()) wire {
	t.Helper()
	var fd int
	err := lab.InNetNS(lc.Lab.UnderlayNetNS, func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		return err
	})
	if err != nil {
		t.Fatalf("raw socket in %s: %v", lc.Lab.UnderlayNetNS, err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	w := wire{direct: map[string]int{}, vxlanFrom: map[netip.Addr]int{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 34 {
				continue
			}
			f := buf[:n]
			if binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP {
				continue
			}
			ip := f[14:]
			ihl := int(ip[0]&0x0f) * 4
			src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
			if ip[9] == unix.IPPROTO_UDP && len(ip) >= ihl+4 && binary.BigEndian.Uint16(ip[ihl+2:ihl+4]) == uint16(networkv1.DefaultVXLANPort) {
				w.vxlan++
				w.vxlanFrom[src]++
				continue
			}
			if (src == a && dst == b) || (src == b && dst == a) {
				w.direct[net.HardwareAddr(f[6:12]).String()]++
			}
		}
	})
	// The socket is open before the traffic starts.
	during()
	close(done)
	wg.Wait()
	return w
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// exchange sends TCP probes both ways and checks that each server sees the client's own address.
func exchange(t *testing.T, ctx context.Context, x, y *cluster.Pod, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		for _, pair := range [][2]*cluster.Pod{{x, y}, {y, x}} {
			from, to := pair[0], pair[1]
			r, err := from.Probe(ctx, "tcp", netip.AddrPortFrom(to.IP, cluster.TestPort), 1400)
			if err != nil {
				t.Errorf("%s → %s: %v", from.Key(), to.Key(), err)
				return
			}
			if want := to.Key() + " " + from.IP.String() + ":"; !strings.HasPrefix(r, want) {
				t.Errorf("%s → %s: reply %q, want %q… (the pod's own source address)", from.Key(), to.Key(), r, want)
			}
		}
	}
}

// TestEncapsulationOnTheWire: what the underlay carries between two pods on two nodes. With VXLAN the
// pods' addresses never show on the wire (only inside VXLAN datagrams); with none there is not one
// VXLAN datagram, the pods' packets cross with their own addresses, from the nodes' uplink MACs.
func TestEncapsulationOnTheWire(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pods := runPods(t, ctx, "wire", []string{"e2e-wire"}, lc.Nodes[:2])
	a, b := pods[0], pods[1]
	uplinkMACs := map[string]bool{}
	for _, n := range lc.Nodes[:2] {
		uplinkMACs[pipeline.UplinkMAC(n.IP).String()] = true
	}
	forEachEncapsulation(t, ctx, func(t *testing.T) {
		exchange(t, ctx, a, b, 1) // warm: neighbours resolved before the capture
		w := captureUnderlay(t, a.IP, b.IP, func() { exchange(t, ctx, a, b, 10) })
		t.Logf("underlay: %d VXLAN datagrams, bare packets between %s and %s by source MAC %v", w.vxlan, a.IP, b.IP, w.direct)
		switch lc.Encapsulation(ctx) {
		case networkv1.EncapsulationNone:
			if w.vxlan != 0 {
				t.Errorf("%d VXLAN datagrams crossed the underlay in encapsulation none (from %v)", w.vxlan, w.vxlanFrom)
			}
			if w.directTotal() < 40 {
				t.Errorf("only %d bare packets between the pods' addresses crossed; 20 TCP exchanges of 1400 bytes make far more", w.directTotal())
			}
			for mac := range w.direct {
				if !uplinkMACs[mac] {
					t.Errorf("a pod packet crossed from MAC %s, not a node's uplink MAC %v", mac, uplinkMACs)
				}
			}
		default:
			if w.vxlan < 40 || w.directTotal() != 0 {
				t.Errorf("vxlan: %d VXLAN datagrams and %d bare pod packets; want many and none", w.vxlan, w.directTotal())
			}
		}
	})
}

// TestEncapsulationSwitchLive changes the encapsulation back and forth under 100 UDP datagrams a second
// and one established TCP connection between pods on two nodes in two directions of the change, and
// reports the longest silence each change caused. The TCP connection must survive both changes (br0's
// conntrack does not care how packets cross), and the datagrams must flow again after each.
func TestEncapsulationSwitchLive(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	pods := runPods(t, ctx, "live", []string{"e2e-live"}, lc.Nodes[:2])
	a, b := pods[0], pods[1]
	if _, err := lc.SetEncapsulation(ctx, networkv1.EncapsulationVXLAN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN) })
	exchange(t, ctx, a, b, 1)

	var udp, tcp net.Conn
	err := lab.InNetNS(a.NetNS, func() (err error) {
		if udp, err = net.Dial("udp4", netip.AddrPortFrom(b.IP, cluster.TestPort).String()); err != nil {
			return err
		}
		tcp, err = net.Dial("tcp4", netip.AddrPortFrom(b.IP, cluster.TestPort).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	defer tcp.Close()
	hello := make([]byte, 256)
	_ = tcp.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := tcp.Read(hello); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var replies []time.Time
	sent := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // 100 datagrams a second
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := udp.Write([]byte("probe")); err == nil {
					mu.Lock()
					sent++
					mu.Unlock()
				}
			}
		}
	})
	wg.Go(func() {
		buf := make([]byte, 512)
		for {
			_ = udp.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := udp.Read(buf); err == nil {
				mu.Lock()
				replies = append(replies, time.Now())
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	tcpErr := make(chan error, 1)
	wg.Go(func() { // the established connection echoes 64 bytes ten times a second
		msg := []byte(strings.Repeat("x", 64))
		back := make([]byte, 64)
		for {
			select {
			case <-stop:
				tcpErr <- nil
				return
			case <-time.After(100 * time.Millisecond):
			}
			_ = tcp.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := tcp.Write(msg); err != nil {
				tcpErr <- err
				return
			}
			for got := 0; got < len(back); {
				n, err := tcp.Read(back[got:])
				if err != nil {
					tcpErr <- err
					return
				}
				got += n
			}
		}
	})

	type change struct {
		to       networkv1.Encapsulation
		at, done time.Time
	}
	var changes []change
	time.Sleep(2 * time.Second)
	for _, e := range []networkv1.Encapsulation{networkv1.EncapsulationNone, networkv1.EncapsulationVXLAN} {
		c := change{to: e, at: time.Now()}
		took, err := lc.SetEncapsulation(ctx, e) // back at vxlan it also waits out the uplink port's linger
		if err != nil {
			t.Fatal(err)
		}
		c.done = c.at.Add(took)
		changes = append(changes, c)
		time.Sleep(3 * time.Second)
	}
	close(stop)
	wg.Wait()
	if err := <-tcpErr; err != nil {
		t.Errorf("the established TCP connection broke across the changes: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d datagrams sent, %d replies (%d lost over %d changes)", sent, len(replies), sent-len(replies), len(changes))
	for _, c := range changes {
		// The longest silence between replies from the change until 3 s after it.
		gap, prev := time.Duration(0), c.at
		resumed := false
		for _, r := range replies {
			if r.Before(c.at) {
				continue
			}
			if r.After(c.at.Add(3 * time.Second)) {
				break
			}
			gap = max(gap, r.Sub(prev))
			prev = r
			if r.After(c.done) {
				resumed = true
			}
		}
		t.Logf("to %s: flows on every node after %s; longest silence around it %s", c.to, c.done.Sub(c.at).Round(time.Millisecond), gap.Round(time.Millisecond))
		if !resumed {
			t.Errorf("no datagram came back after the change to %s", c.to)
		}
	}
}

// TestEncapsulationNoneOffSegmentPeer: node3 reaches node2's address only through a router (the
// external host, forwarding), so node3 tunnels to node2 while it sends to node1 directly, and node2
// (which has node3 on-link) sends to node3 directly: pods on all three still reach each other, and the
// agent says which peer it tunnels to.
func TestEncapsulationNoneOffSegmentPeer(t *testing.T) {
	needsStandIn(t, "restarts the agent's process to see it take the new peers; there kubelet restarts it on its own")
	ctx := ctxT(t, 5*time.Minute)
	n1, n2, n3 := lc.Nodes[0], lc.Nodes[1], lc.Nodes[2]
	ext := lc.Lab.External
	pods := runPods(t, ctx, "seg", []string{"e2e-seg"}, lc.Nodes)
	p1, p2, p3 := pods[0], pods[1], pods[2]
	if _, err := lc.SetEncapsulation(ctx, networkv1.EncapsulationNone); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = lc.SetEncapsulation(context.Background(), networkv1.EncapsulationVXLAN) })
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run("ip", "netns", "exec", ext.NetNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run("ip", "-n", n3.NetNS, "route", "add", n2.IP.String()+"/32", "via", ext.IP.String(), "dev", lab.UnderlayBridge)
	t.Cleanup(func() {
		_ = exec.Command("ip", "-n", n3.NetNS, "route", "del", n2.IP.String()+"/32").Run()
		_ = exec.Command("ip", "netns", "exec", ext.NetNS, "sysctl", "-qw", "net.ipv4.ip_forward=0").Run()
		// node3's agent decides at start: restart it with the direct route back.
		lc.StopAgent(n3, false)
		_ = lc.StartAgent(n3)
		_ = lc.WaitAgentsReady(context.Background())
	})
	// The agent looks at routes at start, on peer changes and every 30 s: a restart is the quick way.
	lc.StopAgent(n3, false)
	if err := lc.StartAgent(n3); err != nil {
		t.Fatal(err)
	}
	if err := lc.WaitAgentsReady(ctx); err != nil {
		t.Fatal(err)
	}
	uplink := fmt.Sprintf("output:%d", pipeline.PortUplink)
	sub2, err := lc.Subnet(ctx, n2.Name)
	if err != nil {
		t.Fatal(err)
	}
	sub1, err := lc.Subnet(ctx, n1.Name)
	if err != nil {
		t.Fatal(err)
	}
	var flows string
	ok := false
	for deadline := time.Now().Add(30 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		flows, _ = n3.Ofctl(ctx, "dump-flows", "br0", "table=90")
		ok = directTo(flows, sub1.String(), uplink) && !directTo(flows, sub2.String(), uplink)
	}
	if !ok {
		t.Fatalf("node3 should send to %s (node1) directly and to %s (node2) through VXLAN:\n%s", sub1, sub2, flows)
	}
	if log := lc.AgentLogTail(n3, 400); !strings.Contains(log, "peers not on the uplink segment get VXLAN") || !strings.Contains(log, n2.Name) {
		t.Errorf("node3's agent does not say it tunnels to %s:\n%s", n2.Name, log)
	}
	for _, pair := range [][2]*cluster.Pod{{p3, p2}, {p3, p1}, {p1, p2}} {
		exchange(t, ctx, pair[0], pair[1], 1)
	}
	w := captureUnderlay(t, p3.IP, p2.IP, func() { exchange(t, ctx, p3, p2, 5) })
	t.Logf("node3 ↔ node2: VXLAN by outer source %v, bare pod packets by source MAC %v", w.vxlanFrom, w.direct)
	if w.vxlanFrom[n3.IP] == 0 {
		t.Errorf("node3 sent no VXLAN towards node2 (off its segment)")
	}
	if w.vxlanFrom[n2.IP] != 0 || w.direct[pipeline.UplinkMAC(n2.IP).String()] == 0 {
		t.Errorf("node2 has node3 on-link and must send to it directly: VXLAN from node2 %d, direct %d",
			w.vxlanFrom[n2.IP], w.direct[pipeline.UplinkMAC(n2.IP).String()])
	}
}

// directTo reports whether table 90's dump sends nw_dst=subnet out of the uplink port.
func directTo(dump, subnet, uplink string) bool {
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "nw_dst="+subnet) && strings.Contains(l, uplink) {
			return true
		}
	}
	return false
}
