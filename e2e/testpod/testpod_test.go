package testpod

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestServeAndProbeOnLoopback(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "ns/web", []int{port}, []int{port}) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	var rep Reply
	var err error
	for {
		if rep, err = ProbeTCP(pctx, addr, 1400); err == nil || pctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || rep.Name != "ns/web" || !strings.HasPrefix(rep.Seen, "127.0.0.1:") {
		t.Fatalf("tcp probe: %+v %v", rep, err)
	}
	if rep, err = ProbeUDP(pctx, addr); err != nil || rep.Name != "ns/web" {
		t.Fatalf("udp probe: %+v %v", rep, err)
	}
	if _, err := ParsePorts("80,x"); err == nil {
		t.Error("bad port accepted")
	}
}

// TestClientsFromSources: each source address's connections leave from it (the server sees it) and
// are counted under it; a dead destination counts as errors.
func TestClientsFromSources(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "ns/web", []int{port}, []int{port}) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	srcs := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")}
	deadline := time.Now().Add(5 * time.Second)
	for _, proto := range []string{"tcp", "udp"} {
		var got map[string]*ClientResult
		// Retry until the server listens: a round that raced its start counts some "error: …" entries, so
		// wait for a round whose every connection reached the server (the check below judges it).
		want := "ns/web:" + strconv.Itoa(port)
		for {
			got = Clients(context.Background(), proto, []string{addr}, srcs, 5, 3, time.Second)
			if got["127.0.0.2"].Endpoints[want] == 5 && got["127.0.0.3"].Endpoints[want] == 5 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, s := range srcs {
			r := got[s.String()]
			if r.Endpoints["ns/web:"+strconv.Itoa(port)] != 5 || r.Seen[s.String()] != 5 {
				t.Errorf("%s from %s: %+v", proto, s, r)
			}
		}
	}
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t))
	got := Clients(context.Background(), "tcp", []string{dead}, srcs[:1], 2, 1, time.Second)
	errs := 0
	for k, n := range got["127.0.0.2"].Endpoints {
		if !strings.HasPrefix(k, "error: ") {
			t.Errorf("a dead destination answered: %+v", got["127.0.0.2"])
		}
		errs += n
	}
	if errs != 2 {
		t.Errorf("2 connections to a dead destination: %+v", got["127.0.0.2"])
	}
}

// TestProbeUDPRefused: a UDP probe to a port nothing listens on is refused at once (the kernel's ICMP
// port unreachable), not retried until its deadline.
func TestProbeUDPRefused(t *testing.T) {
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ProbeUDP(ctx, dead); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a closed port: %v, want connection refused", err)
	}
}

func TestProbeAllAndRepeat(t *testing.T) {
	port, closed := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "ns/all", []int{port}, []int{port}) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var targets []Target
	for _, s := range []string{"tcp/" + addr, "udp/" + addr, "tcp/127.0.0.1:" + strconv.Itoa(closed)} {
		tg, err := ParseTarget(s)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, tg)
	}
	if _, err := ParseTarget("icmp/" + addr); err == nil {
		t.Error("icmp target accepted")
	}
	var res []Result
	for i := 0; i < 50; i++ { // the server needs a moment to listen
		if res = ProbeAll(context.Background(), targets, 700*time.Millisecond); res[0].Error == "" && res[1].Error == "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res[0].Error != "" || !strings.HasPrefix(res[0].Reply, "ns/all 127.0.0.1:") || res[1].Error != "" || res[2].Error == "" {
		t.Fatalf("probe-all: %+v", res)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer rcancel()
	if st := Repeat(rctx, "tcp", addr, "ns/all", 20*time.Millisecond, 200*time.Millisecond); st.OK < 5 || st.Failed != 0 {
		t.Errorf("repeat to a server: %+v", st)
	}
	rctx2, rcancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer rcancel2()
	if st := Repeat(rctx2, "udp", addr, "ns/other", 20*time.Millisecond, 200*time.Millisecond); st.OK != 0 || st.Failed < 5 {
		t.Errorf("repeat wanting another server: %+v", st)
	}
}

// SCTP in user space over raw sockets (root only: skipped where raw sockets are refused).
func TestSCTPOnLoopback(t *testing.T) {
	if c, err := net.ListenPacket(sctpProtocol, "127.0.0.1"); err != nil {
		t.Skipf("no raw SCTP socket here: %v", err)
	} else {
		c.Close()
	}
	port := 40000 + int(time.Now().UnixNano()%10000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeSCTP(ctx, "ns/sctp", []int{port}) }()
	t.Cleanup(func() { cancel(); <-done })
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer pcancel()
	rep, err := ProbeSCTP(pctx, "127.0.0.1:"+strconv.Itoa(port))
	if err != nil || rep.Name != "ns/sctp" || rep.Port != port || !strings.HasPrefix(rep.Seen, "127.0.0.1:") {
		t.Fatalf("sctp probe: %+v %v", rep, err)
	}
	if _, err := ProbeSCTP(pctx, "127.0.0.1:"+strconv.Itoa(port+1)); err == nil || !strings.Contains(err.Error(), "ABORT") {
		t.Errorf("an INIT to a port nobody serves must be aborted: %v", err)
	}
	// A corrupted packet is refused by the checksum.
	pkt := sctpPacket(1, 2, 3, chunkInit, 0, initValue(4))
	if _, err := parseSCTP(pkt); err != nil {
		t.Fatal(err)
	}
	pkt[20] ^= 1
	if _, err := parseSCTP(pkt); err == nil {
		t.Error("corrupted packet accepted")
	}
}

func TestSession(t *testing.T) {
	port := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "ns/sess", []int{port}, []int{port}) }()
	t.Cleanup(func() { cancel(); <-done })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for _, proto := range []string{"tcp", "udp"} {
		var out strings.Builder
		sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		var err error
		for i := 0; i < 50; i++ { // the server needs a moment to listen
			out.Reset()
			if err = Session(sctx, proto, addr, 50*time.Millisecond, 200*time.Millisecond, &out); err == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		scancel()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if err != nil || len(lines) < 3 || strings.Count(out.String(), " ok") != len(lines) {
			t.Errorf("%s session: %v\n%s", proto, err, out.String())
		}
	}
}
