package adminpolicy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/policy"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// View is where the watchers file their changes for the flow loop's Index: RecordAdminChange runs f on
// the changes the next snapshot hands over (latest per object wins).
type View interface {
	RecordAdminChange(f func(c *Changes))
}

// Watch files ClusterNetworkPolicies, the cluster's pods, namespaces and nodes as changes in the view
// for the flow loop's Index. They are enforced in every plugin mode, so every change that resolution
// reads asks for a sync.
type Watch struct {
	View View
	Sync k8sobj.Sync
	Log  klog.Logger
}

func (w *Watch) record(f func(c *Changes)) {
	w.View.RecordAdminChange(f)
	w.Sync.Trigger()
}

// Handlers are the informer handlers; updates that change nothing resolution reads are dropped. The
// policies' informer is a dynamic one (unstructured objects).
func (w *Watch) Handlers() (pods, namespaces, nodes, policies cache.ResourceEventHandlerFuncs) {
	nodes = k8sobj.Handlers(w.node)
	nodes.UpdateFunc = func(old, obj any) {
		o, ok1 := old.(*corev1.Node)
		n, ok2 := obj.(*corev1.Node)
		if ok1 && ok2 && NodeOf(o).Equal(NodeOf(n)) {
			return
		}
		w.node(obj, false)
	}
	return policy.PodHandlers(w.pod), policy.NamespaceLabelHandlers(w.namespace), nodes, k8sobj.Handlers(w.policy)
}

func (w *Watch) pod(key string, p *policy.Pod) {
	w.record(func(c *Changes) { c.Pods[key] = p })
}

func (w *Watch) namespace(name string, nc policy.NamespaceChange) {
	w.record(func(c *Changes) { c.Namespaces[name] = nc })
}

func (w *Watch) node(obj any, deleted bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	var an *Node
	if !deleted {
		an = NodeOf(n)
	}
	w.record(func(c *Changes) { c.Nodes[n.Name] = an })
}

func (w *Watch) policy(obj any, deleted bool) {
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
			w.Log.Error(err, "ClusterNetworkPolicy not enforced: ofsdn cannot read it", "policy", u.GetName())
			p = nil
		}
	}
	w.record(func(c *Changes) { c.Policies[u.GetName()] = p })
}

// NodeOf is what a nodes peer matches of a node: its labels and IPv4 status addresses.
func NodeOf(n *corev1.Node) *Node {
	out := &Node{Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() && !slices.Contains(out.Addrs, ip) {
			out.Addrs = append(out.Addrs, ip)
		}
	}
	slices.SortFunc(out.Addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// Served says whether the API server serves ClusterNetworkPolicy v1beta1 (its CRD is installed).
func Served(ctx context.Context, d discovery.DiscoveryInterface) (bool, error) {
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
