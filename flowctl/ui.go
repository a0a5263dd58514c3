package flowctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/ofsdn/ofsdn/debugapi"
	"k8s.io/client-go/dynamic"
)

const uiUsage = `usage: flowctl ui [--address 127.0.0.1:9180] [--kubeconfig FILE]

Serves the web console on this machine: the cluster's Networks, tenants (NETIDs, joins, globals and the
requests under way), nodes with their subnets and agents, policies and what they select, a trace form
that shows flowctl trace's answer table by table, and the drops view. Open the address it prints in a
browser; Ctrl-C stops it.

Like kubectl proxy, it talks to the cluster with your kubeconfig and shows what your permissions allow:
objects from the API server, node views and traces from each agent's debug API through the API
server's node proxy (get on nodes/proxy). It only reads. On a loopback address (the default) it
answers only requests addressed to loopback; on any other address, anyone who reaches it reads your
cluster with your credentials.
`

// RunUI is `flowctl ui`.
func RunUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCmdLine("ui", uiUsage, stdout, stderr)
	fs := c.fs
	var nf nodeFlags
	nf.register(fs, false)
	address := fs.String("address", "127.0.0.1:9180", "`host:port` to serve on (port 0: any free port)")
	limits := defaultUILimits
	fs.DurationVar(&limits.api, "api-timeout", limits.api, "how long a page waits for the API server")
	fs.DurationVar(&limits.agent, "agent-timeout", limits.agent, "how long a page waits for one node's agent (an agent that does not answer in time shows as such)")
	fs.DurationVar(&limits.trace, "trace-timeout", limits.trace, "how long a trace may take over every node it crosses")
	positional, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return c.usageErrorf("ui takes no arguments, got %q", positional)
	}
	if limits.api <= 0 || limits.agent <= 0 || limits.trace <= 0 {
		return c.usageErrorf("timeouts must be positive")
	}
	src, err := liveUISources(nf, stderr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *address)
	if err != nil {
		return fmt.Errorf("serve the console: %w", err)
	}
	hosts := loopbackHosts(ln.Addr())
	s, err := newUIServer(src, limits, hosts, func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) })
	if err != nil {
		_ = ln.Close()
		return err
	}
	fmt.Fprintf(stdout, "flowctl ui: serving the console of %s at http://%s/ (Ctrl-C stops it)\n", src.server, ln.Addr())
	if hosts == nil {
		fmt.Fprintf(stderr, "flowctl ui: %s is not a loopback address: whoever reaches it reads the cluster with your credentials\n", ln.Addr())
	}
	return serveUI(ctx, ln, s.Handler())
}

// serveUI serves until ctx ends, then gives open pages a moment to finish.
func serveUI(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// liveUISources reads the cluster of the user's kubeconfig, and its agents through the node proxy.
func liveUISources(nf nodeFlags, stderr io.Writer) (uiSources, error) {
	cfg, err := restConfig(nf.kubeconfig)
	if err != nil {
		return uiSources{}, err
	}
	kube, netc, err := clientsOf(cfg)
	if err != nil {
		return uiSources{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return uiSources{}, err
	}
	// One token source for the agents' pages and the drops (asked side by side).
	if err := nf.initTokens(cfg); err != nil {
		return uiSources{}, err
	}
	// drops.go; its per-node clients serve the pages too. A failed list of its pod names (podnames.go)
	// is logged when it fails otherwise than the last time, not every few seconds.
	var lastWarn string
	drops := clusterDropClient(cfg, kube, netc, &nf, func(err error) {
		if err.Error() != lastWarn { // lists run one at a time
			lastWarn = err.Error()
			fmt.Fprintf(stderr, "flowctl ui: drops: other nodes' pods are shown as addresses: %v\n", err)
		}
	})
	return uiSources{
		kube: kube, net: netc, dyn: dyn, disco: kube.Discovery(), server: cfg.Host,
		agent: func(node string) (debugapi.Backend, error) {
			c, err := drops.client(node)
			if err != nil {
				return nil, err // not a nil *Client in a non-nil Backend
			}
			return c, nil
		},
		world: func() (world, error) { return liveWorldOf(cfg, kube, nf), nil },
		drops: agentDrops{drops},
	}, nil
}
