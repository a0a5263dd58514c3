// Command ofsdn-demo runs the demo cluster (see e2e/demo) and tears it down on exit.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/demo"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	"github.com/ofsdn/ofsdn/lab/kubenode"
)

func main() {
	nodes := flag.Int("nodes", 3, "lab nodes")
	mode := flag.String("mode", "multitenant", "pluginMode: multitenant, subnet or networkpolicy")
	binDir := flag.String("bin-dir", "", "prebuilt ofsdn binaries (default: build them)")
	keep := flag.Bool("keep", false, "keep the cluster up until interrupted")
	down := flag.Bool("down", false, "only remove labs and API servers left by killed runs")
	verbose := flag.Bool("v", false, "log the cluster's progress")
	kubelets := flag.Bool("kubelets", true, "real containerd and kubelet per node, ofsdn from deploy/ and its image (false: the kubelet stand-in, ofsdn's daemons as processes)")
	coreDNS := flag.String("coredns", "", "with --kubelets: a CoreDNS binary for the nodes' images (make k8s-e2e-bins builds one)")
	flag.Parse()
	if *down {
		kubelab.Sweep()
		kubenode.Sweep("")
		lab.Sweep("")
		return
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := demo.Run(ctx, os.Stdout, demo.Options{Nodes: *nodes, Mode: networkv1.PluginMode(*mode), BinDir: *binDir, Keep: *keep, Logger: logger,
		Kubelets: *kubelets, CoreDNS: *coreDNS})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-demo:", err)
		os.Exit(1)
	}
	if bad := res.Mismatches(); len(bad) > 0 {
		os.Exit(2)
	}
}
