package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ofsdn/ofsdn/e2e/labimages"
	"github.com/ofsdn/ofsdn/internal/image"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	"github.com/ofsdn/ofsdn/lab/kubenode"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Real kubelets (Options.Kubelets): every lab node runs Debian's containerd and kubelet (lab/kubenode),
// and ofsdn runs as a user runs it: deploy/ applied through an overlay (the lab's image, API server
// address and cluster network; the userspace datapath), the agent's DaemonSet and the controller's
// Deployment started by the kubelets from the image `make image` builds, imported into every node's
// containerd with the images of e2e/labimages. Pods of PodSpec run the lab's test pod image.

// ImagesDir is where the lab's images are built and kept between runs (under the repository root).
const ImagesDir = "_output/lab-images"

// ClusterDNSIP is the address kubelets give pods as their DNS server: the tenth of the service network
// (the address kubeadm gives kube-dns), for a cluster DNS a test deploys.
func (c *Cluster) ClusterDNSIP() string {
	ip, err := nthAddr(c.opts.ServiceCIDR, 10)
	if err != nil {
		return ""
	}
	return ip
}

// startKubelets is Start's second half with real kubelets.
func (c *Cluster) startKubelets(ctx context.Context) error {
	root, err := kubelab.RepoRoot()
	if err != nil {
		return err
	}
	kbin, err := kubelab.BinDir()
	if err != nil {
		return err
	}
	kubelet := filepath.Join(kbin, "kubelet")
	if _, err := os.Stat(kubelet); err != nil {
		return fmt.Errorf("cluster: no kubelet in %s: run `make k8s-bins`", kbin)
	}
	began := time.Now()
	var only []string
	if !c.opts.TestImages {
		only = []string{labimages.Pause, labimages.TestPod}
	}
	imgs, err := labimages.Build(ctx, labimages.Options{RepoRoot: root, OutDir: filepath.Join(root, ImagesDir), CoreDNS: c.opts.CoreDNS, Only: only,
		Log: func(f string, a ...any) { c.log.Debug(fmt.Sprintf(f, a...)) }})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	ofsdn, err := image.Build(ctx, image.Options{RepoRoot: root, OutDir: filepath.Join(root, ImagesDir, "ofsdn")})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c.Image = ofsdn.Ref
	tarballs := []string{ofsdn.Tarball}
	var ovsRef string
	if c.opts.ContainerOVS {
		ovs, err := image.BuildOVS(ctx, image.Options{RepoRoot: root, OutDir: filepath.Join(root, ImagesDir, "openvswitch")},
			filepath.Join(root, "_output", "debs"))
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		ovsRef = ovs.Ref
		tarballs = append(tarballs, ovs.Tarball)
	}
	for _, img := range imgs {
		tarballs = append(tarballs, img.Tarball)
	}
	c.log.Info("images built", "ofsdn", ofsdn.Ref, "lab", len(imgs), "took", time.Since(began).Round(time.Millisecond))

	if err := c.applyOverlay(ctx, ofsdn.Ref, ovsRef); err != nil {
		return err
	}
	ca := filepath.Join(c.Dir, "ca.crt")
	if err := os.WriteFile(ca, c.API.CACert(), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	errs := make([]error, len(c.Lab.Nodes))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, ln := range c.Lab.Nodes {
		dir := filepath.Join(ln.Dir, "k8s")
		n := &Node{Node: ln, kubeconfig: filepath.Join(dir, "kubelet.kubeconfig")}
		c.Nodes = append(c.Nodes, n)
		wg.Go(func() {
			errs[i] = func() error {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				creds, err := c.API.CertConfig("system:node:"+ln.Name, "system:nodes")
				if err != nil {
					return err
				}
				if err := kubenode.WriteKubeconfig(n.kubeconfig, creds); err != nil {
					return err
				}
				kn, err := kubenode.Start(ctx, kubenode.Config{Name: ln.Name, NetNS: ln.NetNS, IP: ln.IP, Dir: dir, KubeletBin: kubelet,
					Kubeconfig: n.kubeconfig, ClientCAFile: ca, ClusterDNS: []string{c.ClusterDNSIP()}, SandboxImage: labimages.Pause,
					Images: tarballs, Logger: c.log,
					// The node's Open vSwitch keeps its sockets in the lab node's directory, where the
					// lab's helpers look: the lab's own (host OVS), or deploy/'s DaemonSet's.
					Mounts: map[string]string{"/var/run/openvswitch": ln.Dir}})
				mu.Lock()
				n.Kube = kn
				mu.Unlock()
				if err != nil {
					return err
				}
				n.CNIConfDir, n.CNIBinDir = kn.HostDir("/etc/cni/net.d"), kn.HostDir("/opt/cni/bin")
				n.CNISocket, n.StateDir = filepath.Join(kn.HostDir("/var/run/ofsdn"), "cni-server.sock"), kn.HostDir("/var/lib/ofsdn")
				return nil
			}()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	return c.waitKubeletCluster(ctx)
}

// applyOverlay applies deploy/ through an overlay of the lab's, as README's Deploying section tells a
// user to: the image, the API server's real address, the cluster network of Options, and what the
// lab's nodes differ in from a host (the userspace datapath; extra agent flags of Options).
func (c *Cluster) applyOverlay(ctx context.Context, ref, ovsRef string) error {
	root, err := kubelab.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Dir, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	rel, err := filepath.Rel(dir, filepath.Join(root, "deploy")) // kustomize takes relative paths only
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	u, err := url.Parse(c.API.Server())
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	agent, err := AgentContainer(filepath.Join(root, "deploy", "agent", "daemonset.yaml"))
	if err != nil {
		return err
	}
	dp := -1
	for i, a := range agent.Args {
		if strings.HasPrefix(a, "--datapath-type=") {
			dp = i
		}
	}
	if dp < 0 {
		return fmt.Errorf("cluster: deploy/'s agent has no --datapath-type to patch")
	}
	// The lab's Open vSwitch runs in user space: its nodes have no kernel module. The uplink lingers
	// as briefly as the stand-in's agents' do (UplinkLinger), for the tests that switch encapsulation.
	agentPatch := fmt.Sprintf("      - {op: replace, path: /spec/template/spec/containers/0/args/%d, value: --datapath-type=netdev}\n", dp) +
		fmt.Sprintf("      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --uplink-linger=%s}\n", UplinkLinger)
	for _, a := range c.opts.AgentArgs {
		agentPatch += fmt.Sprintf("      - {op: add, path: /spec/template/spec/containers/0/args/-, value: %q}\n", a)
	}
	// Open vSwitch: the lab's own (host OVS: the DaemonSet goes, as README's host-OVS overlay does), or
	// deploy/'s DaemonSet on the userspace datapath, which must carry the node's address on a bridge.
	ovsPatch := `  - patch: |-
      $patch: delete
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: ofsdn-ovs, namespace: ofsdn}
`
	ovsImage := ""
	if ovsRef != "" {
		ds, err := readDaemonSet(filepath.Join(root, "deploy", "ovs", "daemonset.yaml"))
		if err != nil {
			return err
		}
		at := -1
		for i, a := range ds.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--datapath-type=") {
				at = i
			}
		}
		if at < 0 {
			return fmt.Errorf("cluster: deploy/ovs's DaemonSet has no --datapath-type to patch")
		}
		ovsPatch = fmt.Sprintf(`  - target: {kind: DaemonSet, name: ofsdn-ovs}
    patch: |-
      - {op: replace, path: /spec/template/spec/containers/0/args/%d, value: --datapath-type=netdev}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --uplink=%s}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --uplink-bridge=%s}
`, at, lab.Uplink, lab.UnderlayBridge)
		on, ot, _ := strings.Cut(ovsRef, ":")
		ovsImage = fmt.Sprintf("  - name: ofsdn/openvswitch\n    newName: %s\n    newTag: %q\n", on, ot)
	}
	name, tag, _ := strings.Cut(ref, ":")
	cn := func(key, value string) string {
		return fmt.Sprintf("      - {op: replace, path: /data/%s, value: %q}\n", key, value)
	}
	k := fmt.Sprintf(`# The lab's overlay of deploy/ (e2e/cluster, real kubelets).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: ofsdn/ofsdn
    newName: %s
    newTag: %q
%spatches:
%s
  - target: {kind: ConfigMap, name: ofsdn-apiserver}
    patch: |-
%s%s  - target: {kind: ConfigMap, name: ofsdn-cluster-network}
    patch: |-
%s%s%s%s%s%s  - target: {kind: DaemonSet, name: ofsdn-agent}
    patch: |-
%s`, rel, name, tag, ovsImage, ovsPatch, cn("host", u.Hostname()), cn("port", u.Port()),
		cn("clusterCIDRs", c.opts.ClusterCIDR), cn("hostSubnetLength", strconv.Itoa(c.opts.HostSubnetLength)),
		cn("serviceNetwork", c.opts.ServiceCIDR), cn("pluginMode", string(c.opts.Mode)), cn("encapsulation", string(c.opts.Encapsulation)),
		cn("mtu", strconv.Itoa(c.Lab.PodMTU())), agentPatch)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if out, err := c.API.Kubectl("apply", "--server-side", "-k", dir); err != nil {
		return fmt.Errorf("cluster: apply the lab's overlay of deploy/: %w\n%s\n%s", err, out, k)
	}
	return nil
}

// waitKubeletCluster waits until every node is Ready (its agent installed the CNI configuration), the
// agent's DaemonSet is ready on every node and the controller's Deployment has a ready replica.
func (c *Cluster) waitKubeletCluster(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	var why string
	err := proc.Until(ctx, 0, func() bool {
		why = c.kubeletClusterNotReady(ctx)
		return why == ""
	})
	if err != nil {
		return fmt.Errorf("cluster: not ready: %s: %w", why, err)
	}
	for _, n := range c.Nodes {
		c.kubeAgent(n)
	}
	return nil
}

// agentPod returns the node's running agent pod, or nil.
func (c *Cluster) agentPod(ctx context.Context, n *Node) *corev1.Pod {
	pods, err := c.Client.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name,
		LabelSelector: "app.kubernetes.io/name=ofsdn-agent"})
	if err != nil {
		return nil
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p
		}
	}
	return nil
}

// kubeAgent points a node's AgentPID and AgentLog at its agent's pod: the ofsdn-agent process in the
// pod's cgroup, and the container's log kubelet writes.
func (c *Cluster) kubeAgent(n *Node) {
	n.kubeAgentPID = func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p := c.agentPod(ctx, n)
		if p == nil {
			return 0
		}
		for _, pid := range n.Kube.PodPIDs(string(p.UID)) {
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "ofsdn-agent" {
				return pid
			}
		}
		return 0
	}
	if p := c.agentPod(context.Background(), n); p != nil {
		n.AgentLog = filepath.Join(n.Kube.HostDir("/var/log/pods"), fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), "agent", "0.log")
	}
}

// kubeletClusterNotReady says what is not ready yet, or "".
func (c *Cluster) kubeletClusterNotReady(ctx context.Context) string {
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Sprintf("node %s: %v", n.Name, err)
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status == corev1.ConditionTrue
				if !ready {
					return fmt.Sprintf("node %s not Ready: %s", n.Name, cond.Message)
				}
			}
		}
		if !ready {
			return fmt.Sprintf("node %s has no Ready condition", n.Name)
		}
	}
	ds, err := c.Client.AppsV1().DaemonSets(systemNamespace).Get(ctx, "ofsdn-agent", metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("agent DaemonSet: %v", err)
	}
	if int(ds.Status.NumberReady) < len(c.Nodes) {
		return fmt.Sprintf("agent DaemonSet: %d of %d ready", ds.Status.NumberReady, len(c.Nodes))
	}
	var dep *appsv1.Deployment
	if dep, err = c.Client.AppsV1().Deployments(systemNamespace).Get(ctx, "ofsdn-controller", metav1.GetOptions{}); err != nil {
		return fmt.Sprintf("controller Deployment: %v", err)
	}
	if dep.Status.ReadyReplicas < 1 {
		return "controller Deployment: no ready replica"
	}
	return ""
}

// kubeletPodSpec turns a PodSpec pod (image "ofsdn-testpod") into one a kubelet runs: the lab's test
// pod image, never pulled, serving on the pod's container ports as the stand-in runs it.
func kubeletPodSpec(spec *corev1.Pod) *corev1.Pod {
	spec = spec.DeepCopy()
	for i := range spec.Spec.Containers {
		ctr := &spec.Spec.Containers[i]
		if ctr.Image != "ofsdn-testpod" {
			continue
		}
		var tcp, udp, sctp []string
		for _, p := range ctr.Ports {
			port := strconv.Itoa(int(p.ContainerPort))
			switch p.Protocol {
			case corev1.ProtocolUDP:
				udp = append(udp, port)
			case corev1.ProtocolSCTP:
				sctp = append(sctp, port)
			default:
				tcp = append(tcp, port)
			}
		}
		ctr.Image, ctr.ImagePullPolicy = labimages.TestPod, corev1.PullNever
		ctr.Command = []string{"/ofsdn-testpod", "serve", "--name", spec.Namespace + "/" + spec.Name, "--tcp", strings.Join(tcp, ","),
			"--udp", strings.Join(udp, ","), "--sctp", strings.Join(sctp, ",")}
	}
	return spec
}

// attachPodNetNS names a kubelet's pod's network namespace as the stand-in names its pods' (so Probe,
// Ping and every test's `ip netns exec` reach it): `ip netns attach` to a process of the pod, found in
// the pod's cgroup. The lab removes the name with its other namespaces.
func (c *Cluster) attachPodNetNS(ctx context.Context, n *Node, pod *corev1.Pod, name string) error {
	pid, err := n.Kube.PodPID(string(pod.UID))
	if err != nil {
		return fmt.Errorf("cluster: pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	_ = exec.CommandContext(ctx, "ip", "netns", "del", name).Run() // an earlier pod of the same name
	if out, err := exec.CommandContext(ctx, "ip", "netns", "attach", name, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("cluster: pod %s/%s: ip netns attach: %w: %s", pod.Namespace, pod.Name, err, out)
	}
	return nil
}

// readDaemonSet reads a DaemonSet manifest.
func readDaemonSet(path string) (*appsv1.DaemonSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", path, err)
	}
	if len(ds.Spec.Template.Spec.Containers) == 0 {
		return nil, fmt.Errorf("cluster: %s has no container", path)
	}
	return &ds, nil
}

// nthAddr is the address n after the network address of an IPv4 cidr.
func nthAddr(cidr string, n int) (string, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return "", fmt.Errorf("cluster: service network %q: want an IPv4 CIDR", cidr)
	}
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String(), nil
}
