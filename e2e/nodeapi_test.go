//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodeauth"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/lab"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// nodeAPIEndpoint is one thing an agent serves on its node's address besides the probes.
type nodeAPIEndpoint struct {
	name, method, url string
	// answered is what an allowed caller gets.
	answered func(code int, body string) bool
}

// nodeAPIEndpoints are node n's debug API (its drop stream included), metrics and pprof as deploy/'s
// DaemonSet serves them (the lab's agents run with --profiling).
func nodeAPIEndpoints(t *testing.T, n *cluster.Node) []nodeAPIEndpoint {
	c := agentContainer(t)
	port := func(name string) int32 {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
		t.Fatalf("no container port %s", name)
		return 0
	}
	debug := fmt.Sprintf("https://%s:%d", n.IP, port("debug"))
	metrics := fmt.Sprintf("https://%s:%d", n.IP, port("metrics"))
	ok := func(want string) func(int, string) bool {
		return func(code int, body string) bool { return code == http.StatusOK && strings.Contains(body, want) }
	}
	return []nodeAPIEndpoint{
		{"the node's view", http.MethodGet, debug + debugapi.PathNode, ok(`"name":"` + n.Name + `"`)},
		{"the bridge's dump", http.MethodGet, debug + debugapi.PathDump, ok(`"flows":`)},
		// An empty trace request is refused by the API itself, once the guard let it through.
		{"a trace", http.MethodPost, debug + debugapi.PathTrace, func(code int, body string) bool {
			return code == http.StatusBadRequest && strings.Contains(body, "trace request")
		}},
		// The drop stream: without follow it answers the recent drops and ends.
		{"the drop stream", http.MethodGet, debug + debugapi.PathDrops, func(code int, _ string) bool { return code == http.StatusOK }},
		{"metrics", http.MethodGet, metrics + "/metrics", ok("ofsdn_agent_ready")},
		{"pprof", http.MethodGet, metrics + "/debug/pprof/", ok("goroutine")},
	}
}

// clientIn is an HTTP client whose connections start in network namespace netns ("" the test's own),
// for the agents' TLS servers (their certificates are not verified: the token is what counts).
func clientIn(netns string) *http.Client {
	c := cluster.AgentHTTPClient(5 * time.Second)
	c.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := lab.InNetNS(netns, func() error {
			var d net.Dialer
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	return c
}

// ask sends one request with header "Name: value" (none when empty); err is a failure to get an answer.
// An endpoint that streams (a drop stream following live) has answered once its status is in: its body
// is read until c's timeout cuts it.
func ask(ctx context.Context, c *http.Client, method, url, header string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, "", err
	}
	if k, v, ok := strings.Cut(header, ": "); ok {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), nil
}

// TestNodeAPIAccess is the issue's security must-show for the agents' node API (README, "The node
// API"): from a pod's network namespace, from a node's host namespace without credentials, and with a
// ServiceAccount token that lacks the permission, the debug API (a path added later included), metrics
// and pprof refuse (401, 403) or cannot be reached; with the permission they answer. Through the API
// server, the node proxy carries no identity (an admin without a node API token gets 401) and flowctl
// works for a user holding nodes/proxy and Role ofsdn-flowctl, not for one holding nodes/proxy alone.
// No token used here appears in any agent's log.
func TestNodeAPIAccess(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	n, other := lc.Nodes[0], lc.Nodes[1]
	endpoints := nodeAPIEndpoints(t, n)
	pods := runPods(t, ctx, "nodeapi", []string{"e2e-nodeapi"}, []*cluster.Node{n, other})

	// The RBAC this test writes goes with it (NodeAPIToken's ServiceAccounts and bindings are shared).
	t.Cleanup(func() {
		ctx := context.Background()
		rbac := lc.Client.RbacV1()
		_ = rbac.ClusterRoleBindings().Delete(ctx, "e2e-allowed-e2e-node-profiler", metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, "e2e-node-profiler", metav1.DeleteOptions{})
		for _, u := range []string{"alice", "eve"} {
			_ = rbac.ClusterRoleBindings().Delete(ctx, "e2e-node-proxy-"+u, metav1.DeleteOptions{})
		}
		_ = rbac.ClusterRoles().Delete(ctx, "e2e-node-proxy", metav1.DeleteOptions{})
		_ = rbac.RoleBindings("ofsdn").Delete(ctx, "e2e-alice-flowctl", metav1.DeleteOptions{})
	})
	// Tokens: one without any grant, one with every grant the node API checks.
	nobody, err := lc.NodeAPIToken(ctx, "nobody")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-profiler"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{nodeauth.Group}, Resources: []string{"nodes/" + nodeauth.SubresourcePprof}, Verbs: []string{"get"}}}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	allowed, err := lc.NodeAPIToken(ctx, "allowed", "ofsdn-node-reader", "ofsdn-metrics-reader", "e2e-node-profiler")
	if err != nil {
		t.Fatal(err)
	}
	tokens := []string{nobody, allowed}

	refused := func(t *testing.T, who string, c *http.Client, header string, want int) {
		t.Helper()
		for _, e := range endpoints {
			code, body, err := ask(ctx, c, e.method, e.url, header)
			switch {
			case err != nil && want == http.StatusUnauthorized:
				t.Logf("%s: %s unreachable (%v)", who, e.name, err) // as good as a refusal
			case err != nil:
				t.Errorf("%s: %s: %v, want HTTP %d", who, e.name, err, want)
			case code != want:
				t.Errorf("%s: %s answered HTTP %d, want %d: %.300s", who, e.name, code, want, body)
			}
		}
	}
	t.Run("from a pod", func(t *testing.T) {
		for _, p := range pods {
			refused(t, "pod "+p.Key()+" on "+p.Node, clientIn(p.NetNS), "", http.StatusUnauthorized)
		}
	})
	t.Run("from a host without credentials", func(t *testing.T) {
		for _, from := range []*cluster.Node{n, other} {
			refused(t, "host of "+from.Name, clientIn(from.NetNS), "", http.StatusUnauthorized)
		}
		refused(t, "a bad token", clientIn(other.NetNS), "Authorization: Bearer not-a-token", http.StatusUnauthorized)
		// Plain HTTP gets the TLS server's complaint and nothing else.
		code, body, err := ask(ctx, clientIn(other.NetNS), http.MethodGet, strings.Replace(endpoints[0].url, "https:", "http:", 1), "")
		if err != nil || code != http.StatusBadRequest || strings.Contains(body, n.Name) {
			t.Errorf("plain HTTP: %d %v %.200s", code, err, body)
		}
	})
	t.Run("with a token lacking the permission", func(t *testing.T) {
		refused(t, "nobody, from a host", clientIn(other.NetNS), "Authorization: Bearer "+nobody, http.StatusForbidden)
		refused(t, "nobody, from a pod", clientIn(pods[0].NetNS), "Authorization: Bearer "+nobody, http.StatusForbidden)
	})
	t.Run("with the permission", func(t *testing.T) {
		for _, from := range []string{other.NetNS, ""} {
			for _, e := range endpoints {
				code, body, err := ask(ctx, clientIn(from), e.method, e.url, "Authorization: Bearer "+allowed)
				if err != nil || !e.answered(code, body) {
					t.Errorf("from %q: %s: HTTP %d %v: %.300s", from, e.name, code, err, body)
				}
			}
		}
	})

	t.Run("through the API server", func(t *testing.T) {
		admin, err := rest.HTTPClientFor(lc.API.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		proxied := func(header string) (int, string) {
			url := lc.API.Server() + "/api/v1/nodes/https:" + n.Name + ":9103/proxy" + debugapi.PathNode
			code, body, err := ask(ctx, admin, http.MethodGet, url, header)
			if err != nil {
				t.Fatalf("through the node proxy: %v", err)
			}
			return code, body
		}
		// The admin's own credentials do not reach the agent: the proxy carries no identity.
		if code, body := proxied(""); code != http.StatusUnauthorized || !strings.Contains(body, "no bearer token") {
			t.Errorf("an admin through the node proxy without a node API token: HTTP %d, want 401: %.300s", code, body)
		}
		exp := int64(600)
		tr, err := lc.Client.CoreV1().ServiceAccounts("ofsdn").CreateToken(debugapi.Quiet(ctx), "ofsdn-flowctl", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{debugapi.TokenAudience}, ExpirationSeconds: &exp}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		minted := tr.Status.Token
		tokens = append(tokens, minted)
		if code, body := proxied(debugapi.TokenHeader + ": Bearer " + minted); code != http.StatusOK || !strings.Contains(body, n.Name) {
			t.Errorf("with flowctl's token: HTTP %d: %.300s", code, body)
		}
		// The same token sent straight to the API server is refused: its audience is the node API's.
		direct, err := kubernetes.NewForConfig(&rest.Config{Host: lc.API.Server(), BearerToken: minted,
			TLSClientConfig: rest.TLSClientConfig{CAData: lc.API.CACert()}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := direct.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
			t.Errorf("the API server accepted a node API token: %v", err)
		}

		// Users: both may reach nodes through the proxy; only alice may mint flowctl's tokens.
		if _, err := lc.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-proxy"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get", "create"}},
				{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"get", "list"}},
			}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		for _, u := range []string{"alice", "eve"} {
			if _, err := lc.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-proxy-" + u},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-node-proxy"},
				Subjects: []rbacv1.Subject{{Kind: "User", Name: u}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
		if _, err := lc.Client.RbacV1().RoleBindings("ofsdn").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-alice-flowctl", Namespace: "ofsdn"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ofsdn-flowctl"},
			Subjects: []rbacv1.Subject{{Kind: "User", Name: "alice"}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		as := func(user string, args ...string) (string, error) {
			kc := filepath.Join(t.TempDir(), user+".kubeconfig")
			if err := cluster.WriteKubeconfig(kc, lc.API.UserConfig(t, user)); err != nil {
				t.Fatal(err)
			}
			return runFlowctlWith(ctx, kc, args...)
		}
		if out, err := as("alice", "dump", "--node", other.Name, "--table", "pod-ingress"); err != nil || !strings.Contains(out, "pod-ingress") {
			t.Errorf("alice's flowctl dump: %v\n%.500s", err, out)
		}
		out, err := as("eve", "dump", "--node", other.Name)
		if err == nil || !strings.Contains(err.Error(), "ofsdn-flowctl") {
			t.Errorf("eve (nodes/proxy, no Role ofsdn-flowctl) ran flowctl dump: %v\n%.500s", err, out)
		}
	})

	// The refusals are logged (-v=2), the tokens never.
	for _, node := range lc.Nodes {
		log, err := os.ReadFile(node.AgentLog)
		if err != nil {
			t.Fatal(err)
		}
		if node == n && !strings.Contains(string(log), "node API request refused") {
			t.Errorf("%s's log has no refusal: the check below would prove nothing", node.Name)
		}
		for i, tok := range tokens {
			if strings.Contains(string(log), tok) {
				t.Errorf("token %d appears in %s", i, node.AgentLog)
			}
		}
	}
}
