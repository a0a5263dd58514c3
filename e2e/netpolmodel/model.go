// Package netpolmodel is the e2e suite's own model of Kubernetes NetworkPolicy (networking.k8s.io/v1): given
// namespaces, pods and policies it says whether a connection is allowed, and why. It is written from the API's
// documentation, independently of ofsdn's renderer, so that the lab's observed connectivity can be compared
// with what the API promises. It does no I/O.
//
// The semantics modelled:
//   - A pod is isolated for ingress (egress) only when a policy in its namespace selects it and that policy's
//     policyTypes include Ingress (Egress). Unset policyTypes default to Ingress, plus Egress when the policy
//     has egress rules. An isolated pod accepts (sends) only what some rule of some selecting policy allows:
//     policies are additive.
//   - A rule's peers: podSelector alone (pods of the policy's namespace), namespaceSelector alone (every pod
//     of the matching namespaces), both in one peer (matching pods in matching namespaces), ipBlock (addresses
//     in cidr and in none of except). No peers at all (empty from/to) matches every source/destination,
//     pods or not. A rule list that is present but empty allows nothing.
//   - A rule's ports: protocol (TCP when unset), a numeric port, a range port..endPort, a named port, or no
//     port (every port of the protocol). No ports at all matches every port of every protocol, ICMP too.
//     A named port is resolved against the destination pod: its containerPort with that name and the
//     rule's protocol (so for ingress against the selected pod, for egress against each peer pod; an
//     address that is not a pod has no named ports).
//   - A connection is allowed iff the source's egress allows it and the destination's ingress allows it.
//
// Choices where the API leaves behaviour to the plugin, as ofsdn documents them (issue 12):
//   - hostNetwork pods are their node: never selected or isolated, matched as peers by ipBlock only.
//   - A node always reaches the pods on itself (kubelet's probes); other nodes are plain addresses.
//   - A pod reaching its own address never leaves its network namespace: always allowed ("loopback").
//   - Services: a connection to a ClusterIP is checked against the endpoint it is sent to, for egress as
//     for ingress (ServiceVerdicts), never against the ClusterIP.
package netpolmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProtocolICMP stands for ping in Allowed: only rules without ports allow it.
const ProtocolICMP corev1.Protocol = "ICMP"

// Namespace is a namespace and its labels.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Pod is what the model needs of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	Node            string
	IP              netip.Addr // the node's address for hostNetwork pods
	HostNetwork     bool
	Ports           []corev1.ContainerPort
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Cluster is the world the model judges: it is plain data, filled by the caller.
type Cluster struct {
	Namespaces []Namespace
	Pods       []*Pod
	Policies   []networkingv1.NetworkPolicy
}

// Endpoint is one end of a connection: a pod, a node (its host network), or an address outside the
// cluster. Exactly one of Pod, Node, or only IP is meaningful.
type Endpoint struct {
	Pod  *Pod
	Node string     // a node's host network (not a pod)
	IP   netip.Addr // the address the other end sees; a pod's own IP when Pod is set
}

// PodEndpoint is a pod as one end of a connection.
func PodEndpoint(p *Pod) Endpoint { return Endpoint{Pod: p, IP: p.IP} }

// NodeEndpoint is a node's host network as the source of a connection; ip is the address its packets carry.
func NodeEndpoint(node string, ip netip.Addr) Endpoint { return Endpoint{Node: node, IP: ip} }

// AddressEndpoint is an address outside the cluster's pods.
func AddressEndpoint(ip netip.Addr) Endpoint { return Endpoint{IP: ip} }

func (e Endpoint) String() string {
	switch {
	case e.Pod != nil:
		return e.Pod.Key()
	case e.Node != "":
		return "node " + e.Node
	default:
		return e.IP.String()
	}
}

// policyPod is the pod policies may select and pod selectors may match: hostNetwork pods are their node.
func (e Endpoint) policyPod() *Pod {
	if e.Pod != nil && !e.Pod.HostNetwork {
		return e.Pod
	}
	return nil
}

// Verdict is the model's answer for one connection, with the reason for each direction.
type Verdict struct {
	Allowed bool
	Egress  string // why the source may or may not send it
	Ingress string // why the destination may or may not accept it
}

func (v Verdict) String() string {
	word := "denied"
	if v.Allowed {
		word = "allowed"
	}
	return fmt.Sprintf("%s (egress: %s; ingress: %s)", word, v.Egress, v.Ingress)
}

// Allowed judges a new connection from src to dst on port/protocol (port is ignored for ICMP). It fails
// only on malformed input (a selector or CIDR the API server would refuse).
func (c *Cluster) Allowed(src, dst Endpoint, port int32, proto corev1.Protocol) (Verdict, error) {
	if src.Pod != nil && src.Pod.HostNetwork {
		src = NodeEndpoint(src.Pod.Node, src.IP) // a hostNetwork pod sends as its node
	}
	if src.Pod != nil && dst.Pod != nil && src.Pod.Key() == dst.Pod.Key() {
		return Verdict{Allowed: true, Egress: "loopback", Ingress: "loopback"}, nil
	}
	if src.Node != "" && dst.Pod != nil && dst.Pod.Node == src.Node {
		return Verdict{Allowed: true, Egress: "host network", Ingress: "the local node always reaches its pods"}, nil
	}
	egressOK, _, egressWhy, err := c.direction(true, src.policyPod(), src, dst, port, proto)
	if err != nil {
		return Verdict{}, err
	}
	ingressOK, _, ingressWhy, err := c.direction(false, dst.policyPod(), dst, src, port, proto)
	if err != nil {
		return Verdict{}, err
	}
	return Verdict{Allowed: egressOK && ingressOK, Egress: egressWhy, Ingress: ingressWhy}, nil
}

// Decision is NetworkPolicy's answer for one direction of a connection, as a layer between others
// (ClusterNetworkPolicy's tiers, e2e/cnpmodel): decided when a policy isolates self in that direction
// (allowed then says whether a rule allows the peer), or when self is a pod and the peer its own node's
// host (which always reaches it); undecided otherwise.
func (c *Cluster) Decision(egress bool, self, peer Endpoint, port int32, proto corev1.Protocol) (decided, allowed bool, why string, err error) {
	if peer.Pod != nil && peer.Pod.HostNetwork {
		peer = NodeEndpoint(peer.Pod.Node, peer.IP)
	}
	if !egress && peer.Node != "" && self.Pod != nil && self.Pod.Node == peer.Node {
		return true, true, "the local node always reaches its pods", nil
	}
	allowed, decided, why, err = c.direction(egress, self.policyPod(), self, peer, port, proto)
	return decided, allowed, why, err
}

// Matches says whether a label selector (nil: nothing) matches labels.
func Matches(sel *metav1.LabelSelector, labels map[string]string) (bool, error) {
	return matches(sel, labels)
}

// direction judges one side: subject is the pod whose policies apply (nil: nothing isolates it), peer
// the other end, portPod the pod whose named ports the connection's port is looked up in. decided is
// false when no policy isolates the subject in this direction.
func (c *Cluster) direction(egress bool, subject *Pod, self, peer Endpoint, port int32, proto corev1.Protocol) (allowed, decided bool, why string, err error) {
	if subject == nil {
		return true, false, "not a pod any policy can select", nil
	}
	// Named ports are the destination's: the peer for egress, the subject itself for ingress.
	portPod := self.policyPod()
	if egress {
		portPod = peer.policyPod()
	}
	var selecting []string
	for i := range c.Policies {
		np := &c.Policies[i]
		if np.Namespace != subject.Namespace {
			continue
		}
		ingress, egressType := PolicyTypes(np)
		if egress && !egressType || !egress && !ingress {
			continue
		}
		sel, err := matches(&np.Spec.PodSelector, subject.Labels)
		if err != nil {
			return false, false, "", fmt.Errorf("policy %s/%s podSelector: %w", np.Namespace, np.Name, err)
		}
		if !sel {
			continue
		}
		selecting = append(selecting, np.Name)
		var n int
		if egress {
			n = len(np.Spec.Egress)
		} else {
			n = len(np.Spec.Ingress)
		}
		for r := 0; r < n; r++ {
			var peers []networkingv1.NetworkPolicyPeer
			var ports []networkingv1.NetworkPolicyPort
			if egress {
				peers, ports = np.Spec.Egress[r].To, np.Spec.Egress[r].Ports
			} else {
				peers, ports = np.Spec.Ingress[r].From, np.Spec.Ingress[r].Ports
			}
			okPeer, err := c.peersMatch(np.Namespace, peers, peer)
			if err != nil {
				return false, false, "", fmt.Errorf("policy %s/%s: %w", np.Namespace, np.Name, err)
			}
			if !okPeer {
				continue
			}
			okPort, err := portsMatch(ports, port, proto, portPod)
			if err != nil {
				return false, false, "", fmt.Errorf("policy %s/%s: %w", np.Namespace, np.Name, err)
			}
			if okPort {
				kind := "ingress"
				if egress {
					kind = "egress"
				}
				return true, true, fmt.Sprintf("%s rule %d of %s/%s", kind, r, np.Namespace, np.Name), nil
			}
		}
	}
	if len(selecting) == 0 {
		return true, false, "not isolated", nil
	}
	return false, true, "isolated by " + strings.Join(selecting, ",") + ", no rule matches", nil
}

// PolicyTypes says which directions a policy isolates, defaulting as the API does when policyTypes is unset.
func PolicyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	return slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress),
		slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
}

// peersMatch: does one of a rule's peers (of a policy in namespace ns) match the other end?
func (c *Cluster) peersMatch(ns string, peers []networkingv1.NetworkPolicyPeer, other Endpoint) (bool, error) {
	if len(peers) == 0 {
		return true, nil
	}
	for _, p := range peers {
		ok, err := c.peerMatches(ns, p, other)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (c *Cluster) peerMatches(ns string, peer networkingv1.NetworkPolicyPeer, other Endpoint) (bool, error) {
	if peer.IPBlock != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			return false, fmt.Errorf("a peer with ipBlock may have no selectors")
		}
		return inBlock(peer.IPBlock, other.IP)
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return false, fmt.Errorf("a peer needs podSelector, namespaceSelector or ipBlock")
	}
	pod := other.policyPod()
	if pod == nil {
		return false, nil // selectors match pods only
	}
	if peer.NamespaceSelector == nil {
		if pod.Namespace != ns {
			return false, nil
		}
	} else {
		nsLabels, found := c.namespaceLabels(pod.Namespace)
		if !found {
			return false, nil
		}
		ok, err := matches(peer.NamespaceSelector, nsLabels)
		if err != nil || !ok {
			return false, err
		}
	}
	if peer.PodSelector == nil {
		return true, nil
	}
	return matches(peer.PodSelector, pod.Labels)
}

func (c *Cluster) namespaceLabels(name string) (map[string]string, bool) {
	for _, ns := range c.Namespaces {
		if ns.Name == name {
			return ns.Labels, true
		}
	}
	return nil, false
}

func inBlock(b *networkingv1.IPBlock, ip netip.Addr) (bool, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return false, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			return false, fmt.Errorf("ipBlock except %q: %w", e, err)
		}
		if ip.IsValid() && ex.Contains(ip) {
			return false, nil
		}
	}
	return ip.IsValid() && cidr.Contains(ip), nil
}

// portsMatch: does one of a rule's ports match? portPod holds the named ports (nil: the destination
// is no pod, so no name resolves).
func portsMatch(ports []networkingv1.NetworkPolicyPort, port int32, proto corev1.Protocol, portPod *Pod) (bool, error) {
	if len(ports) == 0 {
		return true, nil
	}
	for _, pp := range ports {
		want := corev1.ProtocolTCP
		if pp.Protocol != nil {
			want = *pp.Protocol
		}
		if protocolOf(want) != proto {
			continue
		}
		switch {
		case pp.Port == nil:
			if pp.EndPort != nil {
				return false, fmt.Errorf("endPort without port")
			}
			return true, nil
		case pp.Port.Type == intstr.String: // a named port
			if pp.EndPort != nil {
				return false, fmt.Errorf("endPort with named port %q", pp.Port.StrVal)
			}
			if portPod == nil {
				continue
			}
			for _, cp := range portPod.Ports {
				if cp.Name == pp.Port.StrVal && protocolOf(cp.Protocol) == proto && cp.ContainerPort == port {
					return true, nil
				}
			}
		default:
			lo, hi := pp.Port.IntVal, pp.Port.IntVal
			if pp.EndPort != nil {
				hi = *pp.EndPort
				if hi < lo {
					return false, fmt.Errorf("endPort %d below port %d", hi, lo)
				}
			}
			if port >= lo && port <= hi {
				return true, nil
			}
		}
	}
	return false, nil
}

// matches evaluates a label selector (matchLabels AND every matchExpression); an empty selector matches
// everything. Malformed selectors (that the API server refuses) are errors.
func matches(sel *metav1.LabelSelector, labels map[string]string) (bool, error) {
	if sel == nil {
		return true, nil
	}
	ok := true
	for k, v := range sel.MatchLabels {
		if got, found := labels[k]; !found || got != v {
			ok = false
		}
	}
	for _, e := range sel.MatchExpressions {
		val, found := labels[e.Key]
		switch e.Operator {
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn:
			if len(e.Values) == 0 {
				return false, fmt.Errorf("selector %s %s needs values", e.Key, e.Operator)
			}
			in := found && slices.Contains(e.Values, val)
			if in != (e.Operator == metav1.LabelSelectorOpIn) {
				ok = false
			}
		case metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
			if len(e.Values) != 0 {
				return false, fmt.Errorf("selector %s %s takes no values", e.Key, e.Operator)
			}
			if found != (e.Operator == metav1.LabelSelectorOpExists) {
				ok = false
			}
		default:
			return false, fmt.Errorf("selector operator %q", e.Operator)
		}
	}
	return ok, nil
}

// Service is a ClusterIP service as the model sees it: its ports and its ready endpoints (pods).
type Service struct {
	Ports     []corev1.ServicePort
	Endpoints []*Pod
}

// ServiceVerdicts judges a connection from src to a service's port: one verdict per endpoint, each
// checked at the endpoint's target port (named target ports resolved on that endpoint). An endpoint
// that does not have a named target port gets no traffic and no verdict.
func (c *Cluster) ServiceVerdicts(src Endpoint, svc Service, port int32, proto corev1.Protocol) (map[string]Verdict, error) {
	var sp *corev1.ServicePort
	for i := range svc.Ports {
		p := &svc.Ports[i]
		if p.Port == port && protocolOf(p.Protocol) == proto {
			sp = p
		}
	}
	if sp == nil {
		return nil, fmt.Errorf("service has no %s port %d", proto, port)
	}
	out := map[string]Verdict{}
	for _, ep := range svc.Endpoints {
		target := sp.TargetPort.IntVal
		switch {
		case sp.TargetPort.Type == intstr.String:
			target = 0
			for _, cp := range ep.Ports {
				if cp.Name == sp.TargetPort.StrVal && protocolOf(cp.Protocol) == proto {
					target = cp.ContainerPort
				}
			}
			if target == 0 {
				continue
			}
		case target == 0:
			target = sp.Port
		}
		v, err := c.Allowed(src, PodEndpoint(ep), target, proto)
		if err != nil {
			return nil, err
		}
		out[ep.Key()] = v
	}
	return out, nil
}

// protocolOf defaults an unset protocol to TCP, as the API does.
func protocolOf(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}
