package agent

// NetworkPolicy resolution: networking.k8s.io/v1 objects, the cluster's pods and namespaces in; for this
// node, one pipeline.PolicyState per policy that selects a local pod out (flows/pipeline/netpol.go
// renders them), and the isolation of each local pod.
//
// The semantics, as the API documents them:
//   - policyTypes: Ingress always when none are listed, Egress when listed or when egress rules exist.
//   - spec.podSelector selects pods in the policy's namespace; here only the node's attached pods
//     (nodeView.pods) that are not Succeeded or Failed. A selected pod is isolated in the policy's
//     directions; policies add up.
//   - Peers: podSelector alone (pods of the policy's namespace), namespaceSelector alone (every pod of the
//     matching namespaces), both in one peer (matching pods in matching namespaces), ipBlock {cidr,
//     except}. Empty from/to: every peer. A present but empty ingress/egress list: isolation, no allow.
//   - A pod peer is its IPv4 address; a hostNetwork pod is its node's addresses (the HostSubnet's hostIP,
//     the node's InternalIP, and its tun0 gateway, the first address of its HostSubnet: what traffic
//     of the node's host carries into the overlay); pods without an address or in a terminal phase
//     are no peer.
//   - Ports: protocol TCP unless given; a number (endPort: a range), a name (a container port's name,
//     resolved per selected pod for ingress, per peer pod for egress), or none (every port of it).
//     An egress rule naming a port towards every peer, or towards ipBlocks, lists as peers the cluster's
//     pods that have that port (inside the blocks), since the renderer resolves egress names per peer.
//
// Bad input narrows, never widens: a peer whose selector cannot be parsed matches nothing, a port that
// cannot be rendered is left out (a rule left without ports allows nothing), a selector that cannot be
// parsed in spec.podSelector selects nothing. Each such problem is kept with its policy, and the agent
// reports it once as a Warning Event on the NetworkPolicy (policyProblemReporter).
//
// Resolution is incremental: each policy keeps its last PolicyState and is computed again only once a
// change could alter it — the policy itself; a pod on which one of its selectors (its podSelector for
// pods attached here; while it selects a local pod, its peers) changes its verdict, or which one of
// them matches while the pod's addresses, named ports or phase change; a namespace on which a
// namespaceSelector of it changes its verdict; a local attachment or a node's addresses (hostNetwork
// peers) that one of its selectors' pods depends on. A policy that selects no local pod resolves no
// peers at all.

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// policyPod is what policy resolution needs of a pod anywhere in the cluster.
type policyPod struct {
	Namespace, Name string
	// Labels is the informer object's map: read only.
	Labels      map[string]string
	IPs         []netip.Addr // IPv4 status.podIPs
	Node        string
	HostNetwork bool
	Terminal    bool                 // Succeeded or Failed
	NamedPorts  []pipeline.NamedPort // its containers' named ports, sorted
}

func (p *policyPod) key() string { return k8sobj.PodKey(p.Namespace, p.Name) }

func (p *policyPod) equal(q *policyPod) bool {
	return p.Namespace == q.Namespace && p.Name == q.Name && p.Node == q.Node && p.HostNetwork == q.HostNetwork &&
		p.Terminal == q.Terminal && maps.Equal(p.Labels, q.Labels) && slices.Equal(p.IPs, q.IPs) && slices.Equal(p.NamedPorts, q.NamedPorts)
}

func (p *policyPod) hasNamed(k namedPortKey) bool {
	for _, np := range p.NamedPorts {
		if np.Name == k.name && np.Protocol == k.proto {
			return true
		}
	}
	return false
}

// policyPodOf converts a pod as the informer keeps it.
func policyPodOf(pod *k8sobj.Pod) *policyPod {
	p := &policyPod{Namespace: pod.Namespace, Name: pod.Name, Labels: pod.Labels, Node: pod.NodeName,
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
	problems     []policyProblem
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

// policyProblem is something of a policy that this node does not enforce as written.
type policyProblem struct {
	Reason  string
	Message string
}

// Event reasons of policy problems.
const (
	// ReasonPolicyNotFullyEnforced: part of a policy cannot be enforced (an unparsable selector or
	// address, a named port no pod has); that part allows nothing.
	ReasonPolicyNotFullyEnforced = "PolicyNotFullyEnforced"
	// ReasonPolicyIPBlockCoversPods: an ipBlock covers a whole cluster network, so it allows every pod
	// (and every node's tun0 address), not only addresses outside the cluster.
	ReasonPolicyIPBlockCoversPods = "PolicyIPBlockCoversClusterNetwork"
)

func (p *parsedPolicy) problem(reason, format string, args ...any) {
	p.problems = append(p.problems, policyProblem{Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// parsePolicy checks and parses a NetworkPolicy.
func parsePolicy(np *networkingv1.NetworkPolicy) *parsedPolicy {
	p := &parsedPolicy{namespace: np.Namespace, name: np.Name}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		p.problem(ReasonPolicyNotFullyEnforced, "spec.podSelector cannot be parsed (%v): the policy selects no pod", err)
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
			p.problem(ReasonPolicyNotFullyEnforced, "%s: ipBlock together with a selector is not a valid peer: it matches nothing", field)
			out.matchesNil = true
			return out
		}
		cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil {
			p.problem(ReasonPolicyNotFullyEnforced, "%s.ipBlock.cidr %q cannot be parsed (%v): the peer matches nothing", field, peer.IPBlock.CIDR, err)
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
				p.problem(ReasonPolicyNotFullyEnforced, "%s.ipBlock.except[%d] %q is not an IPv4 CIDR: the peer matches nothing", field, k, e)
				out.block, out.except, out.matchesNil = netip.Prefix{}, nil, true
				return out
			}
			out.except = append(out.except, ex.Masked())
		}
		return out
	case peer.PodSelector == nil && peer.NamespaceSelector == nil:
		p.problem(ReasonPolicyNotFullyEnforced, "%s names no podSelector, namespaceSelector or ipBlock: it matches nothing", field)
		out.matchesNil = true
		return out
	}
	out.pods = true
	if peer.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			p.problem(ReasonPolicyNotFullyEnforced, "%s.podSelector cannot be parsed (%v): the peer matches nothing", field, err)
			out.matchesNil = true
			return out
		}
		out.podSel = sel
	}
	if peer.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			p.problem(ReasonPolicyNotFullyEnforced, "%s.namespaceSelector cannot be parsed (%v): the peer matches nothing", field, err)
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
		p.problem(ReasonPolicyNotFullyEnforced, "%s: protocol %q is not TCP, UDP or SCTP: the port is left out", field, proto)
		return pipeline.PolicyPort{}, false
	}
	out := pipeline.PolicyPort{Protocol: num}
	if port.Port == nil {
		if port.EndPort != nil {
			p.problem(ReasonPolicyNotFullyEnforced, "%s: endPort without port: the port is left out", field)
			return out, false
		}
		return out, true // every port of the protocol
	}
	if port.Port.Type == intstr.String {
		if port.Port.StrVal == "" {
			p.problem(ReasonPolicyNotFullyEnforced, "%s: empty port name: the port is left out", field)
			return out, false
		}
		if _, err := strconv.Atoi(port.Port.StrVal); err == nil {
			// A container port's name always has a letter: this one can match no pod.
			p.problem(ReasonPolicyNotFullyEnforced, "%s: port %q is a number written as a string: the port is left out", field, port.Port.StrVal)
			return out, false
		}
		if port.EndPort != nil {
			p.problem(ReasonPolicyNotFullyEnforced, "%s: endPort with the named port %q: the port is left out", field, port.Port.StrVal)
			return out, false
		}
		out.Name = port.Port.StrVal
		return out, true
	}
	n := port.Port.IntVal
	if n <= 0 || n > 65535 {
		p.problem(ReasonPolicyNotFullyEnforced, "%s: port %d is out of range: the port is left out", field, n)
		return out, false
	}
	out.Port = uint16(n)
	if port.EndPort != nil {
		end := *port.EndPort
		if end < n || end > 65535 {
			p.problem(ReasonPolicyNotFullyEnforced, "%s: endPort %d is not within %d..65535: the port is left out", field, end, n)
			return out, false
		}
		if end > n {
			out.EndPort = uint16(end)
		}
	}
	return out, true
}

// policyEntry is one policy and its last resolution.
type policyEntry struct {
	parsed *parsedPolicy
	dirty  bool
	state  pipeline.PolicyState // Pods empty: it selects no local pod
	// problems: the parse's and the last resolution's.
	problems []policyProblem
}

// localAttachment is what resolution needs of a pod attached to this node's bridge.
type localAttachment struct {
	OFPort uint32
	IP     netip.Addr
}

// policyIndex resolves the cluster's NetworkPolicies for one node, incrementally (see the top of
// this file). It is plain data guarded by the nodeView's lock.
type policyIndex struct {
	nodeName    string
	pods        map[string]*policyPod            // every pod of the cluster, by namespace/name
	byNS        map[string]map[string]*policyPod // by namespace, then namespace/name
	byNamed     map[namedPortKey]map[string]*policyPod
	hostNet     map[string]map[string]*policyPod // hostNetwork pods by node
	namespaces  map[string]map[string]string     // namespace labels
	policies    map[string]*policyEntry          // by namespace/name
	local       map[string]localAttachment       // the node's attached pods
	nodeAddrs   map[string][]netip.Addr          // node → the addresses its hostNetwork pods have
	clusterNets []netip.Prefix
}

func newPolicyIndex(nodeName string) *policyIndex {
	return &policyIndex{nodeName: nodeName, pods: map[string]*policyPod{}, byNS: map[string]map[string]*policyPod{},
		byNamed: map[namedPortKey]map[string]*policyPod{}, hostNet: map[string]map[string]*policyPod{},
		namespaces: map[string]map[string]string{}, policies: map[string]*policyEntry{},
		local: map[string]localAttachment{}, nodeAddrs: map[string][]netip.Addr{}}
}

// setPod records a pod's new state (nil: deleted) and marks the policies it could affect. It reports
// whether it marked one.
func (x *policyIndex) setPod(key string, p *policyPod) bool {
	old := x.pods[key]
	if old == nil && p == nil || old != nil && p != nil && old.equal(p) {
		if p != nil {
			x.pods[key] = p // same content; keep the newest object
		}
		return false
	}
	_, local := x.local[key]
	marked := x.markChanged(old, p, local)
	if old != nil {
		x.unindex(key, old)
	}
	if p != nil {
		x.pods[key] = p
		x.index(key, p)
	}
	return marked
}

// markChanged marks the policies whose resolution a pod's change from old to p (either nil) alters:
// those where a selector's verdict on it changed, and those that select it or count it as a peer when
// what they take of it (addresses, named ports, phase) changed. It reports whether it marked one.
func (x *policyIndex) markChanged(old, p *policyPod, local bool) bool {
	taken := old == nil || p == nil || !old.sameAddressing(p)
	marked := false
	for _, e := range x.policies {
		if e.dirty {
			continue
		}
		was, exact1 := x.verdicts(e, old, local)
		is, exact2 := x.verdicts(e, p, local)
		if was != is || (was|is) != 0 && (taken || !exact1 || !exact2) {
			e.dirty, marked = true, true
		}
	}
	return marked
}

// sameAddressing: what resolution takes of a pod beyond its labels is the same.
func (p *policyPod) sameAddressing(q *policyPod) bool {
	return p.Node == q.Node && p.HostNetwork == q.HostNetwork && p.Terminal == q.Terminal && slices.Equal(p.IPs, q.IPs) &&
		slices.Equal(p.NamedPorts, q.NamedPorts)
}

// verdicts is one bit per selector of policy e that pod p (nil: none) takes part in — the selection,
// then each peer and each rule's named-port peers — so that comparing two states of a pod says
// whether any verdict changed. exact is false when the policy has more selectors than bits; then a
// non-zero value only says some selector matched. Peers count only while e selects a local pod.
func (x *policyIndex) verdicts(e *policyEntry, p *policyPod, local bool) (bits uint64, exact bool) {
	if p == nil {
		return 0, true
	}
	pp := e.parsed
	n, exact := 0, true
	set := func(v bool) {
		if v {
			if n < 64 {
				bits |= 1 << n
			} else {
				bits |= 1 << 63
				exact = false
			}
		}
		n++
	}
	set(local && p.Namespace == pp.namespace && pp.podSelector != nil && pp.podSelector.Matches(labels.Set(p.Labels)))
	if len(e.state.Pods) == 0 {
		return bits, exact // selects no local pod: its peers are not resolved
	}
	for _, rules := range [][]parsedRule{pp.ingressRules, pp.egressRules} {
		for i := range rules {
			r := &rules[i]
			for j := range r.peers {
				set(x.peerMatches(pp, &r.peers[j], p))
			}
			set(r.namedPods && slices.ContainsFunc(r.named, p.hasNamed))
		}
	}
	return bits, exact
}

func (x *policyIndex) index(key string, p *policyPod) {
	addTo(x.byNS, p.Namespace, key, p)
	for _, np := range p.NamedPorts {
		addTo(x.byNamed, namedPortKey{np.Name, np.Protocol}, key, p)
	}
	if p.HostNetwork {
		addTo(x.hostNet, p.Node, key, p)
	}
}

func (x *policyIndex) unindex(key string, p *policyPod) {
	delete(x.pods, key)
	removeFrom(x.byNS, p.Namespace, key)
	for _, np := range p.NamedPorts {
		removeFrom(x.byNamed, namedPortKey{np.Name, np.Protocol}, key)
	}
	if p.HostNetwork {
		removeFrom(x.hostNet, p.Node, key)
	}
}

func addTo[K comparable](m map[K]map[string]*policyPod, k K, key string, p *policyPod) {
	if m[k] == nil {
		m[k] = map[string]*policyPod{}
	}
	m[k][key] = p
}

func removeFrom[K comparable](m map[K]map[string]*policyPod, k K, key string) {
	delete(m[k], key)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// markAffected marks every policy whose resolution pod p takes part in (its attachment here or its
// node's addresses changed).
func (x *policyIndex) markAffected(p *policyPod, local bool) {
	for _, e := range x.policies {
		if bits, _ := x.verdicts(e, p, local); !e.dirty && bits != 0 {
			e.dirty = true
		}
	}
}

func (x *policyIndex) peerMatches(pp *parsedPolicy, peer *parsedPeer, p *policyPod) bool {
	if !peer.pods || peer.matchesNil {
		return false
	}
	if peer.nsSel == nil {
		if p.Namespace != pp.namespace {
			return false
		}
	} else if !peer.nsSel.Matches(labels.Set(x.namespaces[p.Namespace])) {
		return false
	}
	return peer.podSel == nil || peer.podSel.Matches(labels.Set(p.Labels))
}

// setNamespace records a namespace's labels (deleted: nil) and marks the policies whose
// namespaceSelectors change their verdict on it.
func (x *policyIndex) setNamespace(name string, lbls map[string]string, deleted bool) bool {
	old, had := x.namespaces[name]
	if deleted {
		delete(x.namespaces, name)
	} else {
		if had && maps.Equal(old, lbls) {
			x.namespaces[name] = lbls
			return false
		}
		x.namespaces[name] = lbls
	}
	marked := false
	for _, e := range x.policies {
		if !e.dirty && len(e.state.Pods) > 0 && nsVerdictChanges(e.parsed, old, lbls) {
			e.dirty, marked = true, true
		}
	}
	return marked
}

func nsVerdictChanges(pp *parsedPolicy, old, now map[string]string) bool {
	for _, rules := range [][]parsedRule{pp.ingressRules, pp.egressRules} {
		for _, r := range rules {
			for _, peer := range r.peers {
				if peer.pods && !peer.matchesNil && peer.nsSel != nil &&
					peer.nsSel.Matches(labels.Set(old)) != peer.nsSel.Matches(labels.Set(now)) {
					return true
				}
			}
		}
	}
	return false
}

// setPolicy records a policy (nil: deleted).
func (x *policyIndex) setPolicy(key string, np *networkingv1.NetworkPolicy) {
	if np == nil {
		delete(x.policies, key)
		return
	}
	e := x.policies[key]
	if e == nil {
		e = &policyEntry{}
		x.policies[key] = e
	}
	e.parsed, e.dirty = parsePolicy(np), true
}

// setLocal takes the node's attached pods and marks the policies a pod that came, went or changed
// address could affect.
func (x *policyIndex) setLocal(pods map[string]localPod) {
	for key, att := range x.local {
		if p, ok := pods[key]; !ok || p.OFPort != att.OFPort || p.IP != att.IP {
			delete(x.local, key)
			if pod := x.pods[key]; pod != nil {
				x.markAffected(pod, true)
			}
		}
	}
	for key, p := range pods {
		if _, ok := x.local[key]; ok || p.OFPort == 0 {
			continue
		}
		x.local[key] = localAttachment{OFPort: p.OFPort, IP: p.IP}
		if pod := x.pods[key]; pod != nil {
			x.markAffected(pod, true)
		}
	}
}

// setNodes takes every node's addresses (for its hostNetwork pods) and the cluster networks.
func (x *policyIndex) setNodes(addrs map[string][]netip.Addr, clusterNets []netip.Prefix) {
	if !slices.Equal(x.clusterNets, clusterNets) {
		x.clusterNets = slices.Clone(clusterNets)
		for _, e := range x.policies {
			e.dirty = true // ipBlock problems depend on them
		}
	}
	for node := range x.nodeAddrs {
		if _, ok := addrs[node]; !ok {
			x.nodeChanged(node)
			delete(x.nodeAddrs, node)
		}
	}
	for node, a := range addrs {
		if prev, ok := x.nodeAddrs[node]; !ok || !slices.Equal(prev, a) {
			x.nodeAddrs[node] = a
			x.nodeChanged(node)
		}
	}
}

func (x *policyIndex) nodeChanged(node string) {
	for key, p := range x.hostNet[node] {
		_, local := x.local[key]
		x.markAffected(p, local)
	}
}

// resolve resolves the dirty policies and returns those that select a local pod, sorted by
// namespace/name. The states' slices are never changed afterwards (the renderer keeps them).
func (x *policyIndex) resolve() []pipeline.PolicyState {
	keys := make([]string, 0, len(x.policies))
	for key, e := range x.policies {
		if e.dirty {
			x.compute(e)
			e.dirty = false
		}
		if len(e.state.Pods) > 0 {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	out := make([]pipeline.PolicyState, 0, len(keys))
	for _, k := range keys {
		out = append(out, x.policies[k].state)
	}
	return out
}

// problems returns the current problems of each policy that has some.
func (x *policyIndex) problems() map[string][]policyProblem {
	out := map[string][]policyProblem{}
	for key, e := range x.policies {
		if len(e.problems) > 0 {
			out[key] = e.problems
		}
	}
	return out
}

// compute resolves one policy against the index.
func (x *policyIndex) compute(e *policyEntry) {
	pp := e.parsed
	st := pipeline.PolicyState{Namespace: pp.namespace, Name: pp.name, Ingress: pp.ingress, Egress: pp.egress}
	e.problems = slices.Clone(pp.problems)
	if pp.podSelector != nil {
		for key, att := range x.local {
			p := x.pods[key]
			if p == nil || p.Namespace != pp.namespace || p.Terminal || p.HostNetwork || !pp.podSelector.Matches(labels.Set(p.Labels)) {
				continue
			}
			st.Pods = append(st.Pods, pipeline.PolicyPod{OFPort: att.OFPort, NamedPorts: onlyNamed(p.NamedPorts, pp.ingressNamed)})
		}
	}
	if len(st.Pods) == 0 {
		e.state = pipeline.PolicyState{}
		return
	}
	slices.SortFunc(st.Pods, func(a, b pipeline.PolicyPod) int { return cmp.Compare(a.OFPort, b.OFPort) })
	for i := range pp.ingressRules {
		st.IngressRules = append(st.IngressRules, x.resolveRule(e, &pp.ingressRules[i], st.Pods))
	}
	for i := range pp.egressRules {
		st.EgressRules = append(st.EgressRules, x.resolveRule(e, &pp.egressRules[i], st.Pods))
	}
	e.state = st
	slices.SortStableFunc(e.problems, func(a, b policyProblem) int { return cmp.Compare(a.Message, b.Message) })
}

// resolveRule resolves one rule's peers, and records the problems of its named ports and ipBlocks.
func (x *policyIndex) resolveRule(e *policyEntry, r *parsedRule, selected []pipeline.PolicyPod) pipeline.PolicyRule {
	pp := e.parsed
	out := pipeline.PolicyRule{AllPeers: r.allPeers && !r.none, Ports: r.ports}
	if r.none {
		out.Peers = []pipeline.PolicyPeer{}
		return out // every port it named was left out: it allows nothing
	}
	peerNamed := func(p *policyPod) []pipeline.NamedPort {
		if !r.egress {
			return nil
		}
		return onlyNamed(p.NamedPorts, r.named)
	}
	seen := map[*policyPod]bool{} // the index holds one object per pod
	addPod := func(p *policyPod) {
		if seen[p] {
			return
		}
		seen[p] = true
		named := peerNamed(p)
		for _, a := range x.addrsOf(p) {
			out.Peers = append(out.Peers, pipeline.PolicyPeer{Net: netip.PrefixFrom(a, 32), NamedPorts: named})
		}
	}
	var blocks []*parsedPeer
	for j := range r.peers {
		peer := &r.peers[j]
		switch {
		case peer.matchesNil:
		case peer.block.IsValid():
			blocks = append(blocks, peer)
			out.Peers = append(out.Peers, pipeline.PolicyPeer{Net: peer.block, Except: peer.except})
			for _, cn := range x.clusterNets {
				if peer.block.Bits() <= cn.Bits() && peer.block.Contains(cn.Addr()) &&
					!slices.ContainsFunc(peer.except, func(ex netip.Prefix) bool { return ex.Overlaps(cn) }) {
					e.problems = append(e.problems, policyProblem{Reason: ReasonPolicyIPBlockCoversPods, Message: fmt.Sprintf(
						"%s.ipBlock %s covers the whole cluster network %s: it allows every pod and every node's tun0 address, not only "+
							"addresses outside the cluster (list %s in except to mean outside addresses only)", peer.field, peer.block, cn, cn)})
				}
			}
		case peer.nsSel == nil:
			for _, p := range x.byNS[pp.namespace] {
				if peer.podSel == nil || peer.podSel.Matches(labels.Set(p.Labels)) {
					addPod(p)
				}
			}
		default:
			for ns, pods := range x.byNS {
				if !peer.nsSel.Matches(labels.Set(x.namespaces[ns])) {
					continue
				}
				for _, p := range pods {
					if peer.podSel == nil || peer.podSel.Matches(labels.Set(p.Labels)) {
						addPod(p)
					}
				}
			}
		}
	}
	if r.namedPods {
		// Egress names ports towards every peer or towards ipBlocks: the pods that have them (inside
		// the blocks) are the peers those names resolve against.
		for _, k := range r.named {
			for _, p := range x.byNamed[k] {
				if seen[p] {
					continue
				}
				if r.allPeers || slices.ContainsFunc(x.addrsOf(p), func(a netip.Addr) bool { return inBlocks(blocks, a) }) {
					addPod(p)
				}
			}
		}
	}
	if out.Peers == nil && !out.AllPeers {
		out.Peers = []pipeline.PolicyPeer{}
	}
	slices.SortFunc(out.Peers, comparePeers)
	out.Peers = slices.CompactFunc(out.Peers, func(a, b pipeline.PolicyPeer) bool { return comparePeers(a, b) == 0 })
	for _, k := range r.named {
		if r.egress {
			if !slices.ContainsFunc(out.Peers, func(p pipeline.PolicyPeer) bool { return hasNamedPort(p.NamedPorts, k) }) {
				e.problems = append(e.problems, policyProblem{Reason: ReasonPolicyNotFullyEnforced, Message: fmt.Sprintf(
					"%s: no peer pod has a container port named %q (%s): that port allows nothing", r.field, k.name, protoName(k.proto))})
			}
		} else if !slices.ContainsFunc(selected, func(p pipeline.PolicyPod) bool { return hasNamedPort(p.NamedPorts, k) }) {
			e.problems = append(e.problems, policyProblem{Reason: ReasonPolicyNotFullyEnforced, Message: fmt.Sprintf(
				"%s: no selected pod on node %s has a container port named %q (%s): that port allows nothing there", r.field, x.nodeName, k.name, protoName(k.proto))})
		}
	}
	return out
}

// addrsOf is a peer pod's addresses: its IPv4 pod IPs, its node's for a hostNetwork pod, none for a
// pod in a terminal phase.
func (x *policyIndex) addrsOf(p *policyPod) []netip.Addr {
	switch {
	case p.Terminal:
		return nil
	case p.HostNetwork:
		if a := x.nodeAddrs[p.Node]; len(a) > 0 {
			return a
		}
	case len(p.IPs) == 0:
		if att, ok := x.local[p.key()]; ok && att.IP.IsValid() {
			return []netip.Addr{att.IP} // attached here before its status says so
		}
	}
	return p.IPs
}

func inBlocks(blocks []*parsedPeer, a netip.Addr) bool {
	for _, b := range blocks {
		if b.block.Contains(a) && !slices.ContainsFunc(b.except, func(ex netip.Prefix) bool { return ex.Contains(a) }) {
			return true
		}
	}
	return false
}

func hasNamedPort(ports []pipeline.NamedPort, k namedPortKey) bool {
	return slices.ContainsFunc(ports, func(np pipeline.NamedPort) bool { return np.Name == k.name && np.Protocol == k.proto })
}

// onlyNamed keeps the named ports a policy uses (nil when none).
func onlyNamed(ports []pipeline.NamedPort, used []namedPortKey) []pipeline.NamedPort {
	var out []pipeline.NamedPort
	for _, np := range ports {
		if slices.Contains(used, namedPortKey{np.Name, np.Protocol}) {
			out = append(out, np)
		}
	}
	return out
}

func comparePeers(a, b pipeline.PolicyPeer) int {
	return cmp.Or(a.Net.Addr().Compare(b.Net.Addr()), cmp.Compare(a.Net.Bits(), b.Net.Bits()),
		slices.CompareFunc(a.Except, b.Except, func(x, y netip.Prefix) int {
			return cmp.Or(x.Addr().Compare(y.Addr()), cmp.Compare(x.Bits(), y.Bits()))
		}),
		slices.CompareFunc(a.NamedPorts, b.NamedPorts, func(x, y pipeline.NamedPort) int {
			return cmp.Or(cmp.Compare(x.Name, y.Name), cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
		}))
}

func protoName(p uint8) string { return strings.ToUpper(openflow.ProtoName(p)) }

// isolation says which local pods (by OpenFlow port) some policy isolates, and in which directions.
func isolation(states []pipeline.PolicyState) map[uint32][2]bool {
	out := map[uint32][2]bool{}
	for _, st := range states {
		for _, p := range st.Pods {
			iso := out[p.OFPort]
			iso[0] = iso[0] || st.Ingress
			iso[1] = iso[1] || st.Egress
			out[p.OFPort] = iso
		}
	}
	return out
}
