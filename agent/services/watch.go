package services

import (
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// View is where Watch files the informers' objects (the agent's view, which keeps them as the
// informer cache gave them, never mutated, and converts them at each snapshot): by namespace/name,
// nil for a deleted one.
type View interface {
	SetService(key string, svc *corev1.Service)
	SetEndpointSlice(key string, es *discoveryv1.EndpointSlice)
}

// Watch feeds Services and EndpointSlices into the view: br0 load-balances them, no kube-proxy
// needed. The flows follow whichever of the two changed.
type Watch struct {
	View View
	Sync k8sobj.Sync
}

// Handlers are the Services' and EndpointSlices' informers' handlers.
func (w *Watch) Handlers() (services, endpointSlices cache.ResourceEventHandlerFuncs) {
	return k8sobj.Handlers(w.service), k8sobj.Handlers(w.endpointSlice)
}

func (w *Watch) service(obj any, deleted bool) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: svc.Namespace, Name: svc.Name}.String()
	if deleted {
		svc = nil
	}
	w.View.SetService(key, svc)
	w.Sync.Trigger()
}

func (w *Watch) endpointSlice(obj any, deleted bool) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: es.Namespace, Name: es.Name}.String()
	if deleted {
		es = nil
	}
	w.View.SetEndpointSlice(key, es)
	w.Sync.Trigger()
}
