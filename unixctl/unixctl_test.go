package unixctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDaemon is a control socket that decodes each request with its own JSON reader and answers with
// whatever the test's reply function writes, byte for byte: the protocol as OVS's jsonrpc.c frames it
// (JSON texts back to back), with the odd behaviour a test wants.
type fakeDaemon struct {
	path string
	mu   sync.Mutex
	reqs []map[string]any
}

func startFake(t *testing.T, reply func(c net.Conn, req map[string]any)) *fakeDaemon {
	t.Helper()
	f := &fakeDaemon{path: filepath.Join(t.TempDir(), "d.ctl")}
	ln, err := net.Listen("unix", f.path)
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
			go func() {
				defer c.Close()
				dec := json.NewDecoder(c)
				for {
					var req map[string]any
					if err := dec.Decode(&req); err != nil {
						return
					}
					f.mu.Lock()
					f.reqs = append(f.reqs, req)
					f.mu.Unlock()
					reply(c, req)
				}
			}()
		}
	}()
	return f
}

func (f *fakeDaemon) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.reqs...)
}

// answer writes OVS's reply to req: result or error (one of them null).
func answer(c net.Conn, req map[string]any, result, errText any) {
	b, _ := json.Marshal(map[string]any{"id": req["id"], "result": result, "error": errText})
	_, _ = c.Write(b)
}

func TestCall(t *testing.T) {
	tests := []struct {
		name    string
		reply   func(c net.Conn, req map[string]any)
		args    []string
		want    string
		wantErr string // substring of the error; "" = success
		refused bool   // the error is an *Error (the daemon refused the command)
	}{
		{
			name:  "text reply",
			reply: func(c net.Conn, req map[string]any) { answer(c, req, "line 1\nline 2\n", nil) },
			want:  "line 1\nline 2\n",
		},
		{
			name:  "arguments pass as strings",
			reply: func(c net.Conn, req map[string]any) { answer(c, req, fmt.Sprint(req["params"]), nil) },
			args:  []string{"br0", "in_port=1,ip", ""},
			want:  "[br0 in_port=1,ip ]",
		},
		{
			name:    "refused command",
			reply:   func(c net.Conn, req map[string]any) { answer(c, req, nil, "\"x\" is not a valid command\n") },
			wantErr: `unixctl: m: "x" is not a valid command`,
			refused: true,
		},
		{
			name:  "JSON result is returned as JSON",
			reply: func(c net.Conn, req map[string]any) { answer(c, req, map[string]int{"a": 1}, nil) },
			want:  `{"a":1}`,
		},
		{
			name:  "null result is empty",
			reply: func(c net.Conn, req map[string]any) { answer(c, req, nil, nil) },
			want:  "",
		},
		{
			name: "a daemon's own request and another id are skipped, bytes come one by one",
			reply: func(c net.Conn, req map[string]any) {
				msgs := `{"method":"echo","params":[],"id":"echo"}` + "\n" +
					fmt.Sprintf(`{"id":%v,"result":"old","error":null}`, req["id"].(float64)-1) +
					fmt.Sprintf(`{"error":null,"id":%v,"result":"mine"}`, req["id"])
				for i := range len(msgs) {
					_, _ = c.Write([]byte{msgs[i]})
				}
			},
			want: "mine",
		},
		{
			name:    "connection closed without an answer",
			reply:   func(c net.Conn, req map[string]any) { c.Close() },
			wantErr: "closed the connection without answering",
		},
		{
			name:    "garbage instead of JSON",
			reply:   func(c net.Conn, req map[string]any) { _, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) },
			wantErr: "invalid character",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t, tc.reply)
			got, err := NewSocket(f.path).Call(context.Background(), "m", tc.args...)
			if tc.wantErr == "" {
				if err != nil || got != tc.want {
					t.Fatalf("Call = %q, %v; want %q", got, err, tc.want)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Call = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				var refused *Error
				if errors.As(err, &refused) != tc.refused {
					t.Fatalf("error %v: *Error = %v, want %v", err, !tc.refused, tc.refused)
				}
			}
		})
	}
}

func TestCallRequestShape(t *testing.T) {
	f := startFake(t, func(c net.Conn, req map[string]any) { answer(c, req, "ok", nil) })
	cl := NewSocket(f.path)
	ctx := context.Background()
	if _, err := cl.Call(ctx, "version"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Call(ctx, "tnl/neigh/set", "br-ul", "192.0.2.12", "0a:58:c0:00:02:0c"); err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	// "params" is always an array (OVS rejects a request without one), of strings.
	if p, ok := reqs[0]["params"].([]any); !ok || len(p) != 0 || reqs[0]["method"] != "version" {
		t.Errorf("first request %v: want method version with params []", reqs[0])
	}
	if want := []any{"br-ul", "192.0.2.12", "0a:58:c0:00:02:0c"}; !reflect.DeepEqual(reqs[1]["params"], want) || reqs[1]["method"] != "tnl/neigh/set" {
		t.Errorf("second request %v: want tnl/neigh/set with %v", reqs[1], want)
	}
	id0, ok0 := reqs[0]["id"].(float64)
	id1, ok1 := reqs[1]["id"].(float64)
	if !ok0 || !ok1 || id0 == id1 {
		t.Errorf("ids %v and %v: want two distinct numbers", reqs[0]["id"], reqs[1]["id"])
	}
}

func TestCallContext(t *testing.T) {
	silent := startFake(t, func(net.Conn, map[string]any) {})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := NewSocket(silent.path).Call(ctx, "m")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the context's deadline", err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := NewSocket(silent.path).Call(ctx, "m")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want cancelled", err)
		}
	})
	t.Run("client timeout without a deadline", func(t *testing.T) {
		c := NewSocket(silent.path)
		c.Timeout = 50 * time.Millisecond
		_, err := c.Call(context.Background(), "m")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the client's timeout", err)
		}
	})
	t.Run("no daemon", func(t *testing.T) {
		_, err := NewSocket(filepath.Join(t.TempDir(), "none.ctl")).Call(context.Background(), "m")
		if err == nil || !strings.Contains(err.Error(), "none.ctl") {
			t.Fatalf("err = %v, want one naming the socket", err)
		}
	})
	t.Run("empty command", func(t *testing.T) {
		if _, err := NewSocket(silent.path).Call(context.Background(), ""); err == nil {
			t.Fatal("empty command accepted")
		}
	})
}

func TestSocketPath(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ovs-vswitchd.pid", "4242\n")
	write("bad.pid", "not a pid\n")
	tests := []struct {
		daemon, want, wantErr string
	}{
		{daemon: "ovs-vswitchd", want: filepath.Join(dir, "ovs-vswitchd.4242.ctl")},
		{daemon: "ovsdb-server", wantErr: "is ovsdb-server running"},
		{daemon: "bad", wantErr: "not a PID"},
		{daemon: "../etc/x", wantErr: "plain program name"},
		{daemon: "", wantErr: "plain program name"},
	}
	for _, tc := range tests {
		got, err := New(dir, tc.daemon).SocketPath()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: SocketPath = %q, %v; want an error containing %q", tc.daemon, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: SocketPath = %q, %v; want %q", tc.daemon, got, err, tc.want)
		}
	}
	if got, _ := NewSocket("/x/y.ctl").SocketPath(); got != "/x/y.ctl" {
		t.Errorf("NewSocket path %q", got)
	}
}

// ovsRow formats a tnl/neigh/show row the way OVS 3.1 does (lib/tnl-neigh-cache.c): the IP padded to
// INET6_ADDRSTRLEN (46) columns, then the MAC, three spaces and the bridge.
func ovsRow(ip, mac, bridge, flag string) string {
	row := ip + strings.Repeat(" ", 46-len(ip)) + mac + "   " + bridge
	if flag != "" {
		row += " " + flag
	}
	return row + "\n"
}

const ovsHeader = "IP                                            MAC                 Bridge\n" +
	"==========================================================================\n"

func TestParseTunnelNeighbors(t *testing.T) {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	tests := []struct {
		name    string
		in      string
		want    []TunnelNeighbor
		wantErr string
	}{
		{name: "empty cache", in: ovsHeader, want: nil},
		{
			name: "entries",
			in: ovsHeader + ovsRow("192.0.2.12", "0a:58:c0:00:02:0c", "br-ul", "") +
				ovsRow("198.51.100.13", "aa:bb:cc:dd:ee:ff", "br-ex", "STALE") +
				ovsRow("2001:db8::1", "02:00:00:00:00:01", "br-ul", ""),
			want: []TunnelNeighbor{
				{IP: netip.MustParseAddr("192.0.2.12"), MAC: mac("0a:58:c0:00:02:0c"), Bridge: "br-ul"},
				{IP: netip.MustParseAddr("198.51.100.13"), MAC: mac("aa:bb:cc:dd:ee:ff"), Bridge: "br-ex", Stale: true},
				{IP: netip.MustParseAddr("2001:db8::1"), MAC: mac("02:00:00:00:00:01"), Bridge: "br-ul"},
			},
		},
		{
			// Newer OVS lists entries it is still resolving, with blanks where the MAC goes.
			name: "incomplete entry",
			in:   ovsHeader + "192.0.2.14" + strings.Repeat(" ", 36) + strings.Repeat(" ", 20) + "br-ul INCOMPLETE\n",
			want: []TunnelNeighbor{{IP: netip.MustParseAddr("192.0.2.14"), Bridge: "br-ul", Incomplete: true}},
		},
		{name: "IPv4-mapped is unmapped", in: ovsRow("::ffff:192.0.2.12", "0a:58:c0:00:02:0c", "br-ul", ""),
			want: []TunnelNeighbor{{IP: netip.MustParseAddr("192.0.2.12"), MAC: mac("0a:58:c0:00:02:0c"), Bridge: "br-ul"}}},
		{name: "no bridge", in: ovsHeader + "192.0.2.12   0a:58:c0:00:02:0c\n", wantErr: "no bridge"},
		{name: "no MAC", in: ovsHeader + "192.0.2.12   br-ul\n", wantErr: "no MAC"},
		{name: "not an address", in: ovsHeader + "nonsense 0a:58:c0:00:02:0c br-ul\n", wantErr: "no IP"},
		{name: "unknown flag", in: ovsHeader + ovsRow("192.0.2.12", "0a:58:c0:00:02:0c", "br-ul", "WEIRD"), wantErr: "unknown flag"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTunnelNeighbors(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
}

func TestSetTunnelNeighbor(t *testing.T) {
	f := startFake(t, func(c net.Conn, req map[string]any) { answer(c, req, "OK\n", nil) })
	cl := NewSocket(f.path)
	ctx := context.Background()
	mac, _ := net.ParseMAC("0a:58:c0:00:02:0c")
	if err := cl.SetTunnelNeighbor(ctx, "br-ul", netip.MustParseAddr("::ffff:192.0.2.12"), mac); err != nil {
		t.Fatal(err)
	}
	if got, want := f.requests()[0]["params"], []any{"br-ul", "192.0.2.12", "0a:58:c0:00:02:0c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("params %v, want %v", got, want)
	}
	// Bad input is refused before anything reaches the daemon.
	for _, tc := range []struct {
		bridge string
		ip     netip.Addr
		mac    net.HardwareAddr
	}{
		{"", netip.MustParseAddr("192.0.2.12"), mac},
		{"a-bridge-name-too-long", netip.MustParseAddr("192.0.2.12"), mac},
		{"br ul", netip.MustParseAddr("192.0.2.12"), mac},
		{"br-ul", netip.Addr{}, mac},
		{"br-ul", netip.MustParseAddr("192.0.2.12"), nil},
		{"br-ul", netip.MustParseAddr("192.0.2.12"), net.HardwareAddr{1, 2, 3}},
	} {
		if err := cl.SetTunnelNeighbor(ctx, tc.bridge, tc.ip, tc.mac); err == nil {
			t.Errorf("SetTunnelNeighbor(%q, %v, %v) accepted", tc.bridge, tc.ip, tc.mac)
		}
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("%d requests reached the daemon, want only the valid one", n)
	}
}
