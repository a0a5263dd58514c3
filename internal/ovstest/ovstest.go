// Package ovstest starts private Open vSwitch instances for tests: one ovsdb-server and one userspace
// ovs-vswitchd in a network namespace of its own (shared/LAB.md: one userspace vswitchd per netns), with
// every file under a temporary directory. Everything it starts is torn down by t.Cleanup, and Sweep removes
// what a killed test run left behind, by name prefix and by PID file.
//
// Test code may exec ovs-vsctl/ovs-ofctl here to set up or to cross-check; production code never does.
package ovstest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// Prefix starts the name of every network namespace and directory this package creates.
const Prefix = "ofsdn-t-"

const schema = "/usr/share/openvswitch/vswitch.ovsschema"

var seq atomic.Int32

// Instance is one private OVS: its files live in Dir and its vswitchd runs in network namespace NetNS.
type Instance struct {
	Dir   string
	NetNS string
	t     testing.TB
}

// Available reports why OVS tests cannot run here ("" when they can).
func Available() string {
	if os.Geteuid() != 0 {
		return "OVS tests need root (network namespaces, tap devices)"
	}
	for _, bin := range []string{"ovsdb-server", "ovs-vswitchd", "ovsdb-tool", "ovs-vsctl", "ovs-appctl", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("%s not found: run `make deps` (installs openvswitch-switch)", bin)
		}
	}
	return ""
}

// Require fails the test when OVS cannot run: `make test` installs it, so a missing OVS is a broken setup,
// not a reason to skip silently. Set OFSDN_SKIP_OVS=1 to skip on a developer machine without OVS.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("real OVS: skipped under -short")
	}
	if why := Available(); why != "" {
		if os.Getenv("OFSDN_SKIP_OVS") == "1" {
			t.Skip(why)
		}
		t.Fatal(why)
	}
}

// Start creates a network namespace and starts ovsdb-server and ovs-vswitchd in it.
func Start(t testing.TB) *Instance {
	t.Helper()
	Require(t)
	name := fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), seq.Add(1))
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		t.Fatalf("ovstest: temp dir: %v", err)
	}
	inst := &Instance{Dir: dir, NetNS: name, t: t}
	t.Cleanup(inst.Stop)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ovstest: ip netns add %s: %v: %s", name, err, out)
	}
	_ = inst.run("ip", "link", "set", "lo", "up")
	if err := inst.startDB(); err != nil {
		t.Fatalf("ovstest: %v", err)
	}
	if err := inst.StartVswitchd(); err != nil {
		t.Fatalf("ovstest: %v", err)
	}
	return inst
}

// DBSocket is the ovsdb-server unix socket (the endpoint "unix:" + DBSocket()).
func (i *Instance) DBSocket() string { return filepath.Join(i.Dir, "db.sock") }

// MgmtSocket is the OpenFlow management socket ovs-vswitchd opens for a bridge.
func (i *Instance) MgmtSocket(bridge string) string { return filepath.Join(i.Dir, bridge+".mgmt") }

func (i *Instance) env() []string {
	return append(os.Environ(), "OVS_RUNDIR="+i.Dir, "OVS_DBDIR="+i.Dir, "OVS_LOGDIR="+i.Dir,
		"OVS_SYSCONFDIR="+i.Dir, "OVS_PKGDATADIR=/usr/share/openvswitch")
}

// run executes a command inside the instance's network namespace with the instance's OVS environment.
func (i *Instance) run(name string, args ...string) error {
	_, err := i.Output(name, args...)
	return err
}

// Output runs a command inside the network namespace and returns its standard output.
func (i *Instance) Output(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", i.NetNS, name}, args...)...)
	cmd.Env = i.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Vsctl runs ovs-vsctl against this instance's database.
func (i *Instance) Vsctl(args ...string) (string, error) {
	return i.Output("ovs-vsctl", append([]string{"--db=unix:" + i.DBSocket(), "--timeout=20"}, args...)...)
}

// Ofctl runs ovs-ofctl -O OpenFlow13 against the bridge's management socket.
func (i *Instance) Ofctl(cmd, bridge string, args ...string) (string, error) {
	return i.Output("ovs-ofctl", append([]string{"-O", "OpenFlow13", cmd, "unix:" + i.MgmtSocket(bridge)}, args...)...)
}

// AddBridge creates a netdev bridge speaking only OpenFlow 1.3 with fail_mode=secure, the way the agent's
// ovsdb package does it, and waits for its management socket.
func (i *Instance) AddBridge(name string) {
	i.t.Helper()
	if _, err := i.Vsctl("--may-exist", "add-br", name, "--", "set", "Bridge", name,
		"datapath_type=netdev", "protocols=OpenFlow13", "fail_mode=secure"); err != nil {
		i.t.Fatalf("ovstest: add bridge: %v", err)
	}
	if err := proc.Until(context.Background(), 10*time.Second, func() bool { _, err := os.Stat(i.MgmtSocket(name)); return err == nil }); err != nil {
		i.t.Fatalf("ovstest: bridge %s: management socket never appeared", name)
	}
}

func (i *Instance) startDB() error {
	db := filepath.Join(i.Dir, "conf.db")
	if out, err := exec.Command("ovsdb-tool", "create", db, schema).CombinedOutput(); err != nil {
		return fmt.Errorf("ovsdb-tool create: %v: %s", err, out)
	}
	if err := i.run("ovsdb-server", db, "--remote=punix:"+i.DBSocket(),
		"--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
		"--pidfile="+filepath.Join(i.Dir, "ovsdb-server.pid"), "--log-file="+filepath.Join(i.Dir, "ovsdb-server.log"),
		"--detach", "--no-chdir", "-vconsole:off"); err != nil {
		return err
	}
	_, err := i.Vsctl("--no-wait", "init")
	return err
}

// StartVswitchd starts ovs-vswitchd (again, after StopVswitchd or KillVswitchd).
func (i *Instance) StartVswitchd() error {
	return i.run("ovs-vswitchd", "unix:"+i.DBSocket(), "--pidfile="+filepath.Join(i.Dir, "ovs-vswitchd.pid"),
		"--log-file="+filepath.Join(i.Dir, "ovs-vswitchd.log"), "--detach", "--no-chdir", "-vconsole:off")
}

// VswitchdPID returns the PID of the running ovs-vswitchd, or 0.
func (i *Instance) VswitchdPID() int { return livePID(filepath.Join(i.Dir, "ovs-vswitchd.pid")) }

// KillVswitchd kills ovs-vswitchd with SIGKILL, as a crash would, and waits until it is gone.
func (i *Instance) KillVswitchd() {
	pid := i.VswitchdPID()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = proc.WaitGone(pid, 10*time.Second)
	_ = os.Remove(filepath.Join(i.Dir, "ovs-vswitchd.pid"))
}

// StopVswitchd asks ovs-vswitchd to exit and remove its datapath devices (a SIGTERM leaves taps behind).
func (i *Instance) StopVswitchd() {
	pid := i.VswitchdPID()
	if pid == 0 {
		return
	}
	ctl := filepath.Join(i.Dir, fmt.Sprintf("ovs-vswitchd.%d.ctl", pid))
	if err := i.run("ovs-appctl", "-t", ctl, "exit", "--cleanup"); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = proc.WaitGone(pid, 10*time.Second)
}

// Stop tears the instance down: vswitchd, ovsdb-server, the namespace and the directory.
func (i *Instance) Stop() {
	i.StopVswitchd()
	if pid := livePID(filepath.Join(i.Dir, "ovsdb-server.pid")); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		_ = proc.WaitGone(pid, 5*time.Second)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = exec.Command("ip", "netns", "del", i.NetNS).Run()
	if os.Getenv("OFSDN_KEEP_TEST_DIRS") == "" {
		_ = os.RemoveAll(i.Dir)
	}
}

// Sweep removes what earlier, killed test runs left: daemons found through PID files in prefixed temp
// directories, the directories, and prefixed network namespaces. Names carry the creating test process's
// PID, so a sweep never touches what a test process that is still running owns.
func Sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), Prefix+"*"))
	for _, d := range dirs {
		if proc.OwnerAlive(filepath.Base(d), Prefix) {
			continue
		}
		for _, pf := range []string{"ovs-vswitchd.pid", "ovsdb-server.pid"} {
			if pid := livePID(filepath.Join(d, pf)); pid != 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(d)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], Prefix) && !proc.OwnerAlive(f[0], Prefix) {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

// livePID returns the PID a pidfile names while that process runs, else 0.
func livePID(path string) int {
	if pid := proc.ReadPIDFile(path); proc.Alive(pid) {
		return pid
	}
	return 0
}
