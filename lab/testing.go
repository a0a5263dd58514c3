package lab

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Available reports why a lab cannot run here ("" when it can).
func Available() string {
	if os.Geteuid() != 0 {
		return "the lab needs root (network namespaces, veths, tap devices)"
	}
	for _, bin := range []string{"ip", "ethtool", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found: run `make deps`"
		}
	}
	return ""
}

// Require skips under -short and fails when the lab cannot run, unless OFSDN_SKIP_OVS=1 asks for a skip
// (the same contract as internal/ovstest: `make test` installs what the lab needs).
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("lab: skipped under -short")
	}
	if why := Available(); why != "" {
		if os.Getenv("OFSDN_SKIP_OVS") == "1" {
			t.Skip(why)
		}
		t.Fatal(why)
	}
}

var sweepOnce sync.Once

// StartT starts a lab for a test (Require first) and stops it in t.Cleanup, even when the test fails.
// The first call in a process sweeps what killed runs left under DefaultPrefixBase.
func StartT(t testing.TB, opts Options) *Lab {
	t.Helper()
	Require(t)
	sweepOnce.Do(func() { Sweep(DefaultPrefixBase) })
	l, err := Start(context.Background(), opts)
	if l != nil {
		t.Cleanup(func() {
			if err := l.Stop(); err != nil {
				t.Errorf("lab stop: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("lab start: %v", err)
	}
	t.Logf("lab %s: %d nodes on %s, started in %s", l.Prefix, len(l.Nodes), l.Underlay, l.StartDuration.Round(time.Millisecond))
	return l
}
