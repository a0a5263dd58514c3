// Package ovsnode runs Open vSwitch in a container, for nodes without an Open vSwitch of their own:
// ovsdb-server and ovs-vswitchd of the image (deploy/ovs), on the node's run directory and database
// directory (hostPath volumes the agent's DaemonSet shares), in the foreground as the container's
// children, as openshift-sdn's and Antrea's OVS containers do. The database is created on first start
// and converted when the image's schema is newer; the daemons stop gracefully with the container.
//
// On the userspace datapath (netdev) VXLAN works only when the node's underlay address sits on an Open
// vSwitch bridge of the same ovs-vswitchd (shared/LAB.md): Config.Uplink and UplinkBridge make one, move
// the uplink into it and the uplink's IPv4 addresses and routes onto it (OVN-Kubernetes's br-ex does
// the same), idempotently, so a restarted container finds the node as it left it.
//
// It talks to its daemons through their control sockets (unixctl) and OVSDB (libovsdb); the only
// programs it runs are the daemons and ovsdb-tool, whose file operations have no protocol.
package ovsnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
	"github.com/ofsdn/ofsdn/unixctl"
)

// Config says where Open vSwitch keeps its files and what the node needs.
type Config struct {
	RunDir string // sockets and pidfiles; the agent's --ovs-rundir
	DBDir  string // conf.db
	Schema string // vswitch.ovsschema of the image
	// DatapathType is the datapath the node's bridges use (the agent's --datapath-type): with netdev,
	// ovs-vswitchd is stopped with exit --cleanup (its tap devices go too).
	DatapathType string
	// Uplink, with UplinkBridge, moves the node's underlay interface into a bridge of that name (see
	// the package doc); empty: leave the node's interfaces alone.
	Uplink, UplinkBridge string
	// BinDir holds ovsdb-server, ovs-vswitchd and ovsdb-tool; empty: PATH.
	BinDir string
	Logger *slog.Logger
}

func (c Config) bin(name string) string {
	if c.BinDir != "" {
		return filepath.Join(c.BinDir, name)
	}
	return name
}

// DBSocket is ovsdb-server's socket, as the agent finds it.
func (c Config) DBSocket() string { return filepath.Join(c.RunDir, "db.sock") }

// env is what Open vSwitch's programs read their directories from.
func (c Config) env() []string {
	return append(os.Environ(), "OVS_RUNDIR="+c.RunDir, "OVS_DBDIR="+c.DBDir, "OVS_LOGDIR="+c.RunDir, "OVS_SYSCONFDIR="+c.DBDir)
}

// Run starts ovsdb-server and ovs-vswitchd and keeps them until ctx ends (then stops them gracefully)
// or one of them exits (then stops the other and returns an error, for the container to restart).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger
	for _, d := range []string{cfg.RunDir, cfg.DBDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("ovsnode: %w", err)
		}
	}
	if err := prepareDB(ctx, cfg); err != nil {
		return err
	}
	db, err := start(cfg, "ovsdb-server", filepath.Join(cfg.DBDir, "conf.db"), "--remote=punix:"+cfg.DBSocket(),
		"--remote=db:Open_vSwitch,Open_vSwitch,manager_options", "--pidfile="+filepath.Join(cfg.RunDir, "ovsdb-server.pid"),
		"--no-chdir", "-vconsole:info", "-vsyslog:off")
	if err != nil {
		return err
	}
	stopDB := func() {
		db.Stop(10 * time.Second)
	}
	if err := waitFor(ctx, db, "ovsdb-server", func() bool { return call(ctx, cfg, "ovsdb-server", "version") == nil }); err != nil {
		stopDB()
		return err
	}
	if err := initDB(ctx, cfg); err != nil {
		stopDB()
		return err
	}
	vs, err := start(cfg, "ovs-vswitchd", "unix:"+cfg.DBSocket(), "--pidfile="+filepath.Join(cfg.RunDir, "ovs-vswitchd.pid"),
		"--no-chdir", "-vconsole:info", "-vsyslog:off")
	if err != nil {
		stopDB()
		return err
	}
	stop := func() {
		// exit lets ovs-vswitchd leave the kernel datapath's flows forwarding while it restarts;
		// --cleanup removes what a userspace datapath made (tap devices), which nothing else would.
		args := []string{}
		if cfg.DatapathType == "netdev" {
			args = append(args, "--cleanup")
		}
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := unixctl.New(cfg.RunDir, "ovs-vswitchd").Call(cctx, "exit", args...); err != nil {
			log.Warn("ovs-vswitchd did not take exit; stopping it", "err", err)
		}
		cancel()
		select {
		case <-vs.Done():
		case <-time.After(10 * time.Second):
		}
		vs.Stop(5 * time.Second)
		stopDB()
	}
	if err := waitFor(ctx, vs, "ovs-vswitchd", func() bool { return call(ctx, cfg, "ovs-vswitchd", "version") == nil }); err != nil {
		stop()
		return err
	}
	if cfg.Uplink != "" && cfg.UplinkBridge != "" {
		if err := ensureUplinkBridge(ctx, cfg); err != nil {
			stop()
			return err
		}
	}
	log.Info("Open vSwitch running", "rundir", cfg.RunDir, "db", filepath.Join(cfg.DBDir, "conf.db"), "datapath", cfg.DatapathType,
		"uplinkBridge", cfg.UplinkBridge)
	select {
	case <-ctx.Done():
		log.Info("stopping Open vSwitch")
		stop()
		return nil
	case <-db.Done():
		stop()
		_, err := db.Exited()
		return fmt.Errorf("ovsnode: ovsdb-server exited: %v", err)
	case <-vs.Done():
		stop()
		_, err := vs.Exited()
		return fmt.Errorf("ovsnode: ovs-vswitchd exited: %v", err)
	}
}

// Probe asks both daemons for their version over their control sockets: the container's liveness.
func Probe(ctx context.Context, cfg Config) error {
	for _, d := range []string{"ovsdb-server", "ovs-vswitchd"} {
		if err := call(ctx, cfg, d, "version"); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return nil
}

func call(ctx context.Context, cfg Config, daemon, method string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := unixctl.New(cfg.RunDir, daemon).Call(ctx, method)
	return err
}

// prepareDB creates the database, or converts an existing one to the image's schema when it needs it.
func prepareDB(ctx context.Context, cfg Config) error {
	db := filepath.Join(cfg.DBDir, "conf.db")
	tool := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, cfg.bin("ovsdb-tool"), args...)
		cmd.Env = cfg.env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("ovsnode: ovsdb-tool %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		_, err := tool("create", db, cfg.Schema)
		return err
	}
	needs, err := tool("needs-conversion", db, cfg.Schema)
	if err != nil {
		return err
	}
	if needs == "yes" {
		cfg.Logger.Info("converting the database to the image's schema", "db", db)
		_, err = tool("convert", db, cfg.Schema)
	}
	return err
}

// start runs a daemon in the foreground, its output the container's.
func start(cfg Config, name string, args ...string) (*proc.Daemon, error) {
	cmd := exec.Command(cfg.bin(name), args...)
	cmd.Env = cfg.env()
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	d, err := proc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("ovsnode: %w", err)
	}
	return d, nil
}

func waitFor(ctx context.Context, d *proc.Daemon, name string, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := proc.Poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if exited, err := d.Exited(); exited {
			return false, fmt.Errorf("ovsnode: %s exited during start-up: %v", name, err)
		}
		return ready(), nil
	})
	if err != nil {
		return fmt.Errorf("ovsnode: %s not ready: %w", name, err)
	}
	return nil
}

// uplinkMAC is the uplink bridge's MAC: locally administered, 0a:58 and the node's IPv4 address, as the
// lab's nodes have always had it, and never the uplink's own (the kernel would take the uplink's
// frames for itself too).
func uplinkMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
