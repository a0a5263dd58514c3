package debugapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// TestServiceAccountTokens: a token is minted for the node API's audience with the shortest lifetime,
// reused while more than a fifth of its life is left, then minted anew; a refusal says which Role
// grants the right.
func TestServiceAccountTokens(t *testing.T) {
	kube := fake.NewClientset()
	var mu sync.Mutex
	minted := 0
	refuse := false
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	kube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return true, nil, errors.New(`serviceaccounts "ofsdn-flowctl" is forbidden`)
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		if a.GetNamespace() != "ofsdn" || len(tr.Spec.Audiences) != 1 || tr.Spec.Audiences[0] != TokenAudience ||
			tr.Spec.ExpirationSeconds == nil || *tr.Spec.ExpirationSeconds != 600 {
			return true, nil, fmt.Errorf("unexpected request in %s: %+v", a.GetNamespace(), tr.Spec)
		}
		minted++
		tr.Status = authenticationv1.TokenRequestStatus{Token: fmt.Sprintf("token-%d", minted),
			ExpirationTimestamp: metav1.NewTime(now.Add(TokenLifetime))}
		return true, tr, nil
	})
	clock := now
	s := &ServiceAccountTokens{Namespace: "ofsdn", Name: "ofsdn-flowctl", sas: kube.CoreV1(), clock: func() time.Time { return clock }}
	ctx := context.Background()
	for _, step := range []struct {
		after time.Duration
		want  string
	}{{0, "token-1"}, {TokenLifetime * 3 / 4, "token-1"}, {TokenLifetime / 10, "token-2"}} {
		clock = clock.Add(step.after)
		if got, err := s.Token(ctx); err != nil || got != step.want {
			t.Errorf("after %s: %q %v, want %q", step.after, got, err, step.want)
		}
	}
	clock = clock.Add(TokenLifetime)
	refuse = true
	if _, err := s.Token(ctx); err == nil || !strings.Contains(err.Error(), "Role ofsdn/ofsdn-flowctl") {
		t.Errorf("refused: %v", err)
	}
	if _, err := NewServiceAccountTokens(&rest.Config{Host: "https://example.invalid"}, "no-slash"); err == nil {
		t.Error("a ServiceAccount without its namespace was accepted")
	}
}

type fixedToken string

func (f fixedToken) Token(context.Context) (string, error) { return string(f), nil }

// TestNodeProxyClient: the node proxy's path asks for TLS to the agent (https:<node>:<port>), the user's
// credentials go to the API server only, and the agent's token rides in TokenHeader.
func TestNodeProxyClient(t *testing.T) {
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		fmt.Fprint(w, `{"name":"n1"}`)
	}))
	defer srv.Close()
	c, err := NewNodeProxyClient(&rest.Config{Host: srv.URL, BearerToken: "users-own"}, "n1", 9103, fixedToken("minted"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Node(context.Background()); err != nil || n.Name != "n1" {
		t.Fatalf("%+v %v", n, err)
	}
	if got.URL.Path != "/api/v1/nodes/https:n1:9103/proxy"+PathNode {
		t.Errorf("path %s", got.URL.Path)
	}
	if got.Header.Get("Authorization") != "Bearer users-own" || got.Header.Get(TokenHeader) != "Bearer minted" {
		t.Errorf("headers %v", got.Header)
	}
}
