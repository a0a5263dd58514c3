package testpod

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestConnect: the agnhost connect answers on loopback — nothing for a connection made or a datagram
// answered, REFUSED for a closed TCP port, TIMEOUT when nothing answers.
func TestConnect(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	answering, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { answering.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := answering.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = answering.WriteTo([]byte("host\n"), from)
		}
	}()
	silent, err := net.ListenPacket("udp", "127.0.0.1:0") // reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	tests := []struct {
		proto, addr, want string
		code              int
	}{
		{"tcp", ln.Addr().String(), "", 0},
		{"tcp", closedAddr, "REFUSED\n", 1},
		{"udp", answering.LocalAddr().String(), "", 0},
		{"udp", silent.LocalAddr().String(), "TIMEOUT\n", 1},
		{"icmp", ln.Addr().String(), `OTHER: unsupported protocol "icmp"` + "\n", 1},
	}
	for _, tt := range tests {
		got, code := Connect(ctx, tt.proto, tt.addr, 300*time.Millisecond)
		if got != tt.want || code != tt.code {
			t.Errorf("connect %s %s: %q exit %d, want %q exit %d", tt.proto, tt.addr, got, code, tt.want, tt.code)
		}
	}
}
