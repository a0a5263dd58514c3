package pipeline

// NetworkPolicy (networkpolicy mode) in br0, in OpenFlow conjunctions: O(N+M) flows per rule, not N×M.
//
// Egress is enforced at the source node in table 50 (egress-policy), after service DNAT, so a client
// is checked against the endpoint it really talks to; ingress at the destination node in table 80
// (ingress-isolation), for local and tunnelled traffic alike, against the client's real address.
//
// Every policy is one owner (netpol/<ns>/<name>) and gets a priority of its own in each table it
// renders into (policyBand): all of its flows sit at that priority, so no flow is ever shared with
// another policy and cookie ownership and diffs stay exact. Within the policy, each rule is a
// conjunction (conj_id stable, see policyRuleKey; rules of one direction naming the same ports share
// one, see directionConjunctions):
//
//	clause "pods"  the selected local pods: in_port=<pod port> (egress) or reg2=<pod port> (ingress)
//	clause "ports" tcp/udp/sctp with tp_dst (a port, or an endPort range as masked prefixes), or ip
//	               when the rule allows every port
//	clause "peers" nw_dst (egress) / nw_src (ingress): each peer pod's address, and each ipBlock cut
//	               into the prefixes its excepts leave (absent when the rule allows everyone)
//
// and a flow conj_id=<id> that allows the packet — one per conjunction, so its counters show the hits
// of the rules behind it.
// Two rules of one policy that need the same clause flow share it: one flow, several conjunction()
// actions. A flow must fit an OpenFlow message (64 KiB, 16 bytes per conjunction action), so a policy
// with more than maxConjunctionsPerPriority conjunctions (thousands of rules, say) spreads them over
// further priorities of its own, each a complete set of clause flows. Named ports split a rule into one conjunction per port number the name resolves to (per
// selected pod for ingress, per peer pod for egress), still O(N+M). OVS evaluates overlapping
// conjunctions at one priority and falls through to lower priorities when none completes (checked on
// OVS 3.1), so policies are additive: any rule of any policy allows.
//
// A pod some policy isolates gets a default-deny flow of its own (owner pod/<ns>/<name>, priority
// isolationPriority, below every policy band), so drop counters say whose isolation dropped a packet.
// Above every band: replies and related traffic of a tracked connection (ct_state +rpl / +rel) always
// pass, and the node itself (kubelet probes through tun0, from the gateway address) always reaches its
// pods. Original-direction packets are checked against the current policies on every packet, not only
// the first: a policy change that no longer allows an established connection cuts it at its next
// packet, and one that still allows it leaves it alone.
//
// Connections are committed to conntrack (zone ZoneService) only once they are allowed: in table 80
// when a packet is delivered locally, and in table 60 when it is routed to another node (its egress
// checked by then), so a denied packet never creates the entry whose replies would pass.

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// PolicyState is one NetworkPolicy as this node enforces it: the local pods it selects and its rules,
// with every selector already resolved to addresses and ports (the agent does that, agent/netpol.go).
type PolicyState struct {
	Namespace, Name string
	// Ingress and Egress say the policy isolates its selected pods in that direction (its policyTypes,
	// defaulted as the API defines them).
	Ingress, Egress bool
	// Pods are the local pods the policy selects.
	Pods         []PolicyPod
	IngressRules []PolicyRule
	EgressRules  []PolicyRule
}

// PolicyPod is a selected local pod: its port on br0 and its named container ports.
type PolicyPod struct {
	OFPort     uint32
	NamedPorts []NamedPort
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string
	Protocol uint8
	Port     uint16
}

// PolicyRule is one ingress or egress rule.
type PolicyRule struct {
	// AllPeers: the rule names no peers (empty from/to), so every source or destination matches.
	AllPeers bool
	Peers    []PolicyPeer
	// Ports are the rule's ports; none means every port of every protocol.
	Ports []PolicyPort
}

// PolicyPeer is one address range a rule allows: a pod's address (/32), with its named ports for
// egress rules that name ports, or an ipBlock and its excepts.
type PolicyPeer struct {
	Net        netip.Prefix
	Except     []netip.Prefix
	NamedPorts []NamedPort
}

// PolicyPort is one port of a rule: a protocol and a port, a range (EndPort), every port of the
// protocol (Port 0), or a named port (Name, resolved against the pods).
type PolicyPort struct {
	Protocol      uint8
	Port, EndPort uint16
	Name          string
}

// Priorities in the policy tables (50 and 80).
const (
	// policyPassPriority: replies and related traffic of tracked connections.
	policyPassPriority uint16 = 65000
	// policyNodePriority: the local node reaches its pods.
	policyNodePriority uint16 = 64000
	// Policies' bands: each policy gets one priority in [policyMinPriority, policyMaxPriority).
	policyMinPriority uint16 = 1000
	policyMaxPriority uint16 = 60000
	// isolationPriority: a selected pod's default deny, below every band.
	isolationPriority uint16 = 500
)

// NetPolOwner owns one NetworkPolicy's flows.
func NetPolOwner(namespace, name string) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryNetPol, Name: namespace + "/" + name}
}

// policyDirection is what differs between ingress and egress rendering.
type policyDirection struct {
	name  string
	table TableID
	pod   func(port uint32) MatchField      // the selected pod
	peer  func(p netip.Prefix) MatchField   // the other end
	allow []Action                          // what an allowed packet does
	rules func(p *PolicyState) []PolicyRule // the policy's rules of this direction
	on    func(p *PolicyState) bool         // the policy isolates in this direction
}

var (
	commitService = CT{Commit: true, Table: NoTable, Zone: ZoneService}
	ingressDir    = policyDirection{name: "ingress", table: TableIngressIsolation,
		pod:   func(port uint32) MatchField { return Reg(RegOutPort, port) },
		peer:  IPSrcNet,
		allow: []Action{commitService, Goto{Table: TableOutput}},
		rules: func(p *PolicyState) []PolicyRule { return p.IngressRules },
		on:    func(p *PolicyState) bool { return p.Ingress }}
	egressDir = policyDirection{name: "egress", table: TableEgressPolicy,
		pod:   InPort,
		peer:  IPDstNet,
		allow: []Action{Goto{Table: TableEgressClassify}}, // decided: past the Baseline tier (52), on to egress.go's tables
		rules: func(p *PolicyState) []PolicyRule { return p.EgressRules },
		on:    func(p *PolicyState) bool { return p.Egress }}
)

// renderPolicyBase renders the policy plumbing of networkpolicy mode (owner pipeline/base): replies
// and related traffic pass both policy tables, and the node reaches its pods.
func renderPolicyBase(gateway netip.Addr) []Flow {
	var out []Flow
	for _, dir := range []struct {
		table TableID
		pass  []Action
	}{{TableEgressPolicy, []Action{Goto{Table: TableRouting}}}, {TableIngressIsolation, []Action{Goto{Table: TableOutput}}}} {
		out = append(out,
			F(dir.table, policyPassPriority, M(append(IP, CtState(CtRpl|CtTrk, 0))...), dir.pass...),
			F(dir.table, policyPassPriority, M(append(IP, CtState(CtRel|CtTrk, 0))...), dir.pass...))
	}
	return append(out, F(TableIngressIsolation, policyNodePriority, M(append(IP, InPort(PortTun0), IPSrc(gateway))...), ingressDir.allow...))
}

// isolationFlows are a pod's default-deny flows for the directions some policy isolates it in.
func isolationFlows(p PodState) []Flow {
	var out []Flow
	if p.EgressIsolated {
		out = append(out, F(TableEgressPolicy, isolationPriority, M(append(IP, InPort(p.OFPort))...)))
	}
	if p.IngressIsolated {
		out = append(out, F(TableIngressIsolation, isolationPriority, M(append(IP, Reg(RegOutPort, p.OFPort))...)))
	}
	return out
}

// maxConjunctionsPerPriority bounds the conjunctions one priority of a policy holds, and so the
// conjunction() actions of any of its clause flows: 3,000 × 16 bytes leave room for the flow's match
// within an OpenFlow message.
const maxConjunctionsPerPriority = 3000

// policyMemo is one policy's last render: the key of its input, the priorities and IDs it was given,
// its output.
type policyMemo struct {
	memo
	in       policyIdentity // what key was computed from: the same input again has the same key
	priority uint16
	extra    []uint16 // the priorities of its further chunks (see maxConjunctionsPerPriority)
	ids      []idGrant
	clauses  clauseFlows // its flows, for the next render to reuse what it would build the same
}

// policyIdentity is a policy's identity: its scalars and the backing arrays of its slices. The agent's
// policy index never changes a resolved policy's slices (it resolves a changed policy into new ones),
// as NodeState.Policies asks, so a policy of the identity its memo was keyed from has that key: the
// renderer hashes only the policies whose inputs are new, not all of them on every render.
type policyIdentity struct {
	namespace, name string
	ingress, egress bool
	pods            *PolicyPod
	npods           int
	ingressRules    *PolicyRule
	ningress        int
	egressRules     *PolicyRule
	negress         int
}

func identityOfPolicy(p *PolicyState) policyIdentity {
	id := policyIdentity{namespace: p.Namespace, name: p.Name, ingress: p.Ingress, egress: p.Egress,
		npods: len(p.Pods), ningress: len(p.IngressRules), negress: len(p.EgressRules)}
	if len(p.Pods) > 0 {
		id.pods = &p.Pods[0]
	}
	if len(p.IngressRules) > 0 {
		id.ingressRules = &p.IngressRules[0]
	}
	if len(p.EgressRules) > 0 {
		id.egressRules = &p.EgressRules[0]
	}
	return id
}

// chunkKey names a policy's further priority for the band allocator.
func chunkKey(key string, chunk int) string { return key + "#" + strconv.Itoa(chunk) }

// renderPolicies adds every policy's owner to out (networkpolicy mode). A policy that cannot be
// rendered is recorded in failed and the others render.
func (r *Renderer) renderPolicies(s NodeState, out map[reconcile.Owner]reconcile.OwnerState, failed map[reconcile.Owner]error) {
	if s.Mode != ModeNetworkPolicy {
		r.policies, r.policySpare, r.policyAlloc = nil, nil, policyAllocators{}
		return
	}
	type item struct {
		owner reconcile.Owner
		key   string
		st    *PolicyState
	}
	items := make([]item, 0, len(s.Policies))
	for i := range s.Policies {
		p := &s.Policies[i]
		o := NetPolOwner(p.Namespace, p.Name)
		items = append(items, item{o, o.String(), p})
	}
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.key, b.key) })
	// The allocators start empty every render, but keep their maps from the last: built anew and grown
	// grant by grant over every policy, they were a good part of a render's garbage.
	if r.policyAlloc.bands == nil {
		r.policyAlloc.bands, r.policyAlloc.ids = newBandAllocator(len(items)), newIDAllocator()
	}
	bands, ids := r.policyAlloc.bands, r.policyAlloc.ids
	clear(bands.used)
	clear(ids.used)
	ids.record = ids.record[:0]
	memos := r.policySpare // the map the last render replaced: nothing reads it any more
	if memos == nil {
		memos = make(map[reconcile.Owner]*policyMemo, len(items))
	}
	clear(memos)
	for _, it := range items {
		if _, dup := memos[it.owner]; dup {
			failed[it.owner] = fmt.Errorf("policy %s given twice", it.key)
			continue
		}
		prio, err := bands.get(it.key)
		if err != nil {
			failed[it.owner] = err
			continue
		}
		in := identityOfPolicy(it.st)
		m, ok := r.policies[it.owner]
		var key digest
		if ok && m.in == in {
			key = m.key
		} else {
			key = it.st.memoKey()
		}
		if ok && m.priority == prio && m.key == key && m.regrantBands(bands, it.key) && m.regrant(ids) {
			m.in = in
			out[it.owner] = m.out
			memos[it.owner] = m
			continue
		}
		ids.record = ids.record[:0]
		var extra []uint16
		st, clauses, err := renderPolicyReusing(it.st, func(chunk int) (uint16, error) {
			if chunk == 0 {
				return prio, nil
			}
			p, err := bands.get(chunkKey(it.key, chunk))
			extra = append(extra, p)
			return p, err
		}, ids, m.clausesOrNil(), &r.policyScratch)
		if err != nil {
			failed[it.owner] = err
			continue
		}
		sampleDrops(st.Flows)
		if len(st.Flows) > 0 {
			out[it.owner] = st
		}
		memos[it.owner] = &policyMemo{memo: memo{key: key, out: st}, in: in, priority: prio, extra: extra, ids: slices.Clone(ids.record), clauses: clauses}
	}
	r.policies, r.policySpare = memos, r.policies
}

// policyAllocators are the band and ID allocators of the policies' render, kept from one render to
// the next for their maps.
type policyAllocators struct {
	bands *bandAllocator
	ids   *idAllocator
}

// clausesOrNil is the memo's clause flows, nil for no memo.
func (m *policyMemo) clausesOrNil() clauseFlows {
	if m == nil {
		return nil
	}
	return m.clauses
}

// regrantBands asks the band allocator for the memo's further priorities again; false when one moved.
func (m *policyMemo) regrantBands(bands *bandAllocator, key string) bool {
	for i, p := range m.extra {
		if got := bands.peek(chunkKey(key, i+1)); got != p {
			return false
		}
	}
	for i := range m.extra {
		_, _ = bands.get(chunkKey(key, i+1))
	}
	return true
}

// regrant asks the allocator for the memo's conjunction IDs again, in order; false when one moved.
func (m *policyMemo) regrant(ids *idAllocator) bool {
	for _, g := range m.ids {
		if id, err := ids.peek(g.key); err != nil || id != g.id {
			return false
		}
	}
	ids.record = ids.record[:0] // only a fresh render reads it: keep it from growing over every policy
	for _, g := range m.ids {
		_, _ = ids.get(g.key)
	}
	return true
}

// renderPolicy renders one policy: its first maxConjunctionsPerPriority conjunctions at prio(0), the
// next ones (if any) at prio(1), and so on.
func renderPolicy(p *PolicyState, prio func(chunk int) (uint16, error), ids *idAllocator) (reconcile.OwnerState, error) {
	st, _, err := renderPolicyReusing(p, prio, ids, nil, nil)
	return st, err
}

// clauseKind says what a clause flow matches besides the conjunction's table: a selected pod, the
// ports, a peer; or that the flow is a conjunction's allow flow.
type clauseKind uint8

const (
	clausePod clauseKind = iota + 1
	clausePorts
	clausePeer
	clauseAllow
)

// clauseKey names a policy's flow by what it is built from (a pod's port, a peer prefix, a port
// match's text, a conjunction's ID), not by its match's text: a policy of thousands of CIDRs would
// spend most of its render printing them. Two conjunctions needing one match share its flow.
type clauseKey struct {
	kind  clauseKind
	table TableID
	prio  uint16
	pod   uint32 // clausePod: the port; clauseAllow: the conjunction ID
	peer  netip.Prefix
	ports string
}

// clauseFlows are a policy's flows by key, with the conjunctions each was built for: the per-
// conjunction memo. Rendering a policy again reuses every flow whose conjunctions did not change, so a
// changed peer set builds only its own clause flows, and the reused flows keep their very slices.
type clauseFlows map[clauseKey]builtClause

type builtClause struct {
	conj []Conjunction
	flow Flow
}

// clauseFlow is a flow of the policy being rendered, while its conjunctions are gathered.
type clauseFlow struct {
	key       clauseKey
	dir       *policyDirection
	portMatch Match // clausePorts: the match; the others are built from the key when needed
	conj      []Conjunction
}

// policyScratch is a render's working space, kept by the Renderer from one policy to the next: a
// change re-renders whole policies, and allocating these afresh each time was most of its garbage.
type policyScratch struct {
	peers    []netip.Prefix // the conjunctions' peers (directionConjunctions)
	clauses  map[clauseKey]*clauseFlow
	slab     []clauseFlow
	order    []*clauseFlow
	conjSlab []Conjunction
}

// renderPolicyReusing renders like renderPolicy, taking from prev (the policy's last render, nil for
// none) every flow it would build the same, and returns the flows for the next render to reuse: prev
// itself, updated (the caller's old render must not be rendered from again). scratch may be nil.
func renderPolicyReusing(p *PolicyState, prio func(chunk int) (uint16, error), ids *idAllocator, prev clauseFlows,
	scratch *policyScratch) (reconcile.OwnerState, clauseFlows, error) {
	if scratch == nil {
		scratch = &policyScratch{}
	}
	type direction struct {
		dir  *policyDirection
		subs []subRule
	}
	scratch.peers = scratch.peers[:0] // the last policy's conjunctions are gone
	var dirs []direction
	bound := 0 // at most this many clause flows: one per clause of every conjunction
	for _, dir := range []*policyDirection{&ingressDir, &egressDir} {
		if dir.on(p) {
			d := direction{dir, directionConjunctions(p, *dir, &scratch.peers)}
			for _, sub := range d.subs {
				bound += len(sub.pods) + max(len(sub.ports), 1) + len(sub.peers)
			}
			dirs = append(dirs, d)
		}
	}
	// Sized up front and kept from one render to the next: on a policy change the agent renders whole
	// policies, and growing these was half of the render's allocations.
	if scratch.clauses == nil {
		scratch.clauses = make(map[clauseKey]*clauseFlow, bound)
	}
	clear(scratch.clauses)
	clauses := scratch.clauses
	if cap(scratch.slab) < bound {
		scratch.slab, scratch.order, scratch.conjSlab = make([]clauseFlow, 0, bound), make([]*clauseFlow, 0, bound), make([]Conjunction, 0, bound)
	}
	slab, order := scratch.slab[:0], scratch.order[:0]
	defer func() {
		clear(slab[:cap(slab)]) // drop the references to this policy's matches and conjunctions
		clear(order[:cap(order)])
	}()
	var allows []clauseKey
	conjunctions, chunk := 0, -1
	var at uint16 // the priority of the conjunction being rendered
	// clause returns the clause flow of k at the current priority.
	clause := func(k clauseKey, dir *policyDirection) *clauseFlow {
		k.prio = at
		if cf := clauses[k]; cf != nil {
			return cf
		}
		slab = append(slab, clauseFlow{key: k, dir: dir}) // within bound: never moves
		cf := &slab[len(slab)-1]
		clauses[k] = cf
		order = append(order, cf)
		return cf
	}
	conjSlab := scratch.conjSlab[:0]
	join := func(cf *clauseFlow, c Conjunction) {
		switch {
		case cf.conj == nil: // most clause flows serve one conjunction: take it from the slab
			conjSlab = append(conjSlab, c)
			cf.conj = conjSlab[len(conjSlab)-1 : len(conjSlab) : len(conjSlab)] // cap 1: a second one copies out
		case !slices.Contains(cf.conj, c):
			cf.conj = append(cf.conj, c)
		}
	}
	for _, d := range dirs {
		dir := d.dir
		for _, sub := range d.subs {
			if len(sub.pods) == 0 || (sub.peers != nil && len(sub.peers) == 0) {
				continue // matches nothing on this node
			}
			id, err := ids.get(sub.key)
			if err != nil {
				return reconcile.OwnerState{}, nil, err
			}
			if c := conjunctions / maxConjunctionsPerPriority; c != chunk {
				if at, err = prio(c); err != nil {
					return reconcile.OwnerState{}, nil, err
				}
				chunk = c
			}
			conjunctions++
			n := uint8(2)
			if sub.peers != nil {
				n = 3
			}
			for _, port := range sub.pods {
				join(clause(clauseKey{kind: clausePod, table: dir.table, pod: port}, dir), Conjunction{ID: id, Clause: 1, NClauses: n})
			}
			if len(sub.ports) == 0 {
				join(clause(clauseKey{kind: clausePorts, table: dir.table, ports: "ip"}, dir), Conjunction{ID: id, Clause: 2, NClauses: n})
			}
			for _, pm := range sub.ports {
				cf := clause(clauseKey{kind: clausePorts, table: dir.table, ports: pm.String()}, dir)
				cf.portMatch = pm
				join(cf, Conjunction{ID: id, Clause: 2, NClauses: n})
			}
			for _, peer := range sub.peers {
				join(clause(clauseKey{kind: clausePeer, table: dir.table, peer: peer}, dir), Conjunction{ID: id, Clause: 3, NClauses: n})
			}
			allows = append(allows, clauseKey{kind: clauseAllow, table: dir.table, prio: at, pod: id})
		}
	}
	// The next render's flows are prev, updated in place: the entries this render keeps stay, the ones
	// it built replace theirs, and the rest go.
	next := prev
	if next == nil {
		next = make(clauseFlows, len(order)+len(allows))
	}
	out := make([]Flow, 0, len(order)+len(allows))
	for _, cf := range order {
		slices.SortFunc(cf.conj, func(a, b Conjunction) int { return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Clause, b.Clause)) })
		if b, ok := prev[cf.key]; ok && slices.Equal(b.conj, cf.conj) {
			out = append(out, b.flow)
			continue
		}
		var match Match
		switch k := cf.key; {
		case k.kind == clausePod:
			match = ipMatch(cf.dir.pod(k.pod))
		case k.kind == clausePeer:
			match = ipMatch(cf.dir.peer(k.peer))
		case k.ports == "ip":
			match = M(IP...)
		default:
			match = cf.portMatch
		}
		acts := make([]Action, len(cf.conj))
		for i, c := range cf.conj {
			acts[i] = c
		}
		f := F(cf.key.table, cf.key.prio, match, acts...)
		out = append(out, f)
		next[cf.key] = builtClause{conj: slices.Clone(cf.conj), flow: f} // conjSlab is scratch: copy out
	}
	for _, k := range allows {
		if b, ok := prev[k]; ok {
			out = append(out, b.flow)
			continue
		}
		dir := &ingressDir
		if k.table == egressDir.table {
			dir = &egressDir
		}
		b := builtClause{flow: F(k.table, k.prio, M(append(IP, ConjID(k.pod))...), dir.allow...)}
		out = append(out, b.flow)
		next[k] = b
	}
	if len(next) > len(out) { // some flows of prev are not in this render: forget them
		for _, k := range allows {
			clauses[k] = nil // mark the allow flows as this render's (the map is scratch)
		}
		for k := range next {
			if _, ok := clauses[k]; !ok {
				delete(next, k)
			}
		}
	}
	scratch.slab, scratch.order, scratch.conjSlab = slab, order, conjSlab
	return reconcile.OwnerState{Flows: out}, next, nil
}

// ipMatch is ip plus one field, built without the temporary slice append(IP, f) costs.
func ipMatch(f MatchField) Match {
	fields := [2]MatchField{IP[0], f}
	return M(fields[:]...)
}

// directionConjunctions lists the conjunctions of a policy's rules in one direction, each keyed for
// the ID allocator. The numbered-port conjunctions of rules that name the same ports become one, its
// peers the union of theirs: rules are ORed, so pods ∧ ports ∧ (A ∪ B) allows exactly what the two
// rules allowed, and a generated policy of thousands of one-CIDR rules on one port costs what one
// rule of thousands of CIDRs does (half the flows: one conj_id flow, not one per rule). Its key names
// the ports, not a rule's index, so removing one rule leaves the others' IDs alone. Named ports split
// a rule into one conjunction per number the name resolves to — against the selected pods for
// ingress, against the peer pods for egress — and stay per rule.
//
// buf, when not nil, is scratch the peers' prefixes are laid out in (a render's: the conjunctions
// live no longer than the policy's render); each rule's are clipped, so merging rules copies out.
func directionConjunctions(p *PolicyState, dir policyDirection, buf *[]netip.Prefix) []subRule {
	allPods := make([]uint32, 0, len(p.Pods))
	for _, pod := range p.Pods {
		allPods = append(allPods, pod.OFPort)
	}
	var out []subRule
	byPorts := map[string]int{} // numbered ports signature → index in out
	grown := map[int]bool{}     // merged conjunctions, whose peers need sorting again
	for i, rule := range dir.rules(p) {
		peers := peerPrefixes(rule, buf)
		if sig, ok := numberedPortsSignature(rule.Ports); ok {
			switch j, seen := byPorts[sig]; {
			case !seen:
				byPorts[sig] = len(out)
				out = append(out, subRule{key: policyRuleKey(p, dir.name, "ports:"+sig), pods: allPods, peers: peers,
					ports: numberedPortMatches(rule.Ports)})
			case out[j].peers == nil: // already everyone
			case peers == nil:
				out[j].peers = nil
			default:
				out[j].peers = append(out[j].peers, peers...)
				grown[j] = true
			}
		}
		for _, sub := range namedConjunctions(p, rule, dir.name == "egress", allPods, peers) {
			sub.key = policyRuleKey(p, dir.name, strconv.Itoa(i)+"/"+sub.key)
			out = append(out, sub)
		}
	}
	for j := range grown {
		if out[j].peers != nil {
			out[j].peers = sortedPrefixes(out[j].peers)
		}
	}
	return out
}

// numberedPortsSignature names a rule's numbered ports as a set ("any": the rule names no ports, so
// every port); false when the rule has no numbered port br0 can match (only named ports, or only
// protocols without ports), and so no numbered conjunction.
func numberedPortsSignature(ports []PolicyPort) (string, bool) {
	if len(ports) == 0 {
		return "any", true
	}
	var parts []string
	for _, pp := range ports {
		if _, _, ok := l4Fields(pp.Protocol); pp.Name != "" || !ok {
			continue
		}
		part := ProtoName(pp.Protocol) + "/*"
		if pp.Port != 0 {
			part = ProtoName(pp.Protocol) + "/" + strconv.Itoa(int(pp.Port)) + "-" + strconv.Itoa(int(max(pp.EndPort, pp.Port)))
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return "", false
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), ","), true
}

// numberedPortMatches are the port matches of a rule's numbered ports (none: every port).
func numberedPortMatches(ports []PolicyPort) []Match {
	var out []Match
	for _, pp := range ports {
		if pp.Name == "" {
			out = append(out, portMatches(pp)...)
		}
	}
	return out
}

// subRule is one conjunction: the pods, peers (nil: everyone) and port matches (none: every port) it
// combines, and its key for the ID allocator.
type subRule struct {
	key   string
	pods  []uint32
	peers []netip.Prefix
	ports []Match
}

// namedConjunctions splits a rule's named ports into conjunctions, one per number a name resolves to:
// against the selected pods for ingress (peers: the rule's), against the peer pods for egress (pods:
// every selected pod).
func namedConjunctions(p *PolicyState, rule PolicyRule, egress bool, allPods []uint32, allPeers []netip.Prefix) []subRule {
	var out []subRule
	for _, np := range rule.Ports {
		if np.Name == "" {
			continue
		}
		groups := map[uint16]*subRule{}
		var numbers []uint16
		group := func(num uint16) *subRule {
			g := groups[num]
			if g == nil {
				g = &subRule{key: fmt.Sprintf("named:%s/%s=%d", np.Name, ProtoName(np.Protocol), num),
					ports: portMatches(PolicyPort{Protocol: np.Protocol, Port: num})}
				groups[num] = g
				numbers = append(numbers, num)
			}
			return g
		}
		if egress {
			for _, peer := range rule.Peers {
				if num, ok := resolveNamed(peer.NamedPorts, np); ok {
					g := group(num)
					g.pods = allPods
					g.peers = append(g.peers, peer.Net)
				}
			}
		} else {
			for _, pod := range p.Pods {
				if num, ok := resolveNamed(pod.NamedPorts, np); ok {
					g := group(num)
					g.pods = append(g.pods, pod.OFPort)
					g.peers = allPeers
				}
			}
		}
		slices.Sort(numbers)
		for _, num := range numbers {
			out = append(out, *groups[num])
		}
	}
	return out
}

// resolveNamed finds a named port among a pod's container ports.
func resolveNamed(ports []NamedPort, want PolicyPort) (uint16, bool) {
	for _, np := range ports {
		if np.Name == want.Name && np.Protocol == want.Protocol {
			return np.Port, true
		}
	}
	return 0, false
}

// peerPrefixes lists a rule's peers as prefixes, ipBlock excepts cut out; nil when every peer matches
// (no peers named, or an ipBlock 0.0.0.0/0 without excepts: every address the IPv4 tables see).
// They are appended to *buf when buf is not nil (clipped: appending to them copies), else to a new
// slice.
func peerPrefixes(rule PolicyRule, buf *[]netip.Prefix) []netip.Prefix {
	if rule.AllPeers {
		return nil
	}
	var all []netip.Prefix
	if buf == nil {
		all = make([]netip.Prefix, 0, len(rule.Peers))
	} else {
		all = slices.Grow(*buf, len(rule.Peers))
	}
	start := len(all)
	for _, peer := range rule.Peers {
		if len(peer.Except) == 0 && peer.Net.IsValid() { // a pod's address, most of the time
			all = append(all, peer.Net.Masked())
			continue
		}
		all = append(all, cidrMinus(peer.Net.Masked(), peer.Except)...)
	}
	out := all[start:]
	if slices.ContainsFunc(out, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return nil
	}
	out = sortedPrefixes(out)
	if buf != nil {
		*buf = all[:start+len(out)]
	}
	if len(out) == 0 {
		return []netip.Prefix{} // no peer at all: allows nothing (nil would be everyone)
	}
	return out[:len(out):len(out)]
}

// sortedPrefixes sorts prefixes by address, then length, and drops repeats (in place; never nil).
func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return slices.Compact(ps)
}

// cidrMinus returns the prefixes that cover p but none of except: each except that falls inside p
// splits it along the except's path into at most (except bits - p bits) prefixes.
func cidrMinus(p netip.Prefix, except []netip.Prefix) []netip.Prefix {
	if !p.IsValid() {
		return nil
	}
	rest := []netip.Prefix{p}
	for _, e := range except {
		e = e.Masked()
		var next []netip.Prefix
		for _, r := range rest {
			switch {
			case !r.Overlaps(e):
				next = append(next, r)
			case e.Bits() <= r.Bits():
				// e covers r entirely: nothing of r is left.
			default:
				next = append(next, splitAround(r, e)...)
			}
		}
		rest = next
	}
	return rest
}

// splitAround returns r without e (e strictly inside r): at each bit from r's length to e's, the half
// that does not hold e.
func splitAround(r, e netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for bits := r.Bits() + 1; bits <= e.Bits(); bits++ {
		onPath := netip.PrefixFrom(e.Addr(), bits).Masked()
		sibling := netip.PrefixFrom(flipBit(onPath.Addr(), bits-1), bits).Masked()
		out = append(out, sibling)
	}
	return out
}

// flipBit flips bit i (0 = most significant) of an address.
func flipBit(a netip.Addr, i int) netip.Addr {
	b := a.AsSlice()
	b[i/8] ^= 0x80 >> (i % 8)
	out, _ := netip.AddrFromSlice(b)
	return out
}

// portMatches are the matches of one numbered port: the protocol alone (every port), one port, or an
// endPort range as the fewest masked tp_dst prefixes that cover it exactly.
func portMatches(p PolicyPort) []Match {
	dst, _, ok := l4Fields(p.Protocol)
	if !ok {
		return nil
	}
	proto := Proto(p.Protocol)
	if p.Port == 0 {
		return []Match{M(proto...)}
	}
	end := max(p.EndPort, p.Port)
	var out []Match
	for _, r := range portPrefixes(p.Port, end) {
		if r.mask == 0xffff {
			out = append(out, M(append(proto, Exact(dst, uint64(r.value)))...))
		} else {
			out = append(out, M(append(proto, Masked(dst, uint64(r.value), uint64(r.mask)))...))
		}
	}
	return out
}

type portPrefix struct{ value, mask uint16 }

// portPrefixes covers lo..hi with aligned power-of-two blocks (value/mask), largest first.
func portPrefixes(lo, hi uint16) []portPrefix {
	var out []portPrefix
	for v := uint32(lo); v <= uint32(hi); {
		size := uint32(1)
		for v%(size*2) == 0 && v+size*2-1 <= uint32(hi) && size < 1<<16 {
			size *= 2
		}
		out = append(out, portPrefix{value: uint16(v), mask: uint16(^(size - 1))})
		v += size
	}
	return out
}

// policyRuleKey names one conjunction for the ID allocator: stable across renders and restarts.
func policyRuleKey(p *PolicyState, dir, conj string) string {
	return "netpol/" + p.Namespace + "/" + p.Name + "/" + dir + "/" + conj
}

// bandAllocator gives each policy a priority of its own, derived from its key (so it survives
// restarts and other policies coming and going); a collision moves the later key (in sorted order) to
// the next free priority.
type bandAllocator struct{ used map[uint16]bool }

func newBandAllocator(n int) *bandAllocator { return &bandAllocator{used: make(map[uint16]bool, n)} }

func (b *bandAllocator) get(key string) (uint16, error) {
	p := b.peek(key)
	if p == 0 {
		return 0, fmt.Errorf("no free policy priority for %s: more than %d policies", key, policyMaxPriority-policyMinPriority)
	}
	b.used[p] = true
	return p, nil
}

// peek returns the priority get would grant key (0: none is free), granting nothing.
func (b *bandAllocator) peek(key string) uint16 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	span := uint32(policyMaxPriority - policyMinPriority)
	start := h.Sum32() % span
	for i := uint32(0); i < span; i++ {
		p := uint16((start+i)%span) + policyMinPriority
		if !b.used[p] {
			return p
		}
	}
	return 0
}
