// Command ofsdn-conformance is `make conformance`: Kubernetes' own [sig-network] e2e tests (the
// [Conformance] ones, Services, and NetworkPolicy in networkpolicy mode) against a lab cluster on real
// kubelets, once per plugin mode (e2e/conformance). It prints a table of every test — passed, failed,
// or skipped with the reason — and ends with "conformance: N passed, M failed, K skipped"; it exits 1
// when a test failed.
//
//	ofsdn-conformance [--modes multitenant,networkpolicy] [--only REGEXP] [--procs 3] [--out DIR] [--table FILE] [-v]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/e2e/conformance"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	"github.com/ofsdn/ofsdn/lab/kubenode"
)

func main() {
	modes := flag.String("modes", "multitenant,networkpolicy", "plugin modes, comma-separated (subnet, multitenant, networkpolicy)")
	only := flag.String("only", "", "run only the tests matching this regular expression (within the suites)")
	procs := flag.Int("procs", 3, "tests run in parallel (ginkgo --procs)")
	out := flag.String("out", "_output/conformance", "directory for JUnit reports and logs")
	table := flag.String("table", "", "also write the table to this file")
	verbose := flag.Bool("v", false, "show ginkgo's output as it runs")
	fromReports := flag.Bool("from-reports", false, "run nothing: print the table from the JUnit reports an earlier run left in --out")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, *modes, *only, *procs, *out, *table, *verbose, *fromReports)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ofsdn-conformance:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, modes, only string, procs int, out, table string, verbose, fromReports bool) (int, error) {
	opts := conformance.Options{Only: only, Procs: procs, OutDir: out,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, m := range strings.Split(modes, ",") {
		opts.Modes = append(opts.Modes, networkv1.PluginMode(strings.TrimSpace(m)))
	}
	if fromReports {
		res, err := conformance.Report(out, opts.Modes, opts)
		fmt.Print(conformance.Table(res))
		if err != nil {
			return 2, err
		}
		return 0, nil
	}
	if why := lab.Available(); why != "" {
		return 2, fmt.Errorf("%s", why)
	}
	lab.Sweep(lab.DefaultPrefixBase)
	kubelab.Sweep()
	kubenode.Sweep("")
	if verbose {
		opts.Progress = os.Stderr
	} else {
		opts.Progress = io.Discard
	}
	began := time.Now()
	res, err := conformance.Run(ctx, opts)
	t := conformance.Table(res)
	fmt.Print(t)
	fmt.Fprintf(os.Stderr, "took %s; reports in %s\n", time.Since(began).Round(time.Second), out)
	if table != "" {
		if werr := os.WriteFile(table, []byte(t), 0o644); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return 2, err
	}
	if _, failed, _ := conformance.Counts(res); failed > 0 {
		return 1, nil
	}
	return 0, nil
}
