package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// An agent as the plugin may find it. Each returns the socket the plugin is to call.
type agentState func(t *testing.T) string

// noAgent: nothing listens (the agent is not running).
func noAgent(t *testing.T) string { return filepath.Join(t.TempDir(), "cni.sock") }

// frozenAgent listens but never accepts: what a SIGSTOPped agent looks like to a client (the kernel
// completes connections into the backlog, and nobody reads them).
func frozenAgent(t *testing.T) string {
	socket := filepath.Join(t.TempDir(), "cni.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return socket
}

// rawAgent accepts, reads the request and then does what answer says with the connection.
func rawAgent(answer func(net.Conn)) agentState {
	return func(t *testing.T) string {
		socket := filepath.Join(t.TempDir(), "cni.sock")
		ln, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		t.Cleanup(func() { ln.Close(); wg.Wait() })
		wg.Go(func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				var req Request
				if json.NewDecoder(conn).Decode(&req) == nil {
					answer(conn)
				}
				conn.Close()
			}
		})
		return socket
	}
}

// diesAgent reads the request and closes the connection: an agent killed while serving.
var diesAgent = rawAgent(func(net.Conn) {})

// diesAfterAcceptAgent confirms the request, then dies.
var diesAfterAcceptAgent = rawAgent(func(c net.Conn) { _, _ = io.WriteString(c, `{"accepted":true}`+"\n") })

// garbledAgent answers with something that is no JSON.
var garbledAgent = rawAgent(func(c net.Conn) { _, _ = io.WriteString(c, "HTTP/1.1 500 oops\r\n\r\n") })

// serving is the real server with a handler.
func serving(h Handler) agentState { return func(t *testing.T) string { return startServer(t, h) } }

// slowAdd is a Handler whose ADD takes until its context ends (the plugin gave up).
type slowAdd struct{ recorder }

func (s *slowAdd) Add(ctx context.Context, _ *Request) (*current.Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// statusErr is a Handler whose STATUS fails with err.
type statusErr struct {
	recorder
	err error
}

func (s *statusErr) Status(context.Context) error { return s.err }

// TestErrorCodes maps every way a call can fail to the code of CNI spec 1.1 ("Error") the runtime gets.
func TestErrorCodes(t *testing.T) {
	const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web"
	// Short budgets: these cases are about which code, not how long (the defaults are in DefaultTimeouts).
	quick := Timeouts{Connect: time.Second, Accept: 300 * time.Millisecond,
		Verb: map[Command]time.Duration{CmdAdd: time.Second, CmdDel: time.Second, CmdCheck: time.Second, CmdGC: time.Second, CmdStatus: time.Second}}
	for _, tc := range []struct {
		name  string
		cmd   Command
		agent agentState
		conf  string // the plugin's configuration with %s for the socket's JSON string; "" = a valid one
		args  string // CNI_ARGS; "" = podArgs
		want  uint   // 0: success
		msg   string // in the error's message
		// pendingDelete: the DEL must be left for the agent.
		pendingDelete bool
	}{
		// The agent cannot be asked.
		{name: "ADD, no agent", cmd: CmdAdd, agent: noAgent, want: ErrTryAgainLater, msg: "is the ofsdn-agent pod running"},
		{name: "CHECK, no agent", cmd: CmdCheck, agent: noAgent, want: ErrTryAgainLater},
		{name: "GC, no agent", cmd: CmdGC, agent: noAgent, want: ErrTryAgainLater},
		{name: "STATUS, no agent", cmd: CmdStatus, agent: noAgent, want: ErrPluginNotAvailable, msg: "cannot reach the ofsdn agent"},
		{name: "DEL, no agent", cmd: CmdDel, agent: noAgent, pendingDelete: true},
		{name: "ADD, frozen agent", cmd: CmdAdd, agent: frozenAgent, want: ErrTryAgainLater, msg: "did not respond in time while waiting for the agent to accept"},
		{name: "STATUS, frozen agent", cmd: CmdStatus, agent: frozenAgent, want: ErrPluginNotAvailable, msg: "frozen"},
		{name: "DEL, frozen agent", cmd: CmdDel, agent: frozenAgent, pendingDelete: true},
		{name: "ADD, agent dies", cmd: CmdAdd, agent: diesAgent, want: ErrTryAgainLater, msg: "went away"},
		{name: "ADD, agent dies after accepting", cmd: CmdAdd, agent: diesAfterAcceptAgent, want: ErrTryAgainLater, msg: "went away while waiting for the answer"},
		{name: "STATUS, agent dies", cmd: CmdStatus, agent: diesAgent, want: ErrPluginNotAvailable},
		{name: "DEL, agent dies after accepting", cmd: CmdDel, agent: diesAfterAcceptAgent, pendingDelete: true},
		{name: "ADD, agent too slow", cmd: CmdAdd, agent: serving(&slowAdd{}), want: ErrTryAgainLater, msg: "while waiting for the answer"},
		{name: "ADD, garbled answer", cmd: CmdAdd, agent: garbledAgent, want: ErrDecoding, msg: "does not decode"},
		{name: "DEL, no agent, pending deletes not writable", cmd: CmdDel, agent: noAgent,
			conf: `{"cniVersion":"1.1.0","name":"ofsdn","type":"ofsdn","agentSocket":%s,"pendingDeletesDir":"/proc/ofsdn-nowhere"}`,
			want: ErrTryAgainLater, msg: "could not be left for the agent"},
		// The agent answers with an error: its code reaches the runtime.
		{name: "ADD, agent says try again", cmd: CmdAdd, agent: serving(&recorder{addErr: Errorf(ErrTryAgainLater, "node subnet exhausted")}),
			want: ErrTryAgainLater, msg: "exhausted"},
		{name: "ADD, agent refuses the interface", cmd: CmdAdd, agent: serving(&recorder{addErr: Errorf(ErrInvalidEnv, "CNI_IFNAME=eth0: not ofsdn's")}),
			want: ErrInvalidEnv, msg: "CNI_IFNAME"},
		{name: "ADD, agent fails without a code", cmd: CmdAdd, agent: serving(&recorder{addErr: errors.New("boom")}), want: ErrInternal, msg: "boom"},
		{name: "STATUS, agent not ready", cmd: CmdStatus, agent: serving(&statusErr{err: errors.New("no HostSubnet yet")}),
			want: ErrPluginNotAvailable, msg: "no HostSubnet"},
		{name: "STATUS, agent lost its bridge", cmd: CmdStatus, agent: serving(&statusErr{err: Errorf(ErrPluginNotAvailableConn, "no bridge")}),
			want: ErrPluginNotAvailableConn},
		{name: "STATUS, agent with another code", cmd: CmdStatus, agent: serving(&statusErr{err: Errorf(ErrTryAgainLater, "busy")}),
			want: ErrPluginNotAvailable, msg: "busy"},
		{name: "STATUS, ready", cmd: CmdStatus, agent: serving(&recorder{})},
		// The call itself is wrong: no agent is asked.
		{name: "malformed configuration", cmd: CmdAdd, agent: noAgent, conf: `{"cniVersion":"1.1.0","type":"ofsdn","mtu":"big","agentSocket":%s}`,
			want: ErrDecoding, msg: "malformed network configuration"},
		{name: "another plugin's type", cmd: CmdAdd, agent: noAgent, conf: `{"cniVersion":"1.1.0","type":"bridge","agentSocket":%s}`,
			want: ErrInvalidConfig, msg: `"bridge"`},
		{name: "an ipam section", cmd: CmdAdd, agent: noAgent, conf: `{"cniVersion":"1.1.0","type":"ofsdn","ipam":{"type":"host-local"},"agentSocket":%s}`,
			want: ErrUnsupportedField, msg: `ipam.type="host-local"`},
		{name: "an MTU out of range", cmd: CmdAdd, agent: noAgent, conf: `{"cniVersion":"1.1.0","type":"ofsdn","mtu":100,"agentSocket":%s}`,
			want: ErrInvalidConfig, msg: "mtu 100"},
		{name: "a relative socket path", cmd: CmdAdd, agent: noAgent, conf: `{"cniVersion":"1.1.0","type":"ofsdn","agentSocket":"run/cni.sock","x":%s}`,
			want: ErrInvalidConfig, msg: "agentSocket"},
		{name: "malformed CNI_ARGS", cmd: CmdAdd, agent: noAgent, args: "K8S_POD_NAME", want: ErrInvalidEnv, msg: "CNI_ARGS"},
		{name: "ADD without the pod's name", cmd: CmdAdd, agent: noAgent, args: "IgnoreUnknown=1", want: ErrInvalidEnv, msg: "K8S_POD_NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := tc.agent(t)
			sj, _ := json.Marshal(socket)
			conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ofsdn","type":"ofsdn","agentSocket":%s}`, sj)
			if tc.conf != "" {
				conf = fmt.Sprintf(tc.conf, sj)
			}
			args := podArgs
			if tc.args != "" {
				args = tc.args
			}
			if tc.cmd == CmdGC {
				conf = strings.TrimSuffix(conf, "}") + `,"cni.dev/valid-attachments":[]}`
			}
			var stdout, stderr bytes.Buffer
			p := &Plugin{Timeouts: quick, Stdout: &stdout, Stderr: &stderr}
			err := p.Run(tc.cmd, &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/ofsdn-t-x", IfName: "eth0", Args: args, StdinData: []byte(conf)})
			var ce *types.Error
			switch {
			case tc.want == 0 && err != nil:
				t.Fatalf("%s: %v, want success", tc.cmd, err)
			case tc.want != 0 && (!errors.As(err, &ce) || ce.Code != tc.want):
				t.Fatalf("%s: %v (%T), want code %d", tc.cmd, err, err, tc.want)
			case tc.want != 0 && !strings.Contains(ce.Msg, tc.msg):
				t.Errorf("%s: message %q lacks %q", tc.cmd, ce.Msg, tc.msg)
			}
			_, found, rerr := ReadPendingDelete(PendingDeletesDirFor(socket), "c1", "eth0")
			if rerr != nil || found != tc.pendingDelete {
				t.Errorf("pending delete left: %v (%v), want %v", found, rerr, tc.pendingDelete)
			}
			if tc.pendingDelete && !strings.Contains(stderr.String(), "left in") {
				t.Errorf("a DEL left for the agent says nothing on stderr: %q", stderr.String())
			}
		})
	}
}

// A frozen agent's confirmation never comes, whatever the verb's budget: the call ends at Accept.
func TestFrozenAgentFailsAtAccept(t *testing.T) {
	socket := frozenAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	_, err := call(ctx, Timeouts{Connect: time.Second, Accept: 200 * time.Millisecond}, socket, &Request{Command: CmdAdd, Ack: true})
	var ue *AgentUnavailableError
	if !errors.As(err, &ue) || ue.Stage != stageAccept || !ue.Timeout {
		t.Fatalf("call to a frozen agent: %v, want a timeout while waiting for the agent to accept", err)
	}
}

// The server drops a request whose plugin left before it was read: it never reaches the handler.
func TestServerDropsRequestsOfGoneClients(t *testing.T) {
	rec := &recorder{}
	srv := &Server{Socket: filepath.Join(t.TempDir(), "cni.sock"), Handler: rec}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	// Queue requests while nobody serves (a frozen agent), then let the clients go.
	for i := range 3 {
		conn, err := net.Dial("unix", srv.Socket)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.NewEncoder(conn).Encode(&Request{Command: CmdDel, ContainerID: fmt.Sprintf("gone%d", i), Ack: true}); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	// A live client after them is served, so by its answer the server has accepted the queued ones;
	// stopping the server waits for whatever they started.
	resp, err := Call(ctx, srv.Socket, &Request{Command: CmdDel, ContainerID: "live", Ack: true})
	if err != nil || resp.Error != nil {
		t.Fatalf("DEL of a waiting client: %+v %v", resp, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls := strings.Join(rec.calls, "; "); calls != "DEL live" {
		t.Fatalf("the handler saw %q, want only the DEL of the client that waited", calls)
	}
}

func TestPendingDeletes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pending")
	req := func(id string) *Request {
		return &Request{Command: CmdDel, ContainerID: id, IfName: "eth0", Netns: "/var/run/netns/" + id,
			Args: map[string]string{"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "p-" + id}}
	}
	if ds, errs := ReadPendingDeletes(dir); len(ds)+len(errs) != 0 {
		t.Fatalf("a missing directory holds %v %v", ds, errs)
	}
	for _, id := range []string{"b", "a", "b"} { // b twice: one file per attachment
		if err := WritePendingDelete(dir, req(id), errors.New("agent down")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What plugins that died mid-write left: skipped, and removed once a minute old.
	fresh, stale := filepath.Join(dir, ".fresh.json.tmp-1"), filepath.Join(dir, ".stale.json.tmp-2")
	for _, p := range []string{fresh, stale} {
		if err := os.WriteFile(p, []byte(`{"containerID":"half`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(stale, time.Now().Add(-2*time.Minute), time.Now().Add(-2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	ds, errs := ReadPendingDeletes(dir)
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temporary file was removed: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a stale temporary file was kept: %v", err)
	}
	if err := os.Remove(fresh); err != nil {
		t.Fatal(err)
	}
	var m *MalformedPendingDelete
	if len(errs) != 1 || !errors.As(errs[0], &m) {
		t.Fatalf("errors %v, want the malformed file reported", errs)
	}
	if len(ds) != 2 || ds[0].ContainerID != "a" || ds[1].ContainerID != "b" || ds[1].PodName() != "p-b" || ds[0].Reason != "agent down" {
		t.Fatalf("pending deletes %+v, want a then b (oldest first), one each", ds)
	}
	if err := RemoveMalformedPendingDelete(m); err != nil {
		t.Fatal(err)
	}
	// A DEL written again after the agent read it is not removed with the one it served.
	served := ds[1]
	if err := WritePendingDelete(dir, req("b"), errors.New("agent down again")); err != nil {
		t.Fatal(err)
	}
	if err := RemovePendingDelete(dir, served); err != nil {
		t.Fatal(err)
	}
	if d, found, err := ReadPendingDelete(dir, "b", "eth0"); err != nil || !found || d.Reason != "agent down again" {
		t.Fatalf("the newer DEL of b: %+v %v %v", d, found, err)
	}
	for _, d := range []string{"a", "b"} {
		cur, _, _ := ReadPendingDelete(dir, d, "eth0")
		if err := RemovePendingDelete(dir, cur); err != nil {
			t.Fatal(err)
		}
	}
	if ds, errs := ReadPendingDeletes(dir); len(ds)+len(errs) != 0 {
		t.Fatalf("left after removing all: %v %v", ds, errs)
	}
}
