package cluster

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The API server's egress proxy tunnels CONNECT to allowed addresses and refuses others (and anything
// but CONNECT).
func TestEgressProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	sock := filepath.Join(t.TempDir(), "egress.sock")
	p, err := startEgressProxy(sock, "", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	connect := func(target string) (net.Conn, *bufio.Reader, int) {
		c, err := net.DialTimeout("unix", sock, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		return c, br, resp.StatusCode
	}
	c, br, code := connect(echo.Addr().String())
	if code != http.StatusOK {
		t.Fatalf("CONNECT to an allowed address: %d", code)
	}
	fmt.Fprintf(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Errorf("through the tunnel: %q, %v", line, err)
	}
	c.Close()
	for _, target := range []string{"192.0.2.1:443", "example.com:80"} {
		c, _, code := connect(target)
		c.Close()
		if code != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d, want 403 (outside the lab)", target, code)
		}
	}
	c2, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	line, _ := bufio.NewReader(c2).ReadString('\n')
	if !strings.Contains(line, "405") {
		t.Errorf("a GET: %q, want 405", line)
	}
}

// Close returns although a tunnel's upstream never speaks or closes again (its client gone): an idle
// exec stream once held make conformance at the end of a run for good.
func TestEgressProxyCloseEndsSilentTunnels(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := silent.Accept(); err == nil {
			held <- c // kept open, never written to
		}
	}()
	sock := filepath.Join(t.TempDir(), "egress.sock")
	p, err := startEgressProxy(sock, "", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", silent.Addr(), silent.Addr())
	if resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	c.Close()
	up := <-held
	defer up.Close()
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waits for a tunnel whose upstream is silent")
	}
}
