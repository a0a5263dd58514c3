package nodeauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/ofsdn/ofsdn/debugapi"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// How long answers are reused, after kubelet's webhook caches (a token 2 minutes; kubelet keeps
// SubjectAccessReviews 5 minutes allowed and 30 s denied, shorter here so that a revoked grant stops
// working within a minute). A token is never trusted past its own expiry. Errors are never cached.
const (
	TokenTTL       = 2 * time.Minute
	TokenFailedTTL = 10 * time.Second
	AllowedTTL     = time.Minute
	DeniedTTL      = 10 * time.Second
	// cacheEntries bounds each cache, so callers with ever new tokens cannot grow the agent.
	cacheEntries = 4096
)

// User is a caller as the API server authenticated it.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// key identifies the user in the authorization cache: every field a SubjectAccessReview sends.
func (u *User) key() string {
	groups := slices.Clone(u.Groups)
	sort.Strings(groups)
	var b strings.Builder
	b.WriteString(u.Name + "\x00" + u.UID + "\x00" + strings.Join(groups, "\x01") + "\x00")
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b.WriteString(k + "=" + strings.Join(u.Extra[k], "\x01") + "\x02")
	}
	return b.String()
}

// Decision is an authorization answer.
type Decision struct {
	Allowed bool
	Reason  string
}

// Guard authenticates and authorizes requests to node's servers through the API server's
// TokenReview and SubjectAccessReview APIs (the agent's ServiceAccount needs ClusterRole
// system:auth-delegator), caching the answers. Safe for concurrent use.
type Guard struct {
	node   string
	tokens authenticationv1client.TokenReviewInterface
	access authorizationv1client.SubjectAccessReviewInterface
	log    logr.Logger
	clock  func() time.Time
	authn  *ttlCache[authnResult]
	authz  *ttlCache[Decision]
}

type authnResult struct {
	user *User  // nil: not authenticated
	why  string // why not
}

// NewGuard guards node's servers with kube's review APIs.
func NewGuard(node string, kube kubernetes.Interface, log logr.Logger) *Guard {
	return &Guard{node: node, tokens: kube.AuthenticationV1().TokenReviews(), access: kube.AuthorizationV1().SubjectAccessReviews(),
		log: log, clock: time.Now, authn: newTTLCache[authnResult](cacheEntries), authz: newTTLCache[Decision](cacheEntries)}
}

// unauthenticatedError is a token the API server does not authenticate.
type unauthenticatedError struct{ why string }

func (e *unauthenticatedError) Error() string { return "not authenticated: " + e.why }

// refusal says whether err is a refused token, and why.
func refusal(err error) (string, bool) {
	var u *unauthenticatedError
	if errors.As(err, &u) {
		return u.why, true
	}
	return "", false
}

// Authenticate asks the API server who token belongs to. A token minted for debugapi.TokenAudience is
// reviewed for that audience, any other for the API server's own (as a Prometheus ServiceAccount token).
func (g *Guard) Authenticate(ctx context.Context, token string) (*User, error) {
	now := g.clock()
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if r, ok := g.authn.get(key, now); ok {
		if r.user == nil {
			return nil, &unauthenticatedError{r.why}
		}
		return r.user, nil
	}
	claims := peekClaims(token)
	spec := authenticationv1.TokenReviewSpec{Token: token}
	if slices.Contains(claims.Aud, debugapi.TokenAudience) {
		spec.Audiences = []string{debugapi.TokenAudience}
	}
	tr, err := g.tokens.Create(debugapi.Quiet(ctx), &authenticationv1.TokenReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	st := tr.Status
	// A review that named audiences must get one of them back (the TokenReview API's rule for clients).
	if !st.Authenticated || st.User.Username == "" || (len(spec.Audiences) > 0 && !slices.Contains(st.Audiences, debugapi.TokenAudience)) {
		why := st.Error
		if why == "" {
			why = "the API server does not authenticate it"
		}
		g.authn.put(key, authnResult{why: why}, now.Add(TokenFailedTTL), now)
		return nil, &unauthenticatedError{why}
	}
	u := &User{Name: st.User.Username, UID: st.User.UID, Groups: st.User.Groups}
	if len(st.User.Extra) > 0 {
		u.Extra = map[string][]string{}
		for k, v := range st.User.Extra {
			u.Extra[k] = slices.Clone(v)
		}
	}
	until := now.Add(TokenTTL)
	if claims.Exp > 0 {
		if exp := time.Unix(int64(claims.Exp), 0); exp.Before(until) {
			until = exp
		}
	}
	g.authn.put(key, authnResult{user: u}, until, now)
	return u, nil
}

// Authorize asks the API server whether u may do what attrs say.
func (g *Guard) Authorize(ctx context.Context, u *User, attrs Attributes) (Decision, error) {
	now := g.clock()
	key := u.key() + "\x03" + attrs.String()
	if d, ok := g.authz.get(key, now); ok {
		return d, nil
	}
	spec := authorizationv1.SubjectAccessReviewSpec{User: u.Name, UID: u.UID, Groups: u.Groups}
	if len(u.Extra) > 0 {
		spec.Extra = map[string]authorizationv1.ExtraValue{}
		for k, v := range u.Extra {
			spec.Extra[k] = v
		}
	}
	if attrs.Path != "" {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: attrs.Path, Verb: attrs.Verb}
	} else {
		spec.ResourceAttributes = &authorizationv1.ResourceAttributes{Group: Group, Resource: "nodes", Subresource: attrs.Subresource,
			Name: attrs.Name, Verb: attrs.Verb}
	}
	res, err := g.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return Decision{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	d := Decision{Allowed: res.Status.Allowed && !res.Status.Denied, Reason: res.Status.Reason}
	if !d.Allowed && d.Reason == "" {
		d.Reason = res.Status.EvaluationError
	}
	ttl := DeniedTTL
	if d.Allowed {
		ttl = AllowedTTL
	}
	g.authz.put(key, d, now.Add(ttl), now)
	return d, nil
}

// claims are the JWT claims Authenticate peeks at, unverified: the audience only chooses which review
// to ask for (the review verifies), and the expiry only shortens how long an answer is kept.
type claims struct {
	Aud audiences `json:"aud"`
	Exp float64   `json:"exp"`
}

type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// peekClaims reads a JWT's claims without verifying them (zero for anything else).
func peekClaims(token string) claims {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return claims{}
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return claims{}
	}
	var c claims
	if json.Unmarshal(payload, &c) != nil {
		return claims{}
	}
	return c
}

// ttlCache keeps answers until their deadline, at most max of them: when full it drops the expired,
// then arbitrary others (map order), down to nine tenths.
type ttlCache[V any] struct {
	mu      sync.Mutex
	max     int
	entries map[string]cached[V]
}

type cached[V any] struct {
	v     V
	until time.Time
}

func newTTLCache[V any](max int) *ttlCache[V] {
	return &ttlCache[V]{max: max, entries: map[string]cached[V]{}}
}

func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.until) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[V]) put(key string, v V, until, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.until) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.max*9/10 {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = cached[V]{v: v, until: until}
}

func (c *ttlCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
