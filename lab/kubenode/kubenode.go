// Package kubenode runs a real Kubernetes node on a lab node (lab): Debian's containerd (1.6.20,
// with runc 1.1.5) and kubelet (hack/build-k8s.sh builds it from the control plane's version), inside
// the node's network namespace and in a mount namespace of the node's own, so that every node sees the
// usual host paths (/etc/cni/net.d, /opt/cni/bin, /var/run/openvswitch, /var/lib/kubelet, ...) as a
// directory of its own: a DaemonSet's hostPath volumes then mean the same on a lab node as on a real
// host, and three nodes on one machine never share one.
//
// What kubelet needed on these machines (shared/LAB.md; each is set below where it is done):
//   - the cgroupfs driver on the machine's cgroup v1 hierarchies (cgroupDriver: cgroupfs, failCgroupV1:
//     false), with a cgroup root of the node's own created beforehand in every hierarchy (cpuset's with
//     its parent's CPUs and memory nodes) and removed depth-first afterwards;
//   - failSwapOn: false;
//   - containerd's CRI option restrict_oom_score_adj = true: the machines lack CAP_SYS_RESOURCE, so
//     runc cannot give a sandbox the oom_score_adj of -998 kubelet asks, and every sandbox failed
//     ("can't get final child's PID from pipe: EOF") without it;
//   - kernel settings kubelet writes at start (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops,
//     ...) are the machine's, not the node's: the node's mount namespace shows kubelet files with the
//     values it wants over /proc/sys, and protectKernelDefaults makes it refuse, never write, if one
//     differs, so the machine's settings are never touched;
//   - a sysfs of the node's network namespace (mounted over /sys in the node's mount namespace, the
//     cgroup hierarchies bound back under it), so kubelet, cAdvisor and hostNetwork containers see the
//     node's interfaces, not the machine's;
//   - the API server authenticates to kubelet with a client certificate of the cluster's CA
//     (kubelab.Options.KubeletClient) and kubelet authorizes it through the API server (Webhook), so
//     exec, logs and port-forward work as in a real cluster.
//
// Everything a node makes is named after its network namespace (its cgroup root is
// /<netns>, in every hierarchy) or lives under Config.Dir, so Stop, and Sweep after a killed run, find
// it: Stop stops kubelet and containerd, then kills every process left in the node's cgroups (shims,
// containers), then removes the cgroups depth-first; the node's mounts live and die with its mount
// namespace, which the machine's mount table never sees.
package kubenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Config describes one node.
type Config struct {
	// Name is the Node's name (kubelet's hostname override).
	Name string
	// NetNS is the lab node's network namespace ("ip netns" name). It also names the node's cgroup
	// root, so it must carry the lab's prefix (Sweep finds cgroups by it).
	NetNS string
	// IP is the node's address (kubelet's --node-ip and the address it serves on).
	IP netip.Addr
	// Dir holds everything of the node: configurations, logs, containerd's root and state, kubelet's
	// root, and the directories the node sees at the usual host paths.
	Dir string
	// KubeletBin is the kubelet binary.
	KubeletBin string
	// Kubeconfig is kubelet's kubeconfig: the node's credentials (system:node:<name>).
	Kubeconfig string
	// ClientCAFile is the CA kubelet trusts to authenticate clients (the API server).
	ClientCAFile string
	// ClusterDNS and ClusterDomain are what kubelet writes into pods' resolv.conf.
	ClusterDNS    []string
	ClusterDomain string
	// SandboxImage is containerd's pod sandbox ("pause") image; it must be among Images.
	SandboxImage string
	// Images are image tarballs imported into the node's containerd (namespace k8s.io) before kubelet
	// starts: the lab pulls nothing.
	Images []string
	// Mounts binds host directories at paths of the node's file system view, beyond the defaults
	// (each default host path gets a directory under Dir), e.g. /var/run/openvswitch → the lab node's
	// Open vSwitch directory.
	Mounts map[string]string
	// KubeletArgs are extra kubelet flags.
	KubeletArgs []string
	// LoopbackPlugin is the CNI plugin containerd 1.6 brings each pod's lo up with, copied into the
	// node's /opt/cni/bin as a node's OS packages put it there; default LoopbackPlugin.
	LoopbackPlugin string
	Logger         *slog.Logger
}

// LoopbackPlugin is where Debian's containernetworking-plugins installs the loopback plugin.
const LoopbackPlugin = "/usr/lib/cni/loopback"

// HostPaths are the paths each node sees as a directory of its own (Dir/host/<path>) unless
// Config.Mounts binds them elsewhere: where containerd, kubelet and CNI keep state that hard-coded or
// default paths name, and the hostPath volumes of deploy/'s DaemonSets.
var HostPaths = []string{
	"/run/netns",          // containerd 1.6 pins pod network namespaces here (shared into the agent)
	"/run/containerd",     // shim sockets and runc's state
	"/var/lib/kubelet",    // kubelet's root: pod volumes, plugins, pki
	"/var/log/pods",       // container logs
	"/var/log/containers", // kubelet's links to them
	"/var/lib/cni",        // libcni's cache
	"/etc/cni/net.d",      // the CNI configuration the agent installs
	"/opt/cni/bin",        // the CNI plugin the agent installs
	"/var/run/ofsdn",      // the agent's CNI socket
	"/var/lib/ofsdn",      // the agent's state
	"/var/run/openvswitch",
	"/etc/openvswitch",
}

// kernelDefaults are the sysctls kubelet sets at start (pkg/kubelet/cm setupKernelTunables) and the
// values it wants: the node's mount namespace shows it these, the machine keeps its own.
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// Node is a running node.
type Node struct {
	cfg        Config
	log        *slog.Logger
	cgroups    []string // hierarchies
	containerd *proc.Daemon
	kubelet    *proc.Daemon
	stopOnce   sync.Once
	stopErr    error
}

// Socket is containerd's socket, reachable from the machine's namespaces (ctr -a).
func (n *Node) Socket() string { return filepath.Join(n.cfg.Dir, "containerd.sock") }

// HostDir is the directory the node sees at path (one of HostPaths, or a Config.Mounts key).
func (n *Node) HostDir(path string) string {
	if d, ok := n.cfg.Mounts[path]; ok {
		return d
	}
	return filepath.Join(n.cfg.Dir, "host", path)
}

// KubeletLog and ContainerdLog are the daemons' logs.
func (n *Node) KubeletLog() string    { return filepath.Join(n.cfg.Dir, "kubelet.log") }
func (n *Node) ContainerdLog() string { return filepath.Join(n.cfg.Dir, "containerd.log") }

// CgroupRoot is kubelet's cgroupRoot: "/" + the node's network namespace.
func (n *Node) CgroupRoot() string { return "/" + n.cfg.NetNS }

// Start brings containerd up, imports the images, starts kubelet and returns once kubelet's health
// endpoint answers (the Node object exists then; it becomes Ready once a network plugin installed its
// CNI configuration). On error it has stopped what it started.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Name == "" || cfg.NetNS == "" || strings.ContainsAny(cfg.NetNS, "/ ") || cfg.Dir == "" || !cfg.IP.IsValid() {
		return nil, fmt.Errorf("kubenode: Name, NetNS (a plain name), Dir and IP are required")
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name)}
	defer func() {
		if err != nil {
			err = fmt.Errorf("kubenode %s: %w\n--- containerd:\n%s\n--- kubelet:\n%s", cfg.Name, err,
				proc.Tail(n.ContainerdLog(), 15), proc.Tail(n.KubeletLog(), 25))
			_ = n.Stop()
		}
	}()
	began := time.Now()
	if n.cgroups, err = hierarchies(); err != nil {
		return n, err
	}
	root := n.CgroupRoot()
	if err := makeCgroups(n.cgroups, root, filepath.Join(root, "runtime")); err != nil {
		return n, err
	}
	if err := n.writeFiles(); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	for _, img := range cfg.Images {
		if out, err := exec.CommandContext(ctx, "ctr", "-a", n.Socket(), "-n", "k8s.io", "images", "import", img).CombinedOutput(); err != nil {
			return n, fmt.Errorf("import %s: %w: %s", img, err, out)
		}
	}
	n.log.Debug("containerd up, images imported", "images", len(cfg.Images), "took", time.Since(began).Round(time.Millisecond))
	if err := n.startKubelet(ctx); err != nil {
		return n, err
	}
	n.log.Info("node up", "took", time.Since(began).Round(time.Millisecond))
	return n, nil
}

// writeFiles lays out the node's directory: the host paths, containerd's and kubelet's
// configurations, the resolv.conf kubelet gives pods for outside names, the kernel settings kubelet
// reads.
func (n *Node) writeFiles() error {
	c := n.cfg
	for _, p := range HostPaths {
		if err := os.MkdirAll(n.HostDir(p), 0o755); err != nil {
			return err
		}
	}
	loopback := c.LoopbackPlugin
	if loopback == "" {
		loopback = LoopbackPlugin
	}
	data, err := os.ReadFile(loopback)
	if err != nil {
		return fmt.Errorf("containerd needs the CNI loopback plugin (Debian: containernetworking-plugins; make deps): %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.HostDir("/opt/cni/bin"), "loopback"), data, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"sysctl", ".cgroup-hold", "containerd"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return err
		}
	}
	for name, v := range kernelDefaults {
		p := filepath.Join(c.Dir, "sysctl", strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			return err
		}
	}
	// No resolver of the machine is reachable from a node (the lab has no route out): pods whose DNS
	// policy is Default get the cluster's search path only.
	if err := os.WriteFile(filepath.Join(c.Dir, "resolv.conf"), []byte("# ofsdn lab node "+c.Name+": no upstream resolver\noptions ndots:1\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "containerd.toml"), []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "kubelet.yaml"), []byte(n.kubeletConfig()), 0o644)
}

// containerdConfig: a private containerd (its own root, state and socket), the CRI plugin with runc
// and the cgroupfs driver, overlayfs (the machine's root file system is ext4), CNI at the standard
// paths (the node's own, see HostPaths).
func (n *Node) containerdConfig() string {
	c := n.cfg
	return fmt.Sprintf(`# ofsdn lab node %[1]s (lab/kubenode)
version = 2
root = %[2]q
state = %[3]q
[grpc]
  address = %[4]q
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = %[5]q
    # The machines lack CAP_SYS_RESOURCE: without it runc fails every sandbox (kubelet asks -998).
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
`, c.Name, filepath.Join(c.Dir, "containerd", "root"), filepath.Join(c.Dir, "containerd", "state"), n.Socket(), c.SandboxImage)
}

// kubeletConfig is the node's KubeletConfiguration.
func (n *Node) kubeletConfig() string {
	c := n.cfg
	dns := ""
	for _, ip := range c.ClusterDNS {
		dns += fmt.Sprintf("\n  - %q", ip)
	}
	if dns == "" {
		dns = " []"
	}
	domain := c.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	return fmt.Sprintf(`# ofsdn lab node %[1]s (lab/kubenode)
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[2]s
# These machines mount cgroup v1 read-write: the cgroupfs driver, under a root of the node's own that
# kubenode created in every hierarchy.
cgroupDriver: cgroupfs
cgroupRoot: %[3]q
failCgroupV1: false
failSwapOn: false
# Never write the machine's kernel settings: the node's mount namespace shows kubelet the values it wants.
protectKernelDefaults: true
address: %[4]q
port: 10250
readOnlyPort: 0
healthzBindAddress: "127.0.0.1"
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[5]q}
authorization:
  mode: Webhook
clusterDomain: %[6]q
clusterDNS:%[7]s
resolvConf: %[8]q
serializeImagePulls: false
# The lab's disk is shared: evict only when it is really full, never for images.
evictionHard: {"memory.available": "100Mi", "nodefs.available": "2%%", "imagefs.available": "2%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 110
`, c.Name, n.Socket(), n.CgroupRoot(), c.IP.String(), c.ClientCAFile, domain, dns, filepath.Join(c.Dir, "resolv.conf"))
}

// q quotes a string for sh.
func q(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// nodeSetup is the shell run as the first process of the node's mount namespace (unshare --mount
// --propagation private, inside the node's network namespace) before it becomes containerd.
func (n *Node) nodeSetup() string {
	c := n.cfg
	var b strings.Builder
	b.WriteString("set -eu\n")
	fmt.Fprintf(&b, "hostname %s\n", q(c.Name))
	// A sysfs of the node's network namespace, the machine's cgroup hierarchies bound back under it.
	hold := filepath.Join(c.Dir, ".cgroup-hold")
	fmt.Fprintf(&b, "mount --rbind /sys/fs/cgroup %s\nmount -t sysfs sysfs /sys\nmount --rbind %s /sys/fs/cgroup\numount -l %s\n", q(hold), q(hold), q(hold))
	paths := append([]string(nil), HostPaths...)
	for p := range c.Mounts {
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(&b, "mkdir -p %s\nmount --bind %s %s\n", q(p), q(n.HostDir(p)), q(p))
	}
	// Shared inside the node, as / is on a systemd host: pod network namespaces containerd pins in
	// /run/netns must reach the agent's container (HostToContainer), and containerd refuses such a
	// volume on a private mount. unshare made every mount private first, so this peer group is the
	// node's own and nothing propagates to the machine.
	b.WriteString("mount --make-rshared /\n")
	names := make([]string, 0, len(kernelDefaults))
	for name := range kernelDefaults {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&b, "mount --bind %s %s\n", q(filepath.Join(c.Dir, "sysctl", strings.ReplaceAll(name, "/", "."))), q("/proc/sys/"+name))
	}
	b.WriteString(n.joinRuntimeCgroup())
	fmt.Fprintf(&b, "exec containerd --config %s\n", q(filepath.Join(c.Dir, "containerd.toml")))
	return b.String()
}

// joinRuntimeCgroup moves the shell into the node's runtime cgroup in every hierarchy: containerd,
// kubelet and the shims they start then live inside the node's cgroup root, where Stop and Sweep find
// them.
func (n *Node) joinRuntimeCgroup() string {
	var b strings.Builder
	for _, h := range n.cgroups {
		fmt.Fprintf(&b, "echo $$ > %s\n", q(filepath.Join(h, n.CgroupRoot(), "runtime", "cgroup.procs")))
	}
	return b.String()
}

func (n *Node) startContainerd(ctx context.Context) error {
	// A mount namespace and a UTS namespace of the node's own: its hostname is its name, as a real
	// node's, which hostNetwork pods share.
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.cfg.NetNS, "--", "unshare", "--mount", "--uts", "--propagation", "private", "--",
		"sh", "-c", n.nodeSetup())
	d, err := startLogged(cmd, n.ContainerdLog())
	if err != nil {
		return err
	}
	n.containerd = d
	var last string
	err = proc.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if exited, err := d.Exited(); exited {
			return false, fmt.Errorf("containerd exited: %v", err)
		}
		out, err := exec.CommandContext(ctx, "ctr", "-a", n.Socket(), "version").CombinedOutput()
		last = string(out)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("containerd did not answer: %w: %s", err, last)
	}
	return nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	c := n.cfg
	args := []string{"--config=" + filepath.Join(c.Dir, "kubelet.yaml"), "--kubeconfig=" + c.Kubeconfig,
		"--hostname-override=" + c.Name, "--node-ip=" + c.IP.String(), "-v=2"}
	args = append(args, c.KubeletArgs...)
	script := n.joinRuntimeCgroup() + "exec " + q(c.KubeletBin)
	for _, a := range args {
		script += " " + q(a)
	}
	// kubelet joins containerd's namespaces: the node's network, mount and UTS namespaces.
	cmd := exec.Command("nsenter", fmt.Sprintf("--target=%d", n.containerd.PID()), "--mount", "--net", "--uts", "--", "sh", "-c", script)
	d, err := startLogged(cmd, n.KubeletLog())
	if err != nil {
		return err
	}
	n.kubelet = d
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = lab.InNetNS(c.NetNS, func() error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	err = proc.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if exited, err := d.Exited(); exited {
			return false, fmt.Errorf("kubelet exited: %v", err)
		}
		resp, err := client.Get("http://127.0.0.1:10248/healthz")
		if err != nil {
			last = err.Error()
			return false, nil
		}
		resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("kubelet not healthy: %w (last: %s)", err, last)
	}
	return nil
}

func startLogged(cmd *exec.Cmd, logPath string) (*proc.Daemon, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	return proc.Start(cmd)
}

// Stop stops kubelet and containerd, ends every process left in the node's cgroups (shims and
// containers) and removes the cgroups. The node's mounts go with its mount namespace. It is idempotent.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() {
		if n.kubelet != nil {
			n.kubelet.Stop(10 * time.Second)
		}
		if n.containerd != nil {
			n.containerd.Stop(10 * time.Second)
		}
		if n.cgroups == nil {
			return
		}
		root := n.CgroupRoot()
		n.stopErr = errors.Join(killCgroups(n.cgroups, root, 30*time.Second), removeCgroups(n.cgroups, root))
		if n.stopErr != nil {
			n.log.Warn("node teardown incomplete", "err", n.stopErr)
		}
	})
	return n.stopErr
}

// Sweep removes what nodes of killed runs left: for every cgroup root named prefix<pid>-... (the lab's
// default prefix, DefaultPrefixBase of lab) whose owner no longer runs, it kills the processes in
// it and removes it. Run it before the lab's own sweep, which removes the namespaces and directories.
func Sweep(prefix string) {
	if prefix == "" {
		prefix = lab.DefaultPrefixBase
	}
	hs, err := hierarchies()
	if err != nil {
		return
	}
	roots := map[string]bool{}
	for _, h := range hs {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
				continue
			}
			if pid, ok := proc.OwnerPID(e.Name(), prefix); ok && !proc.Alive(pid) {
				roots["/"+e.Name()] = true
			}
		}
	}
	for root := range roots {
		_ = killCgroups(hs, root, 30*time.Second)
		_ = removeCgroups(hs, root)
	}
}

// WriteKubeconfig writes a kubeconfig for cfg (server, CA, token or client certificate) to path.
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["lab"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "user"}
	kc.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubenode: write %s: %w", path, err)
	}
	return nil
}

// PodPID returns a process of the pod with the given UID (its sandbox's or a container's), found in
// the pod's cgroup under the node's cgroup root (kubepods/[burstable|besteffort/]pod<UID>).
func (n *Node) PodPID(uid string) (int, error) {
	if pids := n.PodPIDs(uid); len(pids) > 0 {
		return pids[0], nil
	}
	return 0, fmt.Errorf("kubenode %s: no process in pod %s's cgroup", n.cfg.Name, uid)
}

// PodPIDs lists every process of the pod with the given UID.
func (n *Node) PodPIDs(uid string) []int {
	for _, h := range n.cgroups {
		for _, qos := range []string{"", "burstable", "besteffort"} {
			dir := filepath.Join(n.CgroupRoot(), "kubepods", qos, "pod"+uid)
			if pids := cgroupPIDs([]string{h}, dir); len(pids) > 0 {
				return pids
			}
		}
	}
	return nil
}

// ContainerLogs lists the log files of the containers of pods in namespace on this node (kubelet
// writes them to /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log).
func (n *Node) ContainerLogs(namespace string) []string {
	logs, _ := filepath.Glob(filepath.Join(n.HostDir("/var/log/pods"), namespace+"_*", "*", "*.log"))
	return logs
}
