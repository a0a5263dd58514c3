//go:build e2e

package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Failover under load: pods on the two nodes that do not hold the egress IP send 100 datagrams a second
// each to the external host, which echoes them; the holder is frozen (its agent and Open vSwitch,
// SIGSTOP) or its uplink is cut. What the external host sees is the truth: the source address of every
// datagram (never anything but the egress IP), the source MAC (which node it came through), the gap
// between the last datagram through the old holder and the first through the new one, the datagrams
// lost, and when its neighbour entry for the egress IP moved. Then the old holder comes back: no second
// gap, no datagram lost, the IP stays where it moved.

const failoverPort = 9301

// arrival is one datagram the external host received.
type arrival struct {
	at     time.Time
	mac    string
	src    netip.Addr
	dst    netip.Addr
	sender string
	seq    int
}

// extCapture records every UDP datagram to port on the external host, with its source MAC.
type extCapture struct {
	mu       sync.Mutex
	arrivals []arrival
	fd       int
	done     chan struct{}
	wg       sync.WaitGroup
}

func captureExternal(t *testing.T, port uint16) *extCapture {
	t.Helper()
	c := &extCapture{done: make(chan struct{})}
	err := lab.InNetNS(lc.Lab.External.NetNS, func() (err error) {
		c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IP)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	c.wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			select {
			case <-c.done:
				return
			default:
			}
			n, from, err := unix.Recvfrom(c.fd, buf, 0)
			if err != nil || n < 42 {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue // the echo going out
			}
			f := buf[:n]
			ip := f[14:]
			ihl := int(ip[0]&0x0f) * 4
			if ip[9] != unix.IPPROTO_UDP || len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl+2:]) != port {
				continue
			}
			var sender string
			var seq int
			if _, err := fmt.Sscanf(string(ip[ihl+8:]), "%s %d", &sender, &seq); err != nil {
				continue
			}
			a := arrival{at: time.Now(), mac: net.HardwareAddr(f[6:12]).String(), src: netip.AddrFrom4([4]byte(ip[12:16])),
				dst: netip.AddrFrom4([4]byte(ip[16:20])), sender: sender, seq: seq}
			c.mu.Lock()
			c.arrivals = append(c.arrivals, a)
			c.mu.Unlock()
		}
	})
	t.Cleanup(c.stop)
	return c
}

func (c *extCapture) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	close(c.done)
	c.wg.Wait()
	unix.Close(c.fd)
}

func (c *extCapture) since(t time.Time) []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.arrivals), func(i int) bool { return !c.arrivals[i].at.Before(t) })
	return slices.Clone(c.arrivals[i:])
}

// udpSender sends "<name> <seq>" every interval from a pod and counts the echoes.
type udpSender struct {
	name  string
	mu    sync.Mutex
	sent  []time.Time // by seq
	echos int
	conn  *net.UDPConn
	done  chan struct{}
	wg    sync.WaitGroup
}

func startSender(t *testing.T, p *cluster.Pod, dst netip.AddrPort, interval time.Duration) *udpSender {
	t.Helper()
	s := &udpSender{name: p.Key(), done: make(chan struct{})}
	if err := lab.InNetNS(p.NetNS, func() (err error) {
		s.conn, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			s.mu.Lock()
			s.sent = append(s.sent, time.Now())
			s.mu.Unlock()
			_, _ = fmt.Fprintf(s.conn, "%s %d", s.name, seq)
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	})
	s.wg.Go(func() {
		buf := make([]byte, 512)
		for {
			_ = s.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := s.conn.Read(buf); err == nil {
				s.mu.Lock()
				s.echos++
				s.mu.Unlock()
			}
			select {
			case <-s.done:
				return
			default:
			}
		}
	})
	t.Cleanup(s.stop)
	return s
}

func (s *udpSender) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.wg.Wait()
	s.conn.Close()
}

// sentBetween lists the seqs sent in [from, to).
func (s *udpSender) sentBetween(from, to time.Time) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for i, at := range s.sent {
		if !at.Before(from) && at.Before(to) {
			out = append(out, i)
		}
	}
	return out
}

// echoServer answers every datagram on port from the external host, so it talks to the egress IP (and
// keeps a neighbour entry for it) as a real peer would.
func echoServer(t *testing.T, port uint16) {
	t.Helper()
	serveExternalUDP(t, netip.AddrPortFrom(netip.Addr{}, port), func(req []byte, _ netip.AddrPort) []byte { return req })
}

// neighbourMAC reads the external host's neighbour entry for ip ("" none).
func neighbourMAC(ip netip.Addr) string {
	var mac string
	_ = lab.InNetNS(lc.Lab.External.NetNS, func() error {
		list, err := netlink.NeighList(0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, n := range list {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && len(n.HardwareAddr) == 6 {
				mac = n.HardwareAddr.String()
			}
		}
		return nil
	})
	return mac
}

// freeze stops (or resumes) a node's agent and Open vSwitch daemons.
func freeze(n *cluster.Node, sig syscall.Signal) error {
	for _, pid := range []int{n.AgentPID(), n.VswitchdPID(), n.OVSDBPID()} {
		if pid == 0 {
			return fmt.Errorf("node %s: a daemon is not running", n.Name)
		}
		if err := syscall.Kill(pid, sig); err != nil {
			return err
		}
	}
	return nil
}

// cutUplink takes the node's port on the underlay bridge down (or up).
func cutUplink(n *cluster.Node, down bool) error {
	state := "up"
	if down {
		state = "down"
	}
	if out, err := exec.Command("ip", "-n", lc.Lab.UnderlayNetNS, "link", "set", n.Name, state).CombinedOutput(); err != nil {
		return fmt.Errorf("link %s %s: %v: %s", n.Name, state, err, out)
	}
	return nil
}

// failoverResult is one run's measurements. A sender's gap runs from its last datagram through the old
// holder to its first through the new one: a pod on the new holder resumes when the claim is carried
// out, a pod on another node when its node's tunnels follow; the run's gap is the worst sender's.
type failoverResult struct {
	from, to   string
	gap        time.Duration
	gaps       []string // per sender
	lost       int      // datagrams sent from the failure until their sender resumed that never arrived
	sent       int
	neighMoved time.Duration // failure → the external host's neighbour entry names the new holder
	status     time.Duration // failure → the API status names the new holder
	backGap    time.Duration // longest silence of a sender in the 2 s after the old holder came back
	backLost   int
	wrongSrc   int // datagrams from anything but the egress IP
	// control is what the traffic lost in 400 ms of steady state before the failure.
	control, controlSent int
}

func (r failoverResult) String() string {
	return fmt.Sprintf("%s → %s: gap %v %v, lost %d/%d, neighbour moved after %v, status after %v; back: longest silence %v, lost %d; steady control lost %d/%d",
		r.from, r.to, r.gap.Round(time.Millisecond), r.gaps, r.lost, r.sent, r.neighMoved.Round(time.Millisecond), r.status.Round(time.Millisecond),
		r.backGap.Round(time.Millisecond), r.backLost, r.control, r.controlSent)
}

// watchNeighbour polls the external host's neighbour entry for ip every 5 ms until stop, and reports
// when it first named a MAC other than old.
func watchNeighbour(ip netip.Addr, old string, stop <-chan struct{}) (moved func() (time.Time, string)) {
	var mu sync.Mutex
	var at time.Time
	var mac string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if m := neighbourMAC(ip); m != "" && m != old {
				mu.Lock()
				at, mac = time.Now(), m
				mu.Unlock()
				return
			}
		}
	}()
	return func() (time.Time, string) {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return at, mac
	}
}

func TestEgressFailover(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	eip := egressLab(t, ctx)
	if _, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pods := runPods(t, ctx, "fo", []string{egressNS}, lc.Nodes)
	echoServer(t, failoverPort)
	capture := captureExternal(t, failoverPort)
	dst := netip.AddrPortFrom(lc.Lab.External.IP, failoverPort)
	nodeByMAC := map[string]string{}
	for _, n := range lc.Nodes {
		nodeByMAC[n.MAC.String()] = n.Name
	}
	var thaw func()
	t.Cleanup(func() {
		if thaw != nil {
			thaw()
		}
	})
	var runs []string
	for range 10 {
		runs = append(runs, "frozen")
	}
	for range 3 {
		runs = append(runs, "uplink cut")
	}
	results := map[string][]failoverResult{}
	for i, how := range runs {
		// The holder is whichever node the traffic goes through (the status must agree); the
		// senders run on the two others.
		var senders []*udpSender
		startSenders := func(skip string) {
			for _, s := range senders {
				s.stop()
			}
			senders = nil
			for _, p := range pods {
				if p.Node != skip {
					senders = append(senders, startSender(t, p, dst, 10*time.Millisecond))
				}
			}
		}
		startSenders("")
		time.Sleep(500 * time.Millisecond)
		got := capture.since(time.Now().Add(-300 * time.Millisecond))
		if len(got) < 20 || nodeByMAC[got[len(got)-1].mac] == "" {
			t.Fatalf("run %d: before the failure, %d datagrams in 300 ms; want many through a node", i, len(got))
		}
		holder := nodeByMAC[got[len(got)-1].mac]
		if st, err := lc.WaitEgressHolder(ctx, egressNS, eip, "", 5*time.Second); err != nil || st != holder {
			t.Fatalf("run %d: the status names %q (%v), the traffic goes through %s", i, st, err, holder)
		}
		startSenders(holder)
		time.Sleep(300 * time.Millisecond)
		// Control: what the same traffic loses in steady state.
		res := failoverResult{from: holder}
		steady := time.Now()
		time.Sleep(500 * time.Millisecond)
		seen := func(from time.Time) map[string]bool {
			out := map[string]bool{}
			for _, a := range capture.since(from) {
				out[fmt.Sprintf("%s %d", a.sender, a.seq)] = true
			}
			return out
		}
		arrived := seen(steady.Add(-time.Second))
		for _, s := range senders {
			for _, seq := range s.sentBetween(steady, steady.Add(400*time.Millisecond)) {
				res.controlSent++
				if !arrived[fmt.Sprintf("%s %d", s.name, seq)] {
					res.control++
				}
			}
		}
		h := lc.Node(holder)
		oldNeigh := neighbourMAC(eip)
		stopWatch := make(chan struct{})
		neighMoved := watchNeighbour(eip, oldNeigh, stopWatch)
		// Fail.
		start := time.Now()
		var err error
		if how == "frozen" {
			err = freeze(h, syscall.SIGSTOP)
			thaw = func() { _ = freeze(h, syscall.SIGCONT) }
		} else {
			err = cutUplink(h, true)
			thaw = func() { _ = cutUplink(h, false) }
		}
		if err != nil {
			t.Fatal(err)
		}
		// Until every sender's datagrams come through a new holder and the status names it.
		resumed := map[string]time.Time{}
		deadline := start.Add(10 * time.Second)
		for time.Now().Before(deadline) && (len(resumed) < len(senders) || res.status == 0) {
			for _, a := range capture.since(start) {
				if n := nodeByMAC[a.mac]; n != "" && n != holder {
					if _, ok := resumed[a.sender]; !ok {
						resumed[a.sender], res.to = a.at, n
					}
				}
			}
			if res.status == 0 {
				if st, err := lc.EgressHolder(ctx, egressNS, eip); err == nil && st != "" && st != holder {
					res.status = time.Since(start)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(resumed) < len(senders) {
			t.Fatalf("run %d (%s): after 10 s only %d of %d senders come through a new holder\n%s", i, how, len(resumed), len(senders), lc.Logs(40))
		}
		close(stopWatch)
		if at, mac := neighMoved(); !at.IsZero() && nodeByMAC[mac] == res.to {
			res.neighMoved = at.Sub(start)
		}
		arrived = seen(start.Add(-time.Second))
		var lastResume time.Time
		for _, s := range senders {
			var lastOld time.Time
			for _, a := range capture.since(start.Add(-time.Second)) {
				if a.sender == s.name && nodeByMAC[a.mac] == holder && a.at.Before(resumed[s.name]) {
					lastOld = a.at
				}
			}
			g := resumed[s.name].Sub(lastOld)
			res.gap = max(res.gap, g)
			res.gaps = append(res.gaps, fmt.Sprintf("%s:%v", strings.TrimPrefix(s.name, egressNS+"/"), g.Round(time.Millisecond)))
			if resumed[s.name].After(lastResume) {
				lastResume = resumed[s.name]
			}
			for _, seq := range s.sentBetween(start.Add(-200*time.Millisecond), resumed[s.name]) {
				res.sent++
				if !arrived[fmt.Sprintf("%s %d", s.name, seq)] {
					res.lost++
				}
			}
		}
		for _, a := range capture.since(start.Add(-time.Second)) {
			if a.src != eip {
				res.wrongSrc++
			}
		}
		// Back: the old holder returns; nothing may move or be lost.
		time.Sleep(500 * time.Millisecond)
		back := time.Now()
		thaw()
		thaw = nil
		time.Sleep(2 * time.Second)
		after := capture.since(back)
		arrived = seen(start)
		for _, s := range senders {
			prev := back
			for _, a := range after {
				if a.sender != s.name {
					continue
				}
				if a.src != eip {
					res.wrongSrc++
				}
				if nodeByMAC[a.mac] != res.to && a.at.After(back.Add(100*time.Millisecond)) {
					t.Errorf("run %d: after %s came back, %s's datagram %d came through %s, not %s: a second move", i, holder, s.name, a.seq, nodeByMAC[a.mac], res.to)
				}
				res.backGap = max(res.backGap, a.at.Sub(prev))
				prev = a.at
			}
			for _, seq := range s.sentBetween(back, time.Now().Add(-300*time.Millisecond)) {
				if !arrived[fmt.Sprintf("%s %d", s.name, seq)] {
					res.backLost++
				}
			}
		}
		for _, s := range senders {
			s.stop()
		}
		if st, _ := lc.EgressHolder(ctx, egressNS, eip); st != res.to {
			t.Errorf("run %d: the status names %q after %s came back, want %s", i, st, holder, res.to)
		}
		if res.wrongSrc > 0 {
			t.Errorf("run %d: %d datagrams reached the external host from an address other than %s", i, res.wrongSrc, eip)
		}
		if res.neighMoved == 0 || start.Add(res.neighMoved).After(lastResume.Add(100*time.Millisecond)) {
			t.Errorf("run %d: the external host's neighbour entry for %s moved to %s after %v; the last sender resumed after %v", i, eip, res.to,
				res.neighMoved, lastResume.Sub(start))
		}
		t.Logf("run %d (%s): %s", i, how, res)
		results[how] = append(results[how], res)
		// The returned node is a live member again before the next run.
		time.Sleep(time.Second)
	}
	for _, how := range []string{"frozen", "uplink cut"} {
		rs := results[how]
		gaps := make([]time.Duration, len(rs))
		lost := make([]int, len(rs))
		var backs []string
		for i, r := range rs {
			gaps[i], lost[i] = r.gap, r.lost
			backs = append(backs, fmt.Sprintf("%v/%d", r.backGap.Round(time.Millisecond), r.backLost))
		}
		slices.Sort(gaps)
		slices.Sort(lost)
		t.Logf("%s, %d runs: gap median %v worst %v; lost median %d worst %d (at 200 datagrams/s); after the return, longest silence/lost %s",
			how, len(rs), gaps[len(gaps)/2].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond), lost[len(lost)/2], lost[len(lost)-1],
			strings.Join(backs, " "))
		if gaps[len(gaps)/2] >= time.Second {
			t.Errorf("%s: median gap %v, want under a second", how, gaps[len(gaps)/2])
		}
		for _, r := range rs {
			if r.backLost > r.control {
				t.Errorf("%s: the old holder's return lost %d datagrams, steady state %d (%s)", how, r.backLost, r.control, r)
			}
		}
	}
}
