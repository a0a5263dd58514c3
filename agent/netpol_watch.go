package agent

import (
	"cmp"
	"slices"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	var p *policyPod
	if !deleted {
		p = policyPodOf(pod)
	}
	w.changed(func(v *nodeView) bool { return v.netpol.setPod(podKey(pod.Namespace, pod.Name), p) })
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

// trimForAgent is the transform of the agent's Kubernetes informers: their caches keep only what the
// agent reads, so that every pod of the cluster fits in its memory budget. Pods keep identity, labels,
// node, hostNetwork, container ports and addresses; namespaces their labels; every other object loses
// its managedFields and kubectl's last-applied copy of itself. Idempotent, as client-go asks.
func trimForAgent(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return trimPod(o), nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion,
			Labels: o.Labels, CreationTimestamp: o.CreationTimestamp, DeletionTimestamp: o.DeletionTimestamp}}, nil
	case metav1.Object:
		o.SetManagedFields(nil)
		if a := o.GetAnnotations(); a[corev1.LastAppliedConfigAnnotation] != "" {
			delete(a, corev1.LastAppliedConfigAnnotation)
		}
	}
	return obj, nil
}

// trimPod keeps of a pod what hostPorts and NetworkPolicy need.
func trimPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) == 0 {
			continue
		}
		tc := corev1.Container{Name: c.Name, Ports: make([]corev1.ContainerPort, len(c.Ports))}
		for i, cp := range c.Ports {
			tc.Ports[i] = corev1.ContainerPort{Name: cp.Name, Protocol: cp.Protocol, ContainerPort: cp.ContainerPort, HostPort: cp.HostPort, HostIP: cp.HostIP}
		}
		out.Spec.Containers = append(out.Spec.Containers, tc)
	}
	if m := p.Annotations[mirrorAnnotation]; m != "" {
		out.Annotations = map[string]string{mirrorAnnotation: m} // restore asks whether a static pod's mirror is its pod
	}
	return out
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
