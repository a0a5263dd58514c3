package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"

	"github.com/ofsdn/ofsdn/internal/atomicfile"
)

// manifestName is the file in a lab's directory that says who owns the lab and what it is made of.
const manifestName = "ofsdn-lab.json"

// lockName serialises lab starts and sweeps on this machine (prefix claims, root-link ranges).
const lockName = ".ofsdn-lab.lock"

type manifest struct {
	Prefix     string         `json:"prefix"`
	OwnerPID   int            `json:"ownerPID"`
	OwnerStart uint64         `json:"ownerStart"` // /proc start time: a reused PID is not the owner
	Dir        string         `json:"dir"`
	NetNS      []string       `json:"netns"`
	Nodes      []manifestNode `json:"nodes"`
	RootLink   string         `json:"rootLink,omitempty"`
}

type manifestNode struct {
	Name  string `json:"name"`
	NetNS string `json:"netns"`
	Dir   string `json:"dir"`
}

// write replaces the lab's manifest whole: a sweep reading it concurrently sees the old or the new.
func (m manifest) write() error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(m.Dir, manifestName), b, 0o600); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	return nil
}

func (m manifest) ownerAlive() bool {
	if !proc.Alive(m.OwnerPID) {
		return false
	}
	start, err := proc.StartTime(m.OwnerPID)
	return err == nil && start == m.OwnerStart
}

// readManifests returns every lab manifest in the temp dir, whatever its prefix: a live lab protects
// its names from any sweep.
func readManifests() []manifest {
	paths, _ := filepath.Glob(filepath.Join(os.TempDir(), "*", manifestName))
	var out []manifest
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var m manifest
		if json.Unmarshal(b, &m) != nil || m.Prefix == "" || m.Dir != filepath.Dir(p) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// lockGlobal takes the machine-wide lab lock.
func lockGlobal() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lab lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lab lock: %w", err)
	}
	return func() { _ = f.Close() }, nil // closing releases the flock
}

// prefixesClash: Stop removes "<prefix>-*", so one lab's prefix must not be another's prefix + "-...".
func prefixesClash(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"-") || strings.HasPrefix(b, a+"-")
}

// claimPrefix refuses a prefix that clashes with a live lab's, and removes a dead lab's that clashes.
// Called with the lock held.
func claimPrefix(prefix string, log *slog.Logger) error {
	for _, m := range readManifests() {
		if !prefixesClash(prefix, m.Prefix) {
			continue
		}
		if m.ownerAlive() {
			return fmt.Errorf("prefix %q clashes with lab %q of running process %d", prefix, m.Prefix, m.OwnerPID)
		}
		log.Warn("removing a dead lab that clashes with the new prefix", "prefix", m.Prefix, "owner", m.OwnerPID)
		if err := teardown(m, log); err != nil {
			return fmt.Errorf("remove dead lab %q: %w", m.Prefix, err)
		}
	}
	return nil
}

// pickRootUnderlay chooses a range for a lab with a root link: the requested one, or the first free of
// rootLinkRanges; either way no route of the root namespace may overlap it (the machine's own
// networks, another lab's root link), since the root link adds a connected route there.
func pickRootUnderlay(ctx context.Context, want netip.Prefix, nodes int) (netip.Prefix, error) {
	routes, err := rootRoutes(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	candidates := rootLinkRanges
	if want.IsValid() {
		candidates = []netip.Prefix{want}
	}
	for _, c := range candidates {
		if checkUnderlay(c, nodes) != nil {
			continue
		}
		clash := false
		for _, r := range routes {
			if r.Overlaps(c) {
				clash = true
				break
			}
		}
		if !clash {
			return c, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("root link: every candidate underlay %v overlaps a root-namespace route; stop a lab or name a free documentation range", candidates)
}

// rootRoutes lists the root namespace's IPv4 route destinations in every table, default routes left out.
func rootRoutes(ctx context.Context) ([]netip.Prefix, error) {
	out, err := output(ctx, nil, "ip", "-j", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	var rs []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		return nil, fmt.Errorf("parse ip route: %w", err)
	}
	var ps []netip.Prefix
	for _, r := range rs {
		if r.Dst == "" || r.Dst == "default" {
			continue
		}
		if !strings.Contains(r.Dst, "/") {
			r.Dst += "/32"
		}
		p, err := netip.ParsePrefix(r.Dst)
		if err != nil {
			return nil, fmt.Errorf("parse route %q: %w", r.Dst, err)
		}
		if p.Bits() > 0 {
			ps = append(ps, p)
		}
	}
	return ps, nil
}

// listNetNS lists the names under /run/netns ("ip netns add" creates them there).
func listNetNS() []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func netnsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// netnsPIDs lists the processes whose network namespace is the named one.
func netnsPIDs(name string) []int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := output(ctx, nil, "ip", "netns", "pids", name)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeNetNS ends every process left in the namespace, then deletes it.
func removeNetNS(name string) error {
	if !netnsExists(name) {
		return nil
	}
	pids := netnsPIDs(name)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		if err := proc.WaitGone(pid, 5*time.Second); err != nil {
			return fmt.Errorf("netns %s: process %d: %w", name, pid, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run(ctx, "ip", "netns", "del", name); err != nil && netnsExists(name) {
		return err
	}
	return nil
}

// rootLinkAliases maps root-namespace link names to their aliases, for links a lab made.
func rootLinkAliases() map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := output(ctx, nil, "ip", "-j", "link", "show")
	if err != nil {
		return nil
	}
	var links []struct {
		Name  string `json:"ifname"`
		Alias string `json:"ifalias"`
	}
	if json.Unmarshal([]byte(out), &links) != nil {
		return nil
	}
	m := map[string]string{}
	for _, l := range links {
		if strings.HasPrefix(l.Alias, rootAliasPrefix) {
			m[l.Name] = l.Alias
		}
	}
	return m
}

// removeRootLink deletes the named link only if its alias says it is this lab's.
func removeRootLink(name, prefix string) error {
	if rootLinkAliases()[name] != rootAliasPrefix+prefix {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run(ctx, "ip", "link", "del", name); err != nil {
		if _, still := rootLinkAliases()[name]; still {
			return err
		}
	}
	return nil
}

// teardown removes everything a manifest names, and every namespace under its prefix.
func teardown(m manifest, log *slog.Logger) error {
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for _, n := range m.Nodes {
		wg.Go(func() { fail(stopOVS(n.Dir)) })
	}
	wg.Wait()
	if m.RootLink != "" {
		fail(removeRootLink(m.RootLink, m.Prefix))
	}
	names := map[string]bool{}
	for _, ns := range m.NetNS {
		names[ns] = true
	}
	for _, ns := range listNetNS() {
		if strings.HasPrefix(ns, m.Prefix+"-") {
			names[ns] = true
		}
	}
	for ns := range names {
		wg.Go(func() { fail(removeNetNS(ns)) })
	}
	wg.Wait()
	if os.Getenv("OFSDN_KEEP_TEST_DIRS") == "" && m.Dir != "" {
		fail(os.RemoveAll(m.Dir))
	}
	err := errors.Join(errs...)
	if err != nil {
		log.Warn("lab teardown incomplete", "prefix", m.Prefix, "err", err)
	}
	return err
}

// Sweep removes what killed runs left behind under prefix (DefaultPrefixBase when empty): labs whose
// manifest names a dead owner (daemons by PID file, processes in their namespaces, namespaces, root
// link, directory), empty directories of runs killed before their manifest existed, namespaces named
// "ofsdn-lab-<pid>-..." whose PID is dead, and root links whose alias names a lab no live process owns.
// It never touches a lab whose owner still runs.
func Sweep(prefix string) {
	if prefix == "" {
		prefix = DefaultPrefixBase
	}
	log := slog.New(slog.DiscardHandler)
	unlock, err := lockGlobal()
	if err != nil {
		return
	}
	defer unlock()
	var live []string
	for _, m := range readManifests() {
		if m.ownerAlive() {
			live = append(live, m.Prefix)
			continue
		}
		if strings.HasPrefix(m.Prefix, prefix) {
			_ = teardown(m, log)
		}
	}
	isLive := func(name string) bool {
		for _, p := range live {
			if name == p || strings.HasPrefix(name, p+"-") {
				return true
			}
		}
		return false
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		_ = os.Remove(d) // only empty ones go
	}
	for _, ns := range listNetNS() {
		if strings.HasPrefix(ns, prefix) && !isLive(ns) && defaultOwnerDead(ns) {
			_ = removeNetNS(ns)
		}
	}
	for name, alias := range rootLinkAliases() {
		if p := strings.TrimPrefix(alias, rootAliasPrefix); strings.HasPrefix(p, prefix) && !isLive(p) {
			_ = removeRootLink(name, p)
		}
	}
}

// defaultOwnerDead reports whether a name follows the default "ofsdn-lab-<pid>-..." pattern and that
// PID no longer runs; names of other shapes are left alone without a manifest to vouch for them.
func defaultOwnerDead(name string) bool {
	pid, ok := proc.OwnerPID(name, DefaultPrefixBase)
	return ok && !proc.Alive(pid)
}
