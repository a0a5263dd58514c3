package agent

import (
	"cmp"
	"slices"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
	pod, ok := obj.(*agentPod)
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
// agent reads, so that every pod of the cluster fits in its memory budget. Pods become agentPods
// (identity, labels, node, hostNetwork, container ports, phase and addresses); namespaces keep their
// labels; every other object loses its managedFields and kubectl's last-applied copy of itself.
// Idempotent, as client-go asks.
func trimForAgent(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return agentPodOf(o), nil
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

// agentPod is what the agent's pod informer keeps of a Pod: about a third of a corev1.Pod's memory
// (whose structs alone take 1.5 KB), for every pod of the cluster.
type agentPod struct {
	metav1.TypeMeta
	// Name, namespace, UID, resourceVersion, labels, creation and deletion timestamps.
	metav1.ObjectMeta
	NodeName    string
	HostNetwork bool
	Phase       corev1.PodPhase
	IPs         []string // status.podIPs (status.podIP when the list is empty)
	// Ports are its containers' ports: name, protocol, containerPort, hostPort, hostIP.
	Ports []corev1.ContainerPort
}

// DeepCopyObject makes agentPod a runtime.Object, as an informer's cache wants.
func (p *agentPod) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.IPs = slices.Clone(p.IPs)
	c.Ports = slices.Clone(p.Ports)
	return &c
}

// agentPodOf keeps of a pod what hostPorts and NetworkPolicy need.
func agentPodOf(p *corev1.Pod) *agentPod {
	out := &agentPod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp},
		NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Phase: p.Status.Phase,
	}
	for _, ip := range p.Status.PodIPs {
		out.IPs = append(out.IPs, ip.IP)
	}
	if len(out.IPs) == 0 && p.Status.PodIP != "" {
		out.IPs = []string{p.Status.PodIP}
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			out.Ports = append(out.Ports, corev1.ContainerPort{Name: cp.Name, Protocol: cp.Protocol, ContainerPort: cp.ContainerPort,
				HostPort: cp.HostPort, HostIP: cp.HostIP})
		}
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
