package agent

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/agent/adminpolicy"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/policy"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// watchAdmin files ClusterNetworkPolicies, the cluster's pods, namespaces and nodes as changes in the
// view for the flow loop's ClusterNetworkPolicy index (agent/adminpolicy). They are enforced in every
// plugin mode, so every change that resolution reads asks for a sync.
type watchAdmin struct {
	view *nodeView
	sync *flowSync
	log  klog.Logger
}

func (w *watchAdmin) record(f func(c *adminpolicy.Changes)) {
	w.view.update(func(v *nodeView) {
		if v.adminChanges.Pods == nil {
			v.adminChanges = adminpolicy.NewChanges()
		}
		f(&v.adminChanges)
	})
	w.sync.Trigger()
}

// handlers are the informer handlers; updates that change nothing resolution reads are dropped.
func (w *watchAdmin) handlers() (pods, namespaces, nodes, policies cache.ResourceEventHandlerFuncs) {
	nodes = k8sobj.Handlers(w.node)
	nodes.UpdateFunc = func(old, obj any) {
		o, ok1 := old.(*corev1.Node)
		n, ok2 := obj.(*corev1.Node)
		if ok1 && ok2 && adminNodeOf(o).Equal(adminNodeOf(n)) {
			return
		}
		w.node(obj, false)
	}
	return policy.PodHandlers(w.pod), policy.NamespaceLabelHandlers(w.namespace), nodes, k8sobj.Handlers(w.policy)
}

func (w *watchAdmin) pod(key string, p *policy.Pod) {
	w.record(func(c *adminpolicy.Changes) { c.Pods[key] = p })
}

func (w *watchAdmin) namespace(name string, nc policy.NamespaceChange) {
	w.record(func(c *adminpolicy.Changes) { c.Namespaces[name] = nc })
}

func (w *watchAdmin) node(obj any, deleted bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	var an *adminpolicy.Node
	if !deleted {
		an = adminNodeOf(n)
	}
	w.record(func(c *adminpolicy.Changes) { c.Nodes[n.Name] = an })
}

func (w *watchAdmin) policy(obj any, deleted bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	var p *cnp.ClusterNetworkPolicy
	if !deleted {
		var err error
		if p, err = cnp.FromUnstructured(u); err != nil {
			// The API server validated it against the CRD: an object ofsdn cannot read is of a schema it
			// does not know. Nothing of it can be enforced safely; say so and enforce none of it.
			w.log.Error(err, "ClusterNetworkPolicy not enforced: ofsdn cannot read it", "policy", u.GetName())
			p = nil
		}
	}
	w.record(func(c *adminpolicy.Changes) { c.Policies[u.GetName()] = p })
}

// adminNodeOf is what a nodes peer matches of a node: its labels and IPv4 status addresses.
func adminNodeOf(n *corev1.Node) *adminpolicy.Node {
	out := &adminpolicy.Node{Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() && !slices.Contains(out.Addrs, ip) {
			out.Addrs = append(out.Addrs, ip)
		}
	}
	slices.SortFunc(out.Addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// adminServed says whether the API server serves ClusterNetworkPolicy v1beta1 (its CRD is installed).
func adminServed(ctx context.Context, d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(cnp.Group + "/" + cnp.Version)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s/%s: %w", cnp.Group, cnp.Version, err)
	}
	for _, r := range list.APIResources {
		if r.Name == cnp.Resource.Resource {
			return true, nil
		}
	}
	return false, ctx.Err()
}

// resolveAdmin brings the ClusterNetworkPolicy index up to date and resolves the policies into st
// (every mode).
func (f *flowSync) resolveAdmin(st *pipeline.NodeState, in policyInput) {
	f.admin.Apply(in.admin)
	f.admin.SetLocal(in.local)
	st.AdminPolicies = f.admin.Resolve()
}

// adminReport is one sync's word on each ClusterNetworkPolicy that selects a pod of this node: its
// problems (none: enforced as written).
type adminReport map[string][]adminpolicy.Problem

// reportAdmin tells onAdmin the problems of every policy that selects a local pod, its flows' render or
// install failures among them.
func (f *flowSync) reportAdmin(renderFailed map[reconcile.Owner]error) {
	if f.onAdmin == nil {
		return
	}
	rep := adminReport{}
	for name, ps := range f.admin.Problems() {
		if !f.admin.Selects(name) {
			continue
		}
		ps = slices.Clone(ps)
		o := pipeline.AdminPolicyOwner(name)
		if fail := f.failing[o]; fail != nil {
			ps = append(ps, adminpolicy.Problem{Reason: adminpolicy.ReasonRenderFailed, Message: fmt.Sprintf("its flows are not installed: %v", fail.err)})
		} else if err := renderFailed[o]; err != nil {
			ps = append(ps, adminpolicy.Problem{Reason: adminpolicy.ReasonRenderFailed, Message: fmt.Sprintf("its flows cannot be rendered: %v", err)})
		}
		rep[name] = ps
	}
	f.onAdmin(rep)
}

// Event reasons the agent writes on a ClusterNetworkPolicy: the controller aggregates the latest of
// each node into the policy's status (controller/adminstatus.go).
const (
	EventAdminNotEnforced = "NotEnforced"
	EventAdminEnforced    = "Enforced"
)

// adminReportInterval: a node tells a policy's standing again this often while it lasts, so the Event
// the controller reads outlives the API server's Event TTL (1 h by default).
const adminReportInterval = 20 * time.Minute

// adminReporter turns reports into Events on the policies: a Warning NotEnforced naming this node and
// every problem when the problems change (or again after adminReportInterval), a Normal Enforced when
// a policy that had problems here has none. It runs on the flow loop; the recorder does not block.
type adminReporter struct {
	node     string
	recorder record.EventRecorder
	log      klog.Logger
	clock    func() time.Time
	told     map[string]adminTold
}

type adminTold struct {
	message string // "" enforced
	at      time.Time
}

func (r *adminReporter) report(rep adminReport) {
	now := r.clock()
	next := make(map[string]adminTold, len(rep))
	ref := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: cnp.Kind, APIVersion: cnp.Group + "/" + cnp.Version, Name: name}
	}
	for _, name := range slices.Sorted(maps.Keys(rep)) {
		msg := adminProblemMessage(r.node, rep[name])
		prev, had := r.told[name]
		switch {
		case msg == "":
			next[name] = adminTold{at: now}
			if had && prev.message != "" {
				r.log.Info("ClusterNetworkPolicy enforced as written", "policy", name)
				r.event(ref(name), corev1.EventTypeNormal, EventAdminEnforced, fmt.Sprintf("node %s enforces it as written", r.node))
			}
		case had && prev.message == msg && now.Sub(prev.at) < adminReportInterval:
			next[name] = prev
		default:
			next[name] = adminTold{message: msg, at: now}
			r.log.Info("ClusterNetworkPolicy not enforced as written", "policy", name, "problems", msg)
			r.event(ref(name), corev1.EventTypeWarning, EventAdminNotEnforced, msg)
		}
	}
	for name, prev := range r.told {
		if _, still := rep[name]; !still && prev.message != "" {
			r.event(ref(name), corev1.EventTypeNormal, EventAdminEnforced, fmt.Sprintf("node %s no longer has a pod it selects", r.node))
		}
	}
	r.told = next
}

func (r *adminReporter) event(ref *corev1.ObjectReference, typ, reason, msg string) {
	if r.recorder != nil {
		r.recorder.Event(ref, typ, reason, msg)
	}
}

// adminProblemMessage is the Event message for a node's problems ("" for none): "node N: reason:
// message; ...", problems sorted so that the same problems read the same.
func adminProblemMessage(node string, ps []adminpolicy.Problem) string {
	if len(ps) == 0 {
		return ""
	}
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b adminpolicy.Problem) int {
		return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
	})
	ps = slices.Compact(ps)
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.Reason + ": " + p.Message
	}
	return "node " + node + ": " + strings.Join(parts, "; ")
}
