package flowctl

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The trace page: a form (a GET, so a trace has an address to share) whose answer is flowctl trace's
// own (Trace on a live world, made afresh for each trace), hop by hop and table by table, with the
// verdict on top.

type uiTraceForm struct {
	Src, Dst, Proto, Port, Endpoint string
}

type uiTrace struct {
	Form   uiTraceForm
	Protos []string
	// FieldErrors are the form's mistakes, by field name.
	FieldErrors map[string]string
	Result      *TraceResult
	Err         string
	Took        time.Duration
	// Command is the same trace as a flowctl command line.
	Command     string
	Suggestions []string
}

func (s *uiServer) trace(ctx context.Context, r *http.Request, p *uiPage) {
	p.Title = "Trace"
	q := r.URL.Query()
	v := &uiTrace{Protos: []string{"tcp", "udp", "sctp", "icmp"}, FieldErrors: map[string]string{},
		Form: uiTraceForm{Src: strings.TrimSpace(q.Get("src")), Dst: strings.TrimSpace(q.Get("dst")), Proto: q.Get("proto"),
			Port: strings.TrimSpace(q.Get("port")), Endpoint: strings.TrimSpace(q.Get("endpoint"))}}
	p.Data = v
	if v.Form.Proto == "" {
		v.Form.Proto = "tcp"
	}
	v.Suggestions = s.traceSuggestions(ctx)
	if len(q) == 0 {
		return // the empty form
	}
	o, ok := parseTraceForm(v)
	if !ok {
		p.status = http.StatusBadRequest
		return
	}
	v.Command = traceCommand(o)
	if s.src.world == nil {
		v.Err = "this console cannot trace (no cluster to ask)"
		return
	}
	w, err := s.src.world()
	if err != nil {
		v.Err = err.Error()
		return
	}
	tctx, cancel := context.WithTimeout(ctx, s.limits.trace)
	defer cancel()
	start := time.Now()
	res, err := Trace(tctx, w, o)
	v.Took = time.Since(start)
	switch {
	case err != nil && errors.Is(tctx.Err(), context.DeadlineExceeded):
		v.Err = fmt.Sprintf("the trace took longer than %s and was stopped: %v", s.limits.trace, err)
	case err != nil:
		v.Err = err.Error()
	default:
		v.Result = res
	}
}

// parseTraceForm checks the form as flowctl trace checks its command line.
func parseTraceForm(v *uiTrace) (TraceOptions, bool) {
	f := v.Form
	o := TraceOptions{Src: f.Src, Dst: f.Dst, Proto: f.Proto, Endpoint: f.Endpoint, SrcPort: 40000, Output: "text"}
	if f.Src == "" {
		v.FieldErrors["src"] = "say where the packet comes from: namespace/pod, namespace/pod@net1, a node or an IP address"
	}
	if f.Dst == "" {
		v.FieldErrors["dst"] = "say where it goes: namespace/pod, svc/namespace/name, a node or an IP address"
	}
	if !containsString(v.Protos, f.Proto) {
		v.FieldErrors["proto"] = "tcp, udp, sctp or icmp"
	}
	if f.Port != "" {
		n, err := strconv.ParseUint(f.Port, 10, 16)
		if err != nil || n == 0 {
			v.FieldErrors["port"] = "a port is 1-65535"
		}
		o.Port = uint16(n)
	}
	return o, len(v.FieldErrors) == 0
}

// traceCommand is the trace as a flowctl command line, to copy.
func traceCommand(o TraceOptions) string {
	args := []string{"flowctl", "trace", shellQuote(o.Src), shellQuote(o.Dst)}
	if o.Proto != "tcp" {
		args = append(args, "--proto", o.Proto)
	}
	if o.Port != 0 {
		args = append(args, "--port", strconv.Itoa(int(o.Port)))
	}
	if o.Endpoint != "" {
		args = append(args, "--endpoint", shellQuote(o.Endpoint))
	}
	return strings.Join(args, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/@.:-_", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// traceSuggestions are what SRC and DST can name: pods, services and nodes (a datalist; typing
// anything else works too).
func (s *uiServer) traceSuggestions(ctx context.Context) []string {
	ctx, cancel := s.apiCtx(ctx)
	defer cancel()
	var out []string
	const max = 2000
	if l, err := s.src.kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range l.Items {
			if !p.Spec.HostNetwork && p.Status.Phase == corev1.PodRunning && len(out) < max {
				out = append(out, p.Namespace+"/"+p.Name)
			}
		}
	}
	if l, err := s.src.kube.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
		for _, svc := range l.Items {
			if svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone && len(out) < max {
				out = append(out, "svc/"+svc.Namespace+"/"+svc.Name)
			}
		}
	}
	if l, err := s.src.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range l.Items {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// traceURL is the console's address of a trace (links from other pages).
func traceURL(src, dst, proto string, port int) string {
	q := url.Values{"src": {src}, "dst": {dst}, "proto": {proto}}
	if port != 0 {
		q.Set("port", strconv.Itoa(port))
	}
	return "/trace?" + q.Encode()
}

func init() {
	uiFuncs["tablePurpose"] = func(t uint8) string {
		if tb, ok := pipeline.LookupTable(openflow.TableID(t)); ok {
			return tb.Purpose
		}
		return ""
	}
	uiFuncs["traceURL"] = traceURL
	uiFuncs["sub"] = func(a, b int) int { return a - b }
	uiFuncs["verdictClass"] = func(kind string) string {
		switch kind {
		case VerdictDelivered, VerdictLeftCluster, VerdictHost:
			return "ok"
		case VerdictDropped, VerdictRejected:
			return "bad"
		}
		return "info"
	}
	uiFuncs["deref"] = func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
}
