package ovsnode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/lab"
)

// TestOpenvSwitchOnANodeWithoutIt runs ofsdn-ovs as deploy/ovs does on the lab's userspace datapath, in
// a lab node that has no Open vSwitch: the database is created, both daemons answer, the node's address
// moves from eth0 onto the uplink bridge (and the external host still reaches it, now through Open
// vSwitch), a restart finds the node as it left it, and SIGTERM stops both daemons.
func TestOpenvSwitchOnANodeWithoutIt(t *testing.T) {
	l := lab.StartT(t, lab.Options{Nodes: 1, NoOVS: true})
	n := l.Nodes[0]
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "ofsdn-ovs")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/ofsdn/ofsdn/cmd/ofsdn-ovs")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	dbDir := filepath.Join(n.Dir, "etc")
	cfg := Config{RunDir: n.Dir, DBDir: dbDir}
	start := func() *proc.Daemon {
		cmd := exec.Command("ip", "netns", "exec", n.NetNS, bin, "--ovs-rundir", n.Dir, "--db-dir", dbDir,
			"--schema", "/usr/share/openvswitch/vswitch.ovsschema", "--datapath-type", "netdev", "--uplink", lab.Uplink, "--uplink-bridge", lab.UnderlayBridge)
		logf, err := os.OpenFile(filepath.Join(n.Dir, "ofsdn-ovs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		d, err := proc.Start(cmd)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Stop(20 * time.Second) })
		return d
	}
	ready := func(d *proc.Daemon) {
		t.Helper()
		err := proc.Until(ctx, time.Minute, func() bool {
			out, err := n.Exec(ctx, "ip", "-br", "-4", "addr", "show", "dev", lab.UnderlayBridge)
			return Probe(ctx, cfg) == nil && err == nil && strings.Contains(out, n.Addr.String())
		})
		if err != nil {
			exited, why := d.Exited()
			t.Fatalf("Open vSwitch not up with the node's address on %s (exited %v %v): %v\n%s", lab.UnderlayBridge, exited, why, err,
				proc.Tail(filepath.Join(n.Dir, "ofsdn-ovs.log"), 30))
		}
	}
	d := start()
	ready(d)
	if out, _ := n.Exec(ctx, "ip", "-br", "-4", "addr", "show", "dev", lab.Uplink); strings.Contains(out, n.Addr.Addr().String()) {
		t.Errorf("the address stayed on %s too: %q", lab.Uplink, out)
	}
	if out, err := n.Vsctl(ctx, "list-ports", lab.UnderlayBridge); err != nil || strings.TrimSpace(out) != lab.Uplink {
		t.Errorf("%s's ports: %q, %v; want %s", lab.UnderlayBridge, out, err, lab.Uplink)
	}
	ping := func() error {
		_, err := l.External.Exec(ctx, "ping", "-c", "1", "-W", "2", n.IP.String())
		return err
	}
	if err := proc.Until(ctx, 20*time.Second, func() bool { return ping() == nil }); err != nil {
		t.Errorf("the external host does not reach the node through its uplink bridge: %v", err)
	}

	// A restart (the container's) finds bridge, port and address in place.
	d.Stop(20 * time.Second)
	d = start()
	ready(d)
	if out, err := n.Vsctl(ctx, "list-ports", lab.UnderlayBridge); err != nil || strings.TrimSpace(out) != lab.Uplink {
		t.Errorf("after a restart, %s's ports: %q, %v", lab.UnderlayBridge, out, err)
	}

	// SIGTERM: both daemons go.
	pids := []int{}
	for _, name := range []string{"ovsdb-server", "ovs-vswitchd"} {
		if pid := proc.ReadPIDFile(filepath.Join(n.Dir, name+".pid")); pid > 0 {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		t.Fatalf("pidfiles name %v", pids)
	}
	_ = syscall.Kill(d.PID(), syscall.SIGTERM)
	select {
	case <-d.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("ofsdn-ovs did not stop on SIGTERM")
	}
	if exited, err := d.Exited(); !exited || err != nil {
		t.Errorf("ofsdn-ovs on SIGTERM: exited %v, %v; want a clean exit", exited, err)
	}
	for _, pid := range pids {
		if proc.Alive(pid) {
			t.Errorf("daemon %d outlived ofsdn-ovs", pid)
		}
	}
}
