package adminpolicy

import (
	"fmt"
	"net/netip"
	"slices"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Problem is something of a policy this node does not enforce as written.
type Problem struct {
	Reason  string
	Message string
}

// Problem reasons (the Event reasons agents report, the controller's condition aggregates them).
const (
	// ReasonFailedClosed: a peer or protocol the agent cannot understand (an unknown field, an
	// unparsable selector or CIDR): an Accept rule's part matches nothing, a Deny or Pass rule's part
	// matches everything, as the API asks.
	ReasonFailedClosed = "FailedClosed"
	// ReasonDomainNamesUnsupported: domainNames peers are not implemented; they match nothing.
	ReasonDomainNamesUnsupported = "DomainNamesUnsupported"
	// ReasonNamedPortUnresolved: a destinationNamedPort that no destination pod has on this node.
	ReasonNamedPortUnresolved = "NamedPortUnresolved"
	// ReasonRenderFailed: the node could not install the policy's flows (the agent adds this one).
	ReasonRenderFailed = "RenderFailed"
)

// parsedPolicy is a ClusterNetworkPolicy with its selectors parsed, once per change of the object.
type parsedPolicy struct {
	name     string
	tier     pipeline.AdminTier
	priority int32
	subject  selectorPair // nothing parsed: selects no pod
	ingress  []parsedRule
	egress   []parsedRule
	problems []Problem
	// ingressNamed are the names the ingress rules' destinationNamedPorts use (subject pods carry
	// only those); hasNodes: some egress peer selects nodes.
	ingressNamed []string
	hasNodes     bool
}

// selectorPair selects pods by namespace labels and pod labels (nil selector: every one); valid false:
// nothing.
type selectorPair struct {
	valid bool
	ns    labels.Selector
	pod   labels.Selector
}

type parsedRule struct {
	name   string
	action pipeline.AdminAction
	// all: the rule matches every peer (a Deny or Pass rule with a peer it cannot understand).
	all   bool
	peers []parsedPeer
	ports []pipeline.PolicyPort // none: every port (unless none is set)
	// none: every protocol it listed was left out (an Accept rule failing closed): it matches nothing.
	none  bool
	named []string // destinationNamedPorts
}

type parsedPeer struct {
	pods     selectorPair // valid: a pod peer
	nodes    labels.Selector
	networks []netip.Prefix
}

func (p *parsedPolicy) problem(reason, format string, args ...any) {
	p.problems = append(p.problems, Problem{Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// parsePolicy checks and parses a policy. An unknown tier or action makes the policy or rule fail
// closed: an unknown tier is taken as Admin (it cannot be ignored safely), an unknown action as Deny.
func parsePolicy(c *cnp.ClusterNetworkPolicy) *parsedPolicy {
	p := &parsedPolicy{name: c.Name, priority: c.Spec.Priority}
	switch c.Spec.Tier {
	case cnp.AdminTier:
		p.tier = pipeline.AdminTierAdmin
	case cnp.BaselineTier:
		p.tier = pipeline.AdminTierBaseline
	default:
		p.tier = pipeline.AdminTierAdmin
		p.problem(ReasonFailedClosed, "spec.tier %q is unknown: enforced in the Admin tier", c.Spec.Tier)
	}
	s := c.Spec.Subject
	switch {
	case s.Namespaces != nil:
		p.subject = p.pair("spec.subject.namespaces", s.Namespaces, nil)
	case s.Pods != nil:
		p.subject = p.pair("spec.subject.pods", &s.Pods.NamespaceSelector, &s.Pods.PodSelector)
	default:
		p.problem(ReasonFailedClosed, "spec.subject names neither namespaces nor pods: the policy selects no pod")
	}
	for i, r := range c.Spec.Ingress {
		var peers []cnp.EgressPeer
		for _, f := range r.From {
			peers = append(peers, cnp.EgressPeer{Namespaces: f.Namespaces, Pods: f.Pods})
		}
		pr := p.parseRule(fmt.Sprintf("spec.ingress[%d]", i), r.Name, r.Action, peers, r.Protocols, "from")
		p.ingress = append(p.ingress, pr)
		for _, n := range pr.named {
			if !slices.Contains(p.ingressNamed, n) {
				p.ingressNamed = append(p.ingressNamed, n)
			}
		}
	}
	for i, r := range c.Spec.Egress {
		p.egress = append(p.egress, p.parseRule(fmt.Sprintf("spec.egress[%d]", i), r.Name, r.Action, r.To, r.Protocols, "to"))
	}
	return p
}

func (p *parsedPolicy) pair(field string, ns, pod *metav1.LabelSelector) selectorPair {
	out := selectorPair{valid: true}
	var err error
	if out.ns, err = metav1.LabelSelectorAsSelector(ns); err != nil {
		p.problem(ReasonFailedClosed, "%s: namespace selector cannot be parsed (%v)", field, err)
		return selectorPair{}
	}
	if pod != nil {
		if out.pod, err = metav1.LabelSelectorAsSelector(pod); err != nil {
			p.problem(ReasonFailedClosed, "%s: pod selector cannot be parsed (%v)", field, err)
			return selectorPair{}
		}
	}
	return out
}

func (p *parsedPolicy) parseRule(field, name string, action cnp.Action, peers []cnp.EgressPeer, protocols []cnp.Protocol, list string) parsedRule {
	r := parsedRule{name: name}
	switch action {
	case cnp.Accept:
		r.action = pipeline.AdminAccept
	case cnp.Deny:
		r.action = pipeline.AdminDeny
	case cnp.Pass:
		r.action = pipeline.AdminPass
	default:
		r.action = pipeline.AdminDeny
		p.problem(ReasonFailedClosed, "%s: action %q is unknown: enforced as Deny", field, action)
	}
	accept := r.action == pipeline.AdminAccept
	failClosed := func(what string) {
		if accept {
			p.problem(ReasonFailedClosed, "%s: %s: this Accept rule's part matches nothing", field, what)
		} else {
			r.all = true
			p.problem(ReasonFailedClosed, "%s: %s: this %s rule matches every peer", field, what, r.action)
		}
	}
	for j, peer := range peers {
		pf := fmt.Sprintf("%s.%s[%d]", field, list, j)
		switch {
		case peer.Namespaces != nil:
			if sp := p.pair(pf+".namespaces", peer.Namespaces, nil); sp.valid {
				r.peers = append(r.peers, parsedPeer{pods: sp})
			} else {
				failClosed("a selector cannot be parsed")
			}
		case peer.Pods != nil:
			if sp := p.pair(pf+".pods", &peer.Pods.NamespaceSelector, &peer.Pods.PodSelector); sp.valid {
				r.peers = append(r.peers, parsedPeer{pods: sp})
			} else {
				failClosed("a selector cannot be parsed")
			}
		case peer.Nodes != nil:
			sel, err := metav1.LabelSelectorAsSelector(peer.Nodes)
			if err != nil {
				p.problem(ReasonFailedClosed, "%s.nodes cannot be parsed (%v)", pf, err)
				failClosed("a selector cannot be parsed")
				continue
			}
			p.hasNodes = true
			r.peers = append(r.peers, parsedPeer{nodes: sel})
		case len(peer.Networks) > 0:
			var nets []netip.Prefix
			for k, n := range peer.Networks {
				pfx, err := netip.ParsePrefix(n)
				switch {
				case err != nil:
					failClosed(fmt.Sprintf("networks[%d] %q cannot be parsed", k, n))
				case pfx.Addr().Is4():
					nets = append(nets, pfx.Masked())
				}
				// IPv6 networks match no traffic of this IPv4 cluster: nothing to render.
			}
			if len(nets) > 0 {
				r.peers = append(r.peers, parsedPeer{networks: nets})
			}
		case len(peer.DomainNames) > 0:
			p.problem(ReasonDomainNamesUnsupported, "%s.domainNames: domain name peers are not implemented by ofsdn: they match nothing", pf)
		default:
			failClosed("a peer with no field ofsdn knows (a newer API version?)")
		}
	}
	anyKnown := false
	for j, proto := range protocols {
		pf := fmt.Sprintf("%s.protocols[%d]", field, j)
		var num uint8
		var pp *cnp.ProtocolPort
		switch {
		case proto.TCP != nil:
			num, pp = openflow.IPProtoTCP, proto.TCP
		case proto.UDP != nil:
			num, pp = openflow.IPProtoUDP, proto.UDP
		case proto.SCTP != nil:
			num, pp = openflow.IPProtoSCTP, proto.SCTP
		case proto.DestinationNamedPort != "":
			anyKnown = true
			if !slices.Contains(r.named, proto.DestinationNamedPort) {
				r.named = append(r.named, proto.DestinationNamedPort)
				for _, n := range []uint8{openflow.IPProtoTCP, openflow.IPProtoUDP, openflow.IPProtoSCTP} {
					r.ports = append(r.ports, pipeline.PolicyPort{Protocol: n, Name: proto.DestinationNamedPort})
				}
			}
			continue
		default:
			if accept {
				p.problem(ReasonFailedClosed, "%s names no protocol ofsdn knows: this Accept rule's part matches nothing", pf)
			} else {
				p.problem(ReasonFailedClosed, "%s names no protocol ofsdn knows: this %s rule matches every port", pf, r.action)
				return r.everyPort()
			}
			continue
		}
		port, ok := portOf(pp)
		if !ok {
			p.problem(ReasonFailedClosed, "%s: destinationPort is neither a port number nor a valid range", pf)
			if !accept {
				return r.everyPort()
			}
			continue
		}
		anyKnown = true
		port.Protocol = num
		r.ports = append(r.ports, port)
	}
	if len(protocols) > 0 && !anyKnown {
		r.none = true
	}
	return r
}

// everyPort marks a rule that matches every port (a protocol list failing closed for Deny or Pass).
func (r parsedRule) everyPort() parsedRule {
	r.ports, r.named = nil, nil
	return r
}

// portOf reads a destination port: none (every port), a number, or a range.
func portOf(pp *cnp.ProtocolPort) (pipeline.PolicyPort, bool) {
	d := pp.DestinationPort
	switch {
	case d == nil:
		return pipeline.PolicyPort{}, true
	case d.Range != nil:
		if d.Range.Start < 1 || d.Range.End > 65535 || d.Range.Start > d.Range.End {
			return pipeline.PolicyPort{}, false
		}
		return pipeline.PolicyPort{Port: uint16(d.Range.Start), EndPort: uint16(d.Range.End)}, true
	case d.Number >= 1 && d.Number <= 65535:
		return pipeline.PolicyPort{Port: uint16(d.Number)}, true
	}
	return pipeline.PolicyPort{}, false
}
