// Package adminpolicy resolves ClusterNetworkPolicy (policy.networking.k8s.io, the Admin and Baseline
// tiers) for one node: the policies, the cluster's pods, namespaces and nodes in; for this node, one
// pipeline.AdminPolicyState per policy whose subject selects a local pod out (flows/pipeline/
// adminpolicy.go renders them). It runs in every plugin mode.
//
// The semantics, as the API documents them:
//   - spec.subject selects pods by namespaces, or by namespace and pod labels (pods); here only the
//     node's attached pods that are not hostNetwork, Succeeded or Failed.
//   - Peers: namespaces and pods peers are pods' IPv4 addresses (never hostNetwork pods, never pods in a
//     terminal phase); networks are CIDRs (IPv6 ones match nothing in this IPv4 cluster); nodes are the
//     IPv4 addresses in the selected nodes' status.addresses; domainNames are not implemented and
//     match nothing (a Problem says so).
//   - Protocols: tcp/udp/sctp with no port (every port), a number or a range; destinationNamedPort is
//     resolved against the destination pod (the subject's pods for ingress, the peer pods for egress)
//     on whichever protocol its container port has. No protocols: every packet.
//   - Fail closed, as the API asks of a peer it cannot understand (every field empty: a newer API
//     version; a selector or CIDR that cannot be parsed): for an Accept rule that part matches nothing;
//     a Deny or Pass rule matches every peer (and, for a protocol, every port). An unknown action is
//     Deny; an unknown tier is Admin.
//
// Resolution is incremental, like agent/policy's: a policy is computed again only once a change could
// alter it — the policy itself; a pod its subject (while attached here) or, while it selects a local
// pod, one of its peers matches before or after the change; a namespace whose labels change a
// selector's verdict; a node's labels or addresses (policies with nodes peers); the local attachments.
// It is plain data with no lock and no I/O, owned by the agent's flow loop. The informers' side is
// Watch (watch.go), filing Changes in the agent's view through View; Reporter (report.go) turns each
// sync's problems into Events on the policies.
package adminpolicy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/policy"
	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"k8s.io/apimachinery/pkg/labels"
)

// Node is what resolution needs of a node: its labels and its IPv4 status addresses.
type Node struct {
	Labels map[string]string
	Addrs  []netip.Addr
}

// Equal says two states of a node are the same to resolution.
func (n *Node) Equal(m *Node) bool {
	return n == m || n != nil && m != nil && maps.Equal(n.Labels, m.Labels) && slices.Equal(n.Addrs, m.Addrs)
}

// Changes are what the informers saw since the last Apply (nil pod, node or policy, or a deleted
// namespace: gone).
type Changes struct {
	Pods       map[string]*policy.Pod // by namespace/name
	Namespaces map[string]policy.NamespaceChange
	Nodes      map[string]*Node
	Policies   map[string]*cnp.ClusterNetworkPolicy // by name
}

// NewChanges returns empty changes, ready to record into.
func NewChanges() Changes {
	return Changes{Pods: map[string]*policy.Pod{}, Namespaces: map[string]policy.NamespaceChange{},
		Nodes: map[string]*Node{}, Policies: map[string]*cnp.ClusterNetworkPolicy{}}
}

// Empty says there is nothing to apply.
func (c Changes) Empty() bool {
	return len(c.Pods) == 0 && len(c.Namespaces) == 0 && len(c.Nodes) == 0 && len(c.Policies) == 0
}

type entry struct {
	parsed   *parsedPolicy
	dirty    bool
	state    pipeline.AdminPolicyState // Pods empty: it selects no local pod
	problems []Problem
}

// Index resolves the cluster's ClusterNetworkPolicies for one node, incrementally.
type Index struct {
	nodeName   string
	pods       map[string]*policy.Pod
	byNS       map[string]map[string]*policy.Pod
	namespaces map[string]map[string]string
	nodes      map[string]*Node
	policies   map[string]*entry
	local      map[string]policy.Attachment
}

// NewIndex returns an empty index for a node.
func NewIndex(nodeName string) *Index {
	return &Index{nodeName: nodeName, pods: map[string]*policy.Pod{}, byNS: map[string]map[string]*policy.Pod{},
		namespaces: map[string]map[string]string{}, nodes: map[string]*Node{}, policies: map[string]*entry{},
		local: map[string]policy.Attachment{}}
}

// Apply records the changes and marks the policies they could alter; it reports whether it marked one.
func (x *Index) Apply(c Changes) bool {
	marked := false
	for name, p := range c.Policies {
		x.SetPolicy(name, p)
		marked = true
	}
	for name, ns := range c.Namespaces {
		marked = x.SetNamespace(name, ns.Labels, ns.Deleted) || marked
	}
	for name, n := range c.Nodes {
		marked = x.SetNode(name, n) || marked
	}
	for key, p := range c.Pods {
		marked = x.SetPod(key, p) || marked
	}
	return marked
}

// SetPolicy records a policy (nil: deleted).
func (x *Index) SetPolicy(name string, c *cnp.ClusterNetworkPolicy) {
	if c == nil {
		delete(x.policies, name)
		return
	}
	e := x.policies[name]
	if e == nil {
		e = &entry{}
		x.policies[name] = e
	}
	e.parsed, e.dirty = parsePolicy(c), true
}

// SetPod records a pod's state (nil: deleted) and marks the policies it takes part in, before or after.
func (x *Index) SetPod(key string, p *policy.Pod) bool {
	old := x.pods[key]
	if old == nil && p == nil || old != nil && p != nil && old.Equal(p) {
		if p != nil {
			x.pods[key] = p
		}
		return false
	}
	_, local := x.local[key]
	marked := false
	for _, e := range x.policies {
		if !e.dirty && (x.touches(e, old, local) || x.touches(e, p, local)) {
			e.dirty, marked = true, true
		}
	}
	if old != nil {
		delete(x.pods, key)
		delete(x.byNS[old.Namespace], key)
		if len(x.byNS[old.Namespace]) == 0 {
			delete(x.byNS, old.Namespace)
		}
	}
	if p != nil {
		x.pods[key] = p
		if x.byNS[p.Namespace] == nil {
			x.byNS[p.Namespace] = map[string]*policy.Pod{}
		}
		x.byNS[p.Namespace][key] = p
	}
	return marked
}

// touches says whether pod p (nil: none) takes part in policy e's resolution: its subject, when
// attached here, or, while the policy selects a local pod, one of its pod peers.
func (x *Index) touches(e *entry, p *policy.Pod, local bool) bool {
	if p == nil {
		return false
	}
	pp := e.parsed
	if local && x.pairMatches(pp.subject, p) {
		return true
	}
	if len(e.state.Pods) == 0 {
		return false
	}
	for _, rules := range [][]parsedRule{pp.ingress, pp.egress} {
		for i := range rules {
			for j := range rules[i].peers {
				if x.pairMatches(rules[i].peers[j].pods, p) {
					return true
				}
			}
		}
	}
	return false
}

func (x *Index) pairMatches(s selectorPair, p *policy.Pod) bool {
	if !s.valid || !s.ns.Matches(labels.Set(x.namespaces[p.Namespace])) {
		return false
	}
	return s.pod == nil || s.pod.Matches(labels.Set(p.Labels))
}

// SetNamespace records a namespace's labels (deleted: gone) and marks the policies a selector of which
// changes its verdict on it.
func (x *Index) SetNamespace(name string, lbls map[string]string, deleted bool) bool {
	old, had := x.namespaces[name]
	if deleted {
		delete(x.namespaces, name)
		lbls = nil
	} else {
		x.namespaces[name] = lbls
		if had && maps.Equal(old, lbls) {
			return false
		}
	}
	changes := func(s selectorPair) bool {
		return s.valid && s.ns.Matches(labels.Set(old)) != s.ns.Matches(labels.Set(lbls))
	}
	marked := false
	for _, e := range x.policies {
		if e.dirty {
			continue
		}
		hit := changes(e.parsed.subject)
		if len(e.state.Pods) > 0 {
			for _, rules := range [][]parsedRule{e.parsed.ingress, e.parsed.egress} {
				for i := range rules {
					for j := range rules[i].peers {
						hit = hit || changes(rules[i].peers[j].pods)
					}
				}
			}
		}
		if hit {
			e.dirty, marked = true, true
		}
	}
	return marked
}

// SetNode records a node (nil: deleted) and marks the policies with nodes peers that select a local pod.
func (x *Index) SetNode(name string, n *Node) bool {
	if old := x.nodes[name]; old.Equal(n) {
		return false
	}
	if n == nil {
		delete(x.nodes, name)
	} else {
		x.nodes[name] = n
	}
	marked := false
	for _, e := range x.policies {
		if !e.dirty && e.parsed.hasNodes && len(e.state.Pods) > 0 {
			e.dirty, marked = true, true
		}
	}
	return marked
}

// SetLocal takes the node's attached pods and marks the policies a pod that came, went or changed
// port or address takes part in.
func (x *Index) SetLocal(pods map[string]policy.Attachment) {
	mark := func(key string) {
		p := x.pods[key]
		for _, e := range x.policies {
			if !e.dirty && (x.touches(e, p, true) || x.touches(e, p, false)) {
				e.dirty = true
			}
		}
	}
	for key, att := range x.local {
		if now, ok := pods[key]; !ok || now != att {
			delete(x.local, key)
			mark(key)
		}
	}
	for key, att := range pods {
		if _, ok := x.local[key]; ok || att.OFPort == 0 {
			continue
		}
		x.local[key] = att
		mark(key)
	}
}

// Resolve resolves the marked policies and returns those that select a local pod, by name. The
// states' slices are never changed afterwards (the renderer keeps them).
func (x *Index) Resolve() []pipeline.AdminPolicyState {
	names := make([]string, 0, len(x.policies))
	for name, e := range x.policies {
		if e.dirty {
			x.compute(e)
			e.dirty = false
		}
		if len(e.state.Pods) > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]pipeline.AdminPolicyState, 0, len(names))
	for _, n := range names {
		out = append(out, x.policies[n].state)
	}
	return out
}

// Problems returns every known policy's current problems (nil for none), by name: all policies, so a
// reporter sees the ones whose problems went away.
func (x *Index) Problems() map[string][]Problem {
	out := make(map[string][]Problem, len(x.policies))
	for name, e := range x.policies {
		out[name] = e.problems
	}
	return out
}

// Selects says whether the policy selects a pod attached here (its problems matter on this node).
func (x *Index) Selects(name string) bool {
	e := x.policies[name]
	return e != nil && len(e.state.Pods) > 0
}

func (x *Index) compute(e *entry) {
	pp := e.parsed
	st := pipeline.AdminPolicyState{Name: pp.name, Tier: pp.tier, Priority: pp.priority}
	e.problems = slices.Clone(pp.problems)
	for key, att := range x.local {
		p := x.pods[key]
		if p == nil || p.Terminal || p.HostNetwork || !x.pairMatches(pp.subject, p) {
			continue
		}
		st.Pods = append(st.Pods, pipeline.PolicyPod{OFPort: att.OFPort, NamedPorts: onlyNamed(p.NamedPorts, pp.ingressNamed)})
	}
	if len(st.Pods) == 0 {
		e.state = pipeline.AdminPolicyState{}
		return
	}
	slices.SortFunc(st.Pods, func(a, b pipeline.PolicyPod) int { return cmp.Compare(a.OFPort, b.OFPort) })
	for i := range pp.ingress {
		st.Ingress = append(st.Ingress, x.resolveRule(e, fmt.Sprintf("spec.ingress[%d]", i), &pp.ingress[i], false, st.Pods))
	}
	for i := range pp.egress {
		st.Egress = append(st.Egress, x.resolveRule(e, fmt.Sprintf("spec.egress[%d]", i), &pp.egress[i], true, st.Pods))
	}
	e.state = st
}

// resolveRule resolves one rule's peers.
func (x *Index) resolveRule(e *entry, field string, r *parsedRule, egress bool, subject []pipeline.PolicyPod) pipeline.AdminRule {
	out := pipeline.AdminRule{Name: r.name, Action: r.action, PolicyRule: pipeline.PolicyRule{Ports: r.ports}}
	switch {
	case r.none:
		out.Peers = []pipeline.PolicyPeer{} // every protocol it listed was left out: nothing
		return out
	case r.all:
		out.AllPeers = true
		return out
	}
	seen := map[*policy.Pod]bool{}
	for _, peer := range r.peers {
		switch {
		case peer.pods.valid:
			for ns, pods := range x.byNS {
				if !peer.pods.ns.Matches(labels.Set(x.namespaces[ns])) {
					continue
				}
				for _, p := range pods {
					if seen[p] || p.HostNetwork || p.Terminal || peer.pods.pod != nil && !peer.pods.pod.Matches(labels.Set(p.Labels)) {
						continue
					}
					seen[p] = true
					var named []pipeline.NamedPort
					if egress {
						named = onlyNamed(p.NamedPorts, r.named)
					}
					for _, a := range x.addrsOf(p) {
						out.Peers = append(out.Peers, pipeline.PolicyPeer{Net: netip.PrefixFrom(a, 32), NamedPorts: named})
					}
				}
			}
		case peer.nodes != nil:
			for _, n := range x.nodes {
				if peer.nodes.Matches(labels.Set(n.Labels)) {
					for _, a := range n.Addrs {
						out.Peers = append(out.Peers, pipeline.PolicyPeer{Net: netip.PrefixFrom(a, 32)})
					}
				}
			}
		default:
			for _, n := range peer.networks {
				out.Peers = append(out.Peers, pipeline.PolicyPeer{Net: n})
			}
		}
	}
	if out.Peers == nil {
		out.Peers = []pipeline.PolicyPeer{}
	}
	slices.SortFunc(out.Peers, policy.ComparePeers)
	out.Peers = slices.CompactFunc(out.Peers, func(a, b pipeline.PolicyPeer) bool { return policy.ComparePeers(a, b) == 0 })
	for _, name := range r.named {
		has := func(ports []pipeline.NamedPort) bool {
			return slices.ContainsFunc(ports, func(np pipeline.NamedPort) bool { return np.Name == name })
		}
		if egress && !slices.ContainsFunc(out.Peers, func(p pipeline.PolicyPeer) bool { return has(p.NamedPorts) }) {
			e.problems = append(e.problems, Problem{Reason: ReasonNamedPortUnresolved, Message: fmt.Sprintf(
				"%s: no peer pod has a container port named %q: that protocol matches nothing", field, name)})
		}
		if !egress && !slices.ContainsFunc(subject, func(p pipeline.PolicyPod) bool { return has(p.NamedPorts) }) {
			e.problems = append(e.problems, Problem{Reason: ReasonNamedPortUnresolved, Message: fmt.Sprintf(
				"%s: no subject pod on node %s has a container port named %q: that protocol matches nothing there", field, x.nodeName, name)})
		}
	}
	return out
}

// addrsOf is a pod peer's addresses: its IPv4 pod IPs, or its attachment's address before its status
// says so.
func (x *Index) addrsOf(p *policy.Pod) []netip.Addr {
	if len(p.IPs) == 0 {
		if att, ok := x.local[k8sobj.PodKey(p.Namespace, p.Name)]; ok && att.IP.IsValid() {
			return []netip.Addr{att.IP}
		}
	}
	return p.IPs
}

// onlyNamed keeps the named ports whose names are used (nil when none).
func onlyNamed(ports []pipeline.NamedPort, used []string) []pipeline.NamedPort {
	var out []pipeline.NamedPort
	for _, np := range ports {
		if slices.Contains(used, np.Name) {
			out = append(out, np)
		}
	}
	return out
}
