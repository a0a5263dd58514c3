package flowctl

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net"
	"net/http"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	"github.com/ofsdn/ofsdn/debugapi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// The web console (flowctl ui): server-rendered pages over the API server's objects and the agents'
// debug API, read with the user's own credentials. This file is the server: routes, the guard every
// request passes, page rendering, and reading the agents with a bound. The pages' data are gathered in
// ui_objects.go (Networks, tenants, policies), ui_nodes.go, ui_trace.go and ui_drops.go; their HTML is
// in ui/templates, their style and script in ui/static (ui/static/console.css states the palette).
//
// The console only reads: every route is GET (a trace asks the agents to run ofproto/trace, which
// changes nothing), so a page another site opens in the user's browser cannot make it write with the
// user's credentials. On loopback it answers only requests addressed to loopback names (a page of
// another site that rebinds its own name to 127.0.0.1 gets 403), and its pages forbid framing and
// any script, style or connection that is not its own.

//go:embed ui/templates/*.html ui/static/*
var uiFiles embed.FS

// uiSources is what the console reads. Live, the user's kubeconfig's clients and the agents through
// the API server's node proxy; in tests, fake clientsets, fake agents and offline dumps.
type uiSources struct {
	kube kubernetes.Interface
	net  networkclient.Interface
	// dyn and disco read ClusterNetworkPolicies (network-policy-api), when the cluster serves them;
	// nil: not looked for.
	dyn   dynamic.Interface
	disco discovery.DiscoveryInterface
	// agent is a node's agent (its debug API).
	agent func(node string) (debugapi.Backend, error)
	// world is a fresh world for one trace.
	world func() (world, error)
	drops DropSource
	// server names the cluster in the header (the API server's address).
	server string
}

// uiLimits bound what a page waits for.
type uiLimits struct {
	api   time.Duration // the API server's answers for one page
	agent time.Duration // one agent's answer
	trace time.Duration // one trace, over every node it crosses
	// heartbeat is how often a live stream says it is still there.
	heartbeat time.Duration
	// refresh, when set, replaces every page's own live refresh period (tests).
	refresh time.Duration
}

var defaultUILimits = uiLimits{api: 10 * time.Second, agent: 5 * time.Second, trace: 90 * time.Second, heartbeat: 15 * time.Second}

type uiServer struct {
	src    uiSources
	limits uiLimits
	// hosts are the Host headers answered (the DNS rebinding guard); empty: any.
	hosts map[string]bool
	pages map[string]*template.Template
	now   func() time.Time
	logf  func(format string, args ...any)
}

func newUIServer(src uiSources, limits uiLimits, hosts []string, logf func(string, ...any)) (*uiServer, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	s := &uiServer{src: src, limits: limits, pages: map[string]*template.Template{}, now: time.Now, logf: logf}
	if len(hosts) > 0 {
		s.hosts = map[string]bool{}
		for _, h := range hosts {
			s.hosts[strings.ToLower(h)] = true
		}
	}
	base, err := template.New("layout.html").Funcs(uiFuncs).ParseFS(uiFiles, "ui/templates/layout.html", "ui/templates/partials.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(uiFiles, "ui/templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, path := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "ui/templates/"), ".html")
		if name == "layout" || name == "partials" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(uiFiles, path)
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", name, err)
		}
		s.pages[name] = t
	}
	return s, nil
}

// loopbackHosts are the Host headers of a console listening on a loopback address.
func loopbackHosts(addr net.Addr) []string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return nil
	}
	port := fmt.Sprint(tcp.Port)
	return []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port}
}

// Handler is the console.
func (s *uiServer) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(uiFiles, "ui/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.page("overview", s.overview))
	mux.HandleFunc("GET /networks", s.page("networks", s.networks))
	mux.HandleFunc("GET /networks/{name}", s.page("network", s.network))
	mux.HandleFunc("GET /tenants", s.page("tenants", s.tenants))
	mux.HandleFunc("GET /nodes", s.page("nodes", s.nodes))
	mux.HandleFunc("GET /nodes/{name}", s.page("node", s.node))
	mux.HandleFunc("GET /policies", s.page("policies", s.policies))
	mux.HandleFunc("GET /trace", s.page("trace", s.trace))
	mux.HandleFunc("GET /drops", s.page("drops", s.dropsPage))
	mux.HandleFunc("GET /drops/stream", s.dropsStream)
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		s.render(w, r, http.StatusNotFound, "error", &uiPage{Title: "Not found", Data: "There is no page at " + r.URL.Path + "."})
	})
	return s.guard(mux)
}

// guard checks what every request must be and sets what every answer carries.
func (s *uiServer) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if s.hosts != nil && !s.hosts[strings.ToLower(r.Host)] {
			http.Error(w, fmt.Sprintf("flowctl ui answers only requests addressed to its loopback address, not to %q", r.Host), http.StatusForbidden)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the console only reads: "+r.Method+" is not allowed", http.StatusMethodNotAllowed)
			return
		}
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				s.logf("flowctl ui: %s %s panicked: %v\n%s", r.Method, r.URL.Path, v, debug.Stack())
				http.Error(w, fmt.Sprintf("internal error in the console: %v (a bug: please report it with the page's address)", v), http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// uiPage is what the layout renders around a page's own content.
type uiPage struct {
	Title   string
	Section string // the navigation entry of the page
	// Refresh is how often the page's script reloads its content (seconds; 0: never).
	Refresh  int
	Problems []uiProblem
	Server   string
	Now      time.Time
	Data     any
	status   int
}

// uiProblem is something the page could not read, said in one line, with a hint where there is one.
type uiProblem struct {
	What string
	Err  string
	Hint string
}

func (p *uiPage) problem(what string, err error) {
	p.Problems = append(p.Problems, describeProblem(what, err))
}

// describeProblem says what failed and, for the API server's usual refusals, what to do.
func describeProblem(what string, err error) uiProblem {
	pr := uiProblem{What: what, Err: err.Error()}
	switch {
	case apierrors.IsForbidden(err):
		pr.Hint = "your kubeconfig's user may not read this; the console shows what your own permissions allow"
	case apierrors.IsUnauthorized(err):
		pr.Hint = "the API server did not accept your kubeconfig's credentials (expired?)"
	case apierrors.IsNotFound(err):
		pr.Hint = "the API server does not serve it: is the resource's CRD installed (deploy/)?"
	case errors.Is(err, context.DeadlineExceeded):
		pr.Hint = "no answer in time"
	}
	return pr
}

// page wraps a page's gatherer: it bounds the API reads with the page's limit and renders the result.
func (s *uiServer) page(name string, gather func(ctx context.Context, r *http.Request, p *uiPage)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := &uiPage{Section: name}
		gather(r.Context(), r, p)
		if r.Context().Err() != nil {
			return // the user went away
		}
		if p.Refresh > 0 && s.limits.refresh > 0 {
			p.Refresh = max(1, int(s.limits.refresh.Seconds()))
		}
		status := p.status
		if status == 0 {
			status = http.StatusOK
		}
		s.render(w, r, status, name, p)
	}
}

func (s *uiServer) render(w http.ResponseWriter, r *http.Request, status int, name string, p *uiPage) {
	p.Server, p.Now = s.src.server, s.now()
	t := s.pages[name]
	var buf bytes.Buffer
	err := fmt.Errorf("no template %q", name)
	if t != nil {
		err = t.ExecuteTemplate(&buf, "layout.html", p)
	}
	if err != nil {
		s.logf("flowctl ui: render %s: %v", name, err)
		http.Error(w, fmt.Sprintf("the console could not render %s: %v", r.URL.Path, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, &buf)
	}
}

// apiCtx bounds a page's reads of the API server.
func (s *uiServer) apiCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.limits.api)
}

// agentAnswer is one agent's answer, or why there is none.
type agentAnswer[T any] struct {
	Node    string
	Value   *T
	Err     string
	Latency time.Duration
}

// OK says whether the agent answered.
func (a agentAnswer[T]) OK() bool { return a.Value != nil }

// agentsAtOnce bounds how many agents one page asks at a time (through the API server's proxy).
const agentsAtOnce = 16

// askAgents asks the nodes' agents, up to agentsAtOnce at a time, each bounded by the agent limit: an
// agent that does not answer in time is reported as such and never holds the page longer.
func askAgents[T any](ctx context.Context, s *uiServer, nodes []string, ask func(context.Context, debugapi.Backend) (*T, error)) map[string]agentAnswer[T] {
	out := make(map[string]agentAnswer[T], len(nodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, agentsAtOnce)
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			a := askAgent(ctx, s, n, ask)
			mu.Lock()
			out[n] = a
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func askAgent[T any](ctx context.Context, s *uiServer, node string, ask func(context.Context, debugapi.Backend) (*T, error)) agentAnswer[T] {
	a := agentAnswer[T]{Node: node}
	if s.src.agent == nil {
		a.Err = "no way to reach the agents"
		return a
	}
	agent, err := s.src.agent(node)
	if err != nil {
		a.Err = err.Error()
		return a
	}
	actx, cancel := context.WithTimeout(ctx, s.limits.agent)
	defer cancel()
	start := time.Now()
	v, err := ask(actx, agent)
	a.Latency = time.Since(start)
	switch {
	case err != nil && errors.Is(actx.Err(), context.DeadlineExceeded):
		a.Err = fmt.Sprintf("the agent did not answer within %s", s.limits.agent)
	case err != nil:
		a.Err = agentError(err)
	case v == nil:
		a.Err = "the agent answered nothing"
	default:
		a.Value = v
	}
	return a
}

// agentError shortens what the node proxy says when the agent is not there.
func agentError(err error) string {
	var re *debugapi.ResponseError
	if errors.As(err, &re) {
		body := re.Body
		if len(body) > 300 {
			body = body[:300] + "…"
		}
		switch re.Status {
		case http.StatusServiceUnavailable:
			return "the agent is starting or the node proxy cannot reach it (HTTP 503): " + body
		case http.StatusForbidden:
			return "forbidden (HTTP 403): your kubeconfig's user may not read this node's agent (the node proxy needs get on nodes/proxy): " + body
		case http.StatusUnauthorized:
			return "unauthorized (HTTP 401): your credentials were not accepted on the way to the agent: " + body
		}
		return fmt.Sprintf("HTTP %d: %s", re.Status, body)
	}
	return err.Error()
}

// uiSection is an entry of the navigation.
type uiSection struct{ Name, Path, Label string }

var uiSections = []uiSection{
	{"overview", "/", "Overview"}, {"networks", "/networks", "Networks"}, {"tenants", "/tenants", "Tenants"},
	{"nodes", "/nodes", "Nodes"}, {"policies", "/policies", "Policies"}, {"trace", "/trace", "Trace"}, {"drops", "/drops", "Drops"},
}

// Template functions.
var uiFuncs = template.FuncMap{
	"sections": func() []uiSection { return uiSections },
	"join":     func(sep string, s []string) string { return strings.Join(s, sep) },
	"ago":      ago,
	"ms": func(d time.Duration) string {
		if d < time.Millisecond {
			return "<1 ms"
		}
		return fmt.Sprintf("%d ms", d.Milliseconds())
	},
	"plural": func(n int, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	},
	"clock":    func(t time.Time) string { return t.Format("15:04:05") },
	"utcClock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
	"stamp":    func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
}

// ago says how long ago t was, coarsely.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// uiCondition is a status condition as a badge: Class says whether its status is good news.
type uiCondition struct {
	Type, Status, Reason, Message string
	Class                         string // ok, bad or info
	Since                         time.Time
}

// conditionViews orders conditions and colours them: for most types True is good; for the types in
// neutral it is only information.
func conditionViews(conds []metav1.Condition, neutral ...string) []uiCondition {
	out := make([]uiCondition, 0, len(conds))
	for _, c := range conds {
		v := uiCondition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime.Time}
		switch {
		case containsString(neutral, c.Type):
			v.Class = "info"
		case c.Status == metav1.ConditionTrue:
			v.Class = "ok"
		default:
			v.Class = "bad"
		}
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
