package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// buildPlugin compiles the real plugin binary once, as a runtime would find it in its CNI bin dir.
var buildPlugin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "ofsdn-cni-bin-")
	if err != nil {
		return "", err
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "ofsdn"), "github.com/ofsdn/ofsdn/cmd/ofsdn").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build plugin: %v: %s", err, out)
	}
	return dir, nil
})

// recorder is a Handler that records calls and answers with a fixed result.
type recorder struct {
	mu     sync.Mutex
	calls  []string
	addErr error
	valid  []Attachment
}

func (r *recorder) note(s string) { r.mu.Lock(); r.calls = append(r.calls, s); r.mu.Unlock() }

func (r *recorder) Add(_ context.Context, req *Request) (*current.Result, error) {
	r.note("ADD " + req.PodNamespace() + "/" + req.PodName() + " " + req.IfName)
	if r.addErr != nil {
		return nil, r.addErr
	}
	_, ipn, _ := net.ParseCIDR("10.128.0.5/23")
	ipn.IP = net.ParseIP("10.128.0.5").To4()
	zero := 0
	return &current.Result{CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: req.IfName, Mac: "0a:58:0a:80:00:05", Sandbox: req.Netns}},
		IPs:        []*current.IPConfig{{Interface: &zero, Address: *ipn, Gateway: net.ParseIP("10.128.0.1")}},
	}, nil
}
func (r *recorder) Del(_ context.Context, req *Request) error {
	r.note("DEL " + req.ContainerID)
	return nil
}
func (r *recorder) Check(_ context.Context, req *Request) error { r.note("CHECK"); return nil }
func (r *recorder) Status(context.Context) error                { r.note("STATUS"); return nil }
func (r *recorder) GC(_ context.Context, valid []Attachment) error {
	r.mu.Lock()
	r.valid = valid
	r.mu.Unlock()
	r.note("GC")
	return nil
}

func conflist(socket string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q,"mtu":1450}]}`, socket))
}

func runtimeConf(id string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: "/var/run/netns/ofsdn-t-none", IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", "ns"}, {"K8S_POD_NAME", "web"}, {"IgnoreUnknown", "1"}}}
}

// TestPluginThroughLibcni drives the real plugin binary through libcni, as container runtimes do, against
// the agent's CNI server.
func TestPluginThroughLibcni(t *testing.T) {
	binDir, err := buildPlugin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	socket := filepath.Join(t.TempDir(), "cni.sock")
	rec := &recorder{}
	srv := &Server{Socket: socket, Handler: rec}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = srv.Serve(sctx) }()
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket must be root-only: %v %v", fi.Mode(), err)
	}

	list, err := libcni.ConfListFromBytes(conflist(socket))
	if err != nil {
		t.Fatal(err)
	}
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
	res, err := cniConf.AddNetworkList(ctx, list, runtimeConf("c1"))
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil || len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.128.0.5/23" {
		t.Fatalf("ADD result: %+v, %v", r, err)
	}
	if err := cniConf.CheckNetworkList(ctx, list, runtimeConf("c1")); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := cniConf.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	if err := cniConf.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "c1", IfName: "eth0"}}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if err := cniConf.DelNetworkList(ctx, list, runtimeConf("c1")); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	got := strings.Join(rec.calls, "; ")
	for _, want := range []string{"ADD ns/web eth0", "CHECK", "STATUS", "GC", "DEL c1"} {
		if !strings.Contains(got, want) {
			t.Errorf("agent never saw %q: %s", want, got)
		}
	}
	if len(rec.valid) != 1 || rec.valid[0].ContainerID != "c1" {
		t.Errorf("GC valid attachments: %+v", rec.valid)
	}

	// The agent's errors reach the runtime with their CNI code.
	rec.addErr = Errorf(ErrTryAgainLater, "node subnet exhausted")
	_, err = cniConf.AddNetworkList(ctx, list, runtimeConf("c2"))
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrTryAgainLater || !strings.Contains(ce.Msg, "exhausted") {
		t.Errorf("ADD error: %v", err)
	}
}

func TestPluginErrors(t *testing.T) {
	binDir, err := buildPlugin()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
	missing := filepath.Join(t.TempDir(), "no-agent.sock")
	list, err := libcni.ConfListFromBytes(conflist(missing))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cniConf.AddNetworkList(ctx, list, runtimeConf("c1"))
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != ErrTryAgainLater || !strings.Contains(ce.Msg, "is the ofsdn-agent pod running") {
		t.Errorf("ADD without agent: %v", err)
	}
	if err := cniConf.DelNetworkList(ctx, list, runtimeConf("c1")); err != nil {
		t.Errorf("DEL without agent must succeed, leaving the DEL for the agent: %v", err)
	}
	if d, found, err := ReadPendingDelete(PendingDeletesDirFor(missing), "c1", "eth0"); err != nil || !found ||
		d.PodNamespace() != "ns" || d.PodName() != "web" || d.Netns != runtimeConf("c1").NetNS {
		t.Errorf("DEL without agent left %+v (found %v, %v), want the DEL of c1/eth0 of ns/web", d, found, err)
	}
	noArgs := runtimeConf("c3")
	noArgs.Args = nil
	_, err = cniConf.AddNetworkList(ctx, list, noArgs)
	if !errors.As(err, &ce) || ce.Code != ErrInvalidEnv {
		t.Errorf("ADD without pod args: %v", err)
	}
	bad, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"ofsdn","plugins":[{"type":"ofsdn","mtu":"big"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cniConf.AddNetworkList(ctx, bad, runtimeConf("c4"))
	if !errors.As(err, &ce) || ce.Code != ErrDecoding {
		t.Errorf("ADD with malformed config: %v", err)
	}
	// A cniVersion the plugin does not speak: skel answers it with code 1 before ofsdn's code runs.
	old, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(`{"cniVersion":"0.3.1","name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q}]}`, missing)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = cniConf.AddNetworkList(ctx, old, runtimeConf("c5"))
	if !errors.As(err, &ce) || ce.Code != ErrIncompatibleVersion {
		t.Errorf("ADD with cniVersion 0.3.1: %v", err)
	}
	if _, err := ParseArgs("A=1;B"); err == nil {
		t.Error("ParseArgs accepted a key without value")
	}
}

// blockingAdd is a Handler whose ADD runs until its context ends, and says when that happened.
type blockingAdd struct {
	recorder
	started, canceled chan struct{}
}

func (b *blockingAdd) Add(ctx context.Context, _ *Request) (*current.Result, error) {
	close(b.started)
	<-ctx.Done()
	close(b.canceled)
	return nil, ctx.Err()
}

func startServer(t testing.TB, h Handler) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "cni.sock")
	srv := &Server{Socket: socket, Handler: h}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return socket
}

// A plugin that goes away (its runtime timed out and killed it) cancels the agent's work on its request.
func TestServerCancelsWhenThePluginHangsUp(t *testing.T) {
	h := &blockingAdd{started: make(chan struct{}), canceled: make(chan struct{})}
	socket := startServer(t, h)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := Call(ctx, socket, &Request{Command: CmdAdd, ContainerID: "c1", Netns: "/x", IfName: "eth0"})
		errc <- err
	}()
	select {
	case <-h.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the handler")
	}
	cancel()
	var ue *AgentUnavailableError
	if err := <-errc; !errors.As(err, &ue) || !ue.Timeout || ue.Stage != stageAnswer {
		t.Errorf("Call after its context ended: %v, want the agent unavailable while waiting for the answer", err)
	}
	select {
	case <-h.canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context was not canceled when the plugin hung up")
	}
}

// Garbage on the socket gets a decoding error back, and the server goes on serving.
func TestServerAnswersMalformedRequests(t *testing.T) {
	socket := startServer(t, &recorder{})
	for _, tc := range []struct{ name, send string }{
		{"not JSON", "GET / HTTP/1.1\r\n\r\n"},
		{"wrong shape", `{"command": 7}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("unix", socket)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write([]byte(tc.send)); err != nil {
				t.Fatal(err)
			}
			var resp Response
			if err := json.NewDecoder(conn).Decode(&resp); err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if resp.Error == nil || resp.Error.Code != ErrDecoding {
				t.Fatalf("answer %+v, want a decoding error", resp)
			}
		})
	}
	resp, err := Call(context.Background(), socket, &Request{Command: CmdStatus})
	if err != nil || resp.Error != nil {
		t.Fatalf("STATUS after bad requests: %+v, %v", resp, err)
	}
}
