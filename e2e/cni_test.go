//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"

	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
					if strings.Contains(err.Error(), "closed the connection") || strings.Contains(err.Error(), "connection reset") {
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
