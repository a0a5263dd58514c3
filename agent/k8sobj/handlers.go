package k8sobj

import "k8s.io/client-go/tools/cache"

// Handlers turns one function of (object, deleted) into an informer's handlers, the shape every
// watcher of the agent writes; a deletion whose final state is unknown passes the last state the cache
// had.
func Handlers(fn func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { fn(obj, false) },
		UpdateFunc: func(_, obj any) { fn(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			fn(obj, true)
		},
	}
}

// Sync is the flow loop as the watchers see it: Trigger asks for a sync; bursts coalesce.
type Sync interface{ Trigger() }
