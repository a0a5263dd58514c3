package nodesim

// The kubelet API's exec, as far as the lab's suites need it: the upstream ClusterNetworkPolicy
// conformance suite probes by `pods/exec` of `/agnhost connect --timeout=T --protocol=P HOST:PORT` in
// its pods. The API server proxies an exec to the node's kubelet port (status.daemonEndpoints) over
// TLS; this server answers it with kubelet's own streaming code (k8s.io/kubelet's remotecommand, SPDY
// and WebSocket) and runs that one command the way agnhost does — `ofsdn-testpod connect` in the pod's
// network namespace (e2e/testpod/connect.go): nothing and exit 0 when the connection is made, TIMEOUT
// when nothing answers (a policy's drop), REFUSED on a reset. Any other command is refused with exit
// code 126 and says so: the stand-in runs no container images.
//
// The server listens on the node's address inside the node's network namespace, where a kubelet would.
// Its certificate is self-signed: the lab's API server sets no --kubelet-certificate-authority, so it
// does not verify kubelets' serving certificates (a real cluster would). It asks no client certificate.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	streaming "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// KubeletPort is where the simulated kubelet API listens (kubelet's default).
const KubeletPort = 10250

// serveExec starts the kubelet API server on the node's address in its namespace.
func (s *Sim) serveExec(ctx context.Context) error {
	ln, err := listenIn(s.cfg.NodeNetNS, netip.AddrPortFrom(s.cfg.NodeIP, KubeletPort))
	if err != nil {
		return fmt.Errorf("nodesim %s: kubelet API: %w", s.cfg.NodeName, err)
	}
	cert, err := selfSigned(s.cfg.NodeName, s.cfg.NodeIP)
	if err != nil {
		ln.Close()
		return fmt.Errorf("nodesim %s: kubelet API: %w", s.cfg.NodeName, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(s.handleExec), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error(err, "kubelet API server stopped")
		}
	}()
	return nil
}

// listenIn opens a TCP listener inside a network namespace (a path; "" is the caller's own): the
// socket stays in it after the thread that made it returns.
func listenIn(nsPath string, at netip.AddrPort) (net.Listener, error) {
	if nsPath == "" {
		return net.Listen("tcp", at.String())
	}
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked when the switch back fails: the thread then dies with it
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{err: err}
			return
		}
		ln, err := net.Listen("tcp", at.String())
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{ln, err}
	}()
	r := <-ch
	return r.ln, r.err
}

func selfSigned(node string, ip netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: node},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{ip.AsSlice()}, DNSNames: []string{node}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// handleExec serves /exec/{namespace}/{pod}/{container} (and the /{uid}/ form kubelet also has).
func (s *Sim) handleExec(w http.ResponseWriter, req *http.Request) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	if len(parts) < 4 || len(parts) > 5 || parts[0] != "exec" {
		http.Error(w, "the lab's kubelet stand-in serves only exec", http.StatusNotFound)
		return
	}
	namespace, pod, container := parts[1], parts[2], parts[len(parts)-1]
	opts, err := streaming.NewOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := req.URL.Query()["command"]
	streaming.ServeExec(w, req, simExecutor{s}, namespace+"/"+pod, "", container, cmd, opts,
		4*time.Hour, 30*time.Second, remotecommandconsts.SupportedStreamingProtocols)
}

type simExecutor struct{ s *Sim }

// ExecInContainer runs `/agnhost connect ...` as ofsdn-testpod connect in the pod's namespace.
func (e simExecutor) ExecInContainer(ctx context.Context, name string, _ types.UID, _ string, cmd []string, _ io.Reader,
	stdout, stderr io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	e.s.mu.Lock()
	sp := e.s.pods[name]
	e.s.mu.Unlock()
	if sp == nil || sp.netns == "" {
		return fmt.Errorf("pod %s runs on no network namespace of node %s", name, e.s.cfg.NodeName)
	}
	if len(cmd) < 2 || cmd[0] != "/agnhost" || cmd[1] != "connect" {
		fmt.Fprintf(stderr, "the lab's kubelet stand-in runs no images: of exec it serves only /agnhost connect, not %q\n", cmd)
		return utilexec.CodeExitError{Err: errors.New("command not served"), Code: 126}
	}
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", sp.netns, e.s.cfg.PodBinary, "connect"}, cmd[2:]...)...)
	c.Stdout, c.Stderr = stdout, stderr
	err := c.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return utilexec.CodeExitError{Err: err, Code: exit.ExitCode()}
	}
	return err
}
