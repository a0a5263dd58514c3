package pipeline

// ClusterNetworkPolicy (policy.networking.k8s.io: the Admin and Baseline tiers) in br0.
//
// The tiers wrap the namespace's own layer in each direction, in every mode:
//
//	egress  (source node):      48 admin-egress  → 50 egress-policy     → 52 baseline-egress  → 60
//	ingress (destination node): 78 admin-ingress → 80 ingress-isolation → 82 baseline-ingress → 100
//
// "The namespace's own layer" is NetworkPolicy in networkpolicy mode (50 and 80), VNID isolation in
// multitenant mode (80: it denies a connection between two different non-global VNIDs, and decides
// nothing else), and nothing in subnet mode. A verdict ends the evaluation of its direction:
//
//   - Accept: egress → 60 (skipping 50 and 52; the destination's ingress tables still apply, as the API
//     says of an egress Accept); ingress → ct(commit) → 100, skipping 80: so an Admin ingress Accept
//     opens a path between two tenants. Its commit marks the connection (ct_mark bit 1) so that the
//     replies leave this node as global (reg0 = 0, carried as tun_id 0) and pass the client node's
//     tenant check.
//   - Deny: drop.
//   - Pass: the rest of its tier is skipped: Admin → the namespace's layer (50 / 80), Baseline → on as
//     if undecided (60 / commit → 100).
//
// The namespace's layer either decides (a NetworkPolicy allows, or its isolation drops, or tenant
// isolation drops) or leaves the packet undecided: a pod no NetworkPolicy isolates in that direction,
// or a packet isolation lets through (same VNID, or a global one). Only undecided packets reach the
// baseline tier; what it leaves undecided is allowed (Kubernetes' default). Replies and related
// packets of a committed connection skip the rules of both tiers (48 sends them straight to 60; 78
// hands them to 80, which passes them in networkpolicy mode and checks VNIDs in multitenant mode; 82
// passes them), so a Deny never cuts the replies of a connection its subject opened. Connections are
// committed in every mode: at delivery (80 or 82) and when routed to another node (60).
//
// Every (tier, priority, policy, rule) has an OpenFlow priority of its own in its table: OVS leaves
// overlapping conjunctions at one priority undefined, and the same-priority policies the API allows
// must not mix. A rule is a conjunction (selected local pods × ports × peers), O(N+M) flows, the same
// clauses as NetworkPolicy's (netpol.go); its decision flow matches its conj_id, carries a note naming
// the policy, tier, direction and rule (flowctl trace reads it) and does the action. conj_ids are the
// rule's priority and its conjunction's index within the rule, so they are unique in the table without
// an allocator. Priorities follow the order (spec.priority, policy name, rule index) in each table and
// are a function of the policies alone (assignPriorities), so a restarted agent renders the very
// flows it left: each spec.priority has a band of its own, so a policy whose priority changes moves
// only its own flows (and those of policies sharing a priority with it); a crowded band borrows from
// the next ones, and only when the table runs out is it spread again, all in the same bundle.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// AdminTier is a ClusterNetworkPolicy's spec.tier.
type AdminTier uint8

const (
	AdminTierAdmin AdminTier = iota + 1
	AdminTierBaseline
)

func (t AdminTier) String() string {
	switch t {
	case AdminTierAdmin:
		return "Admin"
	case AdminTierBaseline:
		return "Baseline"
	}
	return "tier" + strconv.Itoa(int(t))
}

// AdminAction is a rule's action.
type AdminAction uint8

const (
	AdminAccept AdminAction = iota + 1
	AdminDeny
	AdminPass
)

func (a AdminAction) String() string {
	switch a {
	case AdminAccept:
		return "Accept"
	case AdminDeny:
		return "Deny"
	case AdminPass:
		return "Pass"
	}
	return "action" + strconv.Itoa(int(a))
}

// AdminPolicyState is one ClusterNetworkPolicy as this node enforces it: the local pods it selects
// (its subject) and its rules, selectors resolved to addresses and ports (agent/adminpolicy).
type AdminPolicyState struct {
	Name     string
	Tier     AdminTier
	Priority int32
	// Pods are the local pods of its subject, with their named ports (ingress rules' named ports
	// resolve against them).
	Pods    []PolicyPod
	Ingress []AdminRule
	Egress  []AdminRule
}

// AdminRule is one rule: its name, action, and what it matches. Peers are resolved: pods' addresses
// (with their named ports, for egress), networks, nodes' addresses; AllPeers for a Deny or Pass rule
// with a peer the agent cannot understand (failing closed, as the API says). Named ports are listed
// once per protocol they may resolve on.
type AdminRule struct {
	Name   string
	Action AdminAction
	PolicyRule
}

// ctMarkAdminAccept marks a connection an Admin ingress Accept committed: its replies leave as global.
var ctMarkAdminAccept = Bits(FieldCtMark, 1, 1)

const ctMarkAdminAcceptBit uint32 = 1 << 1

// Priorities in the tier tables.
const (
	// adminReplyPriority: replies and related packets of committed connections.
	adminReplyPriority uint16 = 65000
	// Rules take priorities in [adminMinPriority, adminMaxPriority].
	adminMinPriority uint16 = 100
	adminMaxPriority uint16 = 64000
	// adminCommitPriority: 82's undecided packets are committed and delivered.
	adminCommitPriority uint16 = 10
)

// AdminPolicyOwner owns one ClusterNetworkPolicy's flows.
func AdminPolicyOwner(name string) reconcile.Owner {
	return Object{Kind: KindClusterNetworkPolicy, Name: name}.Owner()
}

// renderAdminBase renders the tier tables' plumbing (owner pipeline/base, every mode).
func renderAdminBase() []Flow {
	reply := func(state uint32) Match { return M(append(IP, CtState(state|CtTrk, 0))...) }
	replyMarked := func(state uint32) Match {
		return M(append(IP, CtState(state|CtTrk, 0), CtMark(ctMarkAdminAcceptBit, ctMarkAdminAcceptBit))...)
	}
	var out []Flow
	for _, st := range []uint32{CtRpl, CtRel} {
		out = append(out,
			F(TableAdminEgress, adminReplyPriority+1, replyMarked(st), LoadReg(RegSrcVNID, GlobalVNID), Goto{Table: TableRouting}),
			F(TableAdminEgress, adminReplyPriority, reply(st), Goto{Table: TableRouting}),
			F(TableAdminIngress, adminReplyPriority, reply(st), Goto{Table: TableIngressIsolation}),
			F(TableBaselineIngress, adminReplyPriority, reply(st), Goto{Table: TableOutput}))
	}
	return append(out, F(TableBaselineIngress, adminCommitPriority, M(IP...), commitService, Goto{Table: TableOutput}))
}

// adminTable is the table of a tier and direction.
func adminTable(t AdminTier, ingress bool) TableID {
	switch {
	case t == AdminTierAdmin && ingress:
		return TableAdminIngress
	case t == AdminTierAdmin:
		return TableAdminEgress
	case ingress:
		return TableBaselineIngress
	default:
		return TableBaselineEgress
	}
}

// adminDecision is what a rule's decision flow does.
func adminDecision(t AdminTier, ingress bool, a AdminAction) []Action {
	switch {
	case a == AdminDeny:
		return nil
	case ingress && a == AdminAccept && t == AdminTierAdmin:
		return []Action{CT{Commit: true, Table: NoTable, Zone: ZoneService,
			Exec: []Action{Load{Dst: ctMarkAdminAccept, Value: 1}}}, Goto{Table: TableOutput}}
	case ingress && a == AdminPass && t == AdminTierAdmin:
		return []Action{Goto{Table: TableIngressIsolation}}
	case ingress: // Baseline Accept or Pass: delivered, as undecided traffic is
		return []Action{commitService, Goto{Table: TableOutput}}
	case a == AdminPass && t == AdminTierAdmin:
		return []Action{Goto{Table: TableEgressPolicy}}
	default: // egress Accept, or Baseline Pass: decided; what leaves the cluster still meets egress.go's tables
		return []Action{Goto{Table: TableEgressClassify}}
	}
}

// AdminRuleNote is the note on a rule's decision flow: "cnp <name> <tier> <direction> <index> <action>
// <rule name>" (flowctl trace reads it back with ParseAdminRuleNote).
func AdminRuleNote(name string, t AdminTier, ingress bool, index int, a AdminAction, rule string) string {
	return fmt.Sprintf("cnp %s %s %s %d %s %s", name, t, direction(ingress), index, a, rule)
}

// AdminRuleRef names the rule that decided.
type AdminRuleRef struct {
	Policy, Tier, Direction, Action, Rule string
	Index                                 int
}

// ParseAdminRuleNote reads a decision flow's note; false when it is no such note.
func ParseAdminRuleNote(note string) (AdminRuleRef, bool) {
	f := strings.SplitN(strings.TrimRight(note, "\x00"), " ", 7)
	if len(f) < 6 || f[0] != "cnp" {
		return AdminRuleRef{}, false
	}
	i, err := strconv.Atoi(f[4])
	if err != nil {
		return AdminRuleRef{}, false
	}
	r := AdminRuleRef{Policy: f[1], Tier: f[2], Direction: f[3], Index: i, Action: f[5]}
	if len(f) == 7 {
		r.Rule = f[6]
	}
	return r, true
}

// String names the rule for people: `Admin ClusterNetworkPolicy open-b, ingress rule 0 "a-web": Accept`.
func (r AdminRuleRef) String() string {
	name := ""
	if r.Rule != "" {
		name = fmt.Sprintf(" %q", r.Rule)
	}
	return fmt.Sprintf("%s ClusterNetworkPolicy %s, %s rule %d%s: %s", r.Tier, r.Policy, r.Direction, r.Index, name, r.Action)
}

// AdminRuleOfActions finds a rule's decision note among a flow's actions as dumps and traces print
// them (note:63.6e.70...).
func AdminRuleOfActions(actions []string) (AdminRuleRef, bool) {
	for _, a := range actions {
		hexes, ok := strings.CutPrefix(a, "note:")
		if !ok {
			continue
		}
		var b []byte
		for _, h := range strings.Split(hexes, ".") {
			v, err := strconv.ParseUint(h, 16, 8)
			if err != nil {
				return AdminRuleRef{}, false
			}
			b = append(b, byte(v))
		}
		return ParseAdminRuleNote(string(b))
	}
	return AdminRuleRef{}, false
}

func direction(ingress bool) string {
	if ingress {
		return "ingress"
	}
	return "egress"
}

// adminRenderer renders the ClusterNetworkPolicies and remembers each policy's last render.
type adminRenderer struct {
	memos memos
}

// adminRuleKey names a rule within its table, with its policy's spec.priority.
type adminRuleKey struct {
	priority int32
	policy   string
	index    int
}

// render adds every policy's owner to out.
func (r *adminRenderer) render(s NodeState, out map[reconcile.Owner]reconcile.OwnerState, failed map[reconcile.Owner]error) {
	policies := make([]*AdminPolicyState, 0, len(s.AdminPolicies))
	seen := map[string]bool{}
	for i := range s.AdminPolicies {
		p := &s.AdminPolicies[i]
		if seen[p.Name] {
			failed[AdminPolicyOwner(p.Name)] = fmt.Errorf("ClusterNetworkPolicy %s given twice", p.Name)
			continue
		}
		seen[p.Name] = true
		if len(p.Pods) > 0 {
			policies = append(policies, p)
		}
	}
	slices.SortFunc(policies, func(a, b *AdminPolicyState) int {
		return cmp.Or(cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.Name, b.Name))
	})
	// Each table's rules in order, and their priorities.
	order := map[TableID][]adminRuleKey{}
	for _, p := range policies {
		for _, ingress := range []bool{true, false} {
			t := adminTable(p.Tier, ingress)
			for i := range adminRules(p, ingress) {
				order[t] = append(order[t], adminRuleKey{p.Priority, p.Name, i})
			}
		}
	}
	prios := make(map[TableID]map[adminRuleKey]uint16, len(order))
	tableErr := map[TableID]error{}
	for t, keys := range order {
		got, err := assignPriorities(keys, adminMinPriority, adminMaxPriority)
		if err != nil {
			tableErr[t] = err
			continue
		}
		prios[t] = got
	}
	next := make(memos, len(policies))
	for _, p := range policies {
		o := AdminPolicyOwner(p.Name)
		var w keyWriter
		w.init()
		p.writeKey(&w)
		var errs []error
		for _, ingress := range []bool{true, false} {
			t := adminTable(p.Tier, ingress)
			if err := tableErr[t]; err != nil && len(adminRules(p, ingress)) > 0 {
				errs = append(errs, err)
			}
			for i := range adminRules(p, ingress) {
				w.u64(uint64(prios[t][adminRuleKey{p.Priority, p.Name, i}]))
			}
		}
		if len(errs) > 0 {
			failed[o] = errs[0]
			continue
		}
		key := w.sum()
		if m, ok := r.memos[o]; ok && m.key == key {
			next[o] = m
			out[o] = m.out
			continue
		}
		st, err := renderAdminPolicy(p, func(ingress bool, i int) uint16 {
			return prios[adminTable(p.Tier, ingress)][adminRuleKey{p.Priority, p.Name, i}]
		})
		if err != nil {
			failed[o] = err
			continue
		}
		sampleDrops(st.Flows)
		next[o] = memo{key: key, out: st}
		out[o] = st
	}
	r.memos = next
}

func adminRules(p *AdminPolicyState, ingress bool) []AdminRule {
	if ingress {
		return p.Ingress
	}
	return p.Egress
}

// maxAdminConjunctionsPerRule bounds a rule's conjunctions (its numbered ports, and one per number its
// named ports resolve to): conj_id is the rule's priority << 12 | the conjunction's index.
const maxAdminConjunctionsPerRule = 1 << 12

// adminConjID is a rule's conjunction's ID: unique in its table, since every rule has its priority.
func adminConjID(prio uint16, index int) uint32 {
	return 1<<31 | uint32(prio)<<12 | uint32(index)
}

// renderAdminPolicy renders one policy's rules at the priorities prio gives them.
func renderAdminPolicy(p *AdminPolicyState, prio func(ingress bool, index int) uint16) (reconcile.OwnerState, error) {
	var out []Flow
	for _, ingress := range []bool{true, false} {
		dir := egressDir
		if ingress {
			dir = ingressDir
		}
		table := adminTable(p.Tier, ingress)
		for i, rule := range adminRules(p, ingress) {
			at := prio(ingress, i)
			flows, err := renderAdminRule(p, rule, dir, table, at,
				AdminRuleNote(p.Name, p.Tier, ingress, i, rule.Action, rule.Name), adminDecision(p.Tier, ingress, rule.Action))
			if err != nil {
				return reconcile.OwnerState{}, fmt.Errorf("ClusterNetworkPolicy %s %s rule %d: %w", p.Name, direction(ingress), i, err)
			}
			out = append(out, flows...)
		}
	}
	return reconcile.OwnerState{Flows: out}, nil
}

// renderAdminRule renders one rule as conjunctions at one priority: clause flows shared between its
// conjunctions where their matches are the same, and one decision flow per conjunction.
func renderAdminRule(p *AdminPolicyState, rule AdminRule, dir policyDirection, table TableID, at uint16, note string,
	decision []Action) ([]Flow, error) {
	// The rule as a one-rule NetworkPolicy of the selected pods: the same conjunctions (numbered ports
	// together, named ports per number they resolve to against the destination pods).
	one := &PolicyState{Name: p.Name, Pods: p.Pods}
	dir.rules = func(*PolicyState) []PolicyRule { return []PolicyRule{rule.PolicyRule} }
	subs := directionConjunctions(one, dir, nil)
	if len(subs) > maxAdminConjunctionsPerRule {
		return nil, fmt.Errorf("%d conjunctions, more than %d", len(subs), maxAdminConjunctionsPerRule)
	}
	var out []Flow
	clauses := map[clauseKey]int{}
	add := func(k clauseKey, match func() Match, c Conjunction) {
		if i, ok := clauses[k]; ok {
			if !slices.Contains(out[i].Actions, Action(c)) {
				out[i].Actions = append(out[i].Actions, c)
			}
			return
		}
		clauses[k] = len(out)
		out = append(out, F(table, at, match(), c))
	}
	var decisions []Flow
	for j, sub := range subs {
		if len(sub.pods) == 0 || (sub.peers != nil && len(sub.peers) == 0) {
			continue // matches nothing on this node
		}
		id := adminConjID(at, j)
		n := uint8(2)
		if sub.peers != nil {
			n = 3
		}
		for _, port := range sub.pods {
			add(clauseKey{kind: clausePod, pod: port}, func() Match { return ipMatch(dir.pod(port)) }, Conjunction{ID: id, Clause: 1, NClauses: n})
		}
		if len(sub.ports) == 0 {
			add(clauseKey{kind: clausePorts, ports: "ip"}, func() Match { return M(IP...) }, Conjunction{ID: id, Clause: 2, NClauses: n})
		}
		for _, pm := range sub.ports {
			add(clauseKey{kind: clausePorts, ports: pm.String()}, func() Match { return pm }, Conjunction{ID: id, Clause: 2, NClauses: n})
		}
		for _, peer := range sub.peers {
			add(clauseKey{kind: clausePeer, peer: peer}, func() Match { return ipMatch(dir.peer(peer)) }, Conjunction{ID: id, Clause: 3, NClauses: n})
		}
		acts := append([]Action{Note{Data: []byte(note)}}, decision...)
		decisions = append(decisions, F(table, at, M(append(IP, ConjID(id))...), acts...))
	}
	return append(out, decisions...), nil
}

// adminBandWidth is how many OpenFlow priorities each spec.priority (0-1000) has at home in a table:
// 1001 bands of 63 fit between adminMinPriority and adminMaxPriority.
const adminBandWidth = 63

// assignPriorities gives each key (in precedence order, first = highest) a priority in [lo, hi],
// strictly decreasing along keys, as a function of the keys alone: the k-th rule of spec.priority p
// is at home at hi - p·adminBandWidth - k, and takes min(home, one below the rule before it), so a
// crowded priority (more than adminBandWidth rules) borrows from the bands after it. Only when that
// runs out of priorities is every key spread evenly over the range.
func assignPriorities(keys []adminRuleKey, lo, hi uint16) (map[adminRuleKey]uint16, error) {
	n := len(keys)
	if n > int(hi-lo)+1 {
		return nil, fmt.Errorf("%d ClusterNetworkPolicy rules in one table, more than the %d priorities it has", n, int(hi-lo)+1)
	}
	out := make(map[adminRuleKey]uint16, n)
	next, rank := int(hi), 0
	for i, k := range keys {
		if i > 0 && keys[i-1].priority == k.priority {
			rank++
		} else {
			rank = 0
		}
		home := int(hi) - int(min(max(k.priority, 0), 1000))*adminBandWidth - rank
		at := min(home, next)
		if at < int(lo)+(n-1-i) { // the rest would not fit: spread everything
			clear(out)
			for j, k := range keys {
				out[k] = uint16(int(hi) - (j+1)*(int(hi)-int(lo)+2)/(n+1) + 1)
			}
			return out, nil
		}
		out[k] = uint16(at)
		next = at - 1
	}
	return out, nil
}
