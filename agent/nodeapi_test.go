package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/ofsdn/ofsdn/agent/metrics"
	"github.com/ofsdn/ofsdn/debugapi"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestNodeAPIServersAreGuarded: the metrics address and the debug address, as serveObservability wires
// them, speak only TLS and answer only what the API server allows (reviews on a fake clientset): no
// token gets 401 everywhere but the probes, a reader gets metrics and the debug API but not pprof, an
// admin gets pprof; the unix socket needs nothing but its file mode.
func TestNodeAPIServersAreGuarded(t *testing.T) {
	dir := t.TempDir()
	kube := fake.NewClientset()
	users := map[string]string{"reader-token": "reader", "admin-token": "admin"}
	grants := map[string][]string{
		"reader": {"get nodes/debug n1", "get /metrics"},
		"admin":  {"get nodes/debug n1", "get /metrics", "get nodes/pprof n1"},
	}
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		if u, ok := users[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: u}}
		}
		return true, tr, nil
	})
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		asked := ""
		if n := sar.Spec.NonResourceAttributes; n != nil {
			asked = n.Verb + " " + n.Path
		} else if r := sar.Spec.ResourceAttributes; r.Group == "network.ofsdn.io" {
			asked = fmt.Sprintf("%s %s/%s %s", r.Verb, r.Resource, r.Subresource, r.Name)
		}
		for _, g := range grants[sar.Spec.User] {
			sar.Status.Allowed = sar.Status.Allowed || g == asked
		}
		return true, sar, nil
	})
	var logs strings.Builder
	var logMu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintln(&logs, prefix, args)
	}, funcr.Options{})
	a := &Agent{cfg: Config{NodeName: "n1", StateDir: dir, MetricsAddress: "127.0.0.1:0", DebugAddress: "127.0.0.1:0",
		DebugSocket: filepath.Join(dir, "br0.ofsdn.sock"), Profiling: true},
		log: log, health: newHealth(nil, nil), metrics: metrics.New(nil), deps: Deps{Kube: kube}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := a.serveObservability(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pki", "ofsdn-agent.key")); err != nil {
		t.Errorf("no serving key in the state directory: %v", err)
	}

	// Nobody can verify the self-signed certificate (README, "The node API"); the token is what counts.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(c *http.Client, url, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	metrics, debug := "https://"+a.listening.Metrics, "https://"+a.listening.Debug
	// The backend answers Desired with 503 "not available yet" (no bridge): it was reached.
	const reached = "not available yet"
	for _, tc := range []struct {
		url, token string
		code       int
		body       string
	}{
		{metrics + "/healthz", "", 200, "healthz check passed"},
		{metrics + "/metrics", "", 401, "no bearer token"},
		{metrics + "/debug/pprof/", "", 401, "no bearer token"},
		{debug + debugapi.PathDesired, "", 401, "no bearer token"},
		{debug + debugapi.Prefix + "drops", "", 401, "no bearer token"},
		{debug + "/healthz", "", 404, "not found"}, // probes' paths are open, and the debug address has none
		{metrics + "/metrics", "nobody-token", 401, "not valid"},
		{metrics + "/metrics", "reader-token", 200, "ofsdn_agent_bundles_total"},
		{debug + debugapi.PathDesired, "reader-token", 503, reached},
		{metrics + "/debug/pprof/", "reader-token", 403, `user "reader" may not get nodes.network.ofsdn.io/pprof n1`},
		{metrics + "/debug/pprof/", "admin-token", 200, "goroutine"},
	} {
		if code, body := get(client, tc.url, tc.token); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET %s with %q: HTTP %d %.200q, want %d with %q", tc.url, tc.token, code, body, tc.code, tc.body)
		}
	}
	// Plain HTTP gets nothing but the TLS server's complaint, which is the caller's business: no error
	// in the agent's log.
	if code, body := get(http.DefaultClient, "http://"+a.listening.Debug+debugapi.PathDesired, "reader-token"); code != 400 || strings.Contains(body, reached) {
		t.Errorf("plain HTTP to the debug address: HTTP %d %q", code, body)
	}
	logMu.Lock()
	if strings.Contains(logs.String(), "handshake") {
		t.Errorf("a failed handshake was logged:\n%s", logs.String())
	}
	logMu.Unlock()
	// The unix socket: root's file mode is the guard, no token asked.
	if st, err := os.Stat(a.cfg.DebugSocket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("debug socket: %v %v", st, err)
	}
	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.cfg.DebugSocket)
	}}}
	if code, body := get(sock, "http://agent"+debugapi.PathDesired, ""); code != 503 || !strings.Contains(body, reached) {
		t.Errorf("debug socket: HTTP %d %q", code, body)
	}
}
