package debugapi

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// How a caller proves who it is to an agent's TCP servers (agent/nodeauth checks it; README, "The node
// API"): a bearer token the API server vouches for, in the Authorization header when it calls the agent
// directly (Prometheus, a tool in a pod), or in TokenHeader when it goes through the API server's node
// proxy. That proxy removes Authorization once it has authenticated the caller and presents no
// credential of its own to a node's port other than kubelet's, so nothing else reaches the agent.
//
// Through the proxy flowctl sends a ServiceAccount token it mints for the purpose (ServiceAccountTokens),
// never the user's own credentials: the proxy's hop to the node does not verify the agent's certificate,
// and a node should never hold a credential that works against the API server. A minted token is bound
// to TokenAudience (the API server refuses it) and lives TokenLifetime.
const (
	// TokenHeader carries "Bearer <token>" through the API server's proxy, which forwards it untouched.
	TokenHeader = "X-Ofsdn-Authorization"
	// TokenAudience is the audience of tokens minted for the node API; agents accept tokens for it and
	// for the API server's own audiences.
	TokenAudience = "ofsdn-node-api"
	// DefaultTokenServiceAccount is the ServiceAccount flowctl mints its tokens for (deploy/agent/
	// nodeapi-rbac.yaml binds it to ClusterRole ofsdn-node-reader; Role ofsdn-flowctl lets users mint).
	DefaultTokenServiceAccount = "ofsdn/ofsdn-flowctl"
	// TokenLifetime is what flowctl asks for: the shortest the TokenRequest API grants.
	TokenLifetime = 10 * time.Minute
)

// TokenSource gives the bearer token to send with each request.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// ServiceAccountTokens mints tokens of one ServiceAccount for TokenAudience with the TokenRequest API,
// using the caller's own credentials (create on serviceaccounts/token of that ServiceAccount), and
// reuses each until a fifth of its life is left. Safe for concurrent use.
type ServiceAccountTokens struct {
	Namespace, Name string

	sas   corev1client.ServiceAccountsGetter
	clock func() time.Time

	mu      sync.Mutex
	token   string
	expires time.Time
}

// NewServiceAccountTokens mints tokens of ServiceAccount "namespace/name" with cfg's credentials.
func NewServiceAccountTokens(cfg *rest.Config, serviceAccount string) (*ServiceAccountTokens, error) {
	ns, name, ok := strings.Cut(serviceAccount, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("service account %q: want namespace/name", serviceAccount)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node API tokens: %w", err)
	}
	return &ServiceAccountTokens{Namespace: ns, Name: name, sas: kube.CoreV1(), clock: time.Now}, nil
}

// Token returns a token with at least a fifth of its life left, minting one when needed.
func (s *ServiceAccountTokens) Token(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if s.token != "" && now.Before(s.expires.Add(-TokenLifetime/5)) {
		return s.token, nil
	}
	secs := int64(TokenLifetime / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{TokenAudience}, ExpirationSeconds: &secs}}
	tr, err := s.sas.ServiceAccounts(s.Namespace).CreateToken(Quiet(ctx), s.Name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a node API token of ServiceAccount %s/%s (this needs create on its serviceaccounts/token: Role %s/ofsdn-flowctl; README, \"The node API\"): %w",
			s.Namespace, s.Name, s.Namespace, err)
	}
	s.token, s.expires = tr.Status.Token, tr.Status.ExpirationTimestamp.Time
	if s.expires.IsZero() {
		s.expires = now.Add(TokenLifetime)
	}
	return s.token, nil
}

// Quiet is ctx with a logger that drops everything, for API calls whose bodies hold a token
// (TokenRequest, TokenReview): client-go logs request and response bodies at -v=8 through the
// context's logger, and no token may reach a log.
func Quiet(ctx context.Context) context.Context {
	return klog.NewContext(ctx, logr.Discard())
}
