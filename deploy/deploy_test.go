// Package deploy holds the manifests a cluster applies to run ofsdn (kustomization.yaml at the root);
// this test proves the API server accepts all of them.
package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/e2e/kubelab"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestServerSideDryRun applies the kustomization with a server-side dry run against a real API server:
// every object passes the server's validation and admission (the CRDs and the namespace are created
// for real first, as the objects in them need them to exist).
func TestServerSideDryRun(t *testing.T) {
	c := kubelab.StartDeploy(t, kubelab.Options{}, "namespace.yaml", "crds/")
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

// TestComponentsReachTheAPIServerDirectly: ofsdn replaces kube-proxy, so the agent and the controller
// cannot use the kubernetes ClusterIP to reach the API server (it works only once the agent runs); every
// container of both gets KUBERNETES_SERVICE_HOST and _PORT from keys that apiserver.yaml defines.
func TestComponentsReachTheAPIServerDirectly(t *testing.T) {
	var cm corev1.ConfigMap
	readYAML(t, "apiserver.yaml", &cm)
	for _, file := range []string{"agent/daemonset.yaml", "controller/deployment.yaml"} {
		var w struct {
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		readYAML(t, file, &w)
		if !w.Spec.Template.Spec.HostNetwork {
			t.Errorf("%s: not hostNetwork; the pod network needs this component first", file)
		}
		for _, c := range w.Spec.Template.Spec.Containers {
			for _, want := range []string{"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} {
				i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == want })
				if i < 0 {
					t.Errorf("%s: container %s has no %s", file, c.Name, want)
					continue
				}
				ref := c.Env[i].ValueFrom
				if ref == nil || ref.ConfigMapKeyRef == nil || ref.ConfigMapKeyRef.Name != cm.Name {
					t.Errorf("%s: container %s: %s does not come from ConfigMap %s", file, c.Name, want, cm.Name)
					continue
				}
				if _, ok := cm.Data[ref.ConfigMapKeyRef.Key]; !ok {
					t.Errorf("%s: container %s: %s reads key %q, which %s lacks", file, c.Name, want, ref.ConfigMapKeyRef.Key, cm.Name)
				}
			}
		}
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
