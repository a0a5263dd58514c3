// Command ofsdn-demo runs the demo lab (see e2e/demo) and tears it down on exit.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ofsdn/ofsdn/e2e/demo"
	"github.com/ofsdn/ofsdn/e2e/lab"
	"github.com/ofsdn/ofsdn/flows"
)

func main() {
	nodes := flag.Int("nodes", 2, "lab nodes")
	mode := flag.String("mode", "multitenant", "multitenant or subnet")
	keep := flag.Bool("keep", false, "keep the lab up until interrupted")
	down := flag.Bool("down", false, "only remove labs left by killed runs")
	flag.Parse()
	if *down {
		lab.Sweep("")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := demo.Run(ctx, os.Stdout, demo.Options{Nodes: *nodes, Mode: flows.Mode(*mode), Keep: *keep})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-demo:", err)
		os.Exit(1)
	}
	if bad := res.Mismatches(); len(bad) > 0 {
		os.Exit(2)
	}
}
