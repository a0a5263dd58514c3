// Package nodesim does for networking what kubelet does, for the lab's nodes (kubelet needs a CRI runtime,
// and there are no container images here): it registers the Node with its underlay address and keeps it
// Ready, watches the pods bound to it, creates each pod's network namespace, calls the CNI plugin through
// libcni with the installed conflist exactly as container runtimes do, runs the pod's process (the
// ofsdn-testpod server on its container ports, TCP, UDP and SCTP, and on the ports agnhost commands serve)
// inside the namespace, reports status.podIP and Running/Ready, serves the kubelet API's exec for
// `agnhost connect` (exec.go), and on deletion calls CNI DEL, removes the namespace and finishes the
// deletion.
package nodesim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Config configures one simulated node.
type Config struct {
	NodeName   string
	NodeIP     netip.Addr
	Client     kubernetes.Interface
	CNIConfDir string // where the agent installed its conflist
	CNIBinDir  string // where the plugin binary is
	CNICache   string // libcni's cache dir (per node)
	// PodBinary is ofsdn-testpod: each pod runs `PodBinary serve` in its namespace.
	PodBinary string
	// NetNSPrefix names the pods' network namespaces (the lab's prefix, for teardown by name).
	NetNSPrefix string
	// NodeNetNS is the node's own namespace (hostNetwork pods run there).
	NodeNetNS string
	Logger    klog.Logger
}

// Sim is a running node simulator.
type Sim struct {
	cfg  Config
	log  klog.Logger
	mu   sync.Mutex
	pods map[string]*simPod // by namespace/name
	// CNIAdd records CNI ADD latencies (for the lab's benchmarks).
	CNIAdd []time.Duration
}

type simPod struct {
	uid   string
	netns string
	ip    string
	proc  *exec.Cmd
	done  chan struct{} // the pod's process exited
	// Every pod event runs its own reconcile, so a deletion can be seen twice, or while the pod still
	// starts. started closes once startPod returned; the first teardown sets tearing, and the others
	// wait for tornDown, so the pod leaves the API only after its CNI DEL (as kubelet does).
	started  chan struct{}
	tearing  bool
	tornDown chan struct{}
}

// Start registers the node and starts watching its pods.
func Start(ctx context.Context, cfg Config) (*Sim, error) {
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	s := &Sim{cfg: cfg, log: cfg.Logger.WithName("nodesim").WithValues("node", cfg.NodeName), pods: map[string]*simPod{}}
	if err := s.register(ctx); err != nil {
		return nil, err
	}
	if cfg.NodeNetNS != "" {
		if err := s.serveExec(ctx); err != nil { // exec.go
			return nil, err
		}
	}
	go s.heartbeat(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { go s.reconcile(ctx, obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { go s.reconcile(ctx, obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				go s.teardown(context.WithoutCancel(ctx), p.Namespace, p.Name)
			}
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("nodesim %s: pod informer did not sync", cfg.NodeName)
	}
	return s, nil
}

func (s *Sim) register(ctx context.Context) error {
	// The well-known labels kubelet sets on its Node (ClusterNetworkPolicy nodes peers select by them).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName, Labels: map[string]string{"kubernetes.io/hostname": s.cfg.NodeName,
		corev1.LabelOSStable: "linux", corev1.LabelArchStable: runtime.GOARCH}}}
	if _, err := s.cfg.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("nodesim: register node %s: %w", s.cfg.NodeName, err)
	}
	return s.updateStatus(ctx)
}

// updateStatus writes the node's status as kubelet does, reading the node again when another writer
// (the controller, the agent) changed it in between, as kubelet's own status updates do.
func (s *Sim) updateStatus(ctx context.Context) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := s.cfg.Client.CoreV1().Nodes().Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: s.cfg.NodeIP.String()},
			{Type: corev1.NodeHostName, Address: s.cfg.NodeName}}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "ofsdn lab node simulator", LastHeartbeatTime: now, LastTransitionTime: now}}
		node.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: mustQuantity("250"), corev1.ResourceCPU: mustQuantity("8"), corev1.ResourceMemory: mustQuantity("16Gi")}
		node.Status.Allocatable = node.Status.Capacity
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = KubeletPort
		_, err = s.cfg.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("nodesim: node status of %s: %w", s.cfg.NodeName, err)
	}
	return nil
}

// heartbeat renews the node's lease and status as kubelet does, so the node stays Ready.
func (s *Sim) heartbeat(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		leases := s.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, s.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.cfg.NodeName), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now}},
				metav1.CreateOptions{})
		} else if err == nil {
			lease.Spec.RenewTime = &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			s.log.V(2).Info("lease renewal failed", "err", err)
		}
		if err := s.updateStatus(ctx); err != nil && ctx.Err() == nil {
			s.log.V(2).Info("status update failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// UnmanagedAnnotation marks a pod whose sandboxes a test drives itself through libcni, playing the
// runtime: the simulator leaves such a pod alone (it neither runs nor finishes it).
const UnmanagedAnnotation = "lab.ofsdn.io/unmanaged"

// HelloAnnotation makes a pod's process, instead of serving, send its first datagrams to the address
// the annotation names (HOST:PORT) the moment it starts, and exit (ofsdn-testpod hello).
const HelloAnnotation = "lab.ofsdn.io/hello"

// NetworksPort is where a lab pod answers on each of its Network interfaces (net1...), with sockets
// bound to the interface (testpod.ServeNetworks); eth0 serves the pod's container ports.
const NetworksPort = 8081

// NetNSName is the network namespace the simulator creates for a pod.
func NetNSName(prefix, namespace, name string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return prefix + "-p" + hex.EncodeToString(sum[:])[:10]
}

// reconcile starts a new pod or finishes a deleted one.
func (s *Sim) reconcile(ctx context.Context, pod *corev1.Pod) {
	key := pod.Namespace + "/" + pod.Name
	if _, unmanaged := pod.Annotations[UnmanagedAnnotation]; unmanaged {
		return
	}
	if pod.DeletionTimestamp != nil {
		s.teardown(ctx, pod.Namespace, pod.Name)
		// The node finishes the deletion, as kubelet does once the pod's containers are gone.
		zero := int64(0)
		err := s.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			s.log.Error(err, "finishing pod deletion", "pod", key)
		}
		return
	}
	s.mu.Lock()
	if existing, ok := s.pods[key]; ok && existing.uid == string(pod.UID) {
		s.mu.Unlock()
		return
	}
	sp := &simPod{uid: string(pod.UID), done: make(chan struct{}), started: make(chan struct{}), tornDown: make(chan struct{})}
	s.pods[key] = sp
	s.mu.Unlock()
	err := s.startPod(ctx, pod, sp)
	close(sp.started)
	if err != nil {
		s.log.Error(err, "pod start failed", "pod", key)
		s.teardown(ctx, pod.Namespace, pod.Name)
		s.setStatus(ctx, pod, "", err)
	}
}

func (s *Sim) startPod(ctx context.Context, pod *corev1.Pod, sp *simPod) error {
	var tcp, udp, sctp []string
	for _, c := range pod.Spec.Containers {
		t, u, sc := agnhostPorts(c)
		tcp, udp, sctp = append(tcp, t...), append(udp, u...), append(sctp, sc...)
		for _, p := range c.Ports {
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
	}
	// A port both declared and served by an agnhost command is served once.
	tcp, udp, sctp = uniq(tcp), uniq(udp), uniq(sctp)
	var netnsPath string
	if pod.Spec.HostNetwork {
		sp.ip = s.cfg.NodeIP.String()
		netnsPath = s.cfg.NodeNetNS
	} else {
		sp.netns = NetNSName(s.cfg.NetNSPrefix, pod.Namespace, pod.Name)
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", sp.netns).CombinedOutput(); err != nil && !strings.Contains(string(out), "File exists") {
			return fmt.Errorf("create netns %s: %v: %s", sp.netns, err, out)
		}
		netnsPath = "/var/run/netns/" + sp.netns
		start := time.Now()
		res, err := s.cniAdd(ctx, pod, netnsPath)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.CNIAdd = append(s.CNIAdd, time.Since(start))
		s.mu.Unlock()
		if len(res.IPs) == 0 {
			return errors.New("CNI ADD returned no IP")
		}
		sp.ip = res.IPs[0].Address.IP.String()
	}
	args := []string{"serve", "--name", pod.Namespace + "/" + pod.Name, "--tcp", strings.Join(tcp, ","), "--udp", strings.Join(udp, ","),
		"--sctp", strings.Join(sctp, ","), "--networks", strconv.Itoa(NetworksPort)}
	if dst, ok := pod.Annotations[HelloAnnotation]; ok {
		args = []string{"hello", "--name", pod.Namespace + "/" + pod.Name, dst}
	}
	var cmd *exec.Cmd
	if netnsPath != "" {
		nsName := filepath.Base(netnsPath)
		cmd = exec.Command("ip", append([]string{"netns", "exec", nsName, s.cfg.PodBinary}, args...)...)
	} else {
		cmd = exec.Command(s.cfg.PodBinary, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pod process: %w", err)
	}
	sp.proc = cmd
	go func() { _ = cmd.Wait(); close(sp.done) }()
	s.setStatus(ctx, pod, sp.ip, nil)
	return nil
}

func uniq(ports []string) []string {
	slices.Sort(ports)
	return slices.Compact(ports)
}

// agnhostPorts are the ports an agnhost container of the upstream suites serves besides those it
// declares: `serve-hostname --tcp|--udp --port N`, and porter's SERVE_PORT_N / SERVE_SCTP_PORT_N.
func agnhostPorts(c corev1.Container) (tcp, udp, sctp []string) {
	words := strings.Fields(strings.Join(append(slices.Clone(c.Command), c.Args...), " "))
	if slices.Contains(words, "serve-hostname") {
		for i, w := range words {
			port, ok := strings.CutPrefix(w, "--port=")
			if !ok && w == "--port" && i+1 < len(words) {
				port, ok = words[i+1], true
			}
			if _, err := strconv.Atoi(port); !ok || err != nil {
				continue
			}
			if slices.Contains(words, "--udp") {
				udp = append(udp, port)
			} else {
				tcp = append(tcp, port)
			}
		}
	}
	if slices.Contains(words, "porter") {
		for _, e := range c.Env {
			if p, ok := strings.CutPrefix(e.Name, "SERVE_SCTP_PORT_"); ok {
				sctp = append(sctp, p)
			} else if p, ok := strings.CutPrefix(e.Name, "SERVE_PORT_"); ok {
				tcp = append(tcp, p)
			}
		}
	}
	return tcp, udp, sctp
}

func (s *Sim) cniList() (*libcni.NetworkConfigList, *libcni.CNIConfig, error) {
	files, err := libcni.ConfFiles(s.cfg.CNIConfDir, []string{".conflist"})
	if err != nil || len(files) == 0 {
		return nil, nil, fmt.Errorf("no CNI conflist in %s (is the agent running?): %v", s.cfg.CNIConfDir, err)
	}
	sort.Strings(files)
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		return nil, nil, err
	}
	return list, libcni.NewCNIConfigWithCacheDir([]string{s.cfg.CNIBinDir}, s.cfg.CNICache, nil), nil
}

func (s *Sim) runtimeConf(namespace, name, uid, netnsPath string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: sandboxID(namespace, name, uid), NetNS: netnsPath, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", sandboxID(namespace, name, uid)}, {"K8S_POD_UID", uid}}}
}

func sandboxID(namespace, name, uid string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name + "/" + uid))
	return hex.EncodeToString(sum[:])[:32]
}

func (s *Sim) cniAdd(ctx context.Context, pod *corev1.Pod, netnsPath string) (*current.Result, error) {
	list, c, err := s.cniList()
	if err != nil {
		return nil, err
	}
	r, err := c.AddNetworkList(ctx, list, s.runtimeConf(pod.Namespace, pod.Name, string(pod.UID), netnsPath))
	if err != nil {
		return nil, fmt.Errorf("CNI ADD: %w", err)
	}
	return current.NewResultFromResult(r)
}

// teardown stops a pod's process, calls CNI DEL and removes its namespace.
func (s *Sim) teardown(ctx context.Context, namespace, name string) {
	key := namespace + "/" + name
	s.mu.Lock()
	sp, ok := s.pods[key]
	if !ok {
		s.mu.Unlock()
		return
	}
	if sp.tearing {
		s.mu.Unlock()
		select {
		case <-sp.tornDown:
		case <-ctx.Done():
		}
		return
	}
	sp.tearing = true
	s.mu.Unlock()
	defer close(sp.tornDown)
	select {
	case <-sp.started: // a start still running finishes first, so its ADD is undone too
	case <-ctx.Done():
		return
	}
	if sp.proc != nil && sp.proc.Process != nil {
		_ = syscall.Kill(-sp.proc.Process.Pid, syscall.SIGKILL)
		<-sp.done
	}
	s.cleanupNetNS(ctx, namespace, name, sp)
	s.mu.Lock()
	if s.pods[key] == sp {
		delete(s.pods, key)
	}
	s.mu.Unlock()
}

func (s *Sim) cleanupNetNS(ctx context.Context, namespace, name string, sp *simPod) {
	if sp.netns == "" {
		return
	}
	if list, c, err := s.cniList(); err == nil {
		if err := c.DelNetworkList(ctx, list, s.runtimeConf(namespace, name, sp.uid, "/var/run/netns/"+sp.netns)); err != nil {
			s.log.Error(err, "CNI DEL", "pod", namespace+"/"+name)
		}
	}
	_ = exec.Command("ip", "netns", "del", sp.netns).Run()
}

func (s *Sim) setStatus(ctx context.Context, pod *corev1.Pod, ip string, startErr error) {
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := s.cfg.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return
		}
		now := metav1.Now()
		if startErr != nil {
			cur.Status.Phase = corev1.PodPending
			cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "NetworkSetupFailed",
				Message: startErr.Error(), LastTransitionTime: now}}
		} else {
			cur.Status.Phase = corev1.PodRunning
			cur.Status.PodIP, cur.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
			cur.Status.HostIP, cur.Status.HostIPs = s.cfg.NodeIP.String(), []corev1.HostIP{{IP: s.cfg.NodeIP.String()}}
			cur.Status.StartTime = &now
			cur.Status.Conditions = []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
			var cs []corev1.ContainerStatus
			for _, c := range cur.Spec.Containers {
				cs = append(cs, corev1.ContainerStatus{Name: c.Name, Ready: true, Started: ptr.To(true), Image: c.Image,
					State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
			}
			cur.Status.ContainerStatuses = cs
		}
		_, err = s.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) {
			return
		}
	}
}

// Stop tears down every pod this simulator started (processes, CNI DEL, namespaces).
func (s *Sim) Stop(ctx context.Context) {
	s.mu.Lock()
	keys := make([]string, 0, len(s.pods))
	for k := range s.pods {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		s.teardown(ctx, ns, name)
	}
}

// RuntimeConf returns the libcni runtime configuration the simulator used for a running pod's sandbox,
// for tests that call the plugin for that sandbox themselves.
func (s *Sim) RuntimeConf(namespace, name string) (*libcni.RuntimeConf, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.pods[namespace+"/"+name]
	if !ok || sp.netns == "" || sp.tearing {
		return nil, false
	}
	return s.runtimeConf(namespace, name, sp.uid, "/var/run/netns/"+sp.netns), true
}

// CNIAddLatencies returns the CNI ADD latencies recorded so far, in order.
func (s *Sim) CNIAddLatencies() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.CNIAdd...)
}

// Running lists the pods the simulator runs (not those being torn down), with their IPs.
func (s *Sim) Running() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.pods))
	for k, p := range s.pods {
		if !p.tearing {
			out[k] = p.ip
		}
	}
	return out
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
