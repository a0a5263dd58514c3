package kubelab

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Prefix starts the name of every temp dir a cluster uses: "ofsdn-kube-<test pid>-<seq>-...". The
// owner's PID in the name lets Sweep tell a killed run's leftovers from a live test's cluster.
const Prefix = "ofsdn-kube-"

// Binaries are the programs hack/build-k8s.sh builds and a cluster runs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// BinDir finds the directory holding the control-plane binaries: $OFSDN_K8S_BIN when set, else
// _output/k8s/bin under the repository root ($OFSDN_REPO, or found by walking up from the working
// directory to hack/build-k8s.sh). It fails when any binary is missing.
func BinDir() (string, error) {
	dir := os.Getenv("OFSDN_K8S_BIN")
	if dir == "" {
		root, err := repoRoot()
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

func repoRoot() (string, error) {
	if r := os.Getenv("OFSDN_REPO"); r != "" {
		return r, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubelab: working directory: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "hack", "build-k8s.sh")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("kubelab: no repository root (hack/build-k8s.sh) above %s; set OFSDN_REPO or OFSDN_K8S_BIN", wd)
		}
	}
}

// proc is one daemon, run in a process group of its own so that teardown reaches anything it forks.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited and been reaped
	err     error         // exit status, valid after done
	stopped bool          // we asked it to stop (its exit is not a failure)
	mu      sync.Mutex
}

func startProc(dir, name, bin string, args ...string) (*proc, error) {
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
	// Pdeathsig: a test binary killed with SIGKILL takes its daemons along (Sweep catches the rest).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	_ = os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and waits until the process is
// reaped and its group is empty.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	pgid := p.pid()
	_ = syscall.Kill(-pgid, syscall.SIGCONT) // a paused daemon would handle SIGTERM only once resumed
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// SIGKILL the group even after the leader exited: it may have left children behind.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
	_ = waitFor(5*time.Second, func() bool { return syscall.Kill(-pgid, 0) != nil })
}

// unexpectedExit describes an exit we did not ask for, or "".
func (p *proc) unexpectedExit() string {
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped || !p.exited() {
		return ""
	}
	return fmt.Sprintf("%s (pid %d) exited: %v", p.name, p.pid(), p.err)
}

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxRead {
		_, _ = f.Seek(-maxRead, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
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
		if ownerAlive(filepath.Base(d)) {
			continue
		}
		pidFiles, _ := filepath.Glob(filepath.Join(d, "*.pid"))
		for _, pf := range pidFiles {
			if pid := readPID(pf); pid > 0 && cmdlineMentions(pid, d) {
				_ = syscall.Kill(-pid, syscall.SIGKILL) // its group: it was started with Setpgid
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(d)
	}
}

// ownerAlive reports whether the test process named in "<Prefix><pid>-..." still runs.
func ownerAlive(name string) bool {
	rest := strings.TrimPrefix(name, Prefix)
	pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
	return err == nil && alive(pid)
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}

func cmdlineMentions(pid int, s string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(b, []byte(s))
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may itself hold spaces.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func waitFor(d time.Duration, ok func() bool) error {
	deadline := time.Now().Add(d)
	for {
		if ok() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
