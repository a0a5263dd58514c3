// Package deploy holds the manifests a cluster applies to run ofsdn (kustomization.yaml at the root);
// this test proves the API server accepts all of them.
package deploy

import (
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/e2e/kubelab"
)

// TestServerSideDryRun applies the kustomization with a server-side dry run against a real API server:
// every object passes the server's validation and admission (the CRDs and the namespace are created
// for real first, as the objects in them need them to exist).
func TestServerSideDryRun(t *testing.T) {
	c := kubelab.Start(t, kubelab.Options{})
	if out, err := c.Kubectl("apply", "--server-side", "-f", "namespace.yaml", "-f", "crds/"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := c.Kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := c.Kubectl("apply", "--server-side", "--dry-run=server", "-k", ".")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"daemonset.apps/ofsdn-agent", "clusterrole.rbac.authorization.k8s.io/ofsdn-agent",
		"deployment.apps/ofsdn-controller", "clusterrole.rbac.authorization.k8s.io/ofsdn-controller"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run did not apply %s:\n%s", want, out)
		}
	}
}
