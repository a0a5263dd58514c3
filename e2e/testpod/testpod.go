// Package testpod is the process the lab's pods run: it serves TCP and UDP on the pod's container ports
// and answers every connection or datagram with who it is and who it sees (the client's address as
// received, which shows whether traffic was NATed), and probes other pods the same way.
package testpod

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Reply is what a server answers: "<name> <client address as seen> <port it answered on>".
type Reply struct {
	Name string
	Seen string // the client's address as the server saw it
	Port int    // the server's port: with the name, which endpoint of a service answered
}

func (r Reply) String() string { return r.Name + " " + r.Seen + " " + strconv.Itoa(r.Port) }

// Endpoint names the answering endpoint: name:port.
func (r Reply) Endpoint() string { return r.Name + ":" + strconv.Itoa(r.Port) }

func parseReply(line string) (Reply, error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return Reply{}, fmt.Errorf("malformed reply %q", line)
	}
	r := Reply{Name: f[0], Seen: f[1]}
	if len(f) > 2 {
		r.Port, _ = strconv.Atoi(f[2])
	}
	return r, nil
}

// Serve listens on every port for TCP and UDP until ctx ends. A TCP client first reads the reply
// line, then anything it sends is echoed back (large payloads test the MTU path).
func Serve(ctx context.Context, name string, tcpPorts, udpPorts []int) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(tcpPorts)+len(udpPorts))
	for _, p := range tcpPorts {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			return fmt.Errorf("testpod: tcp %d: %w", p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			go func() { <-ctx.Done(); ln.Close() }()
			for {
				c, err := ln.Accept()
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				go func() {
					defer c.Close()
					fmt.Fprintf(c, "%s %s %d\n", name, c.RemoteAddr(), p)
					_, _ = io.Copy(c, c)
				}()
			}
		}()
	}
	for _, p := range udpPorts {
		pc, err := net.ListenPacket("udp", ":"+strconv.Itoa(p))
		if err != nil {
			return fmt.Errorf("testpod: udp %d: %w", p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			go func() { <-ctx.Done(); pc.Close() }()
			buf := make([]byte, 65535)
			for {
				_, addr, err := pc.ReadFrom(buf)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s %d\n", name, addr, p)), addr)
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// ProbeTCP connects, reads the reply and, with payload > 0, checks that many bytes echo back intact.
func ProbeTCP(ctx context.Context, addr string, payload int) (Reply, error) {
	return probeTCP(ctx, dialer(), addr, payload)
}

func probeTCP(ctx context.Context, d *net.Dialer, addr string, payload int) (Reply, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return Reply{}, fmt.Errorf("tcp %s: read reply: %w", addr, err)
	}
	rep, err := parseReply(line)
	if err != nil || payload <= 0 {
		return rep, err
	}
	data := make([]byte, payload)
	for i := range data {
		data[i] = byte(i)
	}
	if _, err := c.Write(data); err != nil {
		return rep, fmt.Errorf("tcp %s: send %d bytes: %w", addr, payload, err)
	}
	back := make([]byte, payload)
	if _, err := io.ReadFull(r, back); err != nil {
		return rep, fmt.Errorf("tcp %s: echo of %d bytes: %w", addr, payload, err)
	}
	for i := range back {
		if back[i] != data[i] {
			return rep, errors.New("echo corrupted")
		}
	}
	return rep, nil
}

// ProbeUDP sends a datagram and waits for the reply, retrying until ctx ends (the first packet to a new
// tunnel neighbour can be lost while OVS resolves ARP); an ICMP port unreachable ends it at once
// (ECONNREFUSED).
func ProbeUDP(ctx context.Context, addr string) (Reply, error) {
	d := dialer()
	if LocalPort > 0 {
		d.LocalAddr = &net.UDPAddr{Port: LocalPort}
	}
	return probeUDP(ctx, d, addr)
}

// LocalPort, when set, is the source port of UDP probes (ProbeUDP): one 5-tuple for several probes.
var LocalPort int

func probeUDP(ctx context.Context, d *net.Dialer, addr string) (Reply, error) {
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	buf := make([]byte, 1024)
	for {
		if _, err := c.Write([]byte("probe")); err != nil {
			return Reply{}, err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return parseReply(string(buf[:n]))
		}
		// ICMP port unreachable is an answer (a service without endpoints refuses), not a loss.
		if errors.Is(err, syscall.ECONNREFUSED) {
			return Reply{}, fmt.Errorf("udp %s: %w", addr, err)
		}
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("udp %s: no reply: %w", addr, ctx.Err())
		}
	}
}

// BindDevice, when set, binds every probe's socket to that interface (SO_BINDTODEVICE): a pod on two
// Networks with the same addresses reaches each through its own interface, never by the routing
// table's pick.
var BindDevice string

// dialer dials from BindDevice, if set.
func dialer() *net.Dialer {
	d := &net.Dialer{}
	if dev := BindDevice; dev != "" {
		d.Control = bindToDevice(dev)
	}
	return d
}

func bindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = syscall.BindToDevice(int(fd), dev) }); cerr != nil {
			return cerr
		}
		return err
	}
}

// ServeNetworks answers on port, TCP and UDP, on each of the pod's Network interfaces (net1, net2, ...:
// every interface but lo and eth0, as they appear) with a socket bound to that interface, so the reply
// leaves by the interface the question came in by, even when two interfaces have the same addresses.
// The reply names the pod as name@interface.
func ServeNetworks(ctx context.Context, name string, port int) error {
	served := map[string]bool{}
	for {
		ifs, err := net.Interfaces()
		if err != nil {
			return fmt.Errorf("testpod: interfaces: %w", err)
		}
		for _, i := range ifs {
			if i.Name == "lo" || i.Name == "eth0" || served[i.Name] {
				continue
			}
			if err := serveOn(ctx, name+"@"+i.Name, i.Name, port); err != nil {
				return err
			}
			served[i.Name] = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// serveOn answers on port, TCP and UDP, with sockets bound to dev.
func serveOn(ctx context.Context, name, dev string, port int) error {
	lc := net.ListenConfig{Control: bindToDevice(dev)}
	addr := ":" + strconv.Itoa(port)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("testpod: tcp %d on %s: %w", port, dev, err)
	}
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("testpod: udp %d on %s: %w", port, dev, err)
	}
	go func() { <-ctx.Done(); ln.Close(); pc.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s %s %d\n", name, c.RemoteAddr(), port)
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	go func() {
		buf := make([]byte, 65535)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(fmt.Appendf(nil, "%s %s %d\n", name, from, port), from)
		}
	}()
	return nil
}

// ParsePorts reads "80,443".
func ParsePorts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("bad port %q", f)
		}
		out = append(out, p)
	}
	return out, nil
}

// Spread makes n connections (parallel at a time, each bounded by timeout) and counts the answering
// endpoints (Reply.Endpoint); failed connections are counted under "error: <reason>".
func Spread(ctx context.Context, proto, addr string, n, parallel int, timeout time.Duration) map[string]int {
	var mu sync.Mutex
	counts := map[string]int{}
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				var rep Reply
				var err error
				if proto == "udp" {
					rep, err = ProbeUDP(cctx, addr)
				} else {
					rep, err = ProbeTCP(cctx, addr, 0)
				}
				cancel()
				key := rep.Endpoint()
				if err != nil {
					key = "error: " + err.Error()
				}
				mu.Lock()
				counts[key]++
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	return counts
}

// UDPSession keeps one UDP socket (one source port: one conntrack entry) and asks addr every interval
// until ctx ends, writing "ok <endpoint>" or "timeout" per question to out.
func UDPSession(ctx context.Context, addr string, interval time.Duration, out io.Writer) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 1024)
	for ctx.Err() == nil {
		start := time.Now()
		if _, err := c.Write([]byte("probe")); err != nil {
			fmt.Fprintln(out, "error", err)
		} else {
			_ = c.SetReadDeadline(start.Add(interval))
			if n, err := c.Read(buf); err != nil {
				fmt.Fprintln(out, "timeout")
			} else if rep, err := parseReply(string(buf[:n])); err == nil {
				fmt.Fprintln(out, "ok", rep.Endpoint())
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(interval))):
		}
	}
	return nil
}
