// Package policytest builds NetworkPolicies and pods for tests of policy resolution, in the agent and
// in agent/policy alike.
package policytest

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Policy is a NetworkPolicy selecting sel in ns; mutate (optional) fills the rest of its spec.
func Policy(ns, name string, sel map[string]string, mutate func(s *networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}}}
	if mutate != nil {
		mutate(&np.Spec)
	}
	return np
}

// PodPeer, NsPeer and BlockPeer are the three kinds of peer.
func PodPeer(sel map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: sel}}
}

func NsPeer(sel map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: sel}}
}

func BlockPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// TCPPort is a numbered TCP port; NamedPort a container port's name.
func TCPPort(p int) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(int32(p)))}
}

func NamedPort(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: ptr.To(intstr.FromString(name))}
}

// Labels makes a label map of key, value pairs.
func Labels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Named is a named container port.
func Named(name string, proto corev1.Protocol, port int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, Protocol: proto, ContainerPort: port}
}

// Pod is a running pod on node with ip ("": none yet) and the given labels and container ports.
func Pod(ns, name, node, ip string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
	if ip != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return pod
}
