package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginMain is the plugin binary's main: spec 0.4.0 to 1.1.0, verbs ADD, DEL, CHECK, VERSION, STATUS, GC.
func PluginMain() {
	p := &Plugin{Timeout: 2 * time.Minute}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: p.cmd(CmdAdd), Del: p.cmd(CmdDel), Check: p.cmd(CmdCheck),
		Status: p.cmd(CmdStatus), GC: p.cmd(CmdGC)},
		version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "ofsdn: Open vSwitch pod networking (forwards to the ofsdn agent)")
}

// Plugin forwards CNI calls to the agent.
type Plugin struct {
	Timeout time.Duration
	// Stdout receives the result of ADD (os.Stdout when nil).
	Stdout io.Writer
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
	if conf.Type != "" && conf.Type != "ofsdn" {
		return Errorf(ErrInvalidConfig, "ofsdn: network configuration has type %q, want \"ofsdn\"", conf.Type)
	}
	cniArgs, err := ParseArgs(args.Args)
	if err != nil {
		return Errorf(ErrInvalidEnv, "ofsdn: %v", err)
	}
	req := &Request{Command: c, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName,
		Args: cniArgs, Config: args.StdinData}
	if c == CmdAdd || c == CmdCheck {
		if req.PodNamespace() == "" || req.PodName() == "" {
			return Errorf(ErrInvalidEnv, "ofsdn: CNI_ARGS lacks K8S_POD_NAMESPACE/K8S_POD_NAME (is this call from a Kubernetes runtime?)")
		}
	}
	socket := conf.AgentSocket
	if socket == "" {
		socket = DefaultSocket
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	resp, err := Call(ctx, socket, req)
	if err != nil {
		if c == CmdDel && errors.Is(err, errAgentUnreachable) {
			// DEL must succeed when there is nothing left to clean: the agent cleans stale ports and
			// IPs itself when it starts (GC against the runtime's valid attachments).
			return nil
		}
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

var errAgentUnreachable = errors.New("ofsdn agent unreachable")

// Call sends a request to the agent's CNI server and reads its answer (see Server for the protocol).
func Call(ctx context.Context, socket string, req *Request) (*Response, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errAgentUnreachable, Errorf(ErrTryAgainLater,
			"ofsdn: cannot reach the ofsdn agent at %s (is the ofsdn-agent pod running on this node?): %v", socket, err))
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return nil, callError(ctx, req, "sending the request", err)
	}
	resp := &Response{}
	if err := json.NewDecoder(io.LimitReader(conn, maxMessage)).Decode(resp); err != nil {
		return nil, callError(ctx, req, "reading the agent's answer", err)
	}
	return resp, nil
}

// callError says whether the agent was too slow or the exchange broke.
func callError(ctx context.Context, req *Request, what string, err error) error {
	var ne net.Error
	if ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
		return Errorf(ErrTryAgainLater, "ofsdn: the agent did not answer %s within the timeout: %v", req.Command, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return Errorf(ErrTryAgainLater, "ofsdn: the agent closed the connection while %s (did it restart?): %v", what, err)
	}
	return Errorf(ErrIO, "ofsdn: %s: %v", what, err)
}

// asCNIError turns any error into a *types.Error for the plugin's caller.
func asCNIError(err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return Errorf(ErrInternal, "%v", err)
}
