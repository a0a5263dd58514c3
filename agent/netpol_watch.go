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
		w.sync.trigger()
	}
}

// handlers are the informer handlers: updates that change nothing resolution reads are dropped here.
func (w *watchPolicies) handlers() (pods, namespaces, policies cache.ResourceEventHandlerFuncs) {
	return policyPodHandlers(w.pod), namespaceLabelHandlers(w.namespace), handlers(w.networkPolicy)
}

// policyPodHandlers call f for pods, but not for an update that changes nothing policy resolution
// reads of the pod (a status heartbeat): NetworkPolicy's and ClusterNetworkPolicy's watchers.
func policyPodHandlers(f func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	h := handlers(f)
	h.UpdateFunc = func(old, obj any) {
		o, ok1 := old.(*k8sobj.Pod)
		n, ok2 := obj.(*k8sobj.Pod)
		if ok1 && ok2 && policy.PodOf(o).Equal(policy.PodOf(n)) {
			return
		}
		f(obj, false)
	}
	return h
}

// namespaceLabelHandlers call f for namespaces, but not for an update that keeps their labels.
func namespaceLabelHandlers(f func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	h := handlers(f)
	h.UpdateFunc = func(old, obj any) {
		o, ok1 := old.(*corev1.Namespace)
		n, ok2 := obj.(*corev1.Namespace)
		if ok1 && ok2 && maps.Equal(o.Labels, n.Labels) {
			return
		}
		f(obj, false)
	}
	return h
}

func (w *watchPolicies) pod(obj any, deleted bool) {
	pod, ok := obj.(*k8sobj.Pod)
	if !ok {
		return
	}
	var p *policy.Pod
	if !deleted {
		p = policy.PodOf(pod)
	}
	w.record(func(c *policy.Changes) { c.Pods[k8sobj.PodKey(pod.Namespace, pod.Name)] = p })
}

func (w *watchPolicies) namespace(obj any, deleted bool) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	w.record(func(c *policy.Changes) {
		c.Namespaces[ns.Name] = policy.NamespaceChange{Labels: ns.Labels, Deleted: deleted}
	})
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
