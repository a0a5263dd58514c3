// Package policy resolves NetworkPolicy for one node: networking.k8s.io/v1 objects, the cluster's pods
// and namespaces in; for this node, one pipeline.PolicyState per policy that selects a local pod out (flows/pipeline/netpol.go
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
// reports it once as a Warning Event on the NetworkPolicy (ProblemReporter, watch.go).
//
// Resolution is incremental: each policy keeps its last PolicyState and is computed again only once a
// change could alter it — the policy itself; a pod on which one of its selectors (its podSelector for
// pods attached here; while it selects a local pod, its peers) changes its verdict, or which one of
// them matches while the pod's addresses, named ports or phase change; a namespace on which a
// namespaceSelector of it changes its verdict; a local attachment or a node's addresses (hostNetwork
// peers) that one of its selectors' pods depends on. A policy that selects no local pod resolves no
// peers at all.
//
// It is plain data with no lock and no I/O: the agent's flow loop owns an Index, hands it what the
// informers saw since the last sync (Changes) and the node's attachments, and resolves outside the lock
// informers and CNI requests take. The informers' side is Watch (watch.go): their handlers file
// Changes in the agent's view through View, and ProblemReporter tells each problem once.
package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Changes are what the informers saw since the last Apply: the latest state of each pod, namespace
// and NetworkPolicy that changed (a nil pod or policy, or a deleted namespace: gone).
type Changes struct {
	Pods       map[string]*Pod // by namespace/name
	Namespaces map[string]NamespaceChange
	Policies   map[string]*networkingv1.NetworkPolicy // by namespace/name
}

// NamespaceChange is a namespace's labels, or its deletion.
type NamespaceChange struct {
	Labels  map[string]string
	Deleted bool
}

// Empty says there is nothing to apply.
func (c Changes) Empty() bool {
	return len(c.Pods) == 0 && len(c.Namespaces) == 0 && len(c.Policies) == 0
}

// Apply records the changes and marks the policies they could alter; it reports whether it marked one.
func (x *Index) Apply(c Changes) bool {
	marked := false
	for key, np := range c.Policies {
		x.SetPolicy(key, np)
		marked = true
	}
	for name, ns := range c.Namespaces {
		marked = x.SetNamespace(name, ns.Labels, ns.Deleted) || marked
	}
	for key, p := range c.Pods {
		marked = x.SetPod(key, p) || marked
	}
	return marked
}

// policyEntry is one policy and its last resolution.
type policyEntry struct {
	parsed *parsedPolicy
	dirty  bool
	// dirtyRules are the rules (ingress, then egress) to resolve again while the rest of the last
	// resolution stands: a pod's verdict changed on a peer selector of theirs and on nothing else of
	// the policy. A relabel among hundreds of peers then resolves the one rule whose peers it left,
	// and the policy's other rules keep their very slices.
	dirtyRules []bool
	anyRule    bool                 // some dirtyRules entry is set
	state      pipeline.PolicyState // Pods empty: it selects no local pod
	// problems: the parse's and the last resolution's; ruleProblems: each rule's, as dirtyRules.
	problems     []Problem
	ruleProblems [][]Problem
}

// Attachment is what resolution needs of a pod attached to this node's bridge.
type Attachment struct {
	OFPort uint32
	IP     netip.Addr
}

// Index resolves the cluster's NetworkPolicies for one node, incrementally (see the top of
// this file). It is plain data guarded by the nodeView's lock.
type Index struct {
	nodeName    string
	pods        map[string]*Pod            // every pod of the cluster, by namespace/name
	byNS        map[string]map[string]*Pod // by namespace, then namespace/name
	byNamed     map[namedPortKey]map[string]*Pod
	hostNet     map[string]map[string]*Pod   // hostNetwork pods by node
	namespaces  map[string]map[string]string // namespace labels
	policies    map[string]*policyEntry      // by namespace/name
	local       map[string]Attachment        // the node's attached pods
	nodeAddrs   map[string][]netip.Addr      // node → the addresses its hostNetwork pods have
	clusterNets []netip.Prefix
	seen        map[*Pod]bool // resolveRule's scratch, kept so that a rule of 300 peers does not grow a map anew
}

func NewIndex(nodeName string) *Index {
	return &Index{nodeName: nodeName, pods: map[string]*Pod{}, byNS: map[string]map[string]*Pod{},
		byNamed: map[namedPortKey]map[string]*Pod{}, hostNet: map[string]map[string]*Pod{},
		namespaces: map[string]map[string]string{}, policies: map[string]*policyEntry{},
		local: map[string]Attachment{}, nodeAddrs: map[string][]netip.Addr{}}
}

// setPod records a pod's new state (nil: deleted) and marks the policies it could affect. It reports
// whether it marked one.
func (x *Index) SetPod(key string, p *Pod) bool {
	old := x.pods[key]
	if old == nil && p == nil || old != nil && p != nil && old.Equal(p) {
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
func (x *Index) markChanged(old, p *Pod, local bool) bool {
	taken := old == nil || p == nil || !old.sameAddressing(p)
	marked := false
	for _, e := range x.policies {
		if e.dirty {
			continue
		}
		was, exact1 := x.verdicts(e, old, local)
		is, exact2 := x.verdicts(e, p, local)
		switch {
		case was == is && ((was|is) == 0 || !taken && exact1 && exact2):
			// Nothing the policy takes of the pod changed.
		case was == is || taken || !exact1 || !exact2 || (was^is)&1 != 0:
			e.dirty, marked = true, true // its addresses, ports or phase, or the selection
		default:
			x.markRules(e, was^is) // only peer verdicts, each naming its rule
			marked = true
		}
	}
	return marked
}

// markRules marks the rules of e whose peer verdicts are set in changed (exact bits, as verdicts lays
// them out) for resolving again.
func (x *Index) markRules(e *policyEntry, changed uint64) {
	pp := e.parsed
	if len(e.dirtyRules) != len(pp.ingressRules)+len(pp.egressRules) {
		e.dirtyRules = make([]bool, len(pp.ingressRules)+len(pp.egressRules))
	}
	n, i := 1, 0 // bit 0 is the selection
	for _, rules := range [][]parsedRule{pp.ingressRules, pp.egressRules} {
		for j := range rules {
			width := len(rules[j].peers) + 1 // its peers, then its named-port peers
			if changed>>n&(1<<width-1) != 0 {
				e.dirtyRules[i], e.anyRule = true, true
			}
			n += width
			i++
		}
	}
}

// sameAddressing: what resolution takes of a pod beyond its labels is the same.
func (p *Pod) sameAddressing(q *Pod) bool {
	return p.Node == q.Node && p.HostNetwork == q.HostNetwork && p.Terminal == q.Terminal && slices.Equal(p.IPs, q.IPs) &&
		slices.Equal(p.NamedPorts, q.NamedPorts)
}

// verdicts is one bit per selector of policy e that pod p (nil: none) takes part in — the selection,
// then each peer and each rule's named-port peers — so that comparing two states of a pod says
// whether any verdict changed. exact is false when the policy has more selectors than bits; then a
// non-zero value only says some selector matched. Peers count only while e selects a local pod.
func (x *Index) verdicts(e *policyEntry, p *Pod, local bool) (bits uint64, exact bool) {
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

func (x *Index) index(key string, p *Pod) {
	addTo(x.byNS, p.Namespace, key, p)
	for _, np := range p.NamedPorts {
		addTo(x.byNamed, namedPortKey{np.Name, np.Protocol}, key, p)
	}
	if p.HostNetwork {
		addTo(x.hostNet, p.Node, key, p)
	}
}

func (x *Index) unindex(key string, p *Pod) {
	delete(x.pods, key)
	removeFrom(x.byNS, p.Namespace, key)
	for _, np := range p.NamedPorts {
		removeFrom(x.byNamed, namedPortKey{np.Name, np.Protocol}, key)
	}
	if p.HostNetwork {
		removeFrom(x.hostNet, p.Node, key)
	}
}

func addTo[K comparable](m map[K]map[string]*Pod, k K, key string, p *Pod) {
	if m[k] == nil {
		m[k] = map[string]*Pod{}
	}
	m[k][key] = p
}

func removeFrom[K comparable](m map[K]map[string]*Pod, k K, key string) {
	delete(m[k], key)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

// markAffected marks every policy whose resolution pod p takes part in (its attachment here or its
// node's addresses changed).
func (x *Index) markAffected(p *Pod, local bool) {
	for _, e := range x.policies {
		if bits, _ := x.verdicts(e, p, local); !e.dirty && bits != 0 {
			e.dirty = true
		}
	}
}

func (x *Index) peerMatches(pp *parsedPolicy, peer *parsedPeer, p *Pod) bool {
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
func (x *Index) SetNamespace(name string, lbls map[string]string, deleted bool) bool {
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
func (x *Index) SetPolicy(key string, np *networkingv1.NetworkPolicy) {
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
func (x *Index) SetLocal(pods map[string]Attachment) {
	for key, att := range x.local {
		if p, ok := pods[key]; !ok || p != att {
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
		x.local[key] = p
		if pod := x.pods[key]; pod != nil {
			x.markAffected(pod, true)
		}
	}
}

// setNodes takes every node's addresses (for its hostNetwork pods) and the cluster networks.
func (x *Index) SetNodes(addrs map[string][]netip.Addr, clusterNets []netip.Prefix) {
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

func (x *Index) nodeChanged(node string) {
	for key, p := range x.hostNet[node] {
		_, local := x.local[key]
		x.markAffected(p, local)
	}
}

// resolve resolves the dirty policies and returns those that select a local pod, sorted by
// namespace/name. The states' slices are never changed afterwards (the renderer keeps them).
func (x *Index) Resolve() []pipeline.PolicyState {
	keys := make([]string, 0, len(x.policies))
	for key, e := range x.policies {
		switch {
		case e.dirty:
			x.compute(e)
			e.dirty = false
		case e.anyRule:
			x.computeRules(e)
		}
		clear(e.dirtyRules)
		e.anyRule = false
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
func (x *Index) Problems() map[string][]Problem {
	out := map[string][]Problem{}
	for key, e := range x.policies {
		if len(e.problems) > 0 {
			out[key] = e.problems
		}
	}
	return out
}

// compute resolves one policy against the index.
func (x *Index) compute(e *policyEntry) {
	pp := e.parsed
	st := pipeline.PolicyState{Namespace: pp.namespace, Name: pp.name, Ingress: pp.ingress, Egress: pp.egress}
	e.problems = slices.Clone(pp.problems)
	e.ruleProblems = nil
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
	// The last resolution's peer counts size this one's: a change moves a peer or two.
	hint := func(rules []pipeline.PolicyRule, i int) int {
		if i < len(rules) {
			return len(rules[i].Peers) + 1
		}
		return 0
	}
	e.ruleProblems = make([][]Problem, len(pp.ingressRules)+len(pp.egressRules))
	for i := range pp.ingressRules {
		st.IngressRules = append(st.IngressRules, x.resolveRule(e, &pp.ingressRules[i], st.Pods, hint(e.state.IngressRules, i), &e.ruleProblems[i]))
	}
	for i := range pp.egressRules {
		st.EgressRules = append(st.EgressRules, x.resolveRule(e, &pp.egressRules[i], st.Pods, hint(e.state.EgressRules, i),
			&e.ruleProblems[len(pp.ingressRules)+i]))
	}
	e.state = st
	x.gatherProblems(e)
}

// computeRules resolves again the rules marked in e.dirtyRules, into new slices: the others, and the
// selection, stand as the last resolution left them.
func (x *Index) computeRules(e *policyEntry) {
	pp := e.parsed
	st := e.state
	ni := len(pp.ingressRules)
	if slices.Contains(e.dirtyRules[:ni], true) {
		st.IngressRules = slices.Clone(st.IngressRules)
	}
	if slices.Contains(e.dirtyRules[ni:], true) {
		st.EgressRules = slices.Clone(st.EgressRules)
	}
	for i, dirty := range e.dirtyRules {
		if !dirty {
			continue
		}
		e.ruleProblems[i] = nil
		if i < ni {
			st.IngressRules[i] = x.resolveRule(e, &pp.ingressRules[i], st.Pods, len(st.IngressRules[i].Peers)+1, &e.ruleProblems[i])
		} else {
			st.EgressRules[i-ni] = x.resolveRule(e, &pp.egressRules[i-ni], st.Pods, len(st.EgressRules[i-ni].Peers)+1, &e.ruleProblems[i])
		}
	}
	e.state = st
	x.gatherProblems(e)
}

// gatherProblems sets e.problems from the parse's and each rule's, in rule order, sorted by message
// (stably: a resolution of one rule lists them as a resolution of all does).
func (x *Index) gatherProblems(e *policyEntry) {
	e.problems = slices.Clone(e.parsed.problems)
	for _, ps := range e.ruleProblems {
		e.problems = append(e.problems, ps...)
	}
	slices.SortStableFunc(e.problems, func(a, b Problem) int { return cmp.Compare(a.Message, b.Message) })
}

// resolveRule resolves one rule's peers, and records the problems of its named ports and ipBlocks.
func (x *Index) resolveRule(e *policyEntry, r *parsedRule, selected []pipeline.PolicyPod, sizeHint int, problems *[]Problem) pipeline.PolicyRule {
	pp := e.parsed
	out := pipeline.PolicyRule{AllPeers: r.allPeers && !r.none, Ports: r.ports}
	if sizeHint > 0 && !out.AllPeers { // everyone's peers stay nil
		out.Peers = make([]pipeline.PolicyPeer, 0, sizeHint)
	}
	if r.none {
		out.Peers = []pipeline.PolicyPeer{}
		return out // every port it named was left out: it allows nothing
	}
	peerNamed := func(p *Pod) []pipeline.NamedPort {
		if !r.egress {
			return nil
		}
		return onlyNamed(p.NamedPorts, r.named)
	}
	if x.seen == nil {
		x.seen = map[*Pod]bool{}
	}
	seen := x.seen // the index holds one object per pod
	defer clear(seen)
	addPod := func(p *Pod) {
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
					*problems = append(*problems, Problem{Reason: ReasonIPBlockCoversClusterNetwork, Message: fmt.Sprintf(
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
	slices.SortFunc(out.Peers, ComparePeers)
	out.Peers = slices.CompactFunc(out.Peers, func(a, b pipeline.PolicyPeer) bool { return ComparePeers(a, b) == 0 })
	for _, k := range r.named {
		if r.egress {
			if !slices.ContainsFunc(out.Peers, func(p pipeline.PolicyPeer) bool { return hasNamedPort(p.NamedPorts, k) }) {
				*problems = append(*problems, Problem{Reason: ReasonNotFullyEnforced, Message: fmt.Sprintf(
					"%s: no peer pod has a container port named %q (%s): that port allows nothing", r.field, k.name, protoName(k.proto))})
			}
		} else if !slices.ContainsFunc(selected, func(p pipeline.PolicyPod) bool { return hasNamedPort(p.NamedPorts, k) }) {
			*problems = append(*problems, Problem{Reason: ReasonNotFullyEnforced, Message: fmt.Sprintf(
				"%s: no selected pod on node %s has a container port named %q (%s): that port allows nothing there", r.field, x.nodeName, k.name, protoName(k.proto))})
		}
	}
	return out
}

// addrsOf is a peer pod's addresses: its IPv4 pod IPs, its node's for a hostNetwork pod, none for a
// pod in a terminal phase.
func (x *Index) addrsOf(p *Pod) []netip.Addr {
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

// ComparePeers orders peers by address, length, excepts, named ports. It stops at the first difference
// (cmp.Or would evaluate every argument, walking both slices for every pair a sort compares).
func ComparePeers(a, b pipeline.PolicyPeer) int {
	if c := a.Net.Addr().Compare(b.Net.Addr()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Net.Bits(), b.Net.Bits()); c != 0 {
		return c
	}
	if c := slices.CompareFunc(a.Except, b.Except, func(x, y netip.Prefix) int {
		return cmp.Or(x.Addr().Compare(y.Addr()), cmp.Compare(x.Bits(), y.Bits()))
	}); c != 0 {
		return c
	}
	return slices.CompareFunc(a.NamedPorts, b.NamedPorts, func(x, y pipeline.NamedPort) int {
		return cmp.Or(cmp.Compare(x.Name, y.Name), cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
	})
}

func protoName(p uint8) string { return strings.ToUpper(openflow.ProtoName(p)) }

// isolation says which local pods (by OpenFlow port) some policy isolates, and in which directions.
func Isolation(states []pipeline.PolicyState) map[uint32][2]bool {
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
