package agent

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Services reach the agent as Services and EndpointSlices (informers, watchServices); the view keeps
// the API objects as the informer cache gave them (never mutated) and services.States turns them into
// pipeline.ServiceState at each snapshot, so the flows follow whichever of the two changed.

// watchServices feeds Services and EndpointSlices into the node view.
type watchServices struct {
	view *nodeView
	sync *flowSync
	log  klog.Logger
}

func (w *watchServices) service(obj any, deleted bool) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: svc.Namespace, Name: svc.Name}.String()
	w.view.update(func(v *nodeView) {
		if deleted {
			delete(v.services, key)
			return
		}
		v.services[key] = svc
	})
	w.sync.Trigger()
}

func (w *watchServices) endpointSlice(obj any, deleted bool) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: es.Namespace, Name: es.Name}.String()
	w.view.update(func(v *nodeView) {
		if deleted {
			delete(v.slices, key)
			return
		}
		v.slices[key] = es
	})
	w.sync.Trigger()
}
