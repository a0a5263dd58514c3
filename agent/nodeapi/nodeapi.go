// Package nodeapi serves the agent's node API: the metrics and health server and the read-only debug
// API flowctl asks (debugapi/), served on a root-only unix socket and, for flowctl through the API
// server's node proxy, on a TCP port of the node. Both TCP servers speak TLS and go through one
// nodeauth.Guard: whatever they serve, now or later (a drop stream), answers only callers the API
// server authenticates and authorizes; only the probes' paths are open (agent/nodeauth says what each
// path needs, and why a token in a header of its own rather than the API server's identity). The unix
// socket's file mode (root only) is its authorization.
//
// It knows the agent through Agent (its view, its flow loop's last synced state, the bridge once open),
// PortDB (OVSDB's ports) and the drop stream (agent/drops).
package nodeapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodeauth"
	"github.com/ofsdn/ofsdn/debugapi"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Rate of the node API's reviews (the Reviews client): a client of their own, so a flood of bad tokens
// slows only other callers of the node API, never the agent's own requests.
const (
	ReviewQPS   = 20
	ReviewBurst = 40
)

// Config says where the node API listens.
type Config struct {
	NodeName  string
	Bridge    string
	OVSRunDir string // ovs-vswitchd's control socket, for ofproto/trace
	StateDir  string // <StateDir>/pki holds the self-signed certificate
	// MetricsAddress serves Metrics over TLS, DebugAddress the debug API over TLS ("" = not served);
	// DebugSocket the debug API on a root-only unix socket ("" or "-" = not served).
	MetricsAddress, DebugAddress, DebugSocket string
	// TLSCertFile and TLSKeyFile are a serving certificate of the operator's (PEM); without them a
	// self-signed one in <StateDir>/pki (nodeauth.SelfSignedCert).
	TLSCertFile, TLSKeyFile string
	Logger                  klog.Logger
}

// Deps are what the node API serves and asks.
type Deps struct {
	// Metrics serves /metrics, /healthz, /readyz (and pprof) on the metrics address.
	Metrics http.Handler
	Agent   Agent
	// Ports lists the bridge's ports (OVSDB); nil: none listed.
	Ports PortDB
	// Drops streams the drop samples' records (debugapi.PathDrops); nil: no stream.
	Drops debugapi.DropStreamer
	// Reviews makes the TokenReviews and SubjectAccessReviews that guard the TCP servers.
	Reviews kubernetes.Interface
}

// Listening are the addresses the TCP servers were bound to ("" when not served).
type Listening struct {
	Metrics, Debug string
}

// Serve binds the metrics and debug listeners and serves them until ctx ends. The agent calls it
// first at start-up: liveness answers while the rest starts, and a port taken is a clear error.
func Serve(ctx context.Context, cfg Config, deps Deps) (Listening, error) {
	var out Listening
	log := cfg.Logger
	logErr := func(what string) func(error) {
		return func(err error) { log.Error(err, "serving "+what) }
	}
	var tlsConfig *tls.Config
	var guard *nodeauth.Guard
	if cfg.MetricsAddress != "" || cfg.DebugAddress != "" {
		cert, err := servingCert(cfg)
		if err != nil {
			return out, err
		}
		tlsConfig = cert.TLSConfig()
		guard = nodeauth.NewGuard(cfg.NodeName, deps.Reviews, log.WithName("node-api"))
	}
	if cfg.MetricsAddress != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return out, fmt.Errorf("metrics and health: %w", err)
		}
		out.Metrics = ln.Addr().String()
		serveHTTP(ctx, ln, tlsConfig, guard.Wrap(deps.Metrics), logErr("metrics"))
		log.Info("serving /metrics, /healthz and /readyz over TLS", "address", out.Metrics)
	}
	var b debugapi.Backend = backend{cfg: cfg, deps: deps}
	if deps.Drops != nil {
		b = streamingBackend{backend{cfg: cfg, deps: deps}}
	}
	api := debugapi.Handler(b, log.WithName("debug-api"))
	if cfg.DebugSocket != "" && cfg.DebugSocket != "-" {
		ln, err := listenUnix(cfg.DebugSocket)
		if err != nil {
			return out, fmt.Errorf("debug API: %w", err)
		}
		serveHTTP(ctx, ln, nil, api, logErr("the debug API"))
		context.AfterFunc(ctx, func() { _ = os.Remove(cfg.DebugSocket) })
	}
	if cfg.DebugAddress != "" {
		ln, err := net.Listen("tcp", cfg.DebugAddress)
		if err != nil {
			return out, fmt.Errorf("debug API: %w", err)
		}
		out.Debug = ln.Addr().String()
		serveHTTP(ctx, ln, tlsConfig, guard.Wrap(api), logErr("the debug API"))
		log.Info("serving the read-only debug API over TLS", "address", out.Debug, "socket", cfg.DebugSocket)
	}
	return out, nil
}

// servingCert is the operator's certificate, else the agent's own for the node's name and the
// addresses it serves on.
func servingCert(cfg Config) (*nodeauth.ServingCert, error) {
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		return nodeauth.CertFiles(cfg.TLSCertFile, cfg.TLSKeyFile)
	}
	var ips []net.IP
	for _, addr := range []string{cfg.DebugAddress, cfg.MetricsAddress} {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		}
	}
	cert, err := nodeauth.SelfSignedCert(filepath.Join(cfg.StateDir, "pki"), cfg.NodeName, ips)
	if err != nil {
		return nil, fmt.Errorf("node API: %w", err)
	}
	return cert, nil
}

// listenUnix listens on a socket only root may open, replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// serverErrors takes net/http's own error lines (a handler's panic, say) to log, except failed TLS
// handshakes: those are a caller's doing (a scanner, plain HTTP to the TLS port), nothing of the agent's.
type serverErrors func(error)

func (s serverErrors) Write(p []byte) (int, error) {
	if msg := strings.TrimSpace(string(p)); !strings.Contains(msg, "TLS handshake error") {
		s(errors.New(msg))
	}
	return len(p), nil
}

// serveHTTP serves handler on an already bound listener until ctx ends, over TLS with tlsConfig (nil:
// plain HTTP, for the unix socket).
func serveHTTP(ctx context.Context, ln net.Listener, tlsConfig *tls.Config, handler http.Handler, log func(error)) {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, TLSConfig: tlsConfig,
		ErrorLog: stdlog.New(serverErrors(log), "", 0)}
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	go func() {
		var err error
		if tlsConfig != nil {
			err = srv.ServeTLS(ln, "", "") // the certificate comes from tlsConfig
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log(err)
		}
	}()
}
