package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	nadlisters "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/listers/k8s.cni.cncf.io/v1"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/networks"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Networks in the agent: informers feed the view's networks.Index (watchNetworks), the CNI side asks
// networkRequests what a pod wants and where it may attach, the flow loop renders the view's Networks
// and attachments, networks.Reporter writes counts and network-status back, and the routes loop keeps
// running pods' cross-talk routes in step (attach.Handler.SyncRoutes).

// watchNetworks feeds the view's Networks from the Network, NetworkSubnet and Namespace informers.
type watchNetworks struct {
	view *nodeView
	sync *flowSync
	log  klog.Logger
	// changed is told of every change that can move a pod's routes or reports (the routes loop, the
	// reporter).
	changed func()
}

func (w *watchNetworks) after(err error, what string) {
	if err != nil {
		w.log.Error(err, "ignoring a corrupt object: the pods on it carry no traffic until it is fixed", "object", what)
	}
	w.sync.Trigger()
	if w.changed != nil {
		w.changed()
	}
}

func (w *watchNetworks) network(obj any, deleted bool) {
	n, ok := obj.(*networkv1.Network)
	if !ok {
		return
	}
	var err error
	w.view.update(func(v *nodeView) {
		if deleted {
			v.networks.DeleteNetwork(n.Name)
			return
		}
		err = v.networks.SetNetwork(n)
	})
	w.after(err, "Network "+n.Name)
}

func (w *watchNetworks) networkSubnet(obj any, deleted bool) {
	s, ok := obj.(*networkv1.NetworkSubnet)
	if !ok {
		return
	}
	var err error
	w.view.update(func(v *nodeView) {
		if deleted {
			v.networks.DeleteSubnet(s.Name)
			return
		}
		err = v.networks.SetSubnet(s)
	})
	w.after(err, "NetworkSubnet "+s.Name)
}

// namespace keeps the namespaces' labels, which Networks' namespaceSelectors read.
func (w *watchNetworks) namespace(obj any, deleted bool) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	changed := false
	w.view.update(func(v *nodeView) {
		if deleted {
			v.networks.DeleteNamespace(ns.Name)
			return
		}
		changed = v.networks.SetNamespace(ns.Name, ns.Labels)
	})
	if changed {
		w.after(nil, "")
	}
}

// networkRequests is attach.Networks: a pod's networks annotation from the pod informer (the API
// server when the informer has not seen the pod yet), its NetworkAttachmentDefinitions from their
// informer (the API server until it synced), placements from the view.
type networkRequests struct {
	view     *nodeView
	pods     cache.Store // the pod informer's (k8sobj.Pod)
	kube     kubernetes.Interface
	nad      nadclient.Interface // nil: no NetworkAttachmentDefinitions on this cluster
	nads     nadlisters.NetworkAttachmentDefinitionLister
	nadReady cache.InformerSynced
	log      klog.Logger
}

func (r *networkRequests) Placement(network, namespace string) (networks.Placement, error) {
	return r.view.Placement(network, namespace)
}

func (r *networkRequests) Requests(ctx context.Context, namespace, name string) ([]networks.Request, error) {
	annotation, err := r.annotation(ctx, namespace, name)
	if err != nil || annotation == "" {
		return nil, err
	}
	reqs, foreign, err := networks.Requests(annotation, namespace, nadGetter{r, ctx})
	if len(foreign) > 0 {
		r.log.V(1).Info("pod asks for networks of other CNI plugins: left to the runtime's meta-plugin", "pod", k8sobj.PodKey(namespace, name), "nads", foreign)
	}
	return reqs, err
}

// annotation reads the pod's networks request.
func (r *networkRequests) annotation(ctx context.Context, namespace, name string) (string, error) {
	if obj, ok, err := r.pods.GetByKey(k8sobj.PodKey(namespace, name)); err == nil && ok {
		if p, ok := obj.(*k8sobj.Pod); ok {
			return p.Annotations[k8sobj.NetworksAnnotation], nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := r.kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil // a pod the API does not know (a static pod before its mirror): no networks
	case err != nil:
		return "", fmt.Errorf("%w: read pod %s/%s's networks annotation: %v", networks.ErrUnavailable, namespace, name, err)
	}
	return pod.Annotations[k8sobj.NetworksAnnotation], nil
}

// nadGetter is networks.NADs for one request.
type nadGetter struct {
	r   *networkRequests
	ctx context.Context
}

func (g nadGetter) NAD(namespace, name string) (*nadv1.NetworkAttachmentDefinition, error) {
	r := g.r
	if r.nad == nil {
		return nil, fmt.Errorf("%w %s/%s: the agent has no NetworkAttachmentDefinition client", networks.ErrNoNAD, namespace, name)
	}
	if r.nadReady != nil && r.nadReady() {
		d, err := r.nads.NetworkAttachmentDefinitions(namespace).Get(name)
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
	d, err := r.nad.K8sCniCncfIoV1().NetworkAttachmentDefinitions(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w %s/%s", networks.ErrNoNAD, namespace, name)
	case err != nil:
		return nil, fmt.Errorf("%w: NetworkAttachmentDefinition %s/%s: %v", networks.ErrUnavailable, namespace, name, err)
	}
	return d, nil
}

// podEvent records an Event on a pod.
func (a *Agent) podEvent(namespace, name, reason, message string) {
	if a.events == nil {
		return
	}
	a.events.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: name}, corev1.EventTypeWarning, reason, "%s", message)
}

// syncRoutes is the routes loop's job.
func (a *Agent) syncRoutes(ctx context.Context) (time.Duration, error) {
	if err := a.view.Ready(); err != nil {
		return 0, err
	}
	err := a.pods.SyncRoutes(ctx)
	if errors.Is(err, context.Canceled) {
		return 0, nil
	}
	return 0, err
}
