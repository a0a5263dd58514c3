package testpod

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Target is one probe: a protocol (tcp, udp or sctp) and an address, written "tcp/10.128.0.5:80".
type Target struct{ Proto, Addr string }

func (t Target) String() string { return t.Proto + "/" + t.Addr }

// ParseTarget reads "proto/host:port".
func ParseTarget(s string) (Target, error) {
	proto, addr, ok := strings.Cut(s, "/")
	if !ok || (proto != "tcp" && proto != "udp" && proto != "sctp") {
		return Target{}, fmt.Errorf("target %q: want tcp|udp|sctp/HOST:PORT", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return Target{}, fmt.Errorf("target %q: %w", s, err)
	}
	return Target{Proto: proto, Addr: addr}, nil
}

// Result is one probe's outcome: the reply, or why none came, and how long it took.
type Result struct {
	Target string `json:"target"`
	Reply  string `json:"reply,omitempty"`
	Error  string `json:"error,omitempty"`
	Millis int64  `json:"ms"`
}

// Probe asks addr once, resending until ctx ends: TCP dials anew every 300 ms (a lost SYN would otherwise
// wait for the kernel's 1 s retransmission), UDP and SCTP resend every 300 ms.
func Probe(ctx context.Context, proto, addr string) (Reply, error) {
	switch proto {
	case "tcp":
		return probeTCPRedialing(ctx, addr, 300*time.Millisecond)
	case "udp":
		return ProbeUDP(ctx, addr)
	case "sctp":
		return ProbeSCTP(ctx, addr)
	}
	return Reply{}, fmt.Errorf("probe %q: want tcp, udp or sctp", proto)
}

func probeTCPRedialing(ctx context.Context, addr string, every time.Duration) (Reply, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		rep Reply
		err error
	}
	results := make(chan outcome, 64) // buffered: attempts still running when we return never block
	attempts := 0
	dial := func() {
		attempts++
		go func() {
			rep, err := ProbeTCP(ctx, addr, 0)
			select {
			case results <- outcome{rep, err}:
			default:
			}
		}()
	}
	dial()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last error
	for {
		select {
		case o := <-results:
			if o.err == nil {
				return o.rep, nil
			}
			last = o.err
		case <-tick.C:
			if attempts < cap(results) {
				dial()
			}
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return Reply{}, fmt.Errorf("tcp %s: no reply: %w", addr, last)
		}
	}
}

// ProbeAll probes every target at once, each for at most timeout, and returns the results in order.
func ProbeAll(ctx context.Context, targets []Target, timeout time.Duration) []Result {
	out := make([]Result, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			rep, err := Probe(pctx, t.Proto, t.Addr)
			out[i] = Result{Target: t.String(), Millis: time.Since(start).Milliseconds()}
			if err != nil {
				out[i].Error = err.Error()
			} else {
				out[i].Reply = rep.String()
			}
		}()
	}
	wg.Wait()
	return out
}

// RepeatStats counts a series of connections made by Repeat.
type RepeatStats struct {
	OK     int            `json:"ok"`
	Failed int            `json:"failed"`
	Errors map[string]int `json:"errors,omitempty"`
	// FailedAt and OKAt: when (ms after the start) the first 50 failures and successes began.
	FailedAt []int64 `json:"failed_at,omitempty"`
	OKAt     []int64 `json:"ok_at,omitempty"`
}

// Repeat starts a new connection to addr every interval until ctx ends, each a single attempt (one SYN,
// one datagram, one INIT) bounded by timeout, and counts those answered by a server whose name is want
// (any name when want is empty).
func Repeat(ctx context.Context, proto, addr, want string, interval, timeout time.Duration) RepeatStats {
	st := RepeatStats{Errors: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Since(start).Milliseconds()
			// Not ctx: an attempt started before the end runs its full timeout.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			defer cancel()
			rep, err := once(actx, proto, addr)
			if err == nil && want != "" && rep.Name != want {
				err = fmt.Errorf("answered by %s", rep.Name)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st.Failed++
				msg := err.Error()
				if i := strings.LastIndex(msg, ": "); i >= 0 {
					msg = msg[i+2:] // the cause, without the address
				}
				st.Errors[msg]++
				if len(st.FailedAt) < 50 {
					st.FailedAt = append(st.FailedAt, began)
				}
				return
			}
			st.OK++
			if len(st.OKAt) < 50 {
				st.OKAt = append(st.OKAt, began)
			}
		}()
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	wg.Wait()
	return st
}

// once is a single attempt: one SYN (the kernel retransmits only after 1 s), one datagram, one INIT.
func once(ctx context.Context, proto, addr string) (Reply, error) {
	switch proto {
	case "tcp":
		return ProbeTCP(ctx, addr, 0)
	case "sctp":
		return ProbeSCTP(ctx, addr) // resends only after 300 ms
	case "udp":
		c, err := dialer().Dial("udp", addr)
		if err != nil {
			return Reply{}, err
		}
		defer c.Close()
		if _, err := c.Write([]byte("probe")); err != nil {
			return Reply{}, err
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetReadDeadline(dl)
		}
		buf := make([]byte, 1024)
		n, err := c.Read(buf)
		if err != nil {
			return Reply{}, fmt.Errorf("udp %s: %w", addr, err)
		}
		return parseReply(string(buf[:n]))
	}
	return Reply{}, fmt.Errorf("repeat %q: want tcp, udp or sctp", proto)
}

// Session keeps one connection (TCP) or one socket (UDP: one conntrack entry) to addr and asks over it every
// interval until ctx ends, numbering each question and waiting up to timeout for its echo. It writes one
// line per question to out: "<ms since the start> ok" or "<ms> timeout". A TCP server echoes what it
// is sent; a UDP server answers every datagram.
func Session(ctx context.Context, proto, addr string, interval, timeout time.Duration, out io.Writer) error {
	c, err := dialer().DialContext(ctx, proto, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if proto == "tcp" {
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		if _, err := r.ReadString('\n'); err != nil { // the greeting
			return fmt.Errorf("tcp %s: greeting: %w", addr, err)
		}
	}
	start := time.Now()
	for seq := 0; ctx.Err() == nil; seq++ {
		asked := time.Now()
		msg := fmt.Sprintf("%08d\n", seq)
		if _, err := c.Write([]byte(msg)); err != nil {
			fmt.Fprintln(out, time.Since(start).Milliseconds(), "error", err)
		} else if sessionAnswer(c, r, proto, msg, asked.Add(timeout)) {
			fmt.Fprintln(out, asked.Sub(start).Milliseconds(), "ok")
		} else {
			fmt.Fprintln(out, asked.Sub(start).Milliseconds(), "timeout")
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(asked.Add(interval))):
		}
	}
	return nil
}

// sessionAnswer waits until deadline for the answer to msg: its echo (TCP) or any reply (UDP, whose
// server answers each datagram with its name); late answers to earlier questions are skipped.
func sessionAnswer(c net.Conn, r *bufio.Reader, proto, msg string, deadline time.Time) bool {
	_ = c.SetReadDeadline(deadline)
	if proto == "udp" {
		buf := make([]byte, 1024)
		_, err := c.Read(buf)
		return err == nil
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return false
		}
		if line == msg {
			return true
		}
	}
}
