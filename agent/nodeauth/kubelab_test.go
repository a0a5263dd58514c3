package nodeauth

import (
	"bytes"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// syncBuffer is a log sink several goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// klogEverything sends klog (client-go's request logs included) at -v=10 to a buffer until the test ends.
func klogEverything(t *testing.T) *syncBuffer {
	buf := &syncBuffer{}
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, v := range map[string]string{"v": "10", "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(k, v); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(buf)
	t.Cleanup(func() {
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
		klog.SetOutput(io.Discard)
	})
	return buf
}

// TestNodeAPIOnARealAPIServer: the Guard with the agent's own ServiceAccount and deploy/'s RBAC, against
// a real kube-apiserver's TokenReview and SubjectAccessReview: who gets what, flowctl's way of minting
// a token (a user with a client certificate, bound to Role ofsdn-flowctl), that token refused by the API
// server itself, per-node grants, and not one token in the logs with client-go logging everything.
func TestNodeAPIOnARealAPIServer(t *testing.T) {
	c := kubelab.StartDeploy(t, kubelab.Options{}, "namespace.yaml", "agent/rbac.yaml", "agent/nodeapi-rbac.yaml")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	guardLogs := &syncBuffer{}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(guardLogs, prefix, args) }, funcr.Options{Verbosity: 10})
	agentKube, err := kubernetes.NewForConfig(c.ServiceAccountConfig(t, "ofsdn", "ofsdn-agent"))
	if err != nil {
		t.Fatal(err)
	}
	guard := NewGuard("n1", agentKube, log)
	srv := httptest.NewTLSServer(guard.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", UserFrom(r.Context()).Name)
	})))
	defer srv.Close()

	bind := func(name, role, ns, sa string) {
		t.Helper()
		_, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	var tokens []string
	token := func(cfg *rest.Config) string {
		tokens = append(tokens, cfg.BearerToken)
		return cfg.BearerToken
	}
	nobody := token(c.ServiceAccountConfig(t, "mon", "nobody"))
	prom := token(c.ServiceAccountConfig(t, "mon", "prometheus"))
	bind("test-prometheus", "ofsdn-metrics-reader", "mon", "prometheus")
	tool := token(c.ServiceAccountConfig(t, "mon", "tool"))
	bind("test-tool", "ofsdn-node-reader", "mon", "tool")
	// A grant for node n2 only.
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-n2-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{Group}, Resources: []string{"nodes/debug"}, ResourceNames: []string{"n2"}, Verbs: []string{"get"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n2Only := token(c.ServiceAccountConfig(t, "mon", "n2-only"))
	bind("test-n2-only", "test-n2-reader", "mon", "n2-only")
	// From here on client-go logs every request and response body (kubelab's own TokenRequests above
	// would be in it: they are the test's, not the agent's).
	klogs := klogEverything(t)

	// flowctl's way: alice (a client certificate, no token of her own) may mint ofsdn-flowctl's tokens.
	if _, err := admin.RbacV1().RoleBindings("ofsdn").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-flowctl", Namespace: "ofsdn"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "ofsdn-flowctl"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "alice"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alice := c.UserConfig(t, "alice")
	minter, err := debugapi.NewServiceAccountTokens(alice, debugapi.DefaultTokenServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	flowctl, err := minter.Token(ctx)
	if err != nil {
		t.Fatalf("alice cannot mint flowctl's token: %v", err)
	}
	tokens = append(tokens, flowctl)
	if again, err := minter.Token(ctx); err != nil || again != flowctl {
		t.Errorf("a second call minted anew: %v", err)
	}
	// ... and nothing else: not the agent's tokens, and bob (no binding) not even flowctl's.
	agentTokens, _ := debugapi.NewServiceAccountTokens(alice, "ofsdn/ofsdn-agent")
	if _, err := agentTokens.Token(ctx); !apierrors.IsForbidden(err) {
		t.Errorf("alice minted a token of the agent's ServiceAccount: %v", err)
	}
	bobTokens, _ := debugapi.NewServiceAccountTokens(c.UserConfig(t, "bob"), debugapi.DefaultTokenServiceAccount)
	if _, err := bobTokens.Token(ctx); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "Role ofsdn/ofsdn-flowctl") {
		t.Errorf("bob without the Role: %v", err)
	}
	// The minted token is worthless against the API server: its audience is the node API's.
	minted := c.AdminConfig()
	minted.BearerToken = flowctl
	mintedKube, err := kubernetes.NewForConfig(minted)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mintedKube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("the API server accepted a node API token: %v", err)
	}
	// A token for another audience is no good at the agent either.
	exp := int64(600)
	tr, err := admin.CoreV1().ServiceAccounts("mon").CreateToken(debugapi.Quiet(ctx), "tool", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"vault"}, ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vault := tr.Status.Token
	tokens = append(tokens, vault)

	for _, tc := range []struct {
		name, path, header, token string
		code                      int
		body                      string
	}{
		{"no token", debugapi.PathNode, "", "", 401, "no bearer token"},
		{"garbage", debugapi.PathNode, "Authorization", "garbage", 401, "not valid"},
		{"no permission", debugapi.PathNode, "Authorization", nobody, 403, `"system:serviceaccount:mon:nobody" may not get nodes.network.ofsdn.io/debug n1`},
		{"no permission, metrics", "/metrics", "Authorization", nobody, 403, "may not get /metrics"},
		{"Prometheus, metrics", "/metrics", "Authorization", prom, 200, "hello system:serviceaccount:mon:prometheus"},
		{"Prometheus, debug API", debugapi.PathNode, "Authorization", prom, 403, "forbidden"},
		{"a reader tool", debugapi.PathDump, "Authorization", tool, 200, "hello system:serviceaccount:mon:tool"},
		{"a reader tool, pprof", "/debug/pprof/", "Authorization", tool, 403, "nodes.network.ofsdn.io/pprof"},
		{"another node's reader", debugapi.PathNode, "Authorization", n2Only, 403, "forbidden"},
		{"flowctl through the proxy", debugapi.PathNode, debugapi.TokenHeader, flowctl, 200, "hello system:serviceaccount:ofsdn:ofsdn-flowctl"},
		{"flowctl's trace", debugapi.PathTrace, debugapi.TokenHeader, flowctl, 200, "hello"},
		{"another audience", debugapi.PathNode, "Authorization", vault, 401, "not valid"},
	} {
		method := http.MethodGet
		if tc.path == debugapi.PathTrace {
			method = http.MethodPost
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.header != "" {
			req.Header.Set(tc.header, "Bearer "+tc.token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.body) {
			t.Errorf("%s: HTTP %d %q, want %d with %q", tc.name, resp.StatusCode, body, tc.code, tc.body)
		}
	}

	// A control: a token requested without debugapi.Quiet is in the logs, as a hex dump of a protobuf
	// body, so the search below would find one.
	tr, err = admin.CoreV1().ServiceAccounts("mon").CreateToken(ctx, "nobody", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all := klogs.String() + guardLogs.String()
	logged := all + string(unhexdump(all))
	if !strings.Contains(logged, tr.Status.Token) {
		t.Fatal("the control token is not found in the logs: the search is blind")
	}
	if !strings.Contains(logged, "SubjectAccessReview") || !strings.Contains(guardLogs.String(), "refused") {
		t.Fatalf("the logs do not show the reviews this test guards:\n%s", all)
	}
	for i, tok := range tokens {
		if tok == "" || strings.Contains(logged, tok) {
			t.Errorf("token %d (%d bytes) is in the logs", i, len(tok))
		}
	}
}

// hexLine is a line of a hex dump (encoding/hex.Dump), as client-go logs binary bodies.
var hexLine = regexp.MustCompile(`(?m)^\s*[0-9a-f]{8}  ((?:[0-9a-f]{2} {1,2}){1,16})`)

// unhexdump is the bytes of every hex dump in s, one after the other.
func unhexdump(s string) []byte {
	var out []byte
	for _, m := range hexLine.FindAllStringSubmatch(s, -1) {
		b, err := hex.DecodeString(strings.Join(strings.Fields(m[1]), ""))
		if err == nil {
			out = append(out, b...)
		}
	}
	return out
}
