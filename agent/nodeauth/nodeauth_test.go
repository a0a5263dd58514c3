package nodeauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/ofsdn/ofsdn/debugapi"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestAttributesFor(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         Attributes
	}{
		{"GET", "/healthz", Attributes{Public: true}},
		{"GET", "/livez", Attributes{Public: true}},
		{"HEAD", "/readyz", Attributes{Public: true}},
		// Only the probes' exact paths and methods are open.
		{"POST", "/healthz", Attributes{Verb: "create", Subresource: "debug", Name: "n1"}},
		{"GET", "/healthz/../debug/ofsdn/v1/node", Attributes{Verb: "get", Subresource: "debug", Name: "n1"}},
		{"GET", "/metrics", Attributes{Verb: "get", Path: "/metrics"}},
		{"GET", "/debug/pprof/", Attributes{Verb: "get", Subresource: "pprof", Name: "n1"}},
		{"GET", "/debug/pprof/profile", Attributes{Verb: "get", Subresource: "pprof", Name: "n1"}},
		{"GET", "/debug/pprof", Attributes{Verb: "get", Subresource: "pprof", Name: "n1"}},
		{"GET", debugapi.PathDump, Attributes{Verb: "get", Subresource: "debug", Name: "n1"}},
		{"POST", debugapi.PathTrace, Attributes{Verb: "create", Subresource: "debug", Name: "n1"}},
		// A route added later (a drop stream) or none at all: the debug API's permission.
		{"GET", debugapi.Prefix + "drops", Attributes{Verb: "get", Subresource: "debug", Name: "n1"}},
		{"GET", "/", Attributes{Verb: "get", Subresource: "debug", Name: "n1"}},
		{"DELETE", "/anything", Attributes{Verb: "delete", Subresource: "debug", Name: "n1"}},
	} {
		r := httptest.NewRequest(tc.method, "http://agent"+tc.path, nil)
		if got := AttributesFor("n1", r); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.method, tc.path, got, tc.want)
		}
	}
}

// reviews is a fake API server's review APIs: tokens[token] is the user it authenticates (absent: not
// authenticated; "error": the review fails), allowed[user] the attributes it may use ("error": fails).
type reviews struct {
	mu      sync.Mutex
	tokens  map[string]authenticationv1.UserInfo
	audOut  map[string][]string // the audiences a token's review answers with
	allowed map[string][]string // user → Attributes.String()s
	tr, sar int
	lastTR  authenticationv1.TokenReviewSpec
}

func (rv *reviews) client() *fake.Clientset {
	kube := fake.NewClientset()
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.mu.Lock()
		defer rv.mu.Unlock()
		rv.tr++
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
		rv.lastTR = tr.Spec
		u, ok := rv.tokens[tr.Spec.Token]
		switch {
		case ok && u.Username == "error":
			return true, nil, errors.New("connection refused")
		case ok:
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u, Audiences: rv.audOut[tr.Spec.Token]}
		default:
			// What kube-apiserver says, which must not be mistaken for a log of the token.
			tr.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token lookup failed]"}
		}
		return true, tr, nil
	})
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.mu.Lock()
		defer rv.mu.Unlock()
		rv.sar++
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		s := sar.Spec
		var attrs string
		if s.NonResourceAttributes != nil {
			attrs = s.NonResourceAttributes.Verb + " " + s.NonResourceAttributes.Path
		} else {
			ra := s.ResourceAttributes
			if ra.Group != Group || ra.Resource != "nodes" {
				return true, nil, fmt.Errorf("unexpected resource %+v", ra)
			}
			attrs = fmt.Sprintf("%s nodes.%s/%s %s", ra.Verb, ra.Group, ra.Subresource, ra.Name)
		}
		grants := rv.allowed[s.User]
		if len(grants) == 1 && grants[0] == "error" {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		for _, g := range grants {
			if g == attrs {
				sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "RBAC: allowed"}
				return true, sar, nil
			}
		}
		sar.Status = authorizationv1.SubjectAccessReviewStatus{Reason: "no RBAC policy matched"}
		return true, sar, nil
	})
	return kube
}

func (rv *reviews) counts() (int, int) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return rv.tr, rv.sar
}

// jwt is an unsigned JWT with the given claims (the fake review checks nothing; the agent only peeks).
func jwt(claims map[string]any) string {
	enc := base64.RawURLEncoding
	body, _ := json.Marshal(claims)
	return enc.EncodeToString([]byte(`{"alg":"RS256"}`)) + "." + enc.EncodeToString(body) + ".c2lnbmF0dXJl"
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fixture is a Guard over fake reviews in front of a handler that records what reached it, with a log
// that keeps every line at every verbosity.
type fixture struct {
	rv      *reviews
	guard   *Guard
	clock   *clock
	srv     *httptest.Server
	logs    *bytes.Buffer
	reached chan *http.Request
}

var (
	readerToken  = "reader-token-0123456789"
	nobodyToken  = "nobody-token-0123456789"
	errorToken   = "error-token-0123456789"
	sarErrToken  = "sarerr-token-0123456789"
	invalidToken = "invalid-token-0123456789"
)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	rv := &reviews{
		tokens: map[string]authenticationv1.UserInfo{
			readerToken: {Username: "system:serviceaccount:mon:reader", UID: "u1", Groups: []string{"system:serviceaccounts"},
				Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=1"}}},
			nobodyToken: {Username: "system:serviceaccount:mon:nobody"},
			errorToken:  {Username: "error"},
			sarErrToken: {Username: "sarerr"},
		},
		audOut: map[string][]string{},
		allowed: map[string][]string{
			"system:serviceaccount:mon:reader": {"get nodes.network.ofsdn.io/debug n1", "create nodes.network.ofsdn.io/debug n1", "get /metrics"},
			"sarerr":                           {"error"},
		},
	}
	logs := &bytes.Buffer{}
	var logMu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintln(logs, prefix, args)
	}, funcr.Options{Verbosity: 10})
	g := NewGuard("n1", rv.client(), log)
	c := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	g.clock = c.Now
	f := &fixture{rv: rv, guard: g, clock: c, logs: logs, reached: make(chan *http.Request, 100)}
	f.srv = httptest.NewServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.reached <- r
		if u := UserFrom(r.Context()); u != nil {
			fmt.Fprintf(w, "hello %s", u.Name)
			return
		}
		fmt.Fprint(w, "hello anyone")
	})))
	t.Cleanup(f.srv.Close)
	return f
}

// do sends a request with headers ("Name: value") and returns the status and body.
func (f *fixture) do(t *testing.T, method, path string, headers ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// TestWrap: who gets what, and what the answers say.
func TestWrap(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name, method, path string
		headers            []string
		code               int
		body               string
	}{
		{"probe without credentials", "GET", "/healthz", nil, 200, "hello anyone"},
		{"no token", "GET", debugapi.PathNode, nil, 401, "no bearer token"},
		{"no token, metrics", "GET", "/metrics", nil, 401, "no bearer token"},
		{"no token, pprof", "GET", "/debug/pprof/", nil, 401, "no bearer token"},
		{"no token, a route added later", "GET", debugapi.Prefix + "drops", nil, 401, "no bearer token"},
		{"basic auth is no token", "GET", debugapi.PathNode, []string{"Authorization: Basic YWRtaW46YWRtaW4="}, 401, "no bearer token"},
		{"empty bearer", "GET", debugapi.PathNode, []string{"Authorization: Bearer "}, 401, "no bearer token"},
		{"invalid token", "GET", debugapi.PathNode, []string{"Authorization: Bearer " + invalidToken}, 401, "invalid bearer token"},
		{"allowed", "GET", debugapi.PathNode, []string{"Authorization: Bearer " + readerToken}, 200, "hello system:serviceaccount:mon:reader"},
		{"allowed through the node proxy's header", "GET", debugapi.PathDump, []string{debugapi.TokenHeader + ": Bearer " + readerToken}, 200, "hello system:serviceaccount:mon:reader"},
		{"trace is create", "POST", debugapi.PathTrace, []string{"Authorization: bearer " + readerToken}, 200, "hello"},
		{"metrics allowed", "GET", "/metrics", []string{"Authorization: Bearer " + readerToken}, 200, "hello"},
		{"pprof not granted", "GET", "/debug/pprof/", []string{"Authorization: Bearer " + readerToken}, 403,
			`forbidden: user "system:serviceaccount:mon:reader" may not get nodes.network.ofsdn.io/pprof n1: no RBAC policy matched`},
		{"no permission", "GET", debugapi.PathNode, []string{"Authorization: Bearer " + nobodyToken}, 403, "forbidden"},
		{"no permission, metrics", "GET", "/metrics", []string{"Authorization: Bearer " + nobodyToken}, 403, "forbidden"},
		{"TokenReview fails", "GET", debugapi.PathNode, []string{"Authorization: Bearer " + errorToken}, 503, "cannot check the caller's token now"},
		{"SubjectAccessReview fails", "GET", debugapi.PathNode, []string{"Authorization: Bearer " + sarErrToken}, 503, "cannot check the caller's permission now"},
	} {
		code, body, hdr := f.do(t, tc.method, tc.path, tc.headers...)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s: HTTP %d %q, want %d with %q", tc.name, code, body, tc.code, tc.body)
		}
		if code == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("%s: 401 without a Bearer challenge: %v", tc.name, hdr)
		}
		var reached *http.Request
		select {
		case reached = <-f.reached:
		default:
		}
		if (reached != nil) != (code == 200) {
			t.Errorf("%s: HTTP %d, but the handler ran: %v", tc.name, code, reached != nil)
		}
		if reached != nil && (reached.Header.Get("Authorization") != "" || reached.Header.Get(debugapi.TokenHeader) != "") {
			t.Errorf("%s: the handler saw a credential header", tc.name)
		}
	}
	if tr, sar := f.rv.counts(); tr == 0 || sar == 0 {
		t.Fatalf("no reviews were made: %d, %d", tr, sar)
	}
	// The probe made none.
	f2 := newFixture(t)
	f2.do(t, "GET", "/readyz")
	if tr, sar := f2.rv.counts(); tr != 0 || sar != 0 {
		t.Errorf("a probe made %d TokenReviews and %d SubjectAccessReviews", tr, sar)
	}
	// What the authorizer was asked carries the whole user.
	u, err := f.guard.Authenticate(t.Context(), readerToken)
	if err != nil || u.UID != "u1" || len(u.Groups) != 1 || u.Extra["authentication.kubernetes.io/credential-id"][0] != "JTI=1" {
		t.Errorf("user %+v, %v", u, err)
	}
}

// TestCaches: answers are reused for their lifetimes, errors never, and a token never past its expiry.
func TestCaches(t *testing.T) {
	f := newFixture(t)
	reader := "Authorization: Bearer " + readerToken
	want := func(step string, code, tr, sar int, headers ...string) {
		t.Helper()
		if got, body, _ := f.do(t, "GET", debugapi.PathNode, headers...); got != code {
			t.Errorf("%s: HTTP %d %s, want %d", step, got, body, code)
		}
		if gtr, gsar := f.rv.counts(); gtr != tr || gsar != sar {
			t.Errorf("%s: %d TokenReviews and %d SubjectAccessReviews so far, want %d and %d", step, gtr, gsar, tr, sar)
		}
		select {
		case <-f.reached:
		default:
		}
	}
	want("first", 200, 1, 1, reader)
	want("again", 200, 1, 1, reader)
	f.clock.add(AllowedTTL)
	want("permission expired", 200, 1, 2, reader)
	f.clock.add(TokenTTL - AllowedTTL)
	want("token expired", 200, 2, 3, reader)

	nobody := "Authorization: Bearer " + nobodyToken
	want("denied", 403, 3, 4, nobody)
	want("denied again", 403, 3, 4, nobody)
	f.clock.add(DeniedTTL)
	want("denial expired", 403, 3, 5, nobody)

	invalid := "Authorization: Bearer " + invalidToken
	want("invalid", 401, 4, 5, invalid)
	want("invalid again", 401, 4, 5, invalid)
	f.clock.add(TokenFailedTTL)
	want("invalid expired", 401, 5, 5, invalid)

	broken := "Authorization: Bearer " + errorToken
	want("review error", 503, 6, 5, broken)
	want("review error is not kept", 503, 7, 5, broken)
	sarErr := "Authorization: Bearer " + sarErrToken
	want("SAR error", 503, 8, 6, sarErr)
	want("SAR error is not kept", 503, 8, 7, sarErr) // its token was authenticated and is kept

	// A token that expires before TokenTTL is reviewed again once it has.
	short := jwt(map[string]any{"aud": "https://kubernetes.default.svc", "exp": f.clock.Now().Add(30 * time.Second).Unix()})
	f.rv.tokens[short] = authenticationv1.UserInfo{Username: "system:serviceaccount:mon:reader"}
	want("short-lived", 200, 9, 8, "Authorization: Bearer "+short)
	f.clock.add(30 * time.Second)
	want("short-lived, expired", 200, 10, 8, "Authorization: Bearer "+short)
}

// TestAudiences: a token minted for the node API is reviewed for its audience, and refused unless the
// review answers with it; any other is reviewed for the API server's audiences.
func TestAudiences(t *testing.T) {
	f := newFixture(t)
	minted := jwt(map[string]any{"aud": []string{debugapi.TokenAudience}, "exp": f.clock.Now().Add(10 * time.Minute).Unix()})
	f.rv.tokens[minted] = authenticationv1.UserInfo{Username: "system:serviceaccount:mon:reader"}
	f.rv.audOut[minted] = []string{debugapi.TokenAudience}
	if code, body, _ := f.do(t, "GET", debugapi.PathNode, debugapi.TokenHeader+": Bearer "+minted); code != 200 {
		t.Errorf("minted token: HTTP %d %s", code, body)
	}
	if a := f.rv.lastTR.Audiences; len(a) != 1 || a[0] != debugapi.TokenAudience {
		t.Errorf("minted token reviewed for audiences %v", a)
	}
	odd := jwt(map[string]any{"aud": debugapi.TokenAudience})
	f.rv.tokens[odd] = authenticationv1.UserInfo{Username: "system:serviceaccount:mon:reader"}
	f.rv.audOut[odd] = []string{"https://kubernetes.default.svc"}
	if code, body, _ := f.do(t, "GET", debugapi.PathNode, "Authorization: Bearer "+odd); code != 401 {
		t.Errorf("a review that did not answer with the audience: HTTP %d %s", code, body)
	}
	api := jwt(map[string]any{"aud": []string{"https://kubernetes.default.svc"}})
	f.rv.tokens[api] = authenticationv1.UserInfo{Username: "system:serviceaccount:mon:reader"}
	if code, body, _ := f.do(t, "GET", debugapi.PathNode, "Authorization: Bearer "+api); code != 200 {
		t.Errorf("API-audience token: HTTP %d %s", code, body)
	}
	if a := f.rv.lastTR.Audiences; len(a) != 0 {
		t.Errorf("API-audience token reviewed for audiences %v, want the API server's (none named)", a)
	}
}

// TestNoTokenInLogs: at every verbosity, whatever happens, no token reaches the log or an answer.
func TestNoTokenInLogs(t *testing.T) {
	f := newFixture(t)
	tokens := []string{readerToken, nobodyToken, errorToken, sarErrToken, invalidToken}
	var bodies strings.Builder
	for _, tok := range tokens {
		for _, h := range []string{"Authorization: Bearer ", debugapi.TokenHeader + ": Bearer "} {
			for _, p := range []string{debugapi.PathNode, "/metrics", "/debug/pprof/"} {
				_, body, _ := f.do(t, "GET", p, h+tok)
				bodies.WriteString(body)
			}
		}
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "refused") || !strings.Contains(logs, "cannot authenticate") {
		t.Fatalf("the test did not exercise the log lines it guards:\n%s", logs)
	}
	for _, tok := range tokens {
		if strings.Contains(logs, tok) || strings.Contains(bodies.String(), tok) {
			t.Errorf("token %s appears in the log or an answer:\n%s\n%s", tok, logs, bodies.String())
		}
	}
}

func TestCacheBounded(t *testing.T) {
	c := newTTLCache[int](100)
	now := time.Now()
	for i := range 1000 {
		c.put(fmt.Sprint(i), i, now.Add(time.Minute), now)
		if c.len() > 100 {
			t.Fatalf("%d entries after %d puts", c.len(), i+1)
		}
	}
	if v, ok := c.get("999", now); !ok || v != 999 {
		t.Errorf("the newest entry is gone: %v %v", v, ok)
	}
	if _, ok := c.get("999", now.Add(time.Minute)); ok {
		t.Error("an entry outlived its deadline")
	}
}
