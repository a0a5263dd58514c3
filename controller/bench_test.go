package controller

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// The allocation benchmark's scale and the targets it prints (never asserts: machines are noisy).
const (
	benchNamespaces  = 1000
	benchNodes       = 500
	benchWorkers     = 20
	benchClusterCIDR = "10.128.0.0/14" // 512 /23s for 500 nodes
	benchHostBits    = 9
	targetAllocate   = 10 * time.Second
	targetRSSMB      = 80.0
)

// BenchmarkAllocate1000Namespaces500Nodes measures the ofsdn-controller binary, as deployed (its own
// process, leader election, its flags), against a real kube-apiserver: from the first create until 1,000
// Namespaces each have a NetNamespace and 500 Nodes each a HostSubnet, and the process's resident memory
// afterwards. It checks that every allocation is correct (distinct VNIDs, non-overlapping subnets) but
// asserts no timing.
//
//	go test -run '^$' -bench Allocate -benchtime 1x ./controller/
func BenchmarkAllocate1000Namespaces500Nodes(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "ofsdn-controller")
	build := exec.Command("go", "build", "-o", bin, "github.com/ofsdn/ofsdn/cmd/ofsdn-controller")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build ofsdn-controller: %v\n%s", err, out)
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		r := benchAllocateOnce(b, bin) // the controller's defaults, as deployed
		// Baseline in the same run: one worker per queue, as the controller first shipped.
		base := benchAllocateOnce(b, bin, "--workers=1")
		b.ReportMetric(r.allocate.Seconds(), "seconds-to-allocate")
		b.ReportMetric(r.create.Seconds(), "seconds-to-create")
		b.ReportMetric(r.rssMB, "rss-MB")
		b.ReportMetric(r.hwmMB, "peak-rss-MB")
		b.ReportMetric(base.allocate.Seconds(), "one-worker-seconds-to-allocate")
		b.ReportMetric(r.allocate.Seconds()/base.allocate.Seconds(), "ratio-to-one-worker")
		fmt.Printf("controller allocation: %d namespaces + %d nodes allocated in %.2fs (target < %s; creating them took %.2fs; "+
			"one worker per queue: %.2fs, ratio %.2f); controller VmRSS %.1f MB (target < %.0f MB), VmHWM %.1f MB\n",
			benchNamespaces, benchNodes, r.allocate.Seconds(), targetAllocate, r.create.Seconds(), base.allocate.Seconds(),
			r.allocate.Seconds()/base.allocate.Seconds(), r.rssMB, targetRSSMB, r.hwmMB)
	}
}

// benchResult is one measurement: from the first create until all is allocated, until all is created
// (with 20 clients the API server, not the controller, may be what limits), and the controller's memory.
type benchResult struct {
	allocate, create time.Duration
	rssMB, hwmMB     float64
}

// benchAllocateOnce runs one measurement on a fresh API server and controller process, both stopped
// before it returns (and by b.Cleanup when it fails midway).
func benchAllocateOnce(b *testing.B, bin string, extraFlags ...string) benchResult {
	api := kubelab.StartDeploy(b, kubelab.Options{}, "namespace.yaml", "crds/")
	defer api.Stop()
	kube := kubernetes.NewForConfigOrDie(api.AdminConfig()) // QPS 1000, burst 2000
	netc := networkclient.NewForConfigOrDie(api.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ctrl, err := startControllerProcess(b, bin, b.TempDir(), append([]string{"--kubeconfig=" + api.KubeconfigPath(),
		"--cluster-cidrs=" + benchClusterCIDR, "--host-subnet-length=" + strconv.Itoa(benchHostBits),
		"--metrics-address=127.0.0.1:0", "--leader-elect-lease-duration=15s"}, extraFlags...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer ctrl.stop()
	// Ready: the controller wrote ClusterNetwork status, which it does once its workers run.
	if err := proc.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if err := ctrl.exited(); err != nil {
			return false, err
		}
		cn, err := netc.NetworkV1().ClusterNetworks().Get(ctx, networkv1.ClusterNetworkName, metav1.GetOptions{})
		return err == nil && len(cn.Status.Conditions) > 0, nil
	}); err != nil {
		b.Fatalf("controller never became ready: %v\n%s", err, ctrl.logTail(40))
	}

	b.StartTimer()
	start := time.Now()
	createErr := make(chan error, 1)
	var created time.Duration
	go func() {
		err := createObjects(ctx, kube)
		created = time.Since(start)
		createErr <- err
	}()
	var nns []networkv1.NetNamespace
	var hss []networkv1.HostSubnet
	err = proc.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if err := ctrl.exited(); err != nil {
			return false, err
		}
		nl, err := netc.NetworkV1().NetNamespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, fmt.Errorf("list NetNamespaces: %w", err)
		}
		hl, err := netc.NetworkV1().HostSubnets().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, fmt.Errorf("list HostSubnets: %w", err)
		}
		nns, hss = nl.Items, hl.Items
		n := 0
		for _, nn := range nns {
			if strings.HasPrefix(nn.Name, "bench-") {
				n++
			}
		}
		return n == benchNamespaces && len(hss) == benchNodes, nil
	})
	took := time.Since(start)
	b.StopTimer()
	if cerr := <-createErr; cerr != nil {
		b.Fatalf("create objects: %v", cerr)
	}
	if err != nil {
		b.Fatalf("allocation not complete after %s (%d NetNamespaces, %d HostSubnets): %v\n%s",
			took.Round(time.Millisecond), len(nns), len(hss), err, ctrl.logTail(40))
	}
	rssMB, hwmMB, err := procMemoryMB(ctrl.PID())
	if err != nil {
		b.Fatal(err)
	}
	checkAllocations(b, nns, hss)
	return benchResult{allocate: took, create: created, rssMB: rssMB, hwmMB: hwmMB}
}

// createObjects creates the Namespaces and the Nodes (each Node then gets its InternalIP through the
// status subresource, as a kubelet registers) with benchWorkers concurrent clients.
func createObjects(ctx context.Context, kube kubernetes.Interface) error {
	jobs := make(chan func() error)
	errs := make(chan error, benchWorkers)
	var wg sync.WaitGroup
	for range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for job := range jobs {
				if err := job(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := range max(benchNamespaces, benchNodes) {
		if i < benchNamespaces {
			jobs <- func() error {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%04d", i)}}
				if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
					return fmt.Errorf("create namespace %s: %w", ns.Name, err)
				}
				return nil
			}
		}
		if i < benchNodes {
			jobs <- func() error { return createNode(ctx, kube, benchNodeName(i), benchNodeIP(i)) }
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs // the first error, or nil
}

func benchNodeName(i int) string { return fmt.Sprintf("bench-node-%03d", i) }

func benchNodeIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{172, 16, byte(i / 250), byte(i%250 + 1)})
}

func createNode(ctx context.Context, kube kubernetes.Interface, name string, ip netip.Addr) error {
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("set node %s InternalIP %s: %w", name, ip, err)
	}
	return nil
}

// checkAllocations: every bench namespace has a VNID of its own, every node a /23 of the cluster CIDR
// that overlaps no other, with its InternalIP as hostIP.
func checkAllocations(b *testing.B, nns []networkv1.NetNamespace, hss []networkv1.HostSubnet) {
	b.Helper()
	vnids := map[uint32]string{}
	for _, nn := range nns {
		if !strings.HasPrefix(nn.Name, "bench-") {
			continue
		}
		if nn.NetID < networkv1.MinVNID || nn.NetID > networkv1.MaxVNID {
			b.Errorf("%s has NETID %d, outside %d-%d", nn.Name, nn.NetID, networkv1.MinVNID, networkv1.MaxVNID)
		}
		if other, dup := vnids[nn.NetID]; dup {
			b.Errorf("%s and %s share NETID %d", nn.Name, other, nn.NetID)
		}
		vnids[nn.NetID] = nn.Name
	}
	cluster := netip.MustParsePrefix(benchClusterCIDR)
	want := map[string]string{}
	for i := range benchNodes {
		want[benchNodeName(i)] = benchNodeIP(i).String()
	}
	// Subnets of one length overlap exactly when equal, so distinctness is non-overlap.
	subnets := map[netip.Prefix]string{}
	for _, hs := range hss {
		p, err := netip.ParsePrefix(string(hs.Subnet))
		if err != nil {
			b.Errorf("HostSubnet %s: %v", hs.Name, err)
			continue
		}
		if p.Bits() != 32-benchHostBits || !cluster.Contains(p.Addr()) || p != p.Masked() {
			b.Errorf("HostSubnet %s has %s, not a /%d of %s", hs.Name, p, 32-benchHostBits, cluster)
		}
		if other, dup := subnets[p]; dup {
			b.Errorf("%s and %s share subnet %s", hs.Name, other, p)
		}
		subnets[p] = hs.Name
		if ip, ok := want[hs.Name]; !ok || hs.Host != hs.Name || hs.HostIP != ip {
			b.Errorf("HostSubnet %s: host %q hostIP %q, want node %s with %q", hs.Name, hs.Host, hs.HostIP, hs.Name, ip)
		}
	}
}

// controllerProcess is the ofsdn-controller binary running as a proc.Daemon, its output in logPath.
type controllerProcess struct {
	*proc.Daemon
	logPath string
}

func startControllerProcess(b *testing.B, bin, dir string, args ...string) (*controllerProcess, error) {
	logPath := filepath.Join(dir, "ofsdn-controller.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("controller log: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := proc.Start(cmd)
	if err != nil {
		return nil, err
	}
	p := &controllerProcess{Daemon: d, logPath: logPath}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("ofsdn-controller log tail:\n%s", p.logTail(40))
		}
		p.stop()
	})
	return p, nil
}

// exited is non-nil once the process has exited (it never should during a run).
func (p *controllerProcess) exited() error {
	if exited, err := p.Exited(); exited {
		return fmt.Errorf("ofsdn-controller exited: %v", err)
	}
	return nil
}

// stop sends SIGTERM to the process group, then SIGKILL after 10 s; it is idempotent.
func (p *controllerProcess) stop() { p.Stop(10 * time.Second) }

func (p *controllerProcess) logTail(n int) string { return proc.Tail(p.logPath, n) }

// procMemoryMB reads VmRSS and VmHWM (peak resident) of pid from /proc, in MB (2^20 bytes).
func procMemoryMB(pid int) (rss, hwm float64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	found := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(rest) // "12345 kB"
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("pid %d: malformed %s line %q", pid, key, sc.Text())
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("pid %d: %s: %w", pid, key, err)
		}
		found[key] = kb / 1024
	}
	if _, ok := found["VmRSS"]; !ok {
		return 0, 0, fmt.Errorf("pid %d: no VmRSS in /proc/%d/status", pid, pid)
	}
	return found["VmRSS"], found["VmHWM"], nil
}
