package nodesim

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// plumbingAgent is a stand-in agent that plumbs real veths (no OVS): enough to prove the simulator
// drives CNI exactly as a runtime does.
type plumbingAgent struct {
	mu     sync.Mutex
	nodeNS string
	next   byte
}

func (a *plumbingAgent) Add(_ context.Context, req *cni.Request) (*current.Result, error) {
	a.mu.Lock()
	a.next++
	ip := netip.AddrFrom4([4]byte{10, 128, 0, 10 + a.next})
	a.mu.Unlock()
	mac, err := podnet.Setup(podnet.Config{NetNS: req.Netns, HostNetNS: a.nodeNS, ContainerID: req.ContainerID, IfName: req.IfName,
		HostVeth: podnet.HostVethName(req.ContainerID, req.IfName), IP: netip.PrefixFrom(ip, 24), MTU: 1450})
	if err != nil {
		return nil, err
	}
	idx := 0
	return &current.Result{CNIVersion: "1.1.0", Interfaces: []*current.Interface{{Name: req.IfName, Mac: mac.String(), Sandbox: req.Netns}},
		IPs: []*current.IPConfig{{Interface: &idx, Address: net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}}}, nil
}
func (a *plumbingAgent) Del(_ context.Context, req *cni.Request) error {
	return podnet.Teardown(a.nodeNS, req.ContainerID, req.IfName)
}
func (a *plumbingAgent) Check(context.Context, *cni.Request) error  { return nil }
func (a *plumbingAgent) Status(context.Context) error               { return nil }
func (a *plumbingAgent) GC(context.Context, []cni.Attachment) error { return nil }

func buildBinaries(t *testing.T) (binDir string) {
	t.Helper()
	binDir = t.TempDir()
	for pkg, name := range map[string]string{"github.com/ofsdn/ofsdn/cmd/ofsdn": "ofsdn", "github.com/ofsdn/ofsdn/e2e/cmd/ofsdn-testpod": "ofsdn-testpod"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, name), pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v: %s", pkg, err, out)
		}
	}
	return binDir
}

func TestNodeSimRunsPodsThroughCNI(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root, network namespaces and a real API server")
	}
	cluster := kubelab.Start(t, kubelab.Options{ControllerManager: true})
	client := kubernetes.NewForConfigOrDie(cluster.AdminConfig())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	prefix := fmt.Sprintf("ofsdn-t-%d-sim", os.Getpid())
	nodeNS := prefix + "-node"
	if out, err := exec.Command("ip", "netns", "add", nodeNS).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", nodeNS).Run() })
	binDir := buildBinaries(t)
	confDir, dir := t.TempDir(), t.TempDir()
	socket := filepath.Join(dir, "cni.sock")
	srv := &cni.Server{Socket: socket, Handler: &plumbingAgent{nodeNS: "/var/run/netns/" + nodeNS}}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ctx) }()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ofsdn","plugins":[{"type":"ofsdn","agentSocket":%q}]}`, socket)
	if err := os.WriteFile(filepath.Join(confDir, "80-ofsdn.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	sim, err := Start(ctx, Config{NodeName: "node-1", NodeIP: netip.MustParseAddr("192.0.2.11"), Client: client,
		CNIConfDir: confDir, CNIBinDir: binDir, CNICache: filepath.Join(dir, "cache"), PodBinary: filepath.Join(binDir, "ofsdn-testpod"),
		NetNSPrefix: prefix, NodeNetNS: "/var/run/netns/" + nodeNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Stop(context.Background()) })

	node, err := client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil || len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Address != "192.0.2.11" {
		t.Fatalf("node not registered with its InternalIP: %+v %v", node.Status.Addresses, err)
	}
	proc.Eventually(t, 60*time.Second, "default ServiceAccount", func() bool {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "node-1",
		Containers: []corev1.Container{{Name: "web", Image: "ofsdn-testpod", Ports: []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 8080, Protocol: corev1.ProtocolUDP}}}}}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podIP string
	proc.Eventually(t, 30*time.Second, "pod running with an IP", func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			podIP = p.Status.PodIP
			return true
		}
		return false
	})
	podNS := NetNSName(prefix, "default", "web")
	proc.Eventually(t, 10*time.Second, "the pod's server answering in its namespace", func() bool {
		out, err := exec.Command("ip", "netns", "exec", podNS, filepath.Join(binDir, "ofsdn-testpod"), "probe", "tcp", podIP+":8080").CombinedOutput()
		return err == nil && strings.HasPrefix(string(out), "default/web ")
	})
	if err := client.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proc.Eventually(t, 30*time.Second, "pod deletion finished by the node", func() bool {
		_, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	proc.Eventually(t, 10*time.Second, "netns removed", func() bool {
		out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		return !strings.Contains(string(out), podNS)
	})
	if len(sim.CNIAdd) != 1 {
		t.Errorf("CNI ADD latencies recorded: %v", sim.CNIAdd)
	}
}
