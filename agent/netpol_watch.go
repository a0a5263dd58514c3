package agent

import (
	"cmp"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// watchPolicies feeds NetworkPolicies, the cluster's pods and namespaces into the view's policy index.
// The informers run in every mode, so a switch to networkpolicy mode has everything at hand; a sync is
// asked for only when a change could alter a policy and policies are enforced.
type watchPolicies struct {
	view *nodeView
	sync *flowSync
}

func (w *watchPolicies) changed(f func(v *nodeView) bool) {
	var marked, enforced bool
	w.view.update(func(v *nodeView) {
		marked = f(v)
		enforced = v.mode == pipeline.ModeNetworkPolicy
	})
	if marked && enforced {
		w.sync.trigger()
	}
}

func (w *watchPolicies) pod(obj any, deleted bool) {
	pod, ok := obj.(*k8sobj.Pod)
	if !ok {
		return
	}
	var p *policyPod
	if !deleted {
		p = policyPodOf(pod)
	}
	w.changed(func(v *nodeView) bool { return v.netpol.setPod(k8sobj.PodKey(pod.Namespace, pod.Name), p) })
}

func (w *watchPolicies) namespace(obj any, deleted bool) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	w.changed(func(v *nodeView) bool { return v.netpol.setNamespace(ns.Name, ns.Labels, deleted) })
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
	w.changed(func(v *nodeView) bool {
		v.netpol.setPolicy(key, np)
		return true
	})
}

// policyProblemReporter tells each problem of a policy once: a log line and a Warning Event on the
// NetworkPolicy. A problem that goes away and comes back is told again.
type policyProblemReporter struct {
	recorder record.EventRecorder
	log      klog.Logger
	told     map[string]map[policyProblem]bool
}

func (r *policyProblemReporter) report(problems map[string][]policyProblem) {
	now := make(map[string]map[policyProblem]bool, len(problems))
	keys := make([]string, 0, len(problems))
	for k := range problems {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		ps := slices.Clone(problems[key])
		slices.SortFunc(ps, func(a, b policyProblem) int {
			return cmp.Or(cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
		})
		now[key] = map[policyProblem]bool{}
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
