package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is what policy resolution needs of a pod anywhere in the cluster.
type Pod struct {
	Namespace, Name string
	// Labels is the informer object's map: read only.
	Labels      map[string]string
	IPs         []netip.Addr // IPv4 status.podIPs
	Node        string
	HostNetwork bool
	Terminal    bool                 // Succeeded or Failed
	NamedPorts  []pipeline.NamedPort // its containers' named ports, sorted
}

func (p *Pod) key() string { return k8sobj.PodKey(p.Namespace, p.Name) }

// Equal says two states of a pod are the same to policy resolution.
func (p *Pod) Equal(q *Pod) bool {
	return p.Namespace == q.Namespace && p.Name == q.Name && p.Node == q.Node && p.HostNetwork == q.HostNetwork &&
		p.Terminal == q.Terminal && maps.Equal(p.Labels, q.Labels) && slices.Equal(p.IPs, q.IPs) && slices.Equal(p.NamedPorts, q.NamedPorts)
}

func (p *Pod) hasNamed(k namedPortKey) bool {
	for _, np := range p.NamedPorts {
		if np.Name == k.name && np.Protocol == k.proto {
			return true
		}
	}
	return false
}

// PodOf converts a pod as the informer keeps it.
func PodOf(pod *k8sobj.Pod) *Pod {
	p := &Pod{Namespace: pod.Namespace, Name: pod.Name, Labels: pod.Labels, Node: pod.NodeName,
		HostNetwork: pod.HostNetwork, Terminal: pod.Phase == corev1.PodSucceeded || pod.Phase == corev1.PodFailed}
	for _, ip := range pod.IPs {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() && !slices.Contains(p.IPs, a) {
			p.IPs = append(p.IPs, a)
		}
	}
	for _, cp := range pod.Ports {
		proto, ok := k8sobj.ProtocolNumber(cp.Protocol)
		if cp.Name == "" || !ok || cp.ContainerPort <= 0 || cp.ContainerPort > 65535 {
			continue
		}
		p.NamedPorts = append(p.NamedPorts, pipeline.NamedPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
	}
	slices.SortFunc(p.NamedPorts, func(a, b pipeline.NamedPort) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	p.NamedPorts = slices.Compact(p.NamedPorts)
	return p
}

// namedPortKey is a named port as a rule names it: its name and protocol.
type namedPortKey struct {
	name  string
	proto uint8
}

// parsedPolicy is a NetworkPolicy with its selectors parsed and its ports checked, once per change of
// the object.
type parsedPolicy struct {
	namespace, name string
	podSelector     labels.Selector // nil: it could not be parsed, the policy selects nothing
	ingress, egress bool
	ingressRules    []parsedRule
	egressRules     []parsedRule
	// ingressNamed are the named ports the ingress rules use (selected pods carry only these).
	ingressNamed []namedPortKey
	problems     []Problem
}

type parsedRule struct {
	field    string // "spec.ingress[0]", for problems
	egress   bool
	allPeers bool
	peers    []parsedPeer
	ports    []pipeline.PolicyPort
	// none: every port given was left out, so the rule allows nothing.
	none  bool
	named []namedPortKey
	// namedPods: an egress rule with named ports towards every peer or ipBlocks, whose named ports
	// are resolved against every pod of the cluster that has them.
	namedPods bool
}

type parsedPeer struct {
	field string
	// Pod peers: podSelector (nil: every pod) in the policy's namespace (nsSelector nil) or in the
	// namespaces nsSelector matches.
	pods       bool
	podSel     labels.Selector
	nsSel      labels.Selector
	block      netip.Prefix // an ipBlock (IPv4)
	except     []netip.Prefix
	matchesNil bool // unusable (a problem was recorded): matches nothing
}

// Problem is something of a policy that this node does not enforce as written.
type Problem struct {
	Reason  string
	Message string
}

// Event reasons of policy problems.
const (
	// ReasonNotFullyEnforced: part of a policy cannot be enforced (an unparsable selector or
	// address, a named port no pod has); that part allows nothing.
	ReasonNotFullyEnforced = "PolicyNotFullyEnforced"
	// ReasonIPBlockCoversClusterNetwork: an ipBlock covers a whole cluster network, so it allows every pod
	// (and every node's tun0 address), not only addresses outside the cluster.
	ReasonIPBlockCoversClusterNetwork = "PolicyIPBlockCoversClusterNetwork"
)

func (p *parsedPolicy) problem(reason, format string, args ...any) {
	p.problems = append(p.problems, Problem{Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// parsePolicy checks and parses a NetworkPolicy.
func parsePolicy(np *networkingv1.NetworkPolicy) *parsedPolicy {
	p := &parsedPolicy{namespace: np.Namespace, name: np.Name}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		p.problem(ReasonNotFullyEnforced, "spec.podSelector cannot be parsed (%v): the policy selects no pod", err)
	} else {
		p.podSelector = sel
	}
	if len(np.Spec.PolicyTypes) == 0 {
		p.ingress, p.egress = true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.ingress = true
		case networkingv1.PolicyTypeEgress:
			p.egress = true
		}
	}
	if p.ingress {
		for i, r := range np.Spec.Ingress {
			p.ingressRules = append(p.ingressRules, p.parseRule(fmt.Sprintf("spec.ingress[%d]", i), false, r.From, r.Ports))
		}
		for _, r := range p.ingressRules {
			for _, k := range r.named {
				if !slices.Contains(p.ingressNamed, k) {
					p.ingressNamed = append(p.ingressNamed, k)
				}
			}
		}
	}
	if p.egress {
		for i, r := range np.Spec.Egress {
			p.egressRules = append(p.egressRules, p.parseRule(fmt.Sprintf("spec.egress[%d]", i), true, r.To, r.Ports))
		}
	}
	return p
}

func (p *parsedPolicy) parseRule(field string, egress bool, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) parsedRule {
	r := parsedRule{field: field, egress: egress, allPeers: len(peers) == 0}
	peerList := "from"
	if egress {
		peerList = "to"
	}
	for j, peer := range peers {
		pf := fmt.Sprintf("%s.%s[%d]", field, peerList, j)
		r.peers = append(r.peers, p.parsePeer(pf, peer))
	}
	for j, port := range ports {
		pf := fmt.Sprintf("%s.ports[%d]", field, j)
		pp, ok := p.parsePort(pf, port)
		if !ok {
			continue
		}
		r.ports = append(r.ports, pp)
		if pp.Name != "" {
			k := namedPortKey{pp.Name, pp.Protocol}
			if !slices.Contains(r.named, k) {
				r.named = append(r.named, k)
			}
		}
	}
	r.none = len(ports) > 0 && len(r.ports) == 0
	if egress && len(r.named) > 0 {
		r.namedPods = r.allPeers || slices.ContainsFunc(r.peers, func(pp parsedPeer) bool { return pp.block.IsValid() })
	}
	return r
}

func (p *parsedPolicy) parsePeer(field string, peer networkingv1.NetworkPolicyPeer) parsedPeer {
	out := parsedPeer{field: field}
	switch {
	case peer.IPBlock != nil:
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			p.problem(ReasonNotFullyEnforced, "%s: ipBlock together with a selector is not a valid peer: it matches nothing", field)
			out.matchesNil = true
			return out
		}
		cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil {
			p.problem(ReasonNotFullyEnforced, "%s.ipBlock.cidr %q cannot be parsed (%v): the peer matches nothing", field, peer.IPBlock.CIDR, err)
			out.matchesNil = true
			return out
		}
		if !cidr.Addr().Is4() {
			// The cluster network is IPv4: an IPv6 block has nothing to allow (dual-stack policies).
			out.matchesNil = true
			return out
		}
		out.block = cidr.Masked()
		for k, e := range peer.IPBlock.Except {
			ex, err := netip.ParsePrefix(e)
			if err != nil || !ex.Addr().Is4() {
				// Leaving the except out would widen the peer: drop the peer instead.
				p.problem(ReasonNotFullyEnforced, "%s.ipBlock.except[%d] %q is not an IPv4 CIDR: the peer matches nothing", field, k, e)
				out.block, out.except, out.matchesNil = netip.Prefix{}, nil, true
				return out
			}
			out.except = append(out.except, ex.Masked())
		}
		return out
	case peer.PodSelector == nil && peer.NamespaceSelector == nil:
		p.problem(ReasonNotFullyEnforced, "%s names no podSelector, namespaceSelector or ipBlock: it matches nothing", field)
		out.matchesNil = true
		return out
	}
	out.pods = true
	if peer.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			p.problem(ReasonNotFullyEnforced, "%s.podSelector cannot be parsed (%v): the peer matches nothing", field, err)
			out.matchesNil = true
			return out
		}
		out.podSel = sel
	}
	if peer.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			p.problem(ReasonNotFullyEnforced, "%s.namespaceSelector cannot be parsed (%v): the peer matches nothing", field, err)
			out.matchesNil = true
			return out
		}
		out.nsSel = sel
	}
	return out
}

func (p *parsedPolicy) parsePort(field string, port networkingv1.NetworkPolicyPort) (pipeline.PolicyPort, bool) {
	proto := corev1.ProtocolTCP
	if port.Protocol != nil && *port.Protocol != "" {
		proto = *port.Protocol
	}
	num, ok := k8sobj.ProtocolNumber(proto)
	if !ok {
		p.problem(ReasonNotFullyEnforced, "%s: protocol %q is not TCP, UDP or SCTP: the port is left out", field, proto)
		return pipeline.PolicyPort{}, false
	}
	out := pipeline.PolicyPort{Protocol: num}
	if port.Port == nil {
		if port.EndPort != nil {
			p.problem(ReasonNotFullyEnforced, "%s: endPort without port: the port is left out", field)
			return out, false
		}
		return out, true // every port of the protocol
	}
	if port.Port.Type == intstr.String {
		if port.Port.StrVal == "" {
			p.problem(ReasonNotFullyEnforced, "%s: empty port name: the port is left out", field)
			return out, false
		}
		if _, err := strconv.Atoi(port.Port.StrVal); err == nil {
			// A container port's name always has a letter: this one can match no pod.
			p.problem(ReasonNotFullyEnforced, "%s: port %q is a number written as a string: the port is left out", field, port.Port.StrVal)
			return out, false
		}
		if port.EndPort != nil {
			p.problem(ReasonNotFullyEnforced, "%s: endPort with the named port %q: the port is left out", field, port.Port.StrVal)
			return out, false
		}
		out.Name = port.Port.StrVal
		return out, true
	}
	n := port.Port.IntVal
	if n <= 0 || n > 65535 {
		p.problem(ReasonNotFullyEnforced, "%s: port %d is out of range: the port is left out", field, n)
		return out, false
	}
	out.Port = uint16(n)
	if port.EndPort != nil {
		end := *port.EndPort
		if end < n || end > 65535 {
			p.problem(ReasonNotFullyEnforced, "%s: endPort %d is not within %d..65535: the port is left out", field, end, n)
			return out, false
		}
		if end > n {
			out.EndPort = uint16(end)
		}
	}
	return out, true
}
