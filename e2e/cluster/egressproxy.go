package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/lab"
)

// The API server runs in the machine's namespace, which has no route to pods or services (network
// safety: LAB.md), while a real control plane sits on a node of the pod network. With real kubelets the
// lab gives kube-apiserver what managed clusters give a control plane outside the node network: an
// egress selector (EgressSelectorConfiguration, "cluster") whose HTTP CONNECT proxy dials from inside
// the first node's network namespace. Pod and service proxying (kubectl proxy, the e2e suite's DNS and
// Proxy tests) and kubelet's exec, logs and port-forward go through it; nothing else changes, and the
// machine's namespace still gets no route into the cluster.

// egressProxy serves HTTP CONNECT on a unix socket and dials each target from inside a lab namespace,
// only to addresses in allowed.
type egressProxy struct {
	log     *slog.Logger
	ln      net.Listener
	netns   string
	allowed []netip.Prefix
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]bool
	closed  bool
}

// startEgressProxy listens on sock and serves until Close.
func startEgressProxy(sock, netns string, allowed []netip.Prefix, log *slog.Logger) (*egressProxy, error) {
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("cluster: egress proxy: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &egressProxy{log: log, ln: ln, netns: netns, allowed: allowed, conns: map[net.Conn]bool{}}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *egressProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c, true) {
			c.Close()
			return
		}
		p.wg.Go(func() {
			defer p.track(c, false)
			defer c.Close()
			p.handle(c)
		})
	}
}

// track adds or removes a connection (a client's or an upstream's); it refuses new ones once the proxy
// closed.
func (p *egressProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.closed {
		return false
	}
	p.conns[c] = true
	return true
}

// handle answers one CONNECT and splices the two connections.
func (p *egressProxy) handle(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	target, err := p.check(req.Host)
	if err != nil {
		p.log.Warn("egress proxy: refused", "target", req.Host, "err", err)
		fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	var up net.Conn
	err = lab.InNetNS(p.netns, func() error {
		var err error
		up, err = net.DialTimeout("tcp", target.String(), 10*time.Second)
		return err
	})
	if err != nil {
		p.log.Debug("egress proxy: dial failed", "target", target, "err", err)
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	defer up.Close()
	// Close ends the tunnel from both sides: closing the client's end alone leaves the copy from an
	// upstream that never speaks again (an idle exec or watch stream) blocked for good.
	if !p.track(up, true) {
		return
	}
	defer p.track(up, false)
	if _, err := fmt.Fprintf(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

// check accepts only IP:port targets inside the lab's own ranges.
func (p *egressProxy) check(hostport string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("target %q: want an IP address and port: %w", hostport, err)
	}
	for _, a := range p.allowed {
		if a.Contains(ap.Addr()) {
			return ap, nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("target %s is outside the lab's networks %v", ap, p.allowed)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = c.Close()
	}
}

// Close stops listening, ends open tunnels and waits for the handlers.
func (p *egressProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// egressSelectorConfig is the API server's --egress-selector-config-file for a proxy at sock.
func egressSelectorConfig(sock string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: %s
`, sock)
}

// setupEgress writes the egress selector configuration and starts the proxy in the first node's
// namespace; it returns the API server flags.
func (c *Cluster) setupEgress() ([]string, error) {
	allowed := []netip.Prefix{c.Lab.Underlay}
	for _, s := range []string{c.opts.ClusterCIDR, c.opts.ServiceCIDR} {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("cluster: %q: %w", s, err)
		}
		allowed = append(allowed, p.Masked())
	}
	if len(c.Lab.Nodes) == 0 {
		return nil, errors.New("cluster: no node to reach the cluster from")
	}
	sock := filepath.Join(c.Dir, "egress.sock")
	p, err := startEgressProxy(sock, c.Lab.Nodes[0].NetNS, allowed, c.log)
	if err != nil {
		return nil, err
	}
	c.egress = p
	cfg := filepath.Join(c.Dir, "egress-selector.yaml")
	if err := os.WriteFile(cfg, []byte(egressSelectorConfig(sock)), 0o644); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return []string{"--egress-selector-config-file=" + cfg}, nil
}
