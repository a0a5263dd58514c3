// Package kubelab runs a real Kubernetes control plane for tests: etcd and kube-apiserver (optionally
// kube-controller-manager and kube-scheduler) built by hack/build-k8s.sh, on free ports, with every file
// in a temp dir and teardown in t.Cleanup even when the test fails.
//
// The apiserver authorizes with Node,RBAC, so tests see exactly the permissions deploy/ grants:
// ServiceAccountConfig authenticates as a pod with that ServiceAccount would (a TokenRequest token), and
// UserConfig mints any user and groups (a client certificate signed by the cluster's CA). TLS is
// verified everywhere against that CA.
//
// Start skips under `go test -short` (the unit tier) and fails when the binaries are missing, unless
// OFSDN_SKIP_K8S=1 asks for a skip. OFSDN_KEEP_TEST_DIRS=1 keeps the temp dir (logs, kubeconfigs).
package kubelab

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// Options choose what runs besides etcd and kube-apiserver.
type Options struct {
	// BindAddress is the address kube-apiserver listens on and advertises; default 127.0.0.1. The
	// node-namespace lab passes the address of its lab veth so agents in node namespaces reach it.
	// etcd, the controller manager and the scheduler always listen on 127.0.0.1.
	BindAddress string
	// ControllerManager also runs kube-controller-manager: default ServiceAccounts (pods are refused
	// without one), EndpointSlices, namespace deletion, node lifecycle, garbage collection.
	ControllerManager bool
	// Scheduler also runs kube-scheduler.
	Scheduler bool
	// ServiceCIDR is --service-cluster-ip-range; default 10.96.0.0/16.
	ServiceCIDR string
	// ExtraAPIServerFlags come after kubelab's own flags; for a flag given twice the last value wins.
	ExtraAPIServerFlags []string
	// KubeletClient gives kube-apiserver a client certificate for kubelets (user
	// kube-apiserver-kubelet-client in system:masters, signed by the cluster's CA), so real kubelets that
	// authenticate with that CA and authorize through the API server serve it logs, exec and proxy.
	KubeletClient bool
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	opts       Options
	binDir     string
	dir        string
	server     string
	ca         *ca
	adminToken string
	tokens     map[string]string // component user -> static token
	kubeconfig string
	etcdURL    string

	mu    sync.Mutex
	procs []*daemon // in start order; stopped in reverse

	stopOnce sync.Once
	admin    kubernetes.Interface
}

// Component names, the keys of PIDs.
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

const (
	adminUser       = "kubelab-admin"
	saIssuer        = "https://kubernetes.default.svc.cluster.local"
	startTimeout    = 3 * time.Minute // a generous bound for a loaded shared machine, not a performance check
	stopGrace       = 10 * time.Second
	startAttempts   = 3
	defaultBind     = "127.0.0.1"
	defaultSvcCIDR  = "10.96.0.0/16"
	logTailLines    = 40
	clientQPS       = 1000
	clientBurst     = 2000
	tokenExpiration = 24 * time.Hour
)

var seq atomic.Int32

// Start runs etcd and kube-apiserver (and what opts ask for) and returns once /readyz answers ok and
// the optional daemons report healthy. Everything stops in t.Cleanup; on failure the daemons' log tails
// are printed through t.Log.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("kubelab: runs a real kube-apiserver; skipped with -short")
	}
	if _, err := BinDir(); err != nil && os.Getenv("OFSDN_SKIP_K8S") == "1" {
		t.Skip(err)
	}
	c, err := Launch(opts, t.Logf)
	if c != nil {
		t.Cleanup(func() { c.cleanup(t) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartDeploy is Start, then ApplyDeploy of the given manifests: the one bootstrap of every test that
// needs ofsdn's CRDs (and RBAC) on a real API server, e.g.
//
//	kubelab.StartDeploy(t, kubelab.Options{}, "namespace.yaml", "crds/", "controller/rbac.yaml")
func StartDeploy(t testing.TB, opts Options, manifests ...string) *Cluster {
	t.Helper()
	c := Start(t, opts)
	if err := c.ApplyDeploy(manifests...); err != nil {
		t.Fatal(err)
	}
	return c
}

// Launch is Start for programs that are not tests (make demo): the caller must call Stop. On error the
// returned Cluster, when not nil, still needs Stop.
func Launch(opts Options, logf func(format string, args ...any)) (*Cluster, error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	sweepOnce.Do(Sweep)
	if opts.BindAddress == "" {
		opts.BindAddress = defaultBind
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = defaultSvcCIDR
	}
	if net.ParseIP(opts.BindAddress) == nil {
		return nil, fmt.Errorf("kubelab: BindAddress %q is not an IP address", opts.BindAddress)
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-%d-", Prefix, os.Getpid(), seq.Add(1)))
	if err != nil {
		return nil, fmt.Errorf("kubelab: temp dir: %w", err)
	}
	c := &Cluster{opts: opts, binDir: binDir, dir: dir}

	began := time.Now()
	if err := c.prepare(); err != nil {
		return c, fmt.Errorf("kubelab: %w", err)
	}
	for attempt := 1; ; attempt++ {
		err = c.boot()
		if err == nil {
			break
		}
		if attempt >= startAttempts || !c.bindConflict() {
			return c, fmt.Errorf("kubelab: start: %w", err)
		}
		logf("kubelab: attempt %d lost a port race, retrying: %v", attempt, err)
		c.stopProcs()
	}
	logf("kubelab: %s ready in %s (dir %s)", c.server, time.Since(began).Round(time.Millisecond), dir)
	return c, nil
}

// prepare writes what every start attempt shares: PKI, service-account keys, the token file. Kubeconfigs
// are written per attempt because they name the port.
func (c *Cluster) prepare() error {
	var err error
	if c.ca, err = newCA(); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("ca.crt"), c.ca.certPEM, 0o644); err != nil {
		return fmt.Errorf("write CA: %w", err)
	}
	ips := []net.IP{net.ParseIP(c.opts.BindAddress), net.ParseIP("127.0.0.1")}
	if svcIP, err := firstIP(c.opts.ServiceCIDR); err == nil {
		ips = append(ips, svcIP)
	} else {
		return err
	}
	certPEM, keyPEM, err := c.ca.issue("kube-apiserver", nil, true, ips,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.path("apiserver.crt"), certPEM, 0o644); err != nil {
		return fmt.Errorf("write serving cert: %w", err)
	}
	if err := os.WriteFile(c.path("apiserver.key"), keyPEM, 0o600); err != nil {
		return fmt.Errorf("write serving key: %w", err)
	}
	if err := writeSAKeys(c.path("sa.key"), c.path("sa.pub")); err != nil {
		return err
	}
	if c.opts.KubeletClient {
		certPEM, keyPEM, err := c.ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil)
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.path("kubelet-client.crt"), certPEM, 0o644); err != nil {
			return fmt.Errorf("write kubelet client cert: %w", err)
		}
		if err := os.WriteFile(c.path("kubelet-client.key"), keyPEM, 0o600); err != nil {
			return fmt.Errorf("write kubelet client key: %w", err)
		}
	}
	c.adminToken = randomToken()
	// token,user,uid,"groups": the admin, and the identities bootstrap RBAC already binds for the
	// controller manager and the scheduler.
	tokens := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", c.adminToken, adminUser, adminUser)
	c.tokens = map[string]string{}
	for _, u := range []string{"system:kube-controller-manager", "system:kube-scheduler"} {
		c.tokens[u] = randomToken()
		tokens += fmt.Sprintf("%s,%s,%s\n", c.tokens[u], u, u)
	}
	if err := os.WriteFile(c.path("tokens.csv"), []byte(tokens), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	return nil
}

// boot starts every daemon once on freshly chosen ports.
func (c *Cluster) boot() error {
	// etcd on loopback only: nothing outside this process needs it.
	clientPort, err := freePort(defaultBind)
	if err != nil {
		return err
	}
	peerPort, err := freePort(defaultBind)
	if err != nil {
		return err
	}
	apiPort, err := freePort(c.opts.BindAddress)
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	c.server = "https://" + net.JoinHostPort(c.opts.BindAddress, strconv.Itoa(apiPort))

	dataDir := c.path("etcd-data")
	if err := os.RemoveAll(dataDir); err != nil {
		return fmt.Errorf("clear etcd data: %w", err)
	}
	if _, err := c.start(Etcd,
		"--name=kubelab", "--data-dir="+dataDir,
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubelab="+peerURL, "--initial-cluster-state=new",
		// Test data is disposable; fsync on a shared disk only slows every write.
		"--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return err
	}

	reconciler := "none" // the apiserver refuses to reconcile its Endpoints to a loopback address
	if ip := net.ParseIP(c.opts.BindAddress); !ip.IsLoopback() {
		reconciler = "lease" // a real address: keep the default kubernetes Service's endpoints, as in production
	}
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=" + c.opts.BindAddress,
		"--advertise-address=" + c.opts.BindAddress,
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + c.path("apiserver-certs"),
		"--tls-cert-file=" + c.path("apiserver.crt"),
		"--tls-private-key-file=" + c.path("apiserver.key"),
		"--client-ca-file=" + c.path("ca.crt"),
		"--token-auth-file=" + c.path("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		// Nodes' proxy subresources (flowctl reaches agents through it) dial the InternalIP: lab node names
		// are not in any DNS, as in most clusters kubeadm sets up the same way.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--service-account-issuer=" + saIssuer,
		"--service-account-key-file=" + c.path("sa.pub"),
		"--service-account-signing-key-file=" + c.path("sa.key"),
		"--service-cluster-ip-range=" + c.opts.ServiceCIDR,
		"--endpoint-reconciler-type=" + reconciler,
		"--allow-privileged=true",
		"--profiling=false",
	}
	if c.opts.KubeletClient {
		args = append(args, "--kubelet-client-certificate="+c.path("kubelet-client.crt"), "--kubelet-client-key="+c.path("kubelet-client.key"))
	}
	args = append(args, c.opts.ExtraAPIServerFlags...)
	api, err := c.start(APIServer, args...)
	if err != nil {
		return err
	}
	if err := c.kubeconfigs(); err != nil {
		return err
	}
	if err := c.waitHealthy(api, c.server+"/readyz", c.adminToken); err != nil {
		return err
	}

	if c.opts.ControllerManager {
		port, err := freePort(defaultBind)
		if err != nil {
			return err
		}
		kc := c.path("controller-manager.kubeconfig")
		p, err := c.start(ControllerManager,
			"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
			// Each controller acts as its own ServiceAccount with its bootstrap RBAC role, as in a
			// real cluster, rather than with the manager's broad identity.
			"--use-service-account-credentials=true",
			"--root-ca-file="+c.path("ca.crt"),
			"--service-account-private-key-file="+c.path("sa.key"),
			"--leader-elect=false",
			"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
			"--cert-dir="+c.path("controller-manager-certs"),
			// ofsdn's controller owns node subnets (HostSubnets); Kubernetes must not allocate pod CIDRs.
			"--allocate-node-cidrs=false",
		)
		if err != nil {
			return err
		}
		if err := c.waitHealthy(p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), ""); err != nil {
			return err
		}
	}
	if c.opts.Scheduler {
		port, err := freePort(defaultBind)
		if err != nil {
			return err
		}
		kc := c.path("scheduler.kubeconfig")
		p, err := c.start(Scheduler,
			"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
			"--leader-elect=false",
			"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
			"--cert-dir="+c.path("scheduler-certs"),
		)
		if err != nil {
			return err
		}
		if err := c.waitHealthy(p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), ""); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) start(name string, args ...string) (*daemon, error) {
	p, err := startDaemon(c.dir, name, filepath.Join(c.binDir, name), args...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// kubeconfigs writes the admin kubeconfig and the controller manager's and scheduler's.
func (c *Cluster) kubeconfigs() error {
	c.kubeconfig = c.path("admin.kubeconfig")
	files := []struct{ path, user, token string }{
		{c.kubeconfig, adminUser, c.adminToken},
		{c.path("controller-manager.kubeconfig"), "system:kube-controller-manager", c.tokens["system:kube-controller-manager"]},
		{c.path("scheduler.kubeconfig"), "system:kube-scheduler", c.tokens["system:kube-scheduler"]},
	}
	for _, f := range files {
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["kubelab"] = &clientcmdapi.Cluster{Server: c.server, CertificateAuthorityData: c.ca.certPEM}
		cfg.AuthInfos[f.user] = &clientcmdapi.AuthInfo{Token: f.token}
		cfg.Contexts["kubelab"] = &clientcmdapi.Context{Cluster: "kubelab", AuthInfo: f.user}
		cfg.CurrentContext = "kubelab"
		if err := clientcmd.WriteToFile(*cfg, f.path); err != nil {
			return fmt.Errorf("write kubeconfig %s: %w", f.path, err)
		}
	}
	return nil
}

// waitHealthy polls url until it answers 200 "ok", or fails when the daemon exits or time runs out.
func (c *Cluster) waitHealthy(p *daemon, url, token string) error {
	pool := x509.NewCertPool()
	pool.AddCert(c.ca.cert)
	// The controller manager and scheduler serve with self-made certificates; only the apiserver's
	// is ours to verify.
	insecure := !strings.HasPrefix(url, c.server)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, InsecureSkipVerify: insecure}},
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var last string
	err := proc.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("%s exited during start-up: %v", p.name, err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, fmt.Errorf("health request %s: %w", url, err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s not healthy at %s after %s: %s", p.name, url, startTimeout, last)
	}
	return err
}

// bindConflict reports whether a daemon's log says it lost a port to another process.
func (c *Cluster) bindConflict() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if b, err := os.ReadFile(p.logPath); err == nil && strings.Contains(string(b), "address already in use") {
			return true
		}
	}
	return false
}

// Server is the apiserver's URL, https://BindAddress:port.
func (c *Cluster) Server() string { return c.server }

// Dir is the cluster's temp dir: logs (<component>.log), kubeconfigs, PKI.
func (c *Cluster) Dir() string { return c.dir }

// CACert is the PEM certificate of the CA that signed the apiserver's serving certificate.
func (c *Cluster) CACert() []byte { return append([]byte(nil), c.ca.certPEM...) }

// KubeconfigPath is an admin (system:masters) kubeconfig, for kubectl and binaries under test.
func (c *Cluster) KubeconfigPath() string { return c.kubeconfig }

// AdminConfig authenticates as a member of system:masters. Client-side rate limits are raised so tests
// and benchmarks measure the server, not client-go's default 5 QPS.
func (c *Cluster) AdminConfig() *rest.Config {
	cfg := c.baseConfig()
	cfg.BearerToken = c.adminToken
	return cfg
}

// UserConfig authenticates as user with groups through a client certificate the cluster's CA signs
// (CN = user, O = groups): a user with no RBAC of its own, for tests of "forbidden".
func (c *Cluster) UserConfig(t testing.TB, user string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := c.CertConfig(user, groups...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// CertConfig is UserConfig for callers that are not tests, e.g. a kubelet's credentials
// (system:node:<name> in system:nodes).
func (c *Cluster) CertConfig(user string, groups ...string) (*rest.Config, error) {
	certPEM, keyPEM, err := c.ca.issue(user, groups, false, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("kubelab: client certificate for %s: %w", user, err)
	}
	cfg := c.baseConfig()
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	return cfg, nil
}

// ServiceAccountConfig authenticates as ServiceAccount namespace/name exactly as a pod running with it
// would: it creates the namespace and the ServiceAccount when missing and requests a token through the
// TokenRequest API. The config has exactly the RBAC bound to that ServiceAccount.
func (c *Cluster) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := c.ServiceAccountToken(ctx, namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ServiceAccountToken is ServiceAccountConfig for callers that are not tests.
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, name string) (*rest.Config, error) {
	cs, err := c.AdminClient()
	if err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kubelab: create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kubelab: create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	exp := int64(tokenExpiration / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubelab: token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := c.baseConfig()
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

func (c *Cluster) baseConfig() *rest.Config {
	return &rest.Config{
		Host:            c.server,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.ca.certPEM...)},
		QPS:             clientQPS,
		Burst:           clientBurst,
	}
}

// AdminClient is a clientset with AdminConfig's credentials, shared by the Cluster's helpers.
func (c *Cluster) AdminClient() (kubernetes.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.admin == nil {
		cs, err := kubernetes.NewForConfig(c.AdminConfig())
		if err != nil {
			return nil, fmt.Errorf("kubelab: admin client: %w", err)
		}
		c.admin = cs
	}
	return c.admin, nil
}

// Kubectl runs kubectl with the admin kubeconfig and returns its standard output; the error carries
// standard error.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "kubectl"), append([]string{"--kubeconfig=" + c.kubeconfig}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// ApplyDeploy applies manifests of the repository's deploy/ directory (files or directories, named
// relative to it) as Apply does.
func (c *Cluster) ApplyDeploy(manifests ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	paths := make([]string, len(manifests))
	for i, m := range manifests {
		paths[i] = filepath.Join(root, "deploy", m)
	}
	return c.Apply(paths...)
}

// Apply applies manifests (files or directories) server-side, in order, and waits until every
// CustomResourceDefinition the server has is Established, so their objects can be created at once.
func (c *Cluster) Apply(paths ...string) error {
	for _, p := range paths {
		if out, err := c.Kubectl("apply", "--server-side", "-f", p); err != nil {
			return fmt.Errorf("kubelab: apply %s: %w\n%s", p, err, out)
		}
	}
	crds, err := c.Kubectl("get", "crd", "-o", "name")
	if err != nil {
		return fmt.Errorf("kubelab: list CRDs: %w", err)
	}
	if names := strings.Fields(crds); len(names) > 0 {
		if out, err := c.Kubectl(append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, names...)...); err != nil {
			return fmt.Errorf("kubelab: CRDs not established: %w\n%s", err, out)
		}
	}
	return nil
}

// PIDs maps each running component (Etcd, APIServer, ControllerManager, Scheduler) to its PID, e.g.
// for a benchmark that samples their memory.
func (c *Cluster) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		if exited, _ := p.Exited(); !exited {
			m[p.name] = p.PID()
		}
	}
	return m
}

// Pause freezes a running component (Etcd, APIServer, ControllerManager, Scheduler) with SIGSTOP, as a
// hung process: its sockets stay open, connections are still accepted by the kernel and requests wait
// for an answer. resume (SIGCONT) lets it go on; it is safe to call more than once, and Stop resumes a
// paused component before stopping it.
func (c *Cluster) Pause(name string) (resume func(), err error) {
	c.mu.Lock()
	var p *daemon
	for _, q := range c.procs {
		if exited, _ := q.Exited(); q.name == name && !exited {
			p = q
		}
	}
	c.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("kubelab: no running %s to pause", name)
	}
	if err := syscall.Kill(-p.PID(), syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("kubelab: pause %s: %w", name, err)
	}
	return func() { _ = syscall.Kill(-p.PID(), syscall.SIGCONT) }, nil
}

// Stop stops every daemon (reverse start order: SIGTERM to its process group, SIGKILL after a grace
// period) and removes the temp dir. It may be called early; t.Cleanup calls it too. After Stop the
// configs no longer reach a server.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.stopProcs()
		if os.Getenv("OFSDN_KEEP_TEST_DIRS") == "" {
			_ = os.RemoveAll(c.dir)
		}
	})
}

func (c *Cluster) stopProcs() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(stopGrace)
	}
}

// cleanup reports daemons that died on their own and, when the test failed, the logs' tails; then stops.
func (c *Cluster) cleanup(t testing.TB) {
	c.mu.Lock()
	var died []string
	for _, p := range c.procs {
		if s := p.unexpectedExit(); s != "" {
			died = append(died, s)
		}
	}
	c.mu.Unlock()
	if len(died) > 0 {
		t.Errorf("kubelab: daemons exited during the test: %s", strings.Join(died, "; "))
	}
	if t.Failed() {
		c.logTails(t)
	}
	c.Stop()
}

func (c *Cluster) logTails(t testing.TB) {
	for _, name := range []string{Etcd, APIServer, ControllerManager, Scheduler} {
		path := c.path(name + ".log")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		t.Logf("kubelab: last %d lines of %s:\n%s", logTailLines, path, proc.Tail(path, logTailLines))
	}
}

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

// firstIP is the first host address of a CIDR: the kubernetes Service's ClusterIP.
func firstIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	ip := append(net.IP(nil), n.IP...)
	ip[len(ip)-1]++
	return ip, nil
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
