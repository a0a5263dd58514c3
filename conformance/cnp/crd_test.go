package cnp

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployedCRDIsTheModules: deploy/ installs the ClusterNetworkPolicy CRD exactly as
// network-policy-api v0.3.0 ships it (experimental channel), byte for byte.
func TestDeployedCRDIsTheModules(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const name = "policy.networking.k8s.io_clusternetworkpolicies.yaml"
	want, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "experimental", name))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "deploy", "crds", name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/crds/%s differs from the module's: copy it again from the module", name)
	}
}
