package testpod

import (
	"context"
	"net"
	"strconv"
	"strings"
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
