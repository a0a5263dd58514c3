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
	"time"
)

// Reply is what a server answers: "<name> <client address as seen>".
type Reply struct {
	Name string
	Seen string // the client's address as the server saw it
}

func (r Reply) String() string { return r.Name + " " + r.Seen }

func parseReply(line string) (Reply, error) {
	name, seen, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		return Reply{}, fmt.Errorf("malformed reply %q", line)
	}
	return Reply{Name: name, Seen: seen}, nil
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
					fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
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
				_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, addr)), addr)
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
	var d net.Dialer
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
// tunnel neighbour can be lost while OVS resolves ARP).
func ProbeUDP(ctx context.Context, addr string) (Reply, error) {
	c, err := net.Dial("udp", addr)
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
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("udp %s: no reply: %w", addr, ctx.Err())
		}
	}
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
