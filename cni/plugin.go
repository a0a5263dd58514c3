package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginMain is the plugin binary's main: spec 0.4.0 to 1.1.0, verbs ADD, DEL, CHECK, VERSION, STATUS, GC.
func PluginMain() {
	p := &Plugin{}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: p.cmd(CmdAdd), Del: p.cmd(CmdDel), Check: p.cmd(CmdCheck),
		Status: p.cmd(CmdStatus), GC: p.cmd(CmdGC)},
		version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "ofsdn: Open vSwitch pod networking (forwards to the ofsdn agent)")
}

// Timeouts bound a call to the agent.
type Timeouts struct {
	// Connect bounds dialing the socket: it blocks only when the agent stopped accepting (its listen
	// backlog is full), so it is short.
	Connect time.Duration
	// Accept bounds the wait for the agent's confirmation that it read the request. Any live agent
	// confirms at once, however busy (a goroutine per connection reads it), so a frozen one is found
	// here, seconds into the call, instead of at the verb's budget.
	Accept time.Duration
	// Verb bounds a whole call by verb: an ADD on a busy node may queue behind a big flow sync; STATUS
	// is a question whose answer is only useful fast.
	Verb map[Command]time.Duration
}

// DefaultTimeouts: ADD ends within 90 s, inside kubelet's 2-minute runtime request timeout (the runtime
// runs CNI under it), so the runtime reads ofsdn's error instead of killing the plugin; STATUS within 5 s.
var DefaultTimeouts = Timeouts{
	Connect: 2 * time.Second,
	Accept:  5 * time.Second,
	Verb:    map[Command]time.Duration{CmdAdd: 90 * time.Second, CmdDel: 60 * time.Second, CmdCheck: 30 * time.Second, CmdGC: 60 * time.Second, CmdStatus: 5 * time.Second},
}

func (t Timeouts) verb(c Command) time.Duration {
	if d, ok := t.Verb[c]; ok && d > 0 {
		return d
	}
	if d, ok := DefaultTimeouts.Verb[c]; ok {
		return d
	}
	return 30 * time.Second
}

func (t Timeouts) orDefault() Timeouts {
	if t.Connect <= 0 {
		t.Connect = DefaultTimeouts.Connect
	}
	if t.Accept <= 0 {
		t.Accept = DefaultTimeouts.Accept
	}
	return t
}

// Plugin forwards CNI calls to the agent.
type Plugin struct {
	Timeouts Timeouts // zero values: DefaultTimeouts
	// Stdout receives the result of ADD (os.Stdout when nil); Stderr notes a DEL left for the agent
	// (os.Stderr when nil; the spec leaves stderr to logs).
	Stdout, Stderr io.Writer
}

func (p *Plugin) cmd(c Command) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error { return p.Run(c, args) }
}

// Run sends one CNI call to the agent and, for ADD, prints the result in the caller's CNI version.
func (p *Plugin) Run(c Command, args *skel.CmdArgs) error {
	conf := &NetConf{}
	if err := json.Unmarshal(args.StdinData, conf); err != nil {
		return Errorf(ErrDecoding, "ofsdn: malformed network configuration: %v", err)
	}
	if err := conf.Validate(); err != nil {
		return err
	}
	cniArgs, err := ParseArgs(args.Args)
	if err != nil {
		return Errorf(ErrInvalidEnv, "ofsdn: %v", err)
	}
	req := &Request{Command: c, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName,
		Args: cniArgs, Config: args.StdinData, Ack: true}
	if c == CmdAdd || c == CmdCheck {
		if req.PodNamespace() == "" || req.PodName() == "" {
			return Errorf(ErrInvalidEnv, "ofsdn: CNI_ARGS lacks K8S_POD_NAMESPACE/K8S_POD_NAME (is this call from a Kubernetes runtime?)")
		}
	}
	t := p.Timeouts.orDefault()
	ctx, cancel := context.WithTimeout(context.Background(), t.verb(c))
	defer cancel()
	resp, err := call(ctx, t, conf.socket(), req)
	var unavailable *AgentUnavailableError
	if errors.As(err, &unavailable) {
		return p.agentUnavailable(c, conf, req, unavailable)
	}
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	if c != CmdAdd {
		return nil
	}
	res, err := current.NewResult(resp.Result)
	if err != nil {
		return Errorf(ErrDecoding, "ofsdn: agent returned a malformed result: %v", err)
	}
	out := p.Stdout
	if out == nil {
		out = os.Stdout
	}
	versioned, err := res.GetAsVersion(conf.CNIVersion)
	if err != nil {
		return Errorf(ErrIncompatibleVersion, "ofsdn: %v", err)
	}
	return versioned.PrintTo(out)
}

// agentUnavailable answers a call the agent did not answer: STATUS says the plugin is not available
// (50), a DEL is left for the agent (WritePendingDelete), anything else is to be tried again later (11).
func (p *Plugin) agentUnavailable(c Command, conf *NetConf, req *Request, cause *AgentUnavailableError) error {
	switch c {
	case CmdStatus:
		return Errorf(ErrPluginNotAvailable, "ofsdn: %v", cause)
	case CmdDel:
		dir := conf.pendingDeletesDir()
		if err := WritePendingDelete(dir, req, cause); err != nil {
			return Errorf(ErrTryAgainLater, "ofsdn: %v; and the DEL could not be left for the agent in %s: %v", cause, dir, err)
		}
		errOut := p.Stderr
		if errOut == nil {
			errOut = os.Stderr
		}
		fmt.Fprintf(errOut, "ofsdn: %v; DEL of %s/%s left in %s for the agent to finish\n", cause, req.ContainerID, req.IfName, dir)
		return nil
	default:
		return Errorf(ErrTryAgainLater, "ofsdn: %v", cause)
	}
}

// AgentUnavailableError says the agent did not answer a call: nothing listens on its socket, it did not
// confirm the request in time (frozen), died while serving it, or did not answer within the verb's
// budget. The agent may or may not have done the work.
type AgentUnavailableError struct {
	Socket  string
	Stage   string // "connecting", "waiting for the agent to accept", "waiting for the answer"
	Timeout bool
	Err     error
}

func (e *AgentUnavailableError) Error() string {
	switch {
	case e.Stage == stageConnect && !e.Timeout:
		return fmt.Sprintf("cannot reach the ofsdn agent at %s (is the ofsdn-agent pod running on this node?): %v", e.Socket, e.Err)
	case e.Timeout:
		return fmt.Sprintf("the ofsdn agent at %s did not respond in time while %s (is it frozen or overloaded?): %v", e.Socket, e.Stage, e.Err)
	default:
		return fmt.Sprintf("the ofsdn agent at %s went away while %s (did it restart?): %v", e.Socket, e.Stage, e.Err)
	}
}

func (e *AgentUnavailableError) Unwrap() error { return e.Err }

const (
	stageConnect = "connecting"
	stageAccept  = "waiting for the agent to accept the request"
	stageAnswer  = "waiting for the answer"
)

// Call sends a request to the agent's CNI server and reads its answer (see Server for the protocol),
// with DefaultTimeouts' connect and accept bounds; ctx bounds the whole call. A failure to get an
// answer is an *AgentUnavailableError.
func Call(ctx context.Context, socket string, req *Request) (*Response, error) {
	return call(ctx, DefaultTimeouts, socket, req)
}

func call(ctx context.Context, t Timeouts, socket string, req *Request) (*Response, error) {
	unavailable := func(stage string, err error) error {
		var ne net.Error
		timeout := ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout()
		return &AgentUnavailableError{Socket: socket, Stage: stage, Timeout: timeout, Err: err}
	}
	dialCtx, cancel := context.WithTimeout(ctx, t.Connect)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dialCtx, "unix", socket)
	if err != nil {
		return nil, unavailable(stageConnect, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	_ = conn.SetDeadline(earliest(deadline, time.Now().Add(t.Accept)))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return nil, unavailable(stageAccept, err)
	}
	dec := json.NewDecoder(io.LimitReader(conn, maxMessage))
	decode := func(stage string, resp *Response) error {
		err := dec.Decode(resp)
		var se *json.SyntaxError
		var ue *json.UnmarshalTypeError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &se) || errors.As(err, &ue):
			return Errorf(ErrDecoding, "ofsdn: the agent's answer does not decode: %v", err)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
			return unavailable(stage, fmt.Errorf("connection closed: %w", err))
		default:
			return unavailable(stage, err)
		}
	}
	resp := &Response{}
	stage := stageAnswer
	if req.Ack {
		stage = stageAccept
	}
	if err := decode(stage, resp); err != nil {
		return nil, err
	}
	if req.Ack && resp.Accepted { // else: the agent answered at once (an error)
		_ = conn.SetDeadline(deadline)
		*resp = Response{}
		if err := decode(stageAnswer, resp); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// asCNIError turns any error into a *types.Error for the plugin's caller.
func asCNIError(err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return Errorf(ErrInternal, "%v", err)
}
