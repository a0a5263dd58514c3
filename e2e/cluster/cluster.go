// Package cluster runs a whole ofsdn cluster in the lab: the node namespaces with their own OVS (e2e/lab),
// a real kube-apiserver with etcd, controller-manager and scheduler (e2e/kubelab) reachable from the node
// namespaces, ofsdn's CRDs and RBAC applied from deploy/, the ofsdn-controller, one ofsdn-agent per node
// running in the node's namespace with exactly the credentials deploy/ gives it, and a node simulator per
// node (e2e/nodesim) that plays kubelet: it registers the Node and runs pods through the installed CNI
// plugin. The e2e tests, the lab benchmarks and `make demo` all stand on it.
package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/e2e/kubelab"
	"github.com/ofsdn/ofsdn/e2e/lab"
	"github.com/ofsdn/ofsdn/e2e/nodesim"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// Options shape a cluster. The zero value is 3 nodes in multitenant mode.
type Options struct {
	Nodes            int
	Mode             networkv1.PluginMode    // default multitenant
	Encapsulation    networkv1.Encapsulation // default vxlan
	ClusterCIDR      string                  // default 10.128.0.0/14
	HostSubnetLength int                     // default 9 (a /23 per node)
	ServiceCIDR      string                  // default 172.30.0.0/16
	// BinDir holds prebuilt binaries (ofsdn-agent, ofsdn-controller, ofsdn, flowctl, ofsdn-testpod);
	// empty builds them into the cluster's directory.
	BinDir string
	// Prefix names the lab's namespaces; default a unique ofsdn-lab-<pid>-<n>.
	Prefix string
	// AgentArgs are extra flags for every agent (e.g. -v=4).
	AgentArgs []string
	// NoController leaves ofsdn-controller out, for tests that write ClusterNetwork, HostSubnets and
	// NetNamespaces themselves; Start then returns without waiting for the agents (WaitAgentsReady does).
	NoController bool
	Logger       *slog.Logger
}

// Cluster is a running lab cluster. Stop tears all of it down.
type Cluster struct {
	Lab    *lab.Lab
	API    *kubelab.Cluster
	Client kubernetes.Interface
	Net    networkclient.Interface
	Nodes  []*Node
	BinDir string
	Dir    string
	opts   Options
	log    *slog.Logger

	ctx        context.Context
	cancel     context.CancelFunc
	controller *process
	stopOnce   sync.Once
}

// Node is one lab node: its namespace and OVS, its agent and its kubelet stand-in.
type Node struct {
	*lab.Node
	Sim        *nodesim.Sim
	CNIConfDir string
	CNIBinDir  string
	CNISocket  string
	StateDir   string
	AgentLog   string
	agent      *process
	kubeconfig string
	mu         sync.Mutex
}

// Binaries the cluster runs, and where their sources are.
var binaries = map[string]string{
	"ofsdn-agent":      "./cmd/ofsdn-agent",
	"ofsdn-controller": "./cmd/ofsdn-controller",
	"ofsdn":            "./cmd/ofsdn",
	"flowctl":          "./cmd/flowctl",
	"ofsdn-testpod":    "./e2e/cmd/ofsdn-testpod",
}

// Namespace of ofsdn's own components (deploy/).
const systemNamespace = "ofsdn"

// Start brings a cluster up and returns once every agent has installed its CNI configuration. On error
// it tears down what it started.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = lab.DefaultNodes
	}
	if opts.Mode == "" {
		opts.Mode = networkv1.PluginModeMultitenant
	}
	if opts.Encapsulation == "" {
		opts.Encapsulation = networkv1.EncapsulationVXLAN
	}
	if opts.ClusterCIDR == "" {
		opts.ClusterCIDR = "10.128.0.0/14"
	}
	if opts.HostSubnetLength == 0 {
		opts.HostSubnetLength = 9
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = "172.30.0.0/16"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{opts: opts, log: opts.Logger}
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Logs(30))
			c.Stop()
		}
	}()
	began := time.Now()
	if c.Dir, err = os.MkdirTemp("", "ofsdn-cluster-"); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c.BinDir = opts.BinDir
	if c.BinDir == "" {
		c.BinDir = filepath.Join(c.Dir, "bin")
		if err := Build(ctx, c.BinDir, !opts.NoController); err != nil {
			return nil, err
		}
	}
	c.Lab, err = lab.Start(ctx, lab.Options{Nodes: opts.Nodes, Prefix: opts.Prefix, RootLink: true, Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c.API, err = kubelab.Launch(kubelab.Options{BindAddress: c.Lab.Root.IP.String(), ControllerManager: true, Scheduler: true,
		ServiceCIDR: opts.ServiceCIDR}, func(f string, a ...any) { c.log.Debug(fmt.Sprintf(f, a...)) })
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.API.AdminConfig()); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if c.Net, err = networkclient.NewForConfig(c.API.AdminConfig()); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.applyDeploy(ctx); err != nil {
		return nil, err
	}
	if !opts.NoController {
		if err := c.startController(ctx); err != nil {
			return nil, err
		}
	}
	agentCfg, err := c.API.ServiceAccountToken(ctx, systemNamespace, "ofsdn-agent")
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	for _, ln := range c.Lab.Nodes {
		n := &Node{Node: ln, CNIConfDir: filepath.Join(ln.Dir, "cni", "net.d"), CNIBinDir: filepath.Join(ln.Dir, "cni", "bin"),
			CNISocket: filepath.Join(ln.Dir, "cni.sock"), StateDir: filepath.Join(ln.Dir, "state"), AgentLog: filepath.Join(ln.Dir, "ofsdn-agent.log"),
			kubeconfig: filepath.Join(ln.Dir, "agent.kubeconfig")}
		if err := writeKubeconfig(n.kubeconfig, agentCfg); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		if err := c.StartAgent(n); err != nil {
			return nil, err
		}
	}
	// Nodes register after their agents run, as kubelet does on a node whose network plugin is deployed.
	for _, n := range c.Nodes {
		sim, err := nodesim.Start(c.ctx, nodesim.Config{NodeName: n.Name, NodeIP: n.IP, Client: c.Client, CNIConfDir: n.CNIConfDir,
			CNIBinDir: n.CNIBinDir, CNICache: filepath.Join(n.Dir, "cni", "cache"), PodBinary: filepath.Join(c.BinDir, "ofsdn-testpod"),
			NetNSPrefix: c.Lab.Prefix + "-" + n.Name, NodeNetNS: "/var/run/netns/" + n.NetNS, Logger: klog.Background()})
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		n.Sim = sim
	}
	if !opts.NoController {
		if err := c.WaitAgentsReady(ctx); err != nil {
			return nil, err
		}
	}
	c.log.Info("cluster up", "nodes", len(c.Nodes), "mode", opts.Mode, "took", time.Since(began).Round(time.Millisecond))
	return c, nil
}

// Build compiles the cluster's binaries into dir (the controller only when asked).
func Build(ctx context.Context, dir string, controller bool) error {
	root, err := kubelab.RepoRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", dir + "/"}
	for name, pkg := range binaries {
		if name != "ofsdn-controller" || controller {
			args = append(args, pkg)
		}
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cluster: go build: %w\n%s", err, out)
	}
	return nil
}

// applyDeploy applies deploy/'s CRDs, namespaces, RBAC and configuration — everything but the workloads,
// which the lab runs as processes instead (there is no container runtime).
func (c *Cluster) applyDeploy(ctx context.Context) error {
	root, err := kubelab.RepoRoot()
	if err != nil {
		return err
	}
	docs, err := DeployDocuments(filepath.Join(root, "deploy"), func(kind string) bool { return kind != "DaemonSet" && kind != "Deployment" })
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "deploy.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := c.API.Apply(path); err != nil {
		return fmt.Errorf("cluster: deploy/: %w", err)
	}
	return nil
}

// DeployDocuments returns the YAML documents of every manifest under dir (kustomization files excluded)
// whose kind keep accepts.
func DeployDocuments(dir string, keep func(kind string) bool) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || filepath.Base(path) == "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			kind := ""
			for _, line := range strings.Split(doc, "\n") {
				if k, ok := strings.CutPrefix(line, "kind: "); ok {
					kind = strings.TrimSpace(k)
					break
				}
			}
			if kind != "" && keep(kind) {
				out = append(out, strings.TrimPrefix(doc, "\n"))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: read %s: %w", dir, err)
	}
	return out, nil
}

func (c *Cluster) startController(ctx context.Context) error {
	cfg, err := c.API.ServiceAccountToken(ctx, systemNamespace, "ofsdn-controller")
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	kc := filepath.Join(c.Dir, "controller.kubeconfig")
	if err := writeKubeconfig(kc, cfg); err != nil {
		return err
	}
	args := []string{"--kubeconfig", kc, "--cluster-cidrs", c.opts.ClusterCIDR, "--host-subnet-length", strconv.Itoa(c.opts.HostSubnetLength),
		"--service-network", c.opts.ServiceCIDR, "--plugin-mode", string(c.opts.Mode), "--encapsulation", string(c.opts.Encapsulation), "--mtu", strconv.Itoa(c.Lab.PodMTU()),
		"--metrics-address", "127.0.0.1:0", "--leader-elect-namespace", systemNamespace,
		// deploy/ names each replica after its pod (POD_NAME): one stable name, as a pod's would be.
		"--leader-elect-identity", "ofsdn-controller-0"}
	c.controller, err = startProcess(filepath.Join(c.BinDir, "ofsdn-controller"), filepath.Join(c.Dir, "ofsdn-controller.log"), "", args...)
	return err
}

// StartAgent starts (or restarts) a node's agent inside the node's namespace, as the DaemonSet's pod
// (hostNetwork) would run.
func (c *Cluster) StartAgent(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent != nil && n.agent.running() {
		return fmt.Errorf("cluster: agent on %s already runs", n.Name)
	}
	manifest, err := AgentManifestArgs(n.IP.String())
	if err != nil {
		return err
	}
	args := []string{"--node-name", n.Name, "--kubeconfig", n.kubeconfig, "--ovs-rundir", n.Dir, "--datapath-type", "netdev",
		"--state-dir", n.StateDir, "--cni-socket", n.CNISocket, "--cni-conf-dir", n.CNIConfDir, "--cni-bin-dir", n.CNIBinDir,
		"--cni-plugin", filepath.Join(c.BinDir, "ofsdn"),
		// The lab's agents follow an encapsulation change within a second; a short linger lets a test
		// that switches back to vxlan wait for the uplink port to go, so later tests find br0 as before.
		"--uplink-linger", UplinkLinger.String(),
		// EgressNetworkPolicy DNS names are resolved by a server of the lab's own (a test runs one on
		// the external host), never by the machine's resolver.
		"--egress-dns-server", netip.AddrPortFrom(c.Lab.External.IP, 53).String()}
	args = append(append(args, manifest...), c.opts.AgentArgs...)
	p, err := startProcess(filepath.Join(c.BinDir, "ofsdn-agent"), n.AgentLog, n.NetNS, args...)
	if err != nil {
		return err
	}
	n.agent = p
	return nil
}

// StopAgent stops a node's agent: gracefully (SIGTERM) or as a crash (SIGKILL).
func (c *Cluster) StopAgent(n *Node, crash bool) {
	n.mu.Lock()
	p := n.agent
	n.mu.Unlock()
	if p == nil {
		return
	}
	if crash {
		p.Kill()
		return
	}
	p.Stop(10 * time.Second)
}

// WaitAgentsReady waits until every agent has set up its node and installed the CNI configuration.
func (c *Cluster) WaitAgentsReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		if err := proc.Until(ctx, 0, func() bool {
			_, err := os.Stat(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
			return err == nil
		}); err != nil {
			return fmt.Errorf("cluster: agent on %s not ready (log %s): %w\n%s", n.Name, n.AgentLog, err, proc.Tail(n.AgentLog, 20))
		}
		if n.agent != nil && !n.agent.running() {
			return fmt.Errorf("cluster: agent on %s exited:\n%s", n.Name, proc.Tail(n.AgentLog, 30))
		}
	}
	return nil
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Stop tears everything down: pods (through CNI DEL), agents, the controller, the API server and the lab.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, n := range c.Nodes {
			if n.Sim != nil {
				n.Sim.Stop(ctx)
			}
		}
		c.cancel()
		for _, n := range c.Nodes {
			c.StopAgent(n, false)
		}
		if c.controller != nil {
			c.controller.Stop(10 * time.Second)
		}
		if c.API != nil {
			c.API.Stop()
		}
		if c.Lab != nil {
			if err := c.Lab.Stop(); err != nil {
				c.log.Error("lab stop", "err", err)
			}
		}
		if c.Dir != "" && os.Getenv("OFSDN_KEEP_TEST_DIRS") == "" {
			_ = os.RemoveAll(c.Dir)
		}
	})
}

// Logs returns the tails of the controller's and agents' logs, for a failing test's report.
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	if c.controller != nil {
		fmt.Fprintf(&b, "--- ofsdn-controller (%s):\n%s\n", c.controller.log, proc.Tail(c.controller.log, lines))
	}
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "--- ofsdn-agent on %s (%s):\n%s\n", n.Name, n.AgentLog, proc.Tail(n.AgentLog, lines))
	}
	return b.String()
}

// Subnet returns a node's HostSubnet once the controller allocated it.
func (c *Cluster) Subnet(ctx context.Context, node string) (netip.Prefix, error) {
	hs, err := c.Net.NetworkV1().HostSubnets().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.ParsePrefix(string(hs.Subnet))
}

func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["lab"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "user"}
	kc.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("cluster: write %s: %w", path, err)
	}
	return nil
}

// process is a daemon the cluster started (proc.Daemon: its own process group, so stopping it stops its
// children; ip netns exec execs in place, so the group is the daemon itself), its output in log.
type process struct {
	*proc.Daemon
	log string
}

func startProcess(bin, logPath, netns string, args ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer logf.Close()
	var cmd *exec.Cmd
	if netns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", netns, bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := proc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", filepath.Base(bin), err)
	}
	return &process{Daemon: d, log: logPath}, nil
}

func (p *process) running() bool {
	exited, _ := p.Exited()
	return !exited
}

// AgentPID returns the PID of a node's agent, or 0.
func (n *Node) AgentPID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent == nil || !n.agent.running() {
		return 0
	}
	return n.agent.PID()
}

// agentManifestFlags are the flags of deploy/'s DaemonSet the lab's agents take as they are: the
// metrics and health server its probes ask, the debug API flowctl reaches through the node proxy, and
// the drift check period. The rest (paths, datapath type) differs in the lab.
var agentManifestFlags = []string{"--metrics-address", "--debug-address", "--drift-check-period"}

// AgentManifestArgs returns those flags as deploy/agent/daemonset.yaml gives them, with $(HOST_IP)
// (the downward API's status.hostIP) replaced by the node's address.
func AgentManifestArgs(hostIP string) ([]string, error) {
	root, err := kubelab.RepoRoot()
	if err != nil {
		return nil, err
	}
	c, err := AgentContainer(filepath.Join(root, "deploy", "agent", "daemonset.yaml"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range c.Args {
		for _, f := range agentManifestFlags {
			if strings.HasPrefix(a, f+"=") {
				out = append(out, strings.ReplaceAll(a, "$(HOST_IP)", hostIP))
			}
		}
	}
	if len(out) != len(agentManifestFlags) {
		return nil, fmt.Errorf("cluster: the agent's DaemonSet sets %v, want each of %v", out, agentManifestFlags)
	}
	return out, nil
}

// AgentContainer reads the agent container of the DaemonSet manifest at path.
func AgentContainer(path string) (*corev1.Container, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", path, err)
	}
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == "agent" {
			return c, nil
		}
	}
	return nil, fmt.Errorf("cluster: %s has no container named agent", path)
}
