package debugapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// backend answers with fixed values; a trace blocks until release is closed.
type backend struct {
	release chan struct{}
	traced  chan TraceRequest
}

func (b *backend) Node(context.Context) (*NodeInfo, error) {
	return &NodeInfo{Name: "n1", NodeIP: netip.MustParseAddr("198.51.100.11")}, nil
}
func (b *backend) Desired(context.Context) (*Desired, error) { return nil, errors.New("boom") }
func (b *backend) Diff(context.Context) (*Diff, error) {
	return nil, ErrUnavailable
}
func (b *backend) Dump(context.Context) (*Dump, error) {
	return &Dump{Node: "n1", Flows: [][]byte{{1, 2, 3}}}, nil
}
func (b *backend) Trace(ctx context.Context, req TraceRequest) (*TraceResponse, error) {
	b.traced <- req
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &TraceResponse{Node: "n1", Output: "Flow: ..."}, nil
}

func serve(t *testing.T, b Backend) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(b, logr.Discard())}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return NewSocketClient(sock)
}

var goodPacket = trace.Packet{InPort: 3, EthSrc: trace.MAC{0x0a, 0x58, 10, 128, 0, 3}, EthDst: trace.MAC{0x0a, 0x58, 10, 128, 0, 1},
	Proto: "tcp", IPSrc: netip.MustParseAddr("10.128.0.3"), IPDst: netip.MustParseAddr("10.128.0.4"), SrcPort: 40000, DstPort: 80}

// TestHandler: answers round-trip through the client; a backend still starting is 503, a failing one
// 500; a trace request that is not a valid packet is refused before it reaches ovs-vswitchd; and
// traces run one at a time, the next waiting at most traceWait.
func TestHandler(t *testing.T) {
	ctx := context.Background()
	b := &backend{release: make(chan struct{}), traced: make(chan TraceRequest, 4)}
	c := serve(t, b)
	if n, err := c.Node(ctx); err != nil || n.Name != "n1" || n.NodeIP != netip.MustParseAddr("198.51.100.11") {
		t.Fatalf("node: %+v %v", n, err)
	}
	if d, err := c.Dump(ctx); err != nil || len(d.Flows) != 1 || string(d.Flows[0]) != "\x01\x02\x03" {
		t.Fatalf("dump: %+v %v", d, err)
	}
	var re *ResponseError
	if _, err := c.Diff(ctx); !errors.As(err, &re) || re.Status != http.StatusServiceUnavailable {
		t.Errorf("diff of a starting agent: %v", err)
	}
	if _, err := c.Desired(ctx); !errors.As(err, &re) || re.Status != http.StatusInternalServerError || !strings.Contains(re.Body, "boom") {
		t.Errorf("failing desired: %v", err)
	}
	bad := goodPacket
	bad.Proto = "gre"
	for _, req := range []TraceRequest{{Packet: bad}, {Packet: trace.Packet{Proto: "tcp"}}, {Packet: goodPacket, CtNext: make([]trace.CtFlags, 17)}} {
		if _, err := c.Trace(ctx, req); !errors.As(err, &re) || re.Status != http.StatusBadRequest {
			t.Errorf("trace %+v: %v, want 400", req, err)
		}
	}
	if len(b.traced) != 0 {
		t.Fatal("a refused request reached the backend")
	}

	traceWait = 200 * time.Millisecond
	t.Cleanup(func() { traceWait = 10 * time.Second })
	first := make(chan error, 1)
	go func() {
		_, err := c.Trace(ctx, TraceRequest{Packet: goodPacket, CtNext: []trace.CtFlags{{"trk", "new"}}})
		first <- err
	}()
	got := <-b.traced
	if got.Packet.IPDst != goodPacket.IPDst || got.CtNext[0].String() != "trk,new" {
		t.Errorf("backend got %+v", got)
	}
	if _, err := c.Trace(ctx, TraceRequest{Packet: goodPacket}); !errors.As(err, &re) || re.Status != http.StatusTooManyRequests {
		t.Errorf("a second trace while one runs: %v, want 429", err)
	}
	close(b.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Trace(ctx, TraceRequest{Packet: goodPacket}); err != nil {
		t.Errorf("a trace after the first finished: %v", err)
	}
	// Only the API's paths, and only their methods.
	resp, err := c.http.Get(c.base + PathTrace)
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET trace: %v %v", resp, err)
	}
}
