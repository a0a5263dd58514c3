// Package cnpmodel is the tests' own model of ClusterNetworkPolicy (policy.networking.k8s.io v1beta1,
// the Admin and Baseline tiers) on top of the namespace's own layer: NetworkPolicy (e2e/netpolmodel) in
// networkpolicy mode, VNID isolation in multitenant mode, nothing in subnet mode. It is written from
// the API's text, independently of ofsdn's renderer and resolver, and does no I/O.
//
// The semantics modelled, per direction (egress at the source pod, ingress at the destination pod; a
// connection is allowed iff both directions allow it):
//   - Tiers in order: Admin, the namespace's layer, Baseline, then default allow. A tier's policies
//     that select the pod (subject: namespaces, or pods by namespace and pod labels; never
//     hostNetwork pods) are taken by ascending spec.priority, each policy's rules in written order; the
//     first rule whose peers and protocols match decides: Accept (allowed, no later tier of this
//     direction is asked), Deny (denied), Pass (the rest of this tier is skipped). Policies of the same
//     priority are taken by name; the API leaves their order open, so tests give overlapping
//     same-priority policies the same verdicts.
//   - The namespace's layer decides only when it says something: a NetworkPolicy isolating the pod in
//     this direction decides (allowed iff some rule allows); tenant isolation (multitenant, ingress)
//     denies a connection between two different VNIDs neither of which is global (0). Everything else
//     is undecided and goes on to Baseline.
//   - Peers: namespaces (every pod, not hostNetwork, of matching namespaces); pods (namespace and pod
//     selectors); networks (the address in a CIDR, pods included); nodes (an address of a selected
//     node, for egress); domainNames match nothing here (ofsdn fails them closed). A peer with no
//     field set is an unknown peer: for an Accept rule it matches nothing, for Deny and Pass every
//     address.
//   - Protocols: none listed matches every packet (ICMP too); tcp/udp/sctp with no port, a port, or a
//     range start..end; destinationNamedPort: the destination pod's container port of that name (and
//     its protocol). A destination that is not a pod has no named ports.
//   - A pod reaching its own address is allowed (loopback; it never leaves the pod).
package cnpmodel

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/e2e/netpolmodel"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode is the cluster's plugin mode.
type Mode string

const (
	Subnet        Mode = "subnet"
	Multitenant   Mode = "multitenant"
	NetworkPolicy Mode = "networkpolicy"
)

// Node is a node as a nodes peer sees it.
type Node struct {
	Name   string
	Labels map[string]string
	IPs    []netip.Addr
}

// World is what the model judges: the namespace layer's cluster (namespaces, pods, NetworkPolicies),
// each namespace's VNID (multitenant), the nodes, and the ClusterNetworkPolicies.
type World struct {
	Mode     Mode
	Cluster  *netpolmodel.Cluster
	VNIDs    map[string]uint32
	Nodes    []Node
	Policies []cnp.ClusterNetworkPolicy
}

// Verdict is the model's answer for one connection.
type Verdict struct {
	Allowed         bool
	Egress, Ingress string
}

func (v Verdict) String() string {
	word := "denied"
	if v.Allowed {
		word = "allowed"
	}
	return fmt.Sprintf("%s (egress: %s; ingress: %s)", word, v.Egress, v.Ingress)
}

// Allowed judges a new connection from one endpoint to another on port/protocol (ICMP: port ignored).
func (w *World) Allowed(src, dst netpolmodel.Endpoint, port int32, proto corev1.Protocol) (Verdict, error) {
	if src.Pod != nil && dst.Pod != nil && src.Pod.Key() == dst.Pod.Key() {
		return Verdict{Allowed: true, Egress: "loopback", Ingress: "loopback"}, nil
	}
	eOK, eWhy, err := w.direction(true, src, dst, port, proto)
	if err != nil {
		return Verdict{}, err
	}
	iOK, iWhy, err := w.direction(false, dst, src, port, proto)
	if err != nil {
		return Verdict{}, err
	}
	return Verdict{Allowed: eOK && iOK, Egress: eWhy, Ingress: iWhy}, nil
}

// decision is a tier's answer: decided (allowed or not), or not.
type decision struct {
	decided, allowed bool
	why              string
}

// direction judges one side: self is the pod whose policies apply, peer the other end.
func (w *World) direction(egress bool, self, peer netpolmodel.Endpoint, port int32, proto corev1.Protocol) (bool, string, error) {
	subject := self.Pod
	if subject != nil && subject.HostNetwork {
		subject = nil
	}
	// The destination's named ports: the peer for egress, the subject for ingress.
	dstPod := self.Pod
	if egress {
		dstPod = peer.Pod
	}
	if subject != nil {
		d, err := w.tier(cnp.AdminTier, egress, subject, peer, dstPod, port, proto)
		if err != nil || d.decided {
			return d.allowed, d.why, err
		}
	}
	d, err := w.namespaceLayer(egress, self, peer, port, proto)
	if err != nil || d.decided {
		return d.allowed, d.why, err
	}
	if subject != nil {
		d, err := w.tier(cnp.BaselineTier, egress, subject, peer, dstPod, port, proto)
		if err != nil || d.decided {
			return d.allowed, d.why, err
		}
	}
	return true, "no tier decided: allowed by default", nil
}

// namespaceLayer is NetworkPolicy (networkpolicy mode) or tenant isolation (multitenant, ingress).
func (w *World) namespaceLayer(egress bool, self, peer netpolmodel.Endpoint, port int32, proto corev1.Protocol) (decision, error) {
	switch w.Mode {
	case NetworkPolicy:
		decided, allowed, why, err := w.Cluster.Decision(egress, self, peer, port, proto)
		return decision{decided, allowed, "NetworkPolicy: " + why}, err
	case Multitenant:
		if egress {
			return decision{}, nil
		}
		src, dst := w.vnidOf(peer), w.vnidOf(self)
		if src != 0 && dst != 0 && src != dst {
			return decision{true, false, fmt.Sprintf("tenant isolation: VNID %d may not reach VNID %d", src, dst)}, nil
		}
	}
	return decision{}, nil
}

// vnidOf is an endpoint's VNID: its namespace's for a pod, global (0) for anything else.
func (w *World) vnidOf(e netpolmodel.Endpoint) uint32 {
	if e.Pod == nil || e.Pod.HostNetwork {
		return 0
	}
	return w.VNIDs[e.Pod.Namespace]
}

// tier evaluates one tier's policies that select subject.
func (w *World) tier(t cnp.Tier, egress bool, subject *netpolmodel.Pod, peer netpolmodel.Endpoint, dstPod *netpolmodel.Pod,
	port int32, proto corev1.Protocol) (decision, error) {
	var ps []*cnp.ClusterNetworkPolicy
	for i := range w.Policies {
		if p := &w.Policies[i]; p.Spec.Tier == t {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b *cnp.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), cmp.Compare(a.Name, b.Name))
	})
	for _, p := range ps {
		sel, err := w.subjectSelects(p.Spec.Subject, subject)
		if err != nil {
			return decision{}, fmt.Errorf("ClusterNetworkPolicy %s subject: %w", p.Name, err)
		}
		if !sel {
			continue
		}
		type rule struct {
			name      string
			action    cnp.Action
			peers     []cnp.EgressPeer
			protocols []cnp.Protocol
		}
		var rules []rule
		if egress {
			for _, r := range p.Spec.Egress {
				rules = append(rules, rule{r.Name, r.Action, r.To, r.Protocols})
			}
		} else {
			for _, r := range p.Spec.Ingress {
				var peers []cnp.EgressPeer
				for _, f := range r.From {
					peers = append(peers, cnp.EgressPeer{Namespaces: f.Namespaces, Pods: f.Pods})
				}
				rules = append(rules, rule{r.Name, r.Action, peers, r.Protocols})
			}
		}
		for i, r := range rules {
			ok, err := w.peersMatch(r.action, r.peers, peer)
			if err != nil {
				return decision{}, fmt.Errorf("ClusterNetworkPolicy %s rule %d: %w", p.Name, i, err)
			}
			if !ok || !protocolsMatch(r.protocols, port, proto, dstPod) {
				continue
			}
			why := fmt.Sprintf("%s %s rule %d (%s) of %s: %s", t, dirName(egress), i, r.name, p.Name, r.action)
			switch r.action {
			case cnp.Accept:
				return decision{true, true, why}, nil
			case cnp.Deny:
				return decision{true, false, why}, nil
			default: // Pass: the rest of the tier is skipped
				return decision{why: why}, nil
			}
		}
	}
	return decision{}, nil
}

func dirName(egress bool) string {
	if egress {
		return "egress"
	}
	return "ingress"
}

func (w *World) subjectSelects(s cnp.Subject, p *netpolmodel.Pod) (bool, error) {
	switch {
	case s.Namespaces != nil:
		return w.nsMatches(s.Namespaces, p.Namespace)
	case s.Pods != nil:
		return w.podMatches(s.Pods, p)
	}
	return false, nil // an unknown subject selects nothing
}

func (w *World) nsMatches(sel *metav1.LabelSelector, ns string) (bool, error) {
	for _, n := range w.Cluster.Namespaces {
		if n.Name == ns {
			return netpolmodel.Matches(sel, n.Labels)
		}
	}
	return false, nil
}

func (w *World) podMatches(np *cnp.NamespacedPod, p *netpolmodel.Pod) (bool, error) {
	ok, err := w.nsMatches(&np.NamespaceSelector, p.Namespace)
	if err != nil || !ok {
		return false, err
	}
	return netpolmodel.Matches(&np.PodSelector, p.Labels)
}

// peersMatch: any peer of the rule matches the other end.
func (w *World) peersMatch(action cnp.Action, peers []cnp.EgressPeer, other netpolmodel.Endpoint) (bool, error) {
	for _, peer := range peers {
		ok, err := w.peerMatches(action, peer, other)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (w *World) peerMatches(action cnp.Action, peer cnp.EgressPeer, other netpolmodel.Endpoint) (bool, error) {
	pod := other.Pod
	if pod != nil && pod.HostNetwork {
		pod = nil // hostNetwork pods are no pod peers
	}
	switch {
	case peer.Namespaces != nil:
		if pod == nil {
			return false, nil
		}
		return w.nsMatches(peer.Namespaces, pod.Namespace)
	case peer.Pods != nil:
		if pod == nil {
			return false, nil
		}
		return w.podMatches(peer.Pods, pod)
	case len(peer.Networks) > 0:
		for _, n := range peer.Networks {
			pfx, err := netip.ParsePrefix(n)
			if err != nil {
				return false, fmt.Errorf("network %q: %w", n, err)
			}
			if other.IP.IsValid() && pfx.Contains(other.IP) {
				return true, nil
			}
		}
		return false, nil
	case peer.Nodes != nil:
		for _, n := range w.Nodes {
			ok, err := netpolmodel.Matches(peer.Nodes, n.Labels)
			if err != nil {
				return false, err
			}
			if ok && slices.Contains(n.IPs, other.IP) {
				return true, nil
			}
		}
		return false, nil
	case len(peer.DomainNames) > 0:
		return false, nil // not implemented by ofsdn: fails closed (matches nothing)
	}
	return action != cnp.Accept, nil // an unknown peer: fail closed
}

// protocolsMatch: no protocols match everything; else one of them matches the packet.
func protocolsMatch(ps []cnp.Protocol, port int32, proto corev1.Protocol, dstPod *netpolmodel.Pod) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		var pp *cnp.ProtocolPort
		var want corev1.Protocol
		switch {
		case p.TCP != nil:
			pp, want = p.TCP, corev1.ProtocolTCP
		case p.UDP != nil:
			pp, want = p.UDP, corev1.ProtocolUDP
		case p.SCTP != nil:
			pp, want = p.SCTP, corev1.ProtocolSCTP
		case p.DestinationNamedPort != "":
			if dstPod == nil || dstPod.HostNetwork {
				continue
			}
			for _, cp := range dstPod.Ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == p.DestinationNamedPort && cpProto == proto && cp.ContainerPort == port {
					return true
				}
			}
			continue
		default:
			continue
		}
		if want != proto {
			continue
		}
		switch d := pp.DestinationPort; {
		case d == nil:
			return true
		case d.Range != nil:
			if port >= d.Range.Start && port <= d.Range.End {
				return true
			}
		case d.Number == port:
			return true
		}
	}
	return false
}
