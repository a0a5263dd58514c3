// Package k8sobj is the agent's view of Kubernetes objects: the trimmed pod its informers keep for
// every pod of the cluster, the transform that trims them, and the small conversions every part of
// the agent shares (a pod's key, a protocol's number).
package k8sobj

import (
	"slices"

	"github.com/ofsdn/ofsdn/flows/openflow"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// MirrorAnnotation is kubelet's annotation on a static pod's mirror: the static pod's UID.
const MirrorAnnotation = "kubernetes.io/config.mirror"

// PodKey is a pod's namespace/name, the key the agent files pods under.
func PodKey(namespace, name string) string { return namespace + "/" + name }

// Trim is the transform of the agent's Kubernetes informers: their caches keep only what the agent
// reads, so that every pod of the cluster fits in its memory budget. Pods become Pods (identity,
// labels, node, hostNetwork, container ports, phase and addresses); namespaces keep their labels;
// every other object loses its managedFields and kubectl's last-applied copy of itself. Idempotent,
// as client-go asks.
func Trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return PodOf(o), nil
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

// Pod is what the agent's pod informer keeps of a Pod: about a third of a corev1.Pod's memory (whose
// structs alone take 1.5 KB), for every pod of the cluster.
type Pod struct {
	metav1.TypeMeta
	// Name, namespace, UID, resourceVersion, labels, creation and deletion timestamps; of the
	// annotations only the mirror pod's and the networks request (keptAnnotations).
	metav1.ObjectMeta
	NodeName    string
	HostNetwork bool
	Phase       corev1.PodPhase
	IPs         []string // status.podIPs (status.podIP when the list is empty)
	// Ports are its containers' ports: name, protocol, containerPort, hostPort, hostIP.
	Ports []corev1.ContainerPort
}

// DeepCopyObject makes Pod a runtime.Object, as an informer's cache wants.
func (p *Pod) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	c.IPs = slices.Clone(p.IPs)
	c.Ports = slices.Clone(p.Ports)
	return &c
}

// Terminal says the pod has ended (Succeeded or Failed): it has no network any more.
func (p *Pod) Terminal() bool { return p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed }

// PodOf keeps of a pod what the agent reads.
func PodOf(p *corev1.Pod) *Pod {
	out := &Pod{
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
	for _, k := range keptAnnotations {
		if v := p.Annotations[k]; v != "" {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out
}

// NetworksAnnotation is the pod's request for Networks (the Network Plumbing Working Group's
// k8s.v1.cni.cncf.io/networks), which the CNI ADD reads.
const NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"

// keptAnnotations are the annotations a Pod keeps: restore asks whether a static pod's mirror is its
// pod; the CNI ADD reads the networks the pod asks for.
var keptAnnotations = []string{MirrorAnnotation, NetworksAnnotation}

// ProtocolNumber is a Kubernetes protocol's IP protocol number: TCP (also for ""), UDP or SCTP.
func ProtocolNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return openflow.IPProtoTCP, true
	case corev1.ProtocolUDP:
		return openflow.IPProtoUDP, true
	case corev1.ProtocolSCTP:
		return openflow.IPProtoSCTP, true
	}
	return 0, false
}
