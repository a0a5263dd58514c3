package kubelab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// Prefix starts the name of every temp dir a cluster uses: "ofsdn-kube-<test pid>-<seq>-...". The
// owner's PID in the name lets Sweep tell a killed run's leftovers from a live test's cluster.
const Prefix = "ofsdn-kube-"

// Binaries are the programs hack/build-k8s.sh builds and a cluster runs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// BinDir finds the directory holding the control-plane binaries: $OFSDN_K8S_BIN when set, else
// _output/k8s/bin under the repository root (RepoRoot). It fails when any binary is missing.
func BinDir() (string, error) {
	dir := os.Getenv("OFSDN_K8S_BIN")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "_output", "k8s", "bin")
	}
	for _, b := range Binaries {
		p := filepath.Join(dir, b)
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("kubelab: %s is missing: run `make k8s-bins` (hack/build-k8s.sh)", p)
		}
	}
	return dir, nil
}

// RepoRoot finds the ofsdn checkout: $OFSDN_REPO when set (the Makefile sets it), else the first
// directory above the working directory (tests run in their package's) whose go.mod is ofsdn's.
func RepoRoot() (string, error) {
	if r := os.Getenv("OFSDN_REPO"); r != "" {
		return r, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubelab: working directory: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/ofsdn/ofsdn\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("kubelab: no ofsdn checkout above %s; set OFSDN_REPO or OFSDN_K8S_BIN", wd)
		}
	}
}

// daemon is one of the cluster's daemons (proc.Daemon: its own process group, dies with the test).
type daemon struct {
	*proc.Daemon
	name    string
	logPath string
	mu      sync.Mutex
	stopped bool // we asked it to stop (its exit is not a failure)
}

func startDaemon(dir, name, bin string, args ...string) (*daemon, error) {
	// Truncated per start: a retried start must not read the previous attempt's errors.
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	d, err := proc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	_ = os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(d.PID())), 0o644)
	return &daemon{Daemon: d, name: name, logPath: logPath}, nil
}

// stop stops the daemon and its process group (SIGTERM, SIGKILL after grace); its exit is no failure.
func (d *daemon) stop(grace time.Duration) {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	d.Stop(grace)
}

// unexpectedExit describes an exit we did not ask for, or "".
func (d *daemon) unexpectedExit() string {
	d.mu.Lock()
	stopped := d.stopped
	d.mu.Unlock()
	if exited, err := d.Exited(); !stopped && exited {
		return fmt.Sprintf("%s (pid %d) exited: %v", d.name, d.PID(), err)
	}
	return ""
}

// ports hands out free TCP ports and never hands the same one out twice in this process, so clusters
// started in parallel do not race each other for a port (other processes still can: Start retries).
var ports struct {
	sync.Mutex
	used map[int]bool
}

func freePort(host string) (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.used == nil {
		ports.used = map[int]bool{}
	}
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, fmt.Errorf("find a free port on %s: %w", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !ports.used[port] {
			ports.used[port] = true
			return port, nil
		}
	}
	return 0, fmt.Errorf("find a free port on %s: every try returned a port already handed out", host)
}

var sweepOnce sync.Once

// Sweep kills the daemons of clusters whose owning test process is gone (a run killed before its
// t.Cleanup ran) and removes their temp dirs. A daemon is found through the PID files in its cluster's
// dir and killed only when its command line names that dir, so a recycled PID is never hit. Start runs
// it once per process; `make sweep` can call it too.
func Sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), Prefix+"*"))
	for _, d := range dirs {
		if proc.OwnerAlive(filepath.Base(d), Prefix) {
			continue
		}
		pidFiles, _ := filepath.Glob(filepath.Join(d, "*.pid"))
		for _, pf := range pidFiles {
			if pid := proc.ReadPIDFile(pf); pid > 0 && cmdlineMentions(pid, d) {
				_ = syscall.Kill(-pid, syscall.SIGKILL) // its group: it was started with Setpgid
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(d)
	}
}

func cmdlineMentions(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte(s))
}
