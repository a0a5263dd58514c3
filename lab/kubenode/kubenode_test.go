package kubenode

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/labimages"
	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNodeRunsAPodAndLeavesNothing: a lab node with a real containerd and kubelet registers its Node,
// runs a hostNetwork pod from an imported image (agnhost, serving HTTP on the node's address), answers
// the API server's exec and logs through kubelet, and after Stop no process, cgroup or mount of it is
// left on the machine.
func TestNodeRunsAPodAndLeavesNothing(t *testing.T) {
	lab.Require(t)
	kbin, err := kubelab.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	root, err := kubelab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := labimages.Build(ctx, labimages.Options{RepoRoot: root, OutDir: filepath.Join(root, "_output", "lab-images"), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var tarballs []string
	for _, img := range imgs {
		if img.Ref == labimages.Pause || img.Ref == labimages.Agnhost {
			tarballs = append(tarballs, img.Tarball)
		}
	}
	l := lab.StartT(t, lab.Options{Nodes: 1, RootLink: true})
	api := kubelab.Start(t, kubelab.Options{BindAddress: l.Root.IP.String(), KubeletClient: true, ControllerManager: true})
	ln := l.Nodes[0]
	dir := filepath.Join(ln.Dir, "k8s")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	creds, err := api.CertConfig("system:node:"+ln.Name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubelet.kubeconfig")
	if err := WriteKubeconfig(kc, creds); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, api.CACert(), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := Start(ctx, Config{Name: ln.Name, NetNS: ln.NetNS, IP: ln.IP, Dir: dir, KubeletBin: filepath.Join(kbin, "kubelet"),
		Kubeconfig: kc, ClientCAFile: ca, SandboxImage: labimages.Pause, Images: tarballs,
		Mounts: map[string]string{"/var/run/openvswitch": ln.Dir}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = n.Stop()
		}
	})
	cs, err := kubernetes.NewForConfig(api.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	proc.Eventually(t, time.Minute, "the Node registered with its address", func() bool {
		node, err := cs.CoreV1().Nodes().Get(ctx, ln.Name, metav1.GetOptions{})
		return err == nil && len(node.Status.Addresses) > 0 && node.Status.Addresses[0].Address == ln.IP.String()
	})
	proc.Eventually(t, time.Minute, "the default ServiceAccount", func() bool {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Spec: corev1.PodSpec{
		NodeName: ln.Name, HostNetwork: true, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		Containers: []corev1.Container{{Name: "agnhost", Image: labimages.Agnhost, Args: []string{"netexec", "--http-port=8085", "--udp-port=-1"}}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	if err := proc.Until(ctx, 2*time.Minute, func() bool {
		last, err = cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && last.Status.Phase == corev1.PodRunning
	}); err != nil {
		t.Fatalf("pod not running: %v; status %+v\n%s", err, last.Status, proc.Tail(n.KubeletLog(), 40))
	}
	// The pod serves on the node's address, inside the node's network namespace.
	var body string
	proc.Eventually(t, time.Minute, "agnhost answers on the node's address", func() bool {
		body, err = httpGet(ln.NetNS, fmt.Sprintf("%s:8085", ln.IP), "/hostname")
		return err == nil
	})
	if body != ln.Name {
		t.Errorf("/hostname of a hostNetwork pod: %q, want the node's name %q", body, ln.Name)
	}
	if out, err := api.Kubectl("exec", "-n", "default", "web", "--", "/bin/sh", "-c", "echo exec-ok; cat /proc/self/net/dev | grep -c eth0"); err != nil || !strings.Contains(out, "exec-ok") {
		t.Errorf("kubectl exec through kubelet: %q, %v", out, err)
	}
	if out, err := api.Kubectl("logs", "-n", "default", "web"); err != nil {
		t.Errorf("kubectl logs through kubelet: %q, %v", out, err)
	}

	// What the node ran, to look for afterwards.
	pids := cgroupPIDs(n.cgroups, n.CgroupRoot())
	if len(pids) < 4 { // containerd, kubelet, a shim, pause, agnhost
		t.Errorf("the node's cgroups hold %d processes, want containerd, kubelet, a shim and the pod's", len(pids))
	}
	stopped = true
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if proc.Alive(pid) {
			t.Errorf("process %d of the node still runs after Stop", pid)
		}
	}
	for _, h := range n.cgroups {
		if _, err := os.Stat(filepath.Join(h, n.CgroupRoot())); !os.IsNotExist(err) {
			t.Errorf("cgroup %s%s still exists after Stop (%v)", h, n.CgroupRoot(), err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dir) {
		t.Errorf("a mount under %s is in the machine's mount table after Stop", dir)
	}
}

// httpGet fetches http://addr/path from inside a network namespace.
func httpGet(netns, addr, path string) (string, error) {
	var conn net.Conn
	err := lab.InNetNS(netns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok || !strings.HasPrefix(string(b), "HTTP/1.") || !strings.Contains(strings.SplitN(string(b), "\r\n", 2)[0], " 200 ") {
		return "", fmt.Errorf("unexpected answer %q", b)
	}
	return body, nil
}

// TestSweepRemovesADeadRunsCgroups: a cgroup root named after a lab whose owner died, with a process
// still inside (as a container a killed run left), is emptied and removed; one whose owner lives is
// left alone.
func TestSweepRemovesADeadRunsCgroups(t *testing.T) {
	lab.Require(t)
	hs, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	// A PID that ran and is gone: the owner of a killed run.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadRoot := fmt.Sprintf("/%s%d-7-node1", lab.DefaultPrefixBase, dead.Process.Pid)
	liveRoot := fmt.Sprintf("/%s%d-7-node1", lab.DefaultPrefixBase, os.Getpid())
	for _, root := range []string{deadRoot, liveRoot} {
		t.Cleanup(func() {
			_ = killCgroups(hs, root, 10*time.Second)
			_ = removeCgroups(hs, root)
		})
		if err := makeCgroups(hs, root, root+"/kubepods"); err != nil {
			t.Fatal(err)
		}
	}
	// A process in the dead run's pod cgroup, in every hierarchy, as runc puts a container.
	sleeper := exec.Command("sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sleeper.Wait() }()
	t.Cleanup(func() { _ = sleeper.Process.Kill() })
	for _, h := range hs {
		if err := os.WriteFile(filepath.Join(h, deadRoot, "kubepods", "cgroup.procs"), []byte(fmt.Sprint(sleeper.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	Sweep("")
	if err := proc.WaitGone(sleeper.Process.Pid, 5*time.Second); err != nil {
		t.Errorf("the dead run's process: %v", err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, deadRoot)); !os.IsNotExist(err) {
			t.Errorf("%s%s survived the sweep (%v)", h, deadRoot, err)
		}
		if _, err := os.Stat(filepath.Join(h, liveRoot, "kubepods")); err != nil {
			t.Errorf("the sweep removed a live run's cgroup %s%s: %v", h, liveRoot, err)
		}
	}
}
