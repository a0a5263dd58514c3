package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
)

// A JUnit report as ginkgo writes it: the suites' tests come out passed, failed (with the failure's
// first line), skipped by a lab rule (with the rule's reason, whatever ginkgo says) or by the framework
// (with its message); tests of no suite are left out, and each test is reported once.
func TestReadJUnit(t *testing.T) {
	report := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6">
  <testsuite name="Kubernetes e2e suite" tests="6">
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" status="passed" time="12.5"></testcase>
    <testcase name="[It] [sig-network] Services should be rejected when no endpoints exist [sig-network]" status="failed" time="30">
      <failure message="[FAILED] error running /tmp/x/kubectl --server=https://192.0.2.1:6443 --kubeconfig=/tmp/k/admin.kubeconfig exec p -- curl&#xA;more" type="failed">[FAILED] x</failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work after restarting apiserver [Disruptive]" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Services should have session affinity work for LoadBalancer service with ESIPP on [Slow] [LinuxOnly]" status="skipped" time="0">
      <skipped message="skipped - Only supported for providers [gce gke aws] (not local)"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Netpol NetworkPolicy between server and client should support allow-all policy [Feature:NetworkPolicy]" status="passed" time="60"></testcase>
    <testcase name="[It] [sig-storage] Volumes should work" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" status="passed" time="12.5"></testcase>
    <testcase name="[It] [sig-network] Services should serve multiport endpoints from pods [Conformance]" status="skipped" time="0">
      <skipped message="skipped - Only supported for providers [gce gke] (not local)"></skipped>
    </testcase>
  </testsuite>
</testsuites>`
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := ReadJUnit(path, networkv1.PluginModeNetworkPolicy, Suites, "", Rules)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		suite  string
		state  State
		reason string
	}{
		"[sig-network] Netpol NetworkPolicy between server and client should support allow-all policy [Feature:NetworkPolicy]": {"Netpol", Passed, ""},
		"[sig-network] Services should be rejected when no endpoints exist":                                                    {"Services", Failed, "error running kubectl exec p -- curl"},
		"[sig-network] Services should have session affinity work for LoadBalancer service with ESIPP on [Slow] [LinuxOnly]":   {"Services", Skipped, "needs a cloud load balancer: the lab has no cloud provider"},
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                                         {"Conformance", Passed, ""},
		"[sig-network] Services should serve multiport endpoints from pods [Conformance]":                                      {"Conformance", Skipped, "Only supported for providers [gce gke] (not local)"},
		"[sig-network] Services should work after restarting apiserver [Disruptive]":                                           {"Services", Skipped, Rules[0].Reason},
	}
	if len(res) != len(want) {
		t.Errorf("%d results, want %d: %+v", len(res), len(want), res)
	}
	for _, r := range res {
		w, ok := want[r.Name]
		if !ok {
			t.Errorf("unexpected result %+v", r)
			continue
		}
		if r.Suite != w.suite || r.State != w.state || r.Reason != w.reason || r.Mode != networkv1.PluginModeNetworkPolicy {
			t.Errorf("%s: %s %s %q, want %s %s %q", r.Name, r.Suite, r.State, r.Reason, w.suite, w.state, w.reason)
		}
	}
	// Only keeps a subset; Netpol does not apply in multitenant mode.
	res, err = ReadJUnit(path, networkv1.PluginModeMultitenant, suitesFor(Options{Suites: Suites}, networkv1.PluginModeMultitenant), "basic endpoint", Rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].State != Passed {
		t.Errorf("with Only: %+v", res)
	}
	table := Table(res)
	if !strings.HasSuffix(table, "\nconformance: 1 passed, 0 failed, 0 skipped\n") || !strings.Contains(table, "| multitenant | Conformance |") {
		t.Errorf("table:\n%s", table)
	}
}
