// Command ofsdn-ovs is the entrypoint of ofsdn's Open vSwitch image (deploy/ovs): it runs ovsdb-server
// and ovs-vswitchd for a node without an Open vSwitch of its own (internal/ovsnode).
//
//	ofsdn-ovs [--ovs-rundir /var/run/openvswitch] [--db-dir /etc/openvswitch] [--datapath-type system]
//	          [--uplink eth0 --uplink-bridge br-ex]
//	ofsdn-ovs probe     (liveness: both daemons answer on their control sockets)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/ofsdn/ofsdn/internal/ovsnode"
	"github.com/ofsdn/ofsdn/internal/version"
)

func main() {
	var cfg ovsnode.Config
	fs := flag.NewFlagSet("ofsdn-ovs", flag.ExitOnError)
	fs.StringVar(&cfg.RunDir, "ovs-rundir", "/var/run/openvswitch", "Open vSwitch run directory (db.sock, pidfiles, control sockets, <bridge>.mgmt)")
	fs.StringVar(&cfg.DBDir, "db-dir", "/etc/openvswitch", "where conf.db lives (a host directory, so it outlives the container)")
	fs.StringVar(&cfg.Schema, "schema", "/usr/share/openvswitch/vswitch.ovsschema", "the image's database schema")
	fs.StringVar(&cfg.DatapathType, "datapath-type", "system", "the node's datapath, as the agent's --datapath-type: system or netdev")
	fs.StringVar(&cfg.Uplink, "uplink", "", "with --uplink-bridge: the node's underlay interface, moved into that bridge with its IPv4 addresses (userspace datapath)")
	fs.StringVar(&cfg.UplinkBridge, "uplink-bridge", "", "the bridge that holds the node's address (see --uplink)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	args := os.Args[1:]
	probe := len(args) > 0 && args[0] == "probe"
	if probe {
		args = args[1:]
	}
	_ = fs.Parse(args)
	if *showVersion {
		fmt.Println("ofsdn-ovs", version.String())
		return
	}
	if (cfg.Uplink == "") != (cfg.UplinkBridge == "") {
		fmt.Fprintln(os.Stderr, "ofsdn-ovs: --uplink and --uplink-bridge go together")
		os.Exit(2)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "ofsdn-ovs")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if probe {
		err = ovsnode.Probe(ctx, cfg)
	} else {
		cfg.Logger.Info("starting", "version", version.String())
		err = ovsnode.Run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-ovs:", err)
		os.Exit(1)
	}
}
