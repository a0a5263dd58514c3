package v1

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsUpToDate regenerates deepcopy, the clientset, informers, listers and the CRD YAML into
// a scratch copy and fails when they differ from what is committed. It needs the Go module cache (or proxy),
// so -short skips it.
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generators; skipped with -short")
	}
	script, err := filepath.Abs("../../../hack/update-codegen.sh")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "bash", script, "--verify").CombinedOutput()
	if err != nil {
		t.Fatalf("hack/update-codegen.sh --verify: %v\n%s", err, out)
	}
}
