// Package unixctl is a client of Open vSwitch's control protocol: the JSON-RPC that ovs-appctl speaks to a
// daemon's control socket, <rundir>/<daemon>.<pid>.ctl. It runs the commands ovs-vswitchd serves there
// (tnl/neigh/show, tnl/neigh/set, ofproto/trace, dpif/show, ...) without exec'ing ovs-appctl.
//
// The protocol (OVS lib/unixctl.c over lib/jsonrpc.c): the client sends
//
//	{"method": "tnl/neigh/show", "params": ["arg", ...], "id": N}
//
// with every parameter a string, and the daemon answers {"id": N, "result": TEXT, "error": null} or
// {"id": N, "result": null, "error": TEXT}. JSON texts follow each other on the stream with no framing.
// A connection may carry several requests in turn; this client dials one per call, which costs a few
// microseconds and always reaches the daemon that runs now (a restarted daemon has a new PID and so a
// new socket).
package unixctl

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
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// maxResponse bounds what a reply may hold (an ofproto/trace of a big pipeline is some kilobytes).
const maxResponse = 16 << 20

// Client calls commands on one daemon. It is safe for concurrent use.
type Client struct {
	rundir, daemon string // the socket is found through <rundir>/<daemon>.pid at each call
	socket         string // or given outright
	// Timeout bounds each call when the context has no deadline; 0 means DefaultTimeout.
	Timeout time.Duration
}

// New returns a client of the daemon (e.g. "ovs-vswitchd") whose pidfile and control socket are in
// rundir, as ovs-appctl -t DAEMON finds them.
func New(rundir, daemon string) *Client { return &Client{rundir: rundir, daemon: daemon} }

// NewSocket returns a client of the control socket at path, as ovs-appctl -t /PATH.
func NewSocket(path string) *Client { return &Client{socket: path} }

// Error is a command the daemon received and refused (ovs-appctl prints it and exits with status 2): an
// unknown command, wrong arguments, or the command's own complaint.
type Error struct {
	Method  string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("unixctl: %s: %s", e.Method, strings.TrimSpace(e.Message))
}

// SocketPath is the control socket a call would dial now.
func (c *Client) SocketPath() (string, error) {
	if c.socket != "" {
		return c.socket, nil
	}
	if c.daemon == "" || strings.ContainsAny(c.daemon, "/\x00") {
		return "", fmt.Errorf("unixctl: daemon name %q: want a plain program name such as ovs-vswitchd", c.daemon)
	}
	pidfile := filepath.Join(c.rundir, c.daemon+".pid")
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return "", fmt.Errorf("unixctl: is %s running? %w", c.daemon, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "", fmt.Errorf("unixctl: pidfile %s holds %q, not a PID", pidfile, strings.TrimSpace(string(b)))
	}
	return filepath.Join(c.rundir, fmt.Sprintf("%s.%d.ctl", c.daemon, pid)), nil
}

type request struct {
	Method string   `json:"method"`
	Params []string `json:"params"`
	ID     uint64   `json:"id"`
}

type response struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	Method string          `json:"method"` // set on a request or notification from the daemon: not ours
}

var lastID atomic.Uint64

// Call runs method with args on the daemon and returns the text it answered (for OVS's text replies,
// the command's output with its trailing newline). A command the daemon refused is an *Error; anything
// else (no daemon, a broken or closed connection, ctx ending first) is another error.
func (c *Client) Call(ctx context.Context, method string, args ...string) (string, error) {
	if method == "" {
		return "", errors.New("unixctl: empty command")
	}
	path, err := c.SocketPath()
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The connection's deadline is only ever the context's, so the context ends too (its timer
			// may fire a moment after the socket's): report the context's reason.
			<-ctx.Done()
		}
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return "", fmt.Errorf("unixctl: %s on %s: %w", method, path, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := c.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	// A cancelled context interrupts a daemon that does not answer.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()

	if args == nil {
		args = []string{} // "params" must be an array, never null
	}
	id := lastID.Add(1)
	if err := json.NewEncoder(conn).Encode(request{Method: method, Params: args, ID: id}); err != nil {
		return fail(err)
	}
	wantID := strconv.FormatUint(id, 10)
	dec := json.NewDecoder(io.LimitReader(conn, maxResponse))
	for {
		var resp response
		if err := dec.Decode(&resp); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the daemon closed the connection without answering")
			}
			return fail(err)
		}
		if resp.Method != "" || string(bytes.TrimSpace(resp.ID)) != wantID {
			continue // not the answer to this request
		}
		if !isNull(resp.Error) {
			return "", &Error{Method: method, Message: text(resp.Error)}
		}
		return text(resp.Result), nil
	}
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// text is a JSON string's value, or the JSON itself for anything else (a daemon told to answer in JSON).
func text(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	return string(bytes.TrimSpace(raw))
}
