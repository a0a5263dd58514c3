// Command ofsdn-lab starts the 3-node lab cluster (e2e/cluster: OVS per node namespace, a real API
// server, ofsdn-controller, an agent and a kubelet stand-in per node), runs a command against it with
// KUBECONFIG set to the cluster's admin kubeconfig, tears the cluster down and exits with the
// command's status. `make conformance-cnp` runs the upstream ClusterNetworkPolicy conformance suite
// (conformance/cnp, a module of its own) this way.
//
//	ofsdn-lab [--mode networkpolicy] [--nodes 3] [--bin-dir DIR] [-v] -- COMMAND [ARG...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/e2e/kubelab"
	"github.com/ofsdn/ofsdn/e2e/lab"
)

func main() { os.Exit(run()) }

func run() int {
	nodes := flag.Int("nodes", 3, "lab nodes")
	mode := flag.String("mode", "networkpolicy", "pluginMode: multitenant, subnet or networkpolicy")
	binDir := flag.String("bin-dir", "", "prebuilt ofsdn binaries (default: build them)")
	verbose := flag.Bool("v", false, "log the cluster's progress")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: ofsdn-lab [flags] -- COMMAND [ARG...]")
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	lab.Sweep(lab.DefaultPrefixBase) // what killed runs left (live labs of other processes stay)
	kubelab.Sweep()
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	c, err := cluster.Start(sctx, cluster.Options{Nodes: *nodes, Mode: networkv1.PluginMode(*mode), BinDir: *binDir, Logger: logger})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-lab: cluster start:", err)
		return 1
	}
	defer c.Stop()
	fmt.Fprintf(os.Stderr, "ofsdn-lab: %d-node cluster (%s mode) up in %s; KUBECONFIG=%s\n", *nodes, *mode,
		time.Since(start).Round(time.Millisecond), c.API.KubeconfigPath())
	cmd := exec.CommandContext(ctx, flag.Arg(0), flag.Args()[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.API.KubeconfigPath())
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		fmt.Fprintln(os.Stderr, c.Logs(40))
		return exit.ExitCode()
	}
	fmt.Fprintln(os.Stderr, "ofsdn-lab:", err)
	return 1
}
