//go:build e2e

package conformance

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/lab"
)

// CISubset is the part of make conformance that make test runs (CI's budget): pod-to-pod and node-to-pod
// over TCP and UDP, DNS, ClusterIP with session affinity, NodePort, hostPort, the API server's proxy, and
// NetworkPolicy ingress by port and default deny — one cluster, networkpolicy mode.
const CISubset = `Networking Granular Checks: Pods should function for (intra|node)-pod communication: (http|udp) |` +
	`DNS should provide DNS for services \[Conformance\]|` +
	`Services should serve a basic endpoint from pods|` +
	`Services should have session affinity work for service with type clusterIP|` +
	`Services should be able to create a functioning NodePort service|` +
	`HostPort validates that there is no conflict|` +
	`Proxy version v1 should proxy through a service and a pod|` +
	`Netpol NetworkPolicy between server and client should (enforce policy based on Ports|support a 'default-deny-ingress' policy) \[Feature:NetworkPolicy\]$`

// TestConformanceSubset runs CISubset of Kubernetes' own e2e suite against the lab on real kubelets:
// every selected test must pass (none may be skipped: each of them applies to the lab).
func TestConformanceSubset(t *testing.T) {
	lab.Require(t)
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Modes: []networkv1.PluginMode{networkv1.PluginModeNetworkPolicy}, Only: CISubset, BinDir: bin,
		OutDir: t.TempDir(), Procs: 2, Timeout: 20 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	t.Logf("\n%s", Table(res))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) < 12 {
		t.Errorf("%d tests ran, want the subset's 13", len(res))
	}
	for _, r := range res {
		if r.State != Passed {
			t.Errorf("%s: %s %s", r.Name, r.State, r.Reason)
		}
	}
}
