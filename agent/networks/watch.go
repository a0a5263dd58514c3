package networks

import (
	"context"
	"fmt"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	nadlisters "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/listers/k8s.cni.cncf.io/v1"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Networks in the agent: the informers feed the view's Index (Watch), the CNI side asks PodRequests
// what a pod wants and where it may attach, the flow loop renders the view's Networks and attachments,
// Reporter writes counts and network-status back, and the agent's routes loop keeps running pods'
// cross-talk routes in step (attach.Handler.SyncRoutes).

// View is the agent's view as the watchers use it: UpdateNetworks runs f on the view's Index under
// the view's lock, in a new generation of the view.
type View interface {
	UpdateNetworks(f func(ix *Index))
}

// Watch feeds the view's Networks from the Network, NetworkSubnet and Namespace informers.
type Watch struct {
	View View
	Sync k8sobj.Sync
	Log  klog.Logger
	// Changed, when set, is told of every change that can move a pod's routes or reports (the routes
	// loop, the reporter).
	Changed func()
}

// Handlers are the informers' handlers: Networks, NetworkSubnets, and the namespaces' labels the
// Networks' namespaceSelectors read.
func (w *Watch) Handlers() (networks, subnets, namespaces cache.ResourceEventHandlerFuncs) {
	return k8sobj.Handlers(w.network), k8sobj.Handlers(w.networkSubnet), k8sobj.Handlers(w.namespace)
}

func (w *Watch) after(err error, what string) {
	if err != nil {
		w.Log.Error(err, "ignoring a corrupt object: the pods on it carry no traffic until it is fixed", "object", what)
	}
	w.Sync.Trigger()
	if w.Changed != nil {
		w.Changed()
	}
}

func (w *Watch) network(obj any, deleted bool) {
	n, ok := obj.(*networkv1.Network)
	if !ok {
		return
	}
	var err error
	w.View.UpdateNetworks(func(ix *Index) {
		if deleted {
			ix.DeleteNetwork(n.Name)
			return
		}
		err = ix.SetNetwork(n)
	})
	w.after(err, "Network "+n.Name)
}

func (w *Watch) networkSubnet(obj any, deleted bool) {
	s, ok := obj.(*networkv1.NetworkSubnet)
	if !ok {
		return
	}
	var err error
	w.View.UpdateNetworks(func(ix *Index) {
		if deleted {
			ix.DeleteSubnet(s.Name)
			return
		}
		err = ix.SetSubnet(s)
	})
	w.after(err, "NetworkSubnet "+s.Name)
}

// namespace keeps the namespaces' labels, which Networks' namespaceSelectors read.
func (w *Watch) namespace(obj any, deleted bool) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	changed := false
	w.View.UpdateNetworks(func(ix *Index) {
		if deleted {
			ix.DeleteNamespace(ns.Name)
			return
		}
		changed = ix.SetNamespace(ns.Name, ns.Labels)
	})
	if changed {
		w.after(nil, "")
	}
}

// Placements says how a pod of namespace attaches to a Network on this node (the agent's view).
type Placements interface {
	Placement(network, namespace string) (Placement, error)
}

// PodRequests is what the CNI side asks about a pod's Networks (attach.Networks): its networks
// annotation from the pod informer (the API server when the informer has not seen the pod yet), its
// NetworkAttachmentDefinitions from their informer (the API server until it synced), placements from
// the view.
type PodRequests struct {
	Placements
	// Pods is the pod informer's store (k8sobj.Pod).
	Pods cache.Store
	Kube kubernetes.Interface
	// NAD reads NetworkAttachmentDefinitions; nil: no NetworkAttachmentDefinitions on this cluster.
	NAD nadclient.Interface
	// NADs and NADsSynced are their informer's lister and sync (nil: ask the API server).
	NADs       nadlisters.NetworkAttachmentDefinitionLister
	NADsSynced cache.InformerSynced
	Log        klog.Logger
}

// Requests resolves the pod's k8s.v1.cni.cncf.io/networks annotation.
func (r *PodRequests) Requests(ctx context.Context, namespace, name string) ([]Request, error) {
	annotation, err := r.annotation(ctx, namespace, name)
	if err != nil || annotation == "" {
		return nil, err
	}
	reqs, foreign, err := Requests(annotation, namespace, nadGetter{r, ctx})
	if len(foreign) > 0 {
		r.Log.V(1).Info("pod asks for networks of other CNI plugins: left to the runtime's meta-plugin", "pod", k8sobj.PodKey(namespace, name), "nads", foreign)
	}
	return reqs, err
}

// annotation reads the pod's networks request.
func (r *PodRequests) annotation(ctx context.Context, namespace, name string) (string, error) {
	if obj, ok, err := r.Pods.GetByKey(k8sobj.PodKey(namespace, name)); err == nil && ok {
		if p, ok := obj.(*k8sobj.Pod); ok {
			return p.Annotations[k8sobj.NetworksAnnotation], nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := r.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil // a pod the API does not know (a static pod before its mirror): no networks
	case err != nil:
		return "", fmt.Errorf("%w: read pod %s/%s's networks annotation: %v", ErrUnavailable, namespace, name, err)
	}
	return pod.Annotations[k8sobj.NetworksAnnotation], nil
}

// nadGetter is NADs for one request.
type nadGetter struct {
	r   *PodRequests
	ctx context.Context
}

func (g nadGetter) NAD(namespace, name string) (*nadv1.NetworkAttachmentDefinition, error) {
	r := g.r
	if r.NAD == nil {
		return nil, fmt.Errorf("%w %s/%s: the agent has no NetworkAttachmentDefinition client", ErrNoNAD, namespace, name)
	}
	if r.NADsSynced != nil && r.NADsSynced() {
		d, err := r.NADs.NetworkAttachmentDefinitions(namespace).Get(name)
		if err == nil {
			return d, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		// Not cached: perhaps created a moment ago. Ask the API server.
	}
	ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
	defer cancel()
	d, err := r.NAD.K8sCniCncfIoV1().NetworkAttachmentDefinitions(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w %s/%s", ErrNoNAD, namespace, name)
	case err != nil:
		return nil, fmt.Errorf("%w: NetworkAttachmentDefinition %s/%s: %v", ErrUnavailable, namespace, name, err)
	}
	return d, nil
}
