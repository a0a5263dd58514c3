package agent

import (
	"cmp"
	"maps"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/policy"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// watchPolicies files NetworkPolicies, the cluster's pods and namespaces as policy changes in the view,
// for the flow loop's policy index (agent/policy). The informers run in every mode, so a switch to
// networkpolicy mode has everything at hand; a sync is asked for only when policies are enforced and
// the change is one resolution reads (a pod's status heartbeat is not).
type watchPolicies struct {
	view *nodeView
	sync *flowSync
}

func (w *watchPolicies) record(f func(c *policy.Changes)) {
	var enforced bool
	w.view.update(func(v *nodeView) {
		v.recordPolicyChange(f)
		enforced = v.mode == pipeline.ModeNetworkPolicy
	})
	if enforced {
		w.sync.Trigger()
	}
}

// handlers are the informer handlers: updates that change nothing resolution reads are dropped here.
func (w *watchPolicies) handlers() (pods, namespaces, policies cache.ResourceEventHandlerFuncs) {
	return policyPodHandlers(w.pod), namespaceLabelHandlers(w.namespace), k8sobj.Handlers(w.networkPolicy)
}

// policyPodHandlers call f with a pod's key and what policy resolution reads of it (nil: deleted), but
// not for an update that changes none of that (a status heartbeat): NetworkPolicy's and
// ClusterNetworkPolicy's watchers.
func policyPodHandlers(f func(key string, p *policy.Pod)) cache.ResourceEventHandlerFuncs {
	h := k8sobj.Handlers(func(obj any, deleted bool) {
		pod, ok := obj.(*k8sobj.Pod)
		if !ok {
			return
		}
		var p *policy.Pod
		if !deleted {
			p = policy.PodOf(pod)
		}
		f(k8sobj.PodKey(pod.Namespace, pod.Name), p)
	})
	h.UpdateFunc = func(old, obj any) {
		n, ok := obj.(*k8sobj.Pod)
		if !ok {
			return
		}
		p := policy.PodOf(n)
		if o, ok := old.(*k8sobj.Pod); ok && policy.PodOf(o).Equal(p) {
			return
		}
		f(k8sobj.PodKey(n.Namespace, n.Name), p)
	}
	return h
}

// namespaceLabelHandlers call f with a namespace's name and labels, but not for an update that keeps
// its labels.
func namespaceLabelHandlers(f func(name string, c policy.NamespaceChange)) cache.ResourceEventHandlerFuncs {
	h := k8sobj.Handlers(func(obj any, deleted bool) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			f(ns.Name, policy.NamespaceChange{Labels: ns.Labels, Deleted: deleted})
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
		f(n.Name, policy.NamespaceChange{Labels: n.Labels})
	}
	return h
}

func (w *watchPolicies) pod(key string, p *policy.Pod) {
	w.record(func(c *policy.Changes) { c.Pods[key] = p })
}

func (w *watchPolicies) namespace(name string, nc policy.NamespaceChange) {
	w.record(func(c *policy.Changes) { c.Namespaces[name] = nc })
}

func (w *watchPolicies) networkPolicy(obj any, deleted bool) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return
	}
	key := cache.ObjectName{Namespace: np.Namespace, Name: np.Name}.String()
	if deleted {
		np = nil
	}
	w.record(func(c *policy.Changes) { c.Policies[key] = np })
}

// policyProblemReporter tells each problem of a policy once: a log line and a Warning Event on the
// NetworkPolicy. A problem that goes away and comes back is told again.
type policyProblemReporter struct {
	recorder record.EventRecorder
	log      klog.Logger
	told     map[string]map[policy.Problem]bool
}

func (r *policyProblemReporter) report(problems map[string][]policy.Problem) {
	now := make(map[string]map[policy.Problem]bool, len(problems))
	keys := make([]string, 0, len(problems))
	for k := range problems {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		ps := slices.Clone(problems[key])
		slices.SortFunc(ps, func(a, b policy.Problem) int {
			return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
		})
		now[key] = map[policy.Problem]bool{}
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
