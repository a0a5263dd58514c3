//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"

	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/nodesim"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cniRuntime plays a node's container runtime: it calls the installed plugin through libcni with the
// conflist the agent wrote, for sandboxes the test makes itself.
type cniRuntime struct {
	n    *cluster.Node
	list *libcni.NetworkConfigList
	conf *libcni.CNIConfig
}

func newCNIRuntime(t *testing.T, n *cluster.Node) *cniRuntime {
	t.Helper()
	list, err := libcni.ConfListFromFile(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	return &cniRuntime{n: n, list: list, conf: libcni.NewCNIConfigWithCacheDir([]string{n.CNIBinDir}, t.TempDir(), nil)}
}

// sandbox is one pod sandbox the test plays the runtime for.
type sandbox struct {
	ID, NetNS           string // container ID; netns name
	Namespace, Pod, UID string
}

func (s *sandbox) rt() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: s.ID, NetNS: "/var/run/netns/" + s.NetNS, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", s.Namespace}, {"K8S_POD_NAME", s.Pod},
			{"K8S_POD_INFRA_CONTAINER_ID", s.ID}, {"K8S_POD_UID", s.UID}}}
}

// newSandbox makes a sandbox's network namespace (named with the lab's prefix, so sweeps find it).
func newSandbox(n *cluster.Node, pod *corev1.Pod) (*sandbox, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	s := &sandbox{ID: fmt.Sprintf("%x", b), Namespace: pod.Namespace, Pod: pod.Name, UID: string(pod.UID)}
	s.NetNS = lc.Lab.Prefix + "-" + n.Name + "-s" + s.ID[:10]
	if out, err := exec.Command("ip", "netns", "add", s.NetNS).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("netns %s: %v: %s", s.NetNS, err, out)
	}
	return s, nil
}

func (s *sandbox) removeNetNS() { _ = exec.Command("ip", "netns", "del", s.NetNS).Run() }

func (r *cniRuntime) add(ctx context.Context, s *sandbox) (*current.Result, error) {
	res, err := r.conf.AddNetworkList(ctx, r.list, s.rt())
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

func (r *cniRuntime) del(ctx context.Context, s *sandbox) error {
	return r.conf.DelNetworkList(ctx, r.list, s.rt())
}

// unmanagedPods creates pods bound to n that the node simulator leaves to the test (the test is their
// runtime), and deletes them when the test ends.
func unmanagedPods(t *testing.T, ctx context.Context, namespace string, n *cluster.Node, names ...string) []*corev1.Pod {
	t.Helper()
	if err := lc.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	var out []*corev1.Pod
	for _, name := range names {
		spec := cluster.PodSpec(namespace, name, n.Name)
		spec.Annotations = map[string]string{nodesim.UnmanagedAnnotation: "true"}
		p, err := lc.Client.CoreV1().Pods(namespace).Create(ctx, spec, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	t.Cleanup(func() {
		zero := int64(0)
		for _, name := range names {
			err := lc.Client.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Logf("delete pod %s/%s: %v", namespace, name, err)
			}
		}
	})
	return out
}

// leaks counts what a node still holds for a namespace's pods, each from the component that holds it.
type leaks struct {
	Reservations   int // address store files naming the namespace
	Ports          int // OVS ports whose external_ids name the namespace
	PodFlows       int // flows whose cookie says category pod and one of the pods as owner
	HostVeths      int // host ends (by their derived names) of the sandboxes given
	PendingDeletes int // DELs the plugin left for the agent that it has not processed yet
}

func (l leaks) zero() bool { return l == leaks{} }

func (l leaks) String() string {
	return fmt.Sprintf("reservations=%d ports=%d podFlows=%d hostVeths=%d pendingDeletes=%d", l.Reservations, l.Ports,
		l.PodFlows, l.HostVeths, l.PendingDeletes)
}

var vethName = regexp.MustCompile(`^\d+: ([^:@]+)[@:]`)

func census(t *testing.T, ctx context.Context, n *cluster.Node, namespace string, pods []*corev1.Pod, sandboxes []*sandbox) leaks {
	t.Helper()
	var l leaks
	dir := filepath.Join(n.StateDir, "ipam")
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "last" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // released meanwhile
		}
		if f := strings.Split(string(data), "\n"); len(f) > 2 && f[2] == namespace {
			l.Reservations++
		}
	}
	out, err := n.Vsctl(ctx, "--format=json", "--columns=name,external_ids", "list", "Port")
	if err != nil {
		t.Fatalf("list ports on %s: %v", n.Name, err)
	}
	var table struct{ Data [][]json.RawMessage }
	if err := json.Unmarshal([]byte(out), &table); err != nil {
		t.Fatalf("ports: %v: %s", err, out)
	}
	for _, row := range table.Data {
		var ids []json.RawMessage // ["map", [[k, v], ...]]
		var pairs [][2]string
		if len(row) == 2 && json.Unmarshal(row[1], &ids) == nil && len(ids) == 2 && json.Unmarshal(ids[1], &pairs) == nil {
			for _, kv := range pairs {
				if kv[0] == "ofsdn/pod-namespace" && kv[1] == namespace {
					l.Ports++
				}
			}
		}
	}
	owners := map[uint32]bool{}
	for _, p := range pods {
		owners[pipeline.PodOwner(p.Namespace, p.Name).Hash()] = true
	}
	dump, err := n.Ofctl(ctx, "dump-flows", "br0", "--no-stats")
	if err != nil {
		t.Fatalf("dump-flows on %s: %v", n.Name, err)
	}
	for _, m := range cookieRE.FindAllStringSubmatch(dump, -1) {
		v, err := strconv.ParseUint(m[1], 16, 64)
		if err == nil && reconcile.Cookie(v).Category() == reconcile.CategoryPod && owners[reconcile.Cookie(v).OwnerHash()] {
			l.PodFlows++
		}
	}
	names := map[string]bool{}
	for _, s := range sandboxes {
		names[podnet.HostVethName(s.ID, "eth0")] = true
	}
	links, err := exec.CommandContext(ctx, "ip", "-n", n.NetNS, "-o", "link", "show", "type", "veth").CombinedOutput()
	if err != nil {
		t.Fatalf("links on %s: %v: %s", n.Name, err, links)
	}
	for _, line := range strings.Split(string(links), "\n") {
		if m := vethName.FindStringSubmatch(line); m != nil && names[m[1]] {
			l.HostVeths++
		}
	}
	if pending := pendingDeletesDir(t, n); pending != "" {
		files, _ := filepath.Glob(filepath.Join(pending, "*.json"))
		l.PendingDeletes = len(files)
	}
	return l
}

// pendingDeletesDir is where the installed conflist tells the plugin to leave DELs the agent could not take.
func pendingDeletesDir(t *testing.T, n *cluster.Node) string {
	data, err := os.ReadFile(filepath.Join(n.CNIConfDir, "80-ofsdn.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			PendingDeletesDir string `json:"pendingDeletesDir"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil || len(conf.Plugins) == 0 {
		t.Fatalf("conflist: %v: %s", err, data)
	}
	return conf.Plugins[0].PendingDeletesDir
}

// ensureAgent starts a node's agent if it is not running and waits until it serves CNI again.
func ensureAgent(t *testing.T, ctx context.Context, n *cluster.Node, r *cniRuntime) {
	t.Helper()
	if n.AgentPID() == 0 {
		if err := lc.StartAgent(n); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := r.conf.GetStatusNetworkList(ctx, r.list)
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the agent on %s does not serve CNI: %v\n%s", n.Name, err, lc.Logs(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cniCode is a CNI error's code, 0 for no CNI error.
func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// TestCNIChurnWithAgentKills runs hundreds of sandboxes through ADD and DEL on one node, as a runtime
// does (a DEL after every ADD, failed or not, repeated while it fails and never again once it succeeded),
// while the agent is killed with SIGKILL at random moments: in the middle of ADDs, during its start-up,
// and for a while at a time, so that DELs arrive while no agent runs. Half the sandboxes keep their
// network namespace until the end, as a runtime may remove it long after DEL. Once the agent runs again,
// nothing of any sandbox may remain: no address, OVS port, pod flow, host veth or unprocessed DEL.
func TestCNIChurnWithAgentKills(t *testing.T) {
	needsStandIn(t, "kills and restarts the agent's process between CNI calls; there the agent is a DaemonSet pod kubelet restarts on its own")
	ctx := ctxT(t, 10*time.Minute)
	n := lc.Nodes[2]
	const namespace, workers, cycles, minKills = "e2e-churn", 4, 300, 25
	var names []string
	for i := range workers {
		names = append(names, "churn-"+strconv.Itoa(i))
	}
	pods := unmanagedPods(t, ctx, namespace, n, names...)
	r := newCNIRuntime(t, n)
	var (
		mu        sync.Mutex
		sandboxes []*sandbox
		live      = map[string]string{} // IP → sandbox, between a successful ADD and its DEL
		kept      []*sandbox            // netns removed only at the end
		codes     = map[uint]int{}      // ADD failures by CNI code
		addsOK    atomic.Int64
		addsCut   atomic.Int64 // ADDs whose agent died while serving them
		delRetry  atomic.Int64
		done      atomic.Int64
		kills     atomic.Int64
		downKills atomic.Int64
		addStart  = make(chan struct{}, 1)
		stopChaos = make(chan struct{})
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range sandboxes {
			s.removeNetNS()
		}
	})
	t.Cleanup(func() {
		if n.AgentPID() == 0 {
			_ = lc.StartAgent(n)
		}
	})

	// The chaos: kill -9 at random moments; half the kills aim at an ADD in flight.
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for {
			if mathrand.IntN(2) == 0 {
				select {
				case <-addStart:
					time.Sleep(time.Duration(mathrand.IntN(60)) * time.Millisecond)
				case <-time.After(2 * time.Second):
				case <-stopChaos:
					return
				}
			} else {
				select {
				case <-time.After(time.Duration(200+mathrand.IntN(1300)) * time.Millisecond):
				case <-stopChaos:
					return
				}
			}
			lc.StopAgent(n, true)
			kills.Add(1)
			if mathrand.IntN(2) == 0 { // stay down a while: ADDs fail, DELs find no agent
				downKills.Add(1)
				time.Sleep(time.Duration(300+mathrand.IntN(1200)) * time.Millisecond)
			}
			if err := lc.StartAgent(n); err != nil {
				t.Errorf("restart agent: %v", err)
				return
			}
			// Sometimes the next kill lands while the agent starts (restoring), sometimes after.
			time.Sleep(time.Duration(100+mathrand.IntN(1500)) * time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for (done.Add(1) <= cycles || kills.Load() < minKills) && ctx.Err() == nil {
				s, err := newSandbox(n, pods[w])
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sandboxes = append(sandboxes, s)
				mu.Unlock()
				select {
				case addStart <- struct{}{}:
				default:
				}
				res, err := r.add(ctx, s)
				if err == nil {
					addsOK.Add(1)
					ip := res.IPs[0].Address.IP.String()
					mu.Lock()
					if other, dup := live[ip]; dup {
						t.Errorf("%s got %s, which %s still holds", s.ID, ip, other)
					}
					live[ip] = s.ID
					mu.Unlock()
				} else {
					mu.Lock()
					codes[cniCode(err)]++
					mu.Unlock()
					if msg := err.Error(); strings.Contains(msg, "went away") || strings.Contains(msg, "closed the connection") ||
						strings.Contains(msg, "connection reset") {
						addsCut.Add(1)
					}
					// A runtime backs off before it tries a pod's sandbox again.
					time.Sleep(time.Duration(50+mathrand.IntN(200)) * time.Millisecond)
				}
				// The runtime's DEL: after any ADD, until it succeeds once.
				for {
					err := r.del(ctx, s)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						t.Errorf("DEL %s never succeeded: %v", s.ID, err)
						return
					}
					delRetry.Add(1)
					time.Sleep(200 * time.Millisecond)
				}
				if res != nil {
					mu.Lock()
					delete(live, res.IPs[0].Address.IP.String())
					mu.Unlock()
				}
				if mathrand.IntN(2) == 0 {
					s.removeNetNS()
				} else {
					mu.Lock()
					kept = append(kept, s)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(stopChaos)
	<-chaosDone
	ensureAgent(t, ctx, n, r)
	t.Logf("%d sandboxes: %d ADDs succeeded, ADD failures by CNI code %v (%d cut by a kill), %d DEL retries; %d agent kills (%d left it down for a while)",
		len(sandboxes), addsOK.Load(), codes, addsCut.Load(), delRetry.Load(), kills.Load(), downKills.Load())

	var got leaks
	deadline := time.Now().Add(45 * time.Second)
	for {
		got = census(t, ctx, n, namespace, pods, sandboxes)
		if got.zero() || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if !got.zero() {
		t.Fatalf("after every sandbox's DEL succeeded and the agent runs again, node %s still holds: %s (%d netns kept)\n%s",
			n.Name, got, len(kept), lc.Logs(40))
	}
	t.Logf("nothing left: %s", got)
}

// pingAt pings dst from a pod's namespace every interval, count times; wait reports what came back.
func pingAt(t *testing.T, fromNetNS string, dst string, count int, interval time.Duration) *pinger {
	p := &pinger{cmd: exec.Command("ip", "netns", "exec", fromNetNS, "ping", "-n", "-q", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64),
		"-W", "1", "-c", strconv.Itoa(count), dst)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// attachmentOf is what identifies a running pod's attachment: its OVS port number and the ifindexes of
// both veth ends. An ADD that recreates anything changes it.
func attachmentOf(t *testing.T, ctx context.Context, n *cluster.Node, rt *libcni.RuntimeConf) string {
	t.Helper()
	host := podnet.HostVethName(rt.ContainerID, rt.IfName)
	ofport, err := n.Vsctl(ctx, "get", "Interface", host, "ofport")
	if err != nil {
		t.Fatal(err)
	}
	hostLink, err := exec.CommandContext(ctx, "ip", "-n", n.NetNS, "-o", "link", "show", host).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, hostLink)
	}
	podLink, err := exec.CommandContext(ctx, "ip", "-n", filepath.Base(rt.NetNS), "-o", "link", "show", rt.IfName).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, podLink)
	}
	return fmt.Sprintf("ofport %s, host end %s, pod end %s", strings.TrimSpace(ofport), strings.Fields(string(hostLink))[0], strings.Fields(string(podLink))[0])
}

// TestCNIRepeatedAddUnderTraffic repeats the ADD of a running pod's sandbox, as a runtime that timed out
// may, while two pods ping it 100 times a second: the ADD answers with the pod's own address, nothing of
// the attachment is recreated, and no ping is lost. ADDs of the sandbox in another netns or with a second
// interface are refused with code 4, harmlessly too.
func TestCNIRepeatedAddUnderTraffic(t *testing.T) {
	needsStandIn(t, "calls the CNI plugin itself as a runtime for sandboxes of its own; there containerd owns the sandboxes")
	ctx := ctxT(t, 5*time.Minute)
	n1, n2 := lc.Nodes[0], lc.Nodes[1]
	pods := runPods(t, ctx, "rep", []string{"e2e-repeat"}, []*cluster.Node{n1, n2})
	target, remote := pods[0], pods[1] // rep-<node1>, rep-<node2>
	local, err := lc.RunPod(ctx, cluster.PodSpec("e2e-repeat", "rep2-"+n1.Name, n1.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), local.Namespace, local.Name) })
	rt, ok := n1.Sim.RuntimeConf(target.Namespace, target.Name)
	if !ok {
		t.Fatalf("no sandbox of %s on %s", target.Key(), n1.Name)
	}
	r := newCNIRuntime(t, n1)
	before := attachmentOf(t, ctx, n1, rt)
	const count, every = 600, 10 * time.Millisecond
	pingers := []*pinger{pingAt(t, remote.NetNS, target.IP.String(), count, every), pingAt(t, local.NetNS, target.IP.String(), count, every)}
	time.Sleep(time.Second)
	for i := range 5 {
		res, err := r.conf.AddNetworkList(ctx, r.list, rt)
		if err != nil {
			t.Fatalf("repeated ADD %d: %v", i, err)
		}
		got, err := current.NewResultFromResult(res)
		if err != nil || len(got.IPs) != 1 || got.IPs[0].Address.IP.String() != target.IP.String() {
			t.Fatalf("repeated ADD %d answered %+v (%v), want the pod's address %s", i, got, err, target.IP)
		}
		time.Sleep(300 * time.Millisecond)
	}
	elsewhere := *rt
	elsewhere.NetNS = "/var/run/netns/" + newNetNS(t, n1, "rep-elsewhere")
	if _, err := r.conf.AddNetworkList(ctx, r.list, &elsewhere); cniCode(err) != 4 || !strings.Contains(err.Error(), "CNI_NETNS") {
		t.Errorf("ADD of the sandbox in another netns: %v, want code 4 naming CNI_NETNS", err)
	}
	eth1 := *rt
	eth1.IfName = "eth1"
	if _, err := r.conf.AddNetworkList(ctx, r.list, &eth1); cniCode(err) != 4 || !strings.Contains(err.Error(), "CNI_IFNAME") {
		t.Errorf("ADD of a second interface: %v, want code 4 naming CNI_IFNAME", err)
	}
	for _, p := range pingers {
		if sent, got, out := p.wait(); sent < count || got != sent {
			t.Errorf("pings to %s through the repeated ADDs: %d sent, %d received\n%s", target.Key(), sent, got, out)
		}
	}
	if after := attachmentOf(t, ctx, n1, rt); after != before {
		t.Errorf("the repeated ADDs changed the attachment: %s, was %s", after, before)
	}
}

// newNetNS makes a lab-prefixed network namespace that the test's cleanup removes.
func newNetNS(t *testing.T, n *cluster.Node, suffix string) string {
	t.Helper()
	name := lc.Lab.Prefix + "-" + n.Name + "-" + suffix
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("netns %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// TestCNIRefusesForeignInterface: a sandbox whose netns already holds an eth0 ofsdn did not make (a veth
// with an address) gets code 4 naming CNI_IFNAME, and its eth0 stays as it was; the DEL that follows the
// failed ADD succeeds and leaves nothing behind.
func TestCNIRefusesForeignInterface(t *testing.T) {
	needsStandIn(t, "calls the CNI plugin itself as a runtime for sandboxes of its own; there containerd owns the sandboxes")
	ctx := ctxT(t, 2*time.Minute)
	n := lc.Nodes[1]
	const namespace = "e2e-foreign"
	pods := unmanagedPods(t, ctx, namespace, n, "foreign")
	r := newCNIRuntime(t, n)
	s, err := newSandbox(n, pods[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.removeNetNS)
	peer := newNetNS(t, n, "foreign-peer")
	for _, args := range [][]string{
		{"-n", s.NetNS, "link", "add", "eth0", "type", "veth", "peer", "name", "p0", "netns", peer},
		{"-n", s.NetNS, "addr", "add", "203.0.113.5/24", "dev", "eth0"},
		{"-n", s.NetNS, "link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	show := func() string {
		out, _ := exec.Command("ip", "-n", s.NetNS, "-o", "addr", "show", "eth0").CombinedOutput()
		return string(out)
	}
	before := show()
	_, err = r.add(ctx, s)
	if cniCode(err) != 4 || !strings.Contains(err.Error(), "CNI_IFNAME=eth0") || !strings.Contains(err.Error(), "not created by ofsdn") {
		t.Errorf("ADD into a netns with a foreign eth0: %v, want code 4 saying CNI_IFNAME=eth0 is not ofsdn's", err)
	}
	if err := r.del(ctx, s); err != nil {
		t.Errorf("DEL after the refused ADD: %v", err)
	}
	if after := show(); after != before || !strings.Contains(after, "203.0.113.5/24") {
		t.Errorf("the foreign eth0 changed:\n%s\nwas:\n%s", after, before)
	}
	if got := census(t, ctx, n, namespace, pods, []*sandbox{s}); !got.zero() {
		t.Errorf("the refused ADD left %s", got)
	}
}

// TestCNIFrozenAgent freezes an agent (SIGSTOP): STATUS answers 50 and ADD 11 within seconds, not at the
// runtime's deadline; DELs succeed, left for the agent, which serves them once it thaws and drops the
// requests their plugins gave up on.
func TestCNIFrozenAgent(t *testing.T) {
	needsStandIn(t, "freezes the agent's process and keeps it down; there the agent is a DaemonSet pod kubelet restarts on its own")
	ctx := ctxT(t, 5*time.Minute)
	n := lc.Nodes[1]
	const namespace = "e2e-frozen"
	pods := unmanagedPods(t, ctx, namespace, n, "fz-a", "fz-b")
	r := newCNIRuntime(t, n)
	a, err := newSandbox(n, pods[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.removeNetNS)
	b, err := newSandbox(n, pods[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.removeNetNS)
	if _, err := r.add(ctx, a); err != nil {
		t.Fatal(err)
	}
	pid := n.AgentPID()
	if pid == 0 {
		t.Fatal("no agent")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)

	// Bounds: the plugin's budgets (STATUS 5 s; connect 2 s + accept 5 s) plus exec'ing it, generously.
	for _, step := range []struct {
		name  string
		call  func() error
		code  uint
		bound time.Duration
	}{
		{"STATUS", func() error { return r.conf.GetStatusNetworkList(ctx, r.list) }, 50, 10 * time.Second},
		{"ADD", func() error { _, err := r.add(ctx, b); return err }, 11, 15 * time.Second},
		{"DEL of the failed ADD", func() error { return r.del(ctx, b) }, 0, 15 * time.Second},
		{"DEL of the attached sandbox", func() error { return r.del(ctx, a) }, 0, 15 * time.Second},
	} {
		start := time.Now()
		err := step.call()
		took := time.Since(start)
		t.Logf("%s with the agent frozen: %v after %s", step.name, err, took.Round(time.Millisecond))
		if cniCode(err) != step.code || (step.code == 0) != (err == nil) {
			t.Errorf("%s with the agent frozen: %v, want code %d", step.name, err, step.code)
		}
		if took > step.bound {
			t.Errorf("%s with the agent frozen took %s, want within %s", step.name, took, step.bound)
		}
	}
	if got := census(t, ctx, n, namespace, pods, []*sandbox{a, b}); got.PendingDeletes != 2 {
		t.Errorf("with the agent frozen the node holds %s, want the 2 DELs pending", got)
	}
	thaw()
	var got leaks
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = census(t, ctx, n, namespace, pods, []*sandbox{a, b})
		if got.zero() || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !got.zero() {
		t.Fatalf("after the agent thawed the node holds %s\n%s", got, lc.Logs(40))
	}
	if log, err := os.ReadFile(n.AgentLog); err != nil || !strings.Contains(string(log), "CNI request dropped") {
		t.Errorf("the thawed agent did not drop the requests whose plugins left (%v)", err)
	}
	// And it serves again.
	c, err := newSandbox(n, pods[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.removeNetNS)
	if _, err := r.add(ctx, c); err != nil {
		t.Fatalf("ADD after the agent thawed: %v", err)
	}
	if err := r.del(ctx, c); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreReleasesWhatIsGone: what became stale while an agent was down — a sandbox replaced by a
// newer one of the same pod, a pod deleted from the API without its DEL — is released once it starts
// (the deleted pod's once it has been missing for the agent's grace, 2 minutes after its ADD: a static
// pod's mirror appears late), and the pods that live on keep their connectivity.
func TestRestoreReleasesWhatIsGone(t *testing.T) {
	needsStandIn(t, "stops the agent's process while it changes sandboxes behind its back; there kubelet restarts it on its own")
	ctx := ctxT(t, 6*time.Minute)
	n := lc.Nodes[2]
	const namespace, absentGrace = "e2e-restore", absentPodGrace // the lab agents' --absent-pod-grace
	pods := unmanagedPods(t, ctx, namespace, n, "keep", "gone", "two")
	r := newCNIRuntime(t, n)
	var all []*sandbox
	add := func(pod *corev1.Pod) (*sandbox, *current.Result) {
		t.Helper()
		s, err := newSandbox(n, pod)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.removeNetNS)
		all = append(all, s)
		res, err := r.add(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		return s, res
	}
	began := time.Now()
	gone, _ := add(pods[1])
	keep, keepRes := add(pods[0])
	older, _ := add(pods[2])
	newer, _ := add(pods[2])
	client := runPods(t, ctx, "rsc", []string{namespace}, lc.Nodes[:1])[0]
	keepIP := netip.MustParseAddr(keepRes.IPs[0].Address.IP.String())
	if !client.Ping(ctx, keepIP) {
		t.Fatalf("%s does not reach the kept sandbox at %s", client.Key(), keepIP)
	}

	lc.StopAgent(n, true)
	zero := int64(0)
	if err := lc.Client.CoreV1().Pods(namespace).Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartAgent(n); err != nil {
		t.Fatal(err)
	}
	ensureAgent(t, ctx, n, r)
	veths := func(s *sandbox) int { return census(t, ctx, n, namespace, pods, []*sandbox{s}).HostVeths }
	for _, tc := range []struct {
		s    *sandbox
		want int
	}{{keep, 1}, {older, 0}, {newer, 1}} {
		if got := veths(tc.s); got != tc.want {
			t.Errorf("after the restart, sandbox %s of %s has %d host veths, want %d", tc.s.ID, tc.s.Pod, got, tc.want)
		}
	}
	if !client.Ping(ctx, keepIP) {
		t.Errorf("the kept sandbox lost connectivity across the restart")
	}
	if time.Since(began) < absentGrace-10*time.Second && veths(gone) != 1 {
		t.Errorf("the deleted pod's sandbox was released within the grace after its ADD")
	}
	deadline := began.Add(absentGrace + 30*time.Second)
	for veths(gone) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted pod's sandbox is still attached %s after its ADD: %s", time.Since(began).Round(time.Second),
				census(t, ctx, n, namespace, pods, []*sandbox{gone}))
		}
		time.Sleep(time.Second)
	}
	t.Logf("the deleted pod's sandbox was released %s after its ADD", time.Since(began).Round(time.Second))
	if got := census(t, ctx, n, namespace, pods, all); got.Reservations != 2 || got.Ports != 2 {
		t.Errorf("the node holds %s, want the reservations and ports of keep and the newer sandbox of two", got)
	}
	for _, s := range []*sandbox{keep, newer, gone, older} { // the runtime's DELs, late
		if err := r.del(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if got := census(t, ctx, n, namespace, pods, all); !got.zero() {
		t.Errorf("after every DEL the node holds %s", got)
	}
}
