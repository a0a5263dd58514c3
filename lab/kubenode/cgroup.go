package kubenode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// cgroupMount is where the machine mounts its cgroup hierarchies (v1 controllers and named ones).
const cgroupMount = "/sys/fs/cgroup"

// hierarchies lists the mount points of the machine's cgroup v1 hierarchies (cpu, memory, ...,
// name=systemd), read from this process's mount table. kubelet with the cgroupfs driver and runc put a
// pod in the same path of every one of them, so a node's cgroup root must exist in all.
func hierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("kubenode: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup" && strings.HasPrefix(fields[4], cgroupMount+"/") {
			out = append(out, fields[4])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kubenode: mountinfo: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("kubenode: no cgroup v1 hierarchy is mounted under " + cgroupMount + " (kubelet's cgroupfs driver needs them)")
	}
	return out, nil
}

// makeCgroups creates the cgroup root and its children (paths relative to each hierarchy) in every
// hierarchy. cpuset directories start empty, and a cpuset without CPUs and memory nodes takes no task:
// they get their parent's.
func makeCgroups(hs []string, paths ...string) error {
	for _, h := range hs {
		for _, p := range paths {
			dir := filepath.Join(h, p)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("kubenode: cgroup %s: %w", dir, err)
			}
			if filepath.Base(h) != "cpuset" {
				continue
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
				if err != nil {
					return fmt.Errorf("kubenode: cgroup %s: %w", dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("kubenode: cgroup %s: %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupPIDs lists every process in the cgroup tree root (relative to the hierarchies), in any of them.
func cgroupPIDs(hs []string, root string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killCgroups ends every process of the tree root: it freezes the tree (where the freezer hierarchy
// exists, so nothing forks away while it is being killed), sends SIGKILL to every process, thaws, and
// repeats until the tree is empty or timeout passes.
func killCgroups(hs []string, root string, timeout time.Duration) error {
	var freezer string
	for _, h := range hs {
		if filepath.Base(h) == "freezer" {
			freezer = filepath.Join(h, root, "freezer.state")
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPIDs(hs, root)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubenode: processes %v of cgroup %s outlived SIGKILL for %s", pids, root, timeout)
		}
		frozen := freezer != "" && os.WriteFile(freezer, []byte("FROZEN"), 0o644) == nil
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if frozen {
			_ = os.WriteFile(freezer, []byte("THAWED"), 0o644)
		}
		for _, pid := range pids {
			_ = proc.WaitGone(pid, time.Second)
		}
	}
}

// removeCgroups removes the tree root from every hierarchy, children before parents (a cgroup
// directory goes only once empty of tasks and children).
func removeCgroups(hs []string, root string) error {
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first: WalkDir lists a parent before its children.
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ { // a task that just died may leave its cgroup busy briefly
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
