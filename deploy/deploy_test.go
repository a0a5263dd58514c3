// Package deploy holds the manifests a cluster applies to run ofsdn (kustomization.yaml at the root);
// this test proves the API server accepts all of them.
package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodeauth"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// overlay writes a user's kustomization on top of deploy/, as README's Deploying section shows: the
// image from a registry of their own by digest, and the API server's address.
func overlay(t *testing.T, image, digest, apiHost string) string {
	t.Helper()
	deployDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, deployDir) // kustomize takes relative paths only
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: ofsdn/ofsdn
    newName: %s
    digest: %s
patches:
  - target: {kind: ConfigMap, name: ofsdn-apiserver}
    patch: |-
      - {op: replace, path: /data/host, value: %q}
`, rel, image, digest, apiHost)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestApplyForReal applies deploy/ through a user's overlay with server-side apply, for real, on a
// real API server: every object of every manifest under deploy/ exists afterwards, the agent's
// DaemonSet and the controller's Deployment run the overlay's image (by digest), as root and as
// nonroot. Applying a new digest over it is an upgrade: one new generation of each workload, with the
// rolling strategies deploy/ promises, and nothing else refused.
func TestApplyForReal(t *testing.T) {
	c := kubelab.Start(t, kubelab.Options{})
	const image = "registry.example/ofsdn/ofsdn"
	v1 := "sha256:" + strings.Repeat("1", 64)
	out, err := c.Kubectl("apply", "--server-side", "-k", overlay(t, image, v1, "192.0.2.10"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	// What must exist comes from the manifests themselves, not from kubectl's report.
	want := manifestObjects(t)
	if len(want) < 12 {
		t.Fatalf("only %d objects found under deploy/", len(want))
	}
	for _, o := range want {
		args := []string{"get", o.resource(), "-o", "name"}
		if o.Namespace != "" {
			args = append(args, "-n", o.Namespace)
		}
		if got, err := c.Kubectl(args...); err != nil {
			t.Errorf("%s not created: %v\n%s", o, err, got)
		}
	}

	kube, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	cm, err := kube.CoreV1().ConfigMaps("ofsdn").Get(t.Context(), "ofsdn-apiserver", metav1.GetOptions{})
	if err != nil || cm.Data["host"] != "192.0.2.10" {
		t.Errorf("ofsdn-apiserver: %v %v", cm.Data, err)
	}
	ds, dep := workloads(t, kube)
	checkImage(t, "DaemonSet ofsdn-agent", ds.Spec.Template.Spec, image+"@"+v1)
	checkImage(t, "Deployment ofsdn-controller", dep.Spec.Template.Spec, image+"@"+v1)
	if sc := ds.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged ||
		sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("the agent must run privileged as root (the image's default user is nonroot): %+v", sc)
	}
	if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("the controller must run as the image's nonroot user: %+v", sc)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		dep.Spec.Strategy.RollingUpdate == nil || dep.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("update strategies: DaemonSet %+v, Deployment %+v", ds.Spec.UpdateStrategy, dep.Spec.Strategy)
	}

	// Upgrade: the same overlay with the next image.
	v2 := "sha256:" + strings.Repeat("2", 64)
	if out, err := c.Kubectl("apply", "--server-side", "-k", overlay(t, image, v2, "192.0.2.10")); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	ds2, dep2 := workloads(t, kube)
	checkImage(t, "upgraded DaemonSet ofsdn-agent", ds2.Spec.Template.Spec, image+"@"+v2)
	checkImage(t, "upgraded Deployment ofsdn-controller", dep2.Spec.Template.Spec, image+"@"+v2)
	if ds2.Generation != ds.Generation+1 || dep2.Generation != dep.Generation+1 {
		t.Errorf("upgrade: generations %d→%d and %d→%d, want one step each", ds.Generation, ds2.Generation, dep.Generation, dep2.Generation)
	}
}

func workloads(t *testing.T, kube kubernetes.Interface) (*appsv1.DaemonSet, *appsv1.Deployment) {
	t.Helper()
	ds, err := kube.AppsV1().DaemonSets("ofsdn").Get(t.Context(), "ofsdn-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep, err := kube.AppsV1().Deployments("ofsdn").Get(t.Context(), "ofsdn-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds, dep
}

func checkImage(t *testing.T, what string, spec corev1.PodSpec, want string) {
	t.Helper()
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != want {
			t.Errorf("%s: container %s runs %q, want %q", what, c.Name, c.Image, want)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: container %s pulls %s; IfNotPresent lets nodes run an imported image", what, c.Name, c.ImagePullPolicy)
		}
	}
}

// object is one manifest document's identity.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Namespace string `json:"-"`
}

func (o object) resource() string {
	group, _, found := strings.Cut(o.APIVersion, "/")
	if !found {
		group = ""
	}
	if group == "" {
		return strings.ToLower(o.Kind) + "/" + o.Metadata.Name
	}
	return strings.ToLower(o.Kind) + "." + group + "/" + o.Metadata.Name
}

func (o object) String() string { return o.resource() + " in " + o.Namespace }

// manifestObjects reads every document of every manifest under deploy/ (kustomizations aside).
func manifestObjects(t *testing.T) []object {
	t.Helper()
	var objs []object
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || filepath.Base(path) == "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if o.Kind == "" {
				continue
			}
			o.Namespace = o.Metadata.Namespace
			objs = append(objs, o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
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

// TestAgentProbesMatchItsFlags: the DaemonSet's probes ask the port the agent's --metrics-address
// binds (through the named container port), at the paths the agent serves, and the debug port is the
// one --debug-address binds on the node's address. e2e's TestAgentProbes asks a running agent with
// these same values.
func TestAgentProbesMatchItsFlags(t *testing.T) {
	var ds struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	readYAML(t, "agent/daemonset.yaml", &ds)
	var agent *corev1.Container
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "agent" {
			agent = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("no agent container")
	}
	flag := func(name string) string {
		for _, a := range agent.Args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		t.Fatalf("agent container has no %s", name)
		return ""
	}
	port := func(named string) int32 {
		for _, p := range agent.Ports {
			if p.Name == named {
				return p.ContainerPort
			}
		}
		t.Fatalf("no container port named %s", named)
		return 0
	}
	metricsPort := port("metrics")
	if want := ":" + strconv.Itoa(int(metricsPort)); !strings.HasSuffix(flag("--metrics-address"), want) {
		t.Errorf("--metrics-address=%s does not bind the metrics port %d", flag("--metrics-address"), metricsPort)
	}
	if want := "$(HOST_IP):" + strconv.Itoa(int(port("debug"))); flag("--debug-address") != want {
		t.Errorf("--debug-address=%s, want %s (the node's own address and the debug port)", flag("--debug-address"), want)
	}
	hostIP := slices.IndexFunc(agent.Env, func(e corev1.EnvVar) bool {
		return e.Name == "HOST_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	})
	if hostIP < 0 {
		t.Error("HOST_IP does not come from status.hostIP")
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", agent.LivenessProbe, "/healthz"}, {"readiness", agent.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port.String() != "metrics" || g.Host != "" {
			t.Errorf("%s probe asks %s:%s%s; want the pod's (node's) address, port metrics, %s", p.name, g.Host, g.Port.String(), g.Path, p.path)
		}
		// The metrics address speaks only TLS (agent/nodeauth).
		if g.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe's scheme is %q; the metrics address speaks HTTPS", p.name, g.Scheme)
		}
	}
	if _, err := time.ParseDuration(flag("--drift-check-period")); err != nil {
		t.Errorf("--drift-check-period: %v", err)
	}
}

// TestClusterNetworkEncapsulation: the CRD's schema, on a real API server, defaults encapsulation to
// vxlan, takes none, and refuses anything else with a message that names the allowed values.
func TestClusterNetworkEncapsulation(t *testing.T) {
	c := kubelab.StartDeploy(t, kubelab.Options{}, "crds/")
	cn := func(encap string) string {
		line := ""
		if encap != "" {
			line = "\n  encapsulation: " + encap
		}
		return `apiVersion: network.ofsdn.io/v1
kind: ClusterNetwork
metadata: {name: default}
spec:
  clusterCIDRs: ["10.128.0.0/14"]
  hostSubnetLength: 9
  serviceNetwork: 172.30.0.0/16` + line + "\n"
	}
	apply := func(doc string) (string, error) {
		path := filepath.Join(t.TempDir(), "cn.yaml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return c.Kubectl("apply", "--server-side", "--force-conflicts", "-f", path)
	}
	get := func() string {
		out, err := c.Kubectl("get", "clusternetwork", "default", "-o", "jsonpath={.spec.encapsulation}")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}
	if out, err := apply(cn("")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := get(); got != "vxlan" {
		t.Errorf("encapsulation defaulted to %q, want vxlan", got)
	}
	if out, err := apply(cn("none")); err != nil {
		t.Fatalf("none refused: %v\n%s", err, out)
	}
	if got := get(); got != "none" {
		t.Errorf("encapsulation is %q after applying none", got)
	}
	for _, bad := range []string{"geneve", "VXLAN", `""`} {
		out, err := apply(cn(bad))
		if err == nil || !strings.Contains(err.Error()+out, `supported values: "vxlan", "none"`) {
			t.Errorf("encapsulation %s: err %v, want a refusal naming the supported values:\n%s", bad, err, out)
		}
	}
	if got := get(); got != "none" {
		t.Errorf("a refused change altered encapsulation to %q", got)
	}
}

// hostOVSOverlay is README's overlay for nodes that run Open vSwitch themselves.
const hostOVSOverlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - patch: |-
      $patch: delete
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: ofsdn-ovs, namespace: ofsdn}
`

// deploy/ runs Open vSwitch as a DaemonSet from its own image, privileged on the host network, sharing
// the agent's /var/run/openvswitch; README's host-OVS overlay removes exactly that DaemonSet.
func TestOVSDaemonSetAndHostOVSOverlay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs kubectl kustomize")
	}
	bin, err := kubelab.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	kustomize := func(dir string) []map[string]any {
		out, err := exec.Command(filepath.Join(bin, "kubectl"), "kustomize", dir).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		var objs []map[string]any
		for _, doc := range strings.Split(string(out), "\n---\n") {
			var o map[string]any
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			objs = append(objs, o)
		}
		return objs
	}
	find := func(objs []map[string]any, kind, name string) map[string]any {
		for _, o := range objs {
			if md, _ := o["metadata"].(map[string]any); o["kind"] == kind && md["name"] == name {
				return o
			}
		}
		return nil
	}
	all := kustomize(".")
	ovs := find(all, "DaemonSet", "ofsdn-ovs")
	if ovs == nil {
		t.Fatal("deploy/ has no Open vSwitch DaemonSet")
	}
	var ds appsv1.DaemonSet
	data, _ := yaml.Marshal(ovs)
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if !spec.HostNetwork || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged ||
		!strings.HasPrefix(c.Image, "ofsdn/openvswitch:") || c.LivenessProbe == nil {
		t.Errorf("the Open vSwitch DaemonSet: hostNetwork %v, container %+v", spec.HostNetwork, c)
	}
	shared := false
	for _, v := range spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/var/run/openvswitch" {
			shared = true
		}
	}
	if !shared {
		t.Error("the Open vSwitch DaemonSet does not put its sockets in the host's /var/run/openvswitch, where the agent looks")
	}
	dir := t.TempDir()
	deployDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, deployDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(fmt.Sprintf(hostOVSOverlay, rel)), 0o644); err != nil {
		t.Fatal(err)
	}
	host := kustomize(dir)
	if find(host, "DaemonSet", "ofsdn-ovs") != nil {
		t.Error("the host-OVS overlay still runs the Open vSwitch DaemonSet")
	}
	if len(host) != len(all)-1 || find(host, "DaemonSet", "ofsdn-agent") == nil {
		t.Errorf("the host-OVS overlay has %d objects, want deploy/'s %d but one, the agent's DaemonSet among them", len(host), len(all))
	}
}

// TestNodeAPIRBAC: deploy/ grants what the node API checks (agent/nodeauth) and what README's "The node
// API" tells users to bind: the agent may ask for reviews (system:auth-delegator); ClusterRole
// ofsdn-node-reader is exactly nodes/debug of the API group nodeauth asks about, get and create (a
// trace); ofsdn-metrics-reader is get on /metrics; flowctl's ServiceAccount, the one debugapi names, is
// bound to the reader role, and Role ofsdn-flowctl lets its holders mint that ServiceAccount's tokens
// and nothing else. TestNodeAPIOnARealAPIServer (agent/nodeauth) checks the same grants on a real API
// server.
func TestNodeAPIRBAC(t *testing.T) {
	docs := map[string]rbacv1.ClusterRole{}
	var bindings []rbacv1.ClusterRoleBinding
	var roles []rbacv1.Role
	var sas []corev1.ServiceAccount
	for _, file := range []string{"agent/rbac.yaml", "agent/nodeapi-rbac.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			var err error
			switch o.Kind {
			case "ClusterRole":
				var r rbacv1.ClusterRole
				err = yaml.UnmarshalStrict([]byte(doc), &r)
				docs[r.Name] = r
			case "ClusterRoleBinding":
				var b rbacv1.ClusterRoleBinding
				err = yaml.UnmarshalStrict([]byte(doc), &b)
				bindings = append(bindings, b)
			case "Role":
				var r rbacv1.Role
				err = yaml.UnmarshalStrict([]byte(doc), &r)
				roles = append(roles, r)
			case "ServiceAccount":
				var sa corev1.ServiceAccount
				err = yaml.UnmarshalStrict([]byte(doc), &sa)
				sas = append(sas, sa)
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		}
	}
	bound := func(role, ns, sa string) bool {
		return slices.ContainsFunc(bindings, func(b rbacv1.ClusterRoleBinding) bool {
			return b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == role && slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == "ServiceAccount" && s.Namespace == ns && s.Name == sa
			})
		})
	}
	if !bound("system:auth-delegator", "ofsdn", "ofsdn-agent") {
		t.Error("the agent's ServiceAccount is not bound to system:auth-delegator: it cannot review the node API's callers")
	}
	reader := docs["ofsdn-node-reader"].Rules
	want := []rbacv1.PolicyRule{{APIGroups: []string{nodeauth.Group}, Resources: []string{"nodes/" + nodeauth.SubresourceDebug}, Verbs: []string{"get", "create"}}}
	if !reflect.DeepEqual(reader, want) {
		t.Errorf("ofsdn-node-reader: %+v, want %+v", reader, want)
	}
	metrics := docs["ofsdn-metrics-reader"].Rules
	if len(metrics) != 1 || !reflect.DeepEqual(metrics[0].NonResourceURLs, []string{"/metrics"}) || !reflect.DeepEqual(metrics[0].Verbs, []string{"get"}) {
		t.Errorf("ofsdn-metrics-reader: %+v", metrics)
	}
	ns, name, _ := strings.Cut(debugapi.DefaultTokenServiceAccount, "/")
	if !slices.ContainsFunc(sas, func(sa corev1.ServiceAccount) bool { return sa.Namespace == ns && sa.Name == name }) {
		t.Errorf("no ServiceAccount %s, which flowctl mints tokens for", debugapi.DefaultTokenServiceAccount)
	}
	if !bound("ofsdn-node-reader", ns, name) {
		t.Errorf("%s is not bound to ofsdn-node-reader", debugapi.DefaultTokenServiceAccount)
	}
	i := slices.IndexFunc(roles, func(r rbacv1.Role) bool { return r.Name == "ofsdn-flowctl" && r.Namespace == ns })
	if i < 0 {
		t.Fatal("no Role ofsdn-flowctl")
	}
	wantRole := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{name}, Verbs: []string{"create"}}}
	if !reflect.DeepEqual(roles[i].Rules, wantRole) {
		t.Errorf("Role ofsdn-flowctl: %+v, want %+v", roles[i].Rules, wantRole)
	}
}
