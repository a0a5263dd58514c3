//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/lab/kubelab"
)

// cnpConformanceTests are the upstream ClusterNetworkPolicy conformance tests `make e2e` runs on the
// lab (`make conformance-cnp` runs all 30): both tiers, priorities, and the three tiers together with
// NetworkPolicy.
var (
	cnpConformanceTests  = []string{"CNPAdminTierPriorityField", "CNPBaselineTierIngressTCP", "CNPAdminTierIntegration"}
	cnpConformanceSubset = "^TestClusterNetworkPolicyConformance$/^(" + strings.Join(cnpConformanceTests, "|") + ")$"
)

// TestClusterNetworkPolicyConformanceSubset runs part of SIG Network's conformance suite (its own
// module, conformance/cnp) against this suite's cluster, in networkpolicy mode.
func TestClusterNetworkPolicyConformanceSubset(t *testing.T) {
	ctx := ctxT(t, 20*time.Minute)
	mode, err := currentMode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.SetMode(ctx, networkv1.PluginModeNetworkPolicy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lc.SetMode(context.Background(), mode); err != nil {
			t.Errorf("restore pluginMode %s: %v", mode, err)
		}
	})
	root, err := kubelab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-v", "-run", cnpConformanceSubset, ".")
	cmd.Dir = filepath.Join(root, "conformance", "cnp")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+lc.API.KubeconfigPath())
	out, err := cmd.CombinedOutput()
	t.Logf("upstream conformance subset:\n%s", out)
	if err != nil {
		t.Fatalf("the upstream ClusterNetworkPolicy conformance subset failed: %v", err)
	}
	// go test passes when -run matches nothing and when the suite skips a test (SkipTests, a feature
	// not claimed, KUBECONFIG unset): each test of the subset must have run and passed.
	for _, name := range cnpConformanceTests {
		if !strings.Contains(string(out), "--- PASS: TestClusterNetworkPolicyConformance/"+name+" ") {
			t.Errorf("upstream conformance test %s did not run and pass (renamed upstream, skipped, or not matched by -run)", name)
		}
	}
}
