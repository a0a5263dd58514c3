package policy

import (
	"cmp"
	"maps"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// View is where the watchers file their changes for the flow loop's Index: RecordPolicyChange runs f
// on the changes the next snapshot hands over (latest per object wins) and says whether policies are
// enforced (networkpolicy mode).
type View interface {
	RecordPolicyChange(f func(c *Changes)) (enforced bool)
}

// Watch files NetworkPolicies, the cluster's pods and namespaces as changes in the view, for the flow
// loop's Index. The informers run in every mode, so a switch to networkpolicy mode has everything at
// hand; a sync is asked for only when policies are enforced and the change is one resolution reads (a
// pod's status heartbeat is not).
type Watch struct {
	View View
	Sync k8sobj.Sync
}

func (w *Watch) record(f func(c *Changes)) {
	if w.View.RecordPolicyChange(f) {
		w.Sync.Trigger()
	}
}

// Handlers are the informer handlers: updates that change nothing resolution reads are dropped here.
func (w *Watch) Handlers() (pods, namespaces, policies cache.ResourceEventHandlerFuncs) {
	return PodHandlers(w.pod), NamespaceLabelHandlers(w.namespace), k8sobj.Handlers(w.networkPolicy)
}

// PodHandlers call f with a pod's key and what policy resolution reads of it (nil: deleted), but not
// for an update that changes none of that (a status heartbeat): NetworkPolicy's and
// ClusterNetworkPolicy's watchers.
func PodHandlers(f func(key string, p *Pod)) cache.ResourceEventHandlerFuncs {
	h := k8sobj.Handlers(func(obj any, deleted bool) {
		pod, ok := obj.(*k8sobj.Pod)
		if !ok {
			return
		}
		var p *Pod
		if !deleted {
			p = PodOf(pod)
		}
		f(k8sobj.PodKey(pod.Namespace, pod.Name), p)
	})
	h.UpdateFunc = func(old, obj any) {
		n, ok := obj.(*k8sobj.Pod)
		if !ok {
			return
		}
		p := PodOf(n)
		if o, ok := old.(*k8sobj.Pod); ok && PodOf(o).Equal(p) {
			return
		}
		f(k8sobj.PodKey(n.Namespace, n.Name), p)
	}
	return h
}

// NamespaceLabelHandlers call f with a namespace's name and labels, but not for an update that keeps
// its labels.
func NamespaceLabelHandlers(f func(name string, c NamespaceChange)) cache.ResourceEventHandlerFuncs {
	h := k8sobj.Handlers(func(obj any, deleted bool) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			f(ns.Name, NamespaceChange{Labels: ns.Labels, Deleted: deleted})
		}
	})
	h.UpdateFunc = func(old, obj any) {
		n, ok := obj.(*corev1.Namespace)
		if !ok {
			return
		}
		if o, ok := old.(*corev1.Namespace); ok && maps.Equal(o.Labels, n.Labels) {
			return
		}
		f(n.Name, NamespaceChange{Labels: n.Labels})
	}
	return h
}

func (w *Watch) pod(key string, p *Pod) {
	w.record(func(c *Changes) { c.Pods[key] = p })
}

func (w *Watch) namespace(name string, nc NamespaceChange) {
	w.record(func(c *Changes) { c.Namespaces[name] = nc })
}

func (w *Watch) networkPolicy(obj any, deleted bool) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: np.Namespace, Name: np.Name}.String()
	if deleted {
		np = nil
	}
	w.record(func(c *Changes) { c.Policies[key] = np })
}

// ProblemReporter tells each problem of a policy once: a log line and a Warning Event on the
// NetworkPolicy. A problem that goes away and comes back is told again.
type ProblemReporter struct {
	recorder record.EventRecorder // nil: log lines only
	log      klog.Logger
	told     map[string]map[Problem]bool
}

// NewProblemReporter reports through recorder (nil: only logs).
func NewProblemReporter(recorder record.EventRecorder, log klog.Logger) *ProblemReporter {
	return &ProblemReporter{recorder: recorder, log: log}
}

// Report takes a sync's problems, by policy key (namespace/name), and tells the new ones.
func (r *ProblemReporter) Report(problems map[string][]Problem) {
	now := make(map[string]map[Problem]bool, len(problems))
	keys := make([]string, 0, len(problems))
	for k := range problems {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		ps := slices.Clone(problems[key])
		slices.SortFunc(ps, func(a, b Problem) int {
			return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
		})
		now[key] = map[Problem]bool{}
		for _, p := range ps {
			if now[key][p] {
				continue
			}
			now[key][p] = true
			if r.told[key][p] {
				continue
			}
			r.log.Info("NetworkPolicy not enforced as written", "policy", key, "reason", p.Reason, "problem", p.Message)
			if r.recorder != nil {
				ns, name, _ := cache.SplitMetaNamespaceKey(key)
				ref := &corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: ns, Name: name}
				r.recorder.Event(ref, corev1.EventTypeWarning, p.Reason, p.Message)
			}
		}
	}
	r.told = now
}
