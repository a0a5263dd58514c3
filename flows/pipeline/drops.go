package pipeline

// Drop attribution: every flow that drops (or rejects) a packet for a reason an administrator cares
// about sends the packet's first bytes to the agent, which names the cause and the deciding object
// (agent/drops). The registry below says which flows those are, by table and priority; every owner's
// render ends in sampleDrops (reused owners keep theirs), so a flow added later (a ClusterNetworkPolicy
// table, an egress firewall) is attributed by adding its line here, nowhere else.
//
// How a drop is sampled: the flow gets one more action, controller(max_len=DropSampleLen,
// meter_id=M) (Open vSwitch's NXAST_CONTROLLER2), first in its list. The meter M is the cause's own
// (DropMeters), so a flood of one cause cannot hide the samples of another, and it limits only the
// packet-ins: a reject (a service without endpoints) still goes to the host's reject ports whatever
// the rate, and a drop is dropped whether sampled or not. The packet-in carries the flow's cookie
// (its owner: the pod whose isolation, the policy, the service), its table, the registers (reg0/reg1:
// the source and destination VNIDs; reg2: the output port) and the packet's headers.
//
// The rate: DropSampleRate packets/s per cause per node, bursts of DropSampleBurst. A packet-in costs
// ovs-vswitchd an upcall and the agent a decode and a ring insert, tens of microseconds together, so
// 100/s per cause keeps a node's worst case (every cause flooded at once) near 1,200 packet-ins/s,
// a few percent of one core, while a person or a test looking at drops sees every one of an
// ordinary trickle (a blocked connection retries a few times per second) and, in a flood, 100 named
// samples a second of it: enough to say what is being dropped and by what. (Twelve causes: about
// 1,200/s in the worst case.) The per-cause counters
// of the agent count samples; the drop flows' own packet counters (flowctl dump) count every packet.

import (
	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// DropCause names why a packet was dropped, in the agent's metrics and records.
type DropCause string

const (
	CauseTenantIsolation    DropCause = "tenant-isolation"       // multitenant: the VNIDs differ and neither is global
	CausePolicyIngress      DropCause = "policy-ingress"         // NetworkPolicy: the destination pod is isolated for ingress
	CausePolicyEgress       DropCause = "policy-egress"          // NetworkPolicy: the source pod is isolated for egress
	CauseAntiSpoofing       DropCause = "anti-spoofing"          // a pod's port sent what is not its MAC/IP (or an interface that carries no traffic)
	CauseTunnelGuard        DropCause = "tunnel-guard"           // a pod's UDP to a tunnel port outside the pod network
	CauseTunnelSource       DropCause = "tunnel-source"          // VXLAN from an unknown node, or an inner source outside the sender's subnet
	CauseUplinkSource       DropCause = "uplink-source"          // encapsulation none: an unknown sender on the uplink
	CauseNetworkVNI         DropCause = "network-vni"            // VXLAN with a Network's VNI from a node without that Network
	CauseNetworkIsolation   DropCause = "network-isolation"      // a Network's pod towards what its Network does not reach
	CauseServiceNoEndpoints DropCause = "service-no-endpoints"   // a service port without a ready (or local) endpoint
	CauseEgressFirewall     DropCause = "egress-firewall"        // a namespace's EgressNetworkPolicy denies the destination
	CauseAdminPolicy        DropCause = "cluster-network-policy" // a ClusterNetworkPolicy's Deny rule (Admin or Baseline tier)
)

// DropCauseInfo describes a cause: its meter and what the datapath does with the packet.
type DropCauseInfo struct {
	Cause DropCause
	// Meter is the OpenFlow meter that bounds the cause's samples.
	Meter uint32
	// Rejected: the packet is refused (the client told), not dropped silently.
	Rejected bool
	// Words say what happened, for records without a more precise object.
	Words string
}

// DropCauses is the list of causes; a cause's meter is its place in it (from 1).
var DropCauses = []DropCauseInfo{
	{Cause: CauseTenantIsolation, Meter: 1, Words: "tenant isolation"},
	{Cause: CausePolicyIngress, Meter: 2, Words: "NetworkPolicy ingress isolation"},
	{Cause: CausePolicyEgress, Meter: 3, Words: "NetworkPolicy egress isolation"},
	{Cause: CauseAntiSpoofing, Meter: 4, Words: "anti-spoofing"},
	{Cause: CauseTunnelGuard, Meter: 5, Words: "tunnel guard: UDP to a tunnel port"},
	{Cause: CauseTunnelSource, Meter: 6, Words: "tunnel ingress: unknown node or forged inner source"},
	{Cause: CauseUplinkSource, Meter: 7, Words: "uplink ingress: unknown sender"},
	{Cause: CauseNetworkVNI, Meter: 8, Words: "Network VNI from a node without that Network"},
	{Cause: CauseNetworkIsolation, Meter: 9, Words: "Network isolation"},
	{Cause: CauseServiceNoEndpoints, Meter: 10, Rejected: true, Words: "service without endpoints"},
	{Cause: CauseEgressFirewall, Meter: 11, Words: "egress firewall"},
	{Cause: CauseAdminPolicy, Meter: 12, Words: "ClusterNetworkPolicy Deny rule"},
}

// LookupDropCause returns a cause's description.
func LookupDropCause(c DropCause) (DropCauseInfo, bool) {
	for _, i := range DropCauses {
		if i.Cause == c {
			return i, true
		}
	}
	return DropCauseInfo{}, false
}

// AnyPriority in a DropRule matches every drop flow of its table.
const AnyPriority = -1

// DropRule attributes the drop flows of one table (and priority) to a cause.
type DropRule struct {
	Table    TableID
	Priority int // AnyPriority: all of the table's drops
	Cause    DropCause
	// Also, when set, picks flows that do not drop (a reject) or refines which drops are meant.
	// Without it the rule takes the flows that have no action.
	Also func(f Flow) bool
}

// DropRules is the registry. A flow matches its first rule. Drops of no cause (the table defaults of
// the services and output stages, a cluster address on no node, a packet that would go back into the
// tunnel, a pod's IPv6 at table 20's priority 1) are not sampled: they say nothing about anyone's
// policy. Table 20's rule is its miss alone (priority 0): a pod's kernel sends IPv6 router
// solicitations and MLD by itself, which would otherwise fill the records as anti-spoofing.
var DropRules = []DropRule{
	{Table: TableTunnelIngress, Priority: 0, Cause: CauseTunnelSource},
	{Table: TableTunnelIngress, Priority: networkTunnelDropPriority, Cause: CauseNetworkVNI},
	{Table: TableUplinkIngress, Priority: 0, Cause: CauseUplinkSource},
	{Table: TablePodIngress, Priority: 0, Cause: CauseAntiSpoofing},
	{Table: TableServices, Priority: 100, Cause: CauseServiceNoEndpoints, Also: isServiceReject},
	{Table: TableEgressPolicy, Priority: int(isolationPriority), Cause: CausePolicyEgress},
	{Table: TableRouting, Priority: guardGatewayPriority, Cause: CauseTunnelGuard},
	{Table: TableRouting, Priority: guardDefaultPriority, Cause: CauseTunnelGuard},
	{Table: TableIngressIsolation, Priority: int(isolationPriority), Cause: CausePolicyIngress},
	{Table: TableIngressIsolation, Priority: 0, Cause: CauseTenantIsolation},
	{Table: TableNetCrossTalk, Priority: 0, Cause: CauseNetworkIsolation},
	// The egress firewall's Deny rules and an unenforceable policy's deny-all (egress.go).
	{Table: TableEgressFirewall, Priority: AnyPriority, Cause: CauseEgressFirewall},
	// ClusterNetworkPolicy Deny rules, Admin and Baseline tiers (adminpolicy.go): a decision flow
	// whose only action is its rule's note.
	{Table: TableAdminEgress, Priority: AnyPriority, Cause: CauseAdminPolicy, Also: isAdminDeny},
	{Table: TableBaselineEgress, Priority: AnyPriority, Cause: CauseAdminPolicy, Also: isAdminDeny},
	{Table: TableAdminIngress, Priority: AnyPriority, Cause: CauseAdminPolicy, Also: isAdminDeny},
	{Table: TableBaselineIngress, Priority: AnyPriority, Cause: CauseAdminPolicy, Also: isAdminDeny},
}

// DropSampleLen is how much of a dropped packet the agent gets: Ethernet, IPv4 with options and the
// transport ports, with room to spare.
const DropSampleLen = 128

// DropSampleRate and DropSampleBurst are every cause's meter (see the top of this file).
const (
	DropSampleRate  = 100
	DropSampleBurst = 100
)

// DropMeters are the meters the drop flows use: the agent installs them before any flow.
func DropMeters() []MeterBand {
	out := make([]MeterBand, len(DropCauses))
	for i, c := range DropCauses {
		out[i] = MeterBand{ID: c.Meter, Rate: DropSampleRate, Burst: DropSampleBurst}
	}
	return out
}

// dropRulesByTable indexes DropRules, so the pass looks at a flow's table once.
var dropRulesByTable = func() (idx [256][]DropRule) {
	for _, r := range DropRules {
		idx[r.Table] = append(idx[r.Table], r)
	}
	return idx
}()

// DropRuleOf returns the rule that attributes a flow (sampled or not), if any.
func DropRuleOf(f Flow) (DropRule, bool) {
	for _, r := range dropRulesByTable[f.Table] {
		if r.Priority != AnyPriority && r.Priority != int(f.Priority) {
			continue
		}
		acts := f.Actions
		if len(acts) > 0 {
			if _, ok := acts[0].(Controller); ok {
				acts = acts[1:]
			}
		}
		if len(acts) == 0 || (r.Also != nil && r.Also(Flow{Table: f.Table, Priority: f.Priority, Match: f.Match, Actions: acts})) {
			return r, true
		}
	}
	return DropRule{}, false
}

// DropCauseOfTable returns the causes of a table's rules, in the registry's order (a cause once per
// rule, so repeated when rules share it): a packet-in names the table, not the priority, and the agent
// tells a table's causes apart (tables 10 and 80) by the packet-in's tun_id and cookie. None: no flow
// of the table is sampled.
func DropCauseOfTable(table TableID) []DropCause {
	var out []DropCause
	for _, r := range dropRulesByTable[table] {
		out = append(out, r.Cause)
	}
	return out
}

// sampleDrops makes every attributed flow of a fresh render sample itself: the controller action with
// its cause's meter, first in its actions. Each renderer calls it on what it renders afresh (memos.render
// and the renderers that keep memos of their own: services, policies, ClusterNetworkPolicies; the
// owners rendered on every Render: tenants, egress), never on an owner it reuses: the change is made
// in place, so the memo holds the sampled flows and hands them back as they are. It is idempotent (a
// sampled flow starts with its Controller action), so flows a render took from an earlier one
// (netpol.go's clause flows) are left as they were. It returns flows.
func sampleDrops(flows []Flow) []Flow {
	for i := range flows {
		f := &flows[i]
		if len(dropRulesByTable[f.Table]) == 0 {
			continue
		}
		if len(f.Actions) > 0 {
			if _, ok := f.Actions[0].(Controller); ok {
				continue
			}
		}
		r, ok := DropRuleOf(*f)
		if !ok {
			continue
		}
		info, _ := LookupDropCause(r.Cause)
		acts := make([]Action, 0, len(f.Actions)+1)
		f.Actions = append(append(acts, Controller{MaxLen: DropSampleLen, MeterID: info.Meter}), f.Actions...)
	}
	return flows
}

// isAdminDeny: a ClusterNetworkPolicy rule's decision flow that denies (its note says so, and it does
// nothing else).
func isAdminDeny(f Flow) bool {
	if len(f.Actions) != 1 {
		return false
	}
	n, ok := f.Actions[0].(Note)
	if !ok {
		return false
	}
	r, ok := ParseAdminRuleNote(string(n.Data))
	return ok && r.Action == AdminDeny.String()
}

// isServiceReject: a service port's flow that refuses (DNAT to the host's reject ports) or drops (a
// Local policy without a local endpoint).
func isServiceReject(f Flow) bool {
	if len(f.Actions) != 1 {
		return false
	}
	ct, ok := f.Actions[0].(CT)
	return ok && ct.NAT != nil && ct.NAT.PortMin == RejectPortMin
}

// IsolatingPolicies names the policies ("namespace/name") that isolate the local pod at ofport in a
// direction (ingress or egress): those behind its default-deny flow, what a drop by its isolation
// is owed to. Sorted as policies are.
func IsolatingPolicies(policies []PolicyState, ofport uint32, ingress bool) []string {
	var out []string
	for _, p := range policies {
		if (ingress && !p.Ingress) || (!ingress && !p.Egress) {
			continue
		}
		for _, pod := range p.Pods {
			if pod.OFPort == ofport {
				out = append(out, p.Namespace+"/"+p.Name)
				break
			}
		}
	}
	return out
}

// SampleDropsForTest runs the sampling pass over owners (for tests that install a few flows of
// their own the way Render would).
func SampleDropsForTest(owners map[reconcile.Owner]reconcile.OwnerState) {
	for _, st := range owners {
		sampleDrops(st.Flows)
	}
}
