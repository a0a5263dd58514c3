// Package nodeauth guards what the agent serves on the node's addresses — the debug API (debugapi/)
// and whatever joins it on that server later, such as a drop stream, and the metrics address's /metrics
// and /debug/pprof/ — the way kubelet guards its own API: TLS with a serving certificate the agent makes
// (cert.go), every request authenticated by a bearer token the API server vouches for (TokenReview) and
// authorized by the API server (SubjectAccessReview) on a documented resource, both answers cached
// briefly. Guard.Wrap wraps a whole server, so a route added to it is guarded without a line of its own:
// only the probes' paths are open, and any other path needs a permission.
//
// What each path needs (Attributes, the contract deploy/ and README's "The node API" document):
//
//	/healthz /livez /readyz   nothing: kubelet's probes carry no credentials, and they tell nothing
//	/metrics                  get on the non-resource URL /metrics, as every Kubernetes component asks
//	                          (Prometheus's usual ClusterRole has it; deploy/ ships ofsdn-metrics-reader)
//	/debug/pprof/...          nodes/pprof in group network.ofsdn.io, name = the node
//	anything else             nodes/debug in group network.ofsdn.io, name = the node (the debug API,
//	                          a drop stream, any route added later; ClusterRole ofsdn-node-reader)
//
// The verb comes from the HTTP method as kubelet maps it: GET and HEAD are get, POST (a trace, which
// changes nothing) is create. The resources are virtual: RBAC checks nodes/debug of network.ofsdn.io like
// any other, and resourceNames can restrict a grant to some nodes. They live in ofsdn's own group, not
// beside kubelet's nodes/proxy in the core group, so no role written for kubelet grants them by accident.
//
// Why a token, and why in a header of its own through the API server: measured on kube-apiserver v1.34
// (and read in its source, pkg/registry/core/node/strategy.go ResourceLocation and
// pkg/controlplane/apiserver CreateProxyTransport), the node proxy reaches a port other than kubelet's
// with its generic proxy transport — TLS that does not verify the server, no client certificate
// (--kubelet-client-certificate is for kubelet's port only, --proxy-client-cert-file for aggregated APIs
// only) — and it removes the caller's Authorization header (and X-Remote-User) once it has
// authenticated the caller. So a request through the proxy arrives exactly as one from a pod would: the
// proxy cannot vouch for anyone, and a design that trusted it would trust every pod. The caller's token
// therefore travels in debugapi.TokenHeader, which the proxy forwards untouched; flowctl puts there a
// ServiceAccount token it mints for debugapi.TokenAudience (worthless against the API server) that lives
// ten minutes, never the user's own credentials. Direct callers (Prometheus, tools in pods) use
// Authorization as with kubelet.
//
// No token is ever logged: reviews run with a context whose logger drops everything (client-go logs
// request bodies at -v=8), caches key tokens by their SHA-256, and the credential headers are removed
// before the wrapped handler runs.
package nodeauth

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
)

// Group is the API group of the node API's virtual resources.
const Group = "network.ofsdn.io"

// The subresources of Group's "nodes" the node API checks.
const (
	SubresourceDebug = "debug"
	SubresourcePprof = "pprof"
)

// Attributes are what a request asks, in SubjectAccessReview terms.
type Attributes struct {
	// Public requests need no credentials (the probes).
	Public bool
	Verb   string
	// A resource request: Group's nodes/<Subresource> named Name.
	Subresource, Name string
	// A non-resource request (Path set): /metrics.
	Path string
}

func (a Attributes) String() string {
	switch {
	case a.Public:
		return "public"
	case a.Path != "":
		return a.Verb + " " + a.Path
	default:
		return fmt.Sprintf("%s nodes.%s/%s %s", a.Verb, Group, a.Subresource, a.Name)
	}
}

// publicPaths are the probes' paths.
var publicPaths = map[string]bool{"/healthz": true, "/livez": true, "/readyz": true}

// AttributesFor is what a request to node's servers needs. Anything not named is the debug API's:
// a new route is guarded like it, never open.
func AttributesFor(node string, r *http.Request) Attributes {
	p := path.Clean("/" + r.URL.Path) // as ServeMux routes it (it redirects to the clean path)
	verb := verbFor(r.Method)
	switch {
	case publicPaths[r.URL.Path] && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		return Attributes{Public: true}
	case p == "/metrics":
		return Attributes{Verb: verb, Path: "/metrics"}
	case p == "/debug/pprof" || strings.HasPrefix(p, "/debug/pprof/"):
		return Attributes{Verb: verb, Subresource: SubresourcePprof, Name: node}
	default:
		return Attributes{Verb: verb, Subresource: SubresourceDebug, Name: node}
	}
}

// verbFor maps an HTTP method to a verb as kubelet does.
func verbFor(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	default:
		return strings.ToLower(method)
	}
}

// bearerToken is the request's token: Authorization first (a direct call), then TokenHeader (through
// the API server's proxy). Only the Bearer scheme counts.
func bearerToken(r *http.Request) string {
	for _, h := range []string{"Authorization", debugapi.TokenHeader} {
		v := strings.TrimSpace(r.Header.Get(h))
		if scheme, token, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
			if token = strings.TrimSpace(token); token != "" {
				return token
			}
		}
	}
	return ""
}

type userKey struct{}

// UserFrom is the caller Wrap authenticated (nil on an open path).
func UserFrom(ctx context.Context) *User {
	u, _ := ctx.Value(userKey{}).(*User)
	return u
}

// Wrap guards next: open paths pass; any other request needs a token the API server authenticates
// (else 401) for a user it authorizes for the request's Attributes (else 403). When a review cannot be
// made (the API server is unreachable) the answer is 503, and nothing is cached.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attrs := AttributesFor(g.node, r)
		if attrs.Public {
			next.ServeHTTP(w, r)
			return
		}
		log := g.log.WithValues("attributes", attrs.String(), "remote", r.RemoteAddr)
		token := bearerToken(r)
		// The wrapped handlers never see a credential.
		r.Header.Del("Authorization")
		r.Header.Del(debugapi.TokenHeader)
		if token == "" {
			log.V(4).Info("node API request without a token")
			unauthorized(w, "no bearer token: send one the API server vouches for, in Authorization, or in "+
				debugapi.TokenHeader+" through the API server's node proxy")
			return
		}
		user, err := g.Authenticate(r.Context(), token)
		if err != nil {
			if why, ok := refusal(err); ok {
				log.V(2).Info("node API request refused: token not authenticated", "why", why)
				unauthorized(w, "the token is not valid: "+why)
				return
			}
			log.Error(err, "cannot authenticate a node API request")
			http.Error(w, "cannot check the caller's token now: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		log = log.WithValues("user", user.Name)
		d, err := g.Authorize(r.Context(), user, attrs)
		if err != nil {
			log.Error(err, "cannot authorize a node API request")
			http.Error(w, "cannot check the caller's permission now: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !d.Allowed {
			log.V(2).Info("node API request refused: not allowed", "reason", d.Reason)
			msg := fmt.Sprintf("forbidden: user %q may not %s", user.Name, attrs)
			if d.Reason != "" {
				msg += ": " + d.Reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		log.V(5).Info("node API request allowed")
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="ofsdn node API"`)
	http.Error(w, "unauthorized: "+msg, http.StatusUnauthorized)
}
