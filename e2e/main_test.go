//go:build e2e

// Package e2e proves ofsdn on the 3-node lab: real OVS per node, a real API server, the controller, one
// agent per node and pods run through the CNI plugin by the node simulator. One cluster serves the whole
// suite (it takes a while to start); tests leave it as they found it. `make e2e` runs it.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

var lc *cluster.Cluster

// kubelets runs the suite on real containerd and kubelet per node, ofsdn from deploy/ and its image
// (OFSDN_E2E_KUBELETS=1, make e2e-kubelets); tests that drive the stand-in or the agent's process skip.
var kubelets = os.Getenv("OFSDN_E2E_KUBELETS") == "1"

// needsStandIn skips a test on real kubelets, saying why it needs the lab's stand-in.
func needsStandIn(t testing.TB, why string) {
	t.Helper()
	if kubelets {
		t.Skip("on real kubelets: " + why)
	}
}

// absentPodGrace is the lab agents' --absent-pod-grace: short, so restore tests need not wait the
// production default of two minutes.
const absentPodGrace = 20 * time.Second

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped under -short")
		os.Exit(0)
	}
	if why := lab.Available(); why != "" {
		fmt.Println("e2e:", why)
		os.Exit(1)
	}
	lab.Sweep(lab.DefaultPrefixBase)
	kubelab.Sweep()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var err error
	// Drift checks every few seconds (the DaemonSet says 5m): TestDriftRepairAndDiff waits for one.
	// --profiling: TestNodeAPIAccess shows who may profile an agent.
	lc, err = cluster.Start(ctx, cluster.Options{Logger: logger, Kubelets: kubelets, AgentArgs: []string{"-v=2", "--absent-pod-grace=" + absentPodGrace.String(),
		"--drift-check-period=3s", "--profiling"}})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cluster start:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, lc.Logs(60))
	}
	lc.Stop()
	os.Exit(code)
}

// ctxT is a test's context with a bound, so a hung probe fails the test instead of the whole run.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
