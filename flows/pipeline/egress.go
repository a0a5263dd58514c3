package pipeline

// Egress IPs and the egress firewall: a namespace's traffic to destinations outside the cluster is
// classified on the node where the pod runs, before routing (60):
//
//	54 egress-classify   replies, service-DNATed connections, UDP to a tunnel port (the guard of 60
//	                     decides those) and destinations inside the cluster (cluster and service networks,
//	                     every node's address) go on to 60 untouched. A local pod of a namespace with an
//	                     egress IP or firewall loads its namespace's egress ID into metadata (one flow per
//	                     pod, owner egress/<namespace>) → 55. A connection the host opens to such a pod
//	                     (a hostPort) is committed, so the pod's replies are replies here and never take an
//	                     egress IP. Tunnelled traffic to outside the cluster is another node's egress
//	                     traffic for an egress IP held here → 57.
//	55 egress-firewall   the namespace's EgressNetworkPolicy (owner egressfw/<namespace>/<name>): rule i at
//	                     priority 200-i, first match wins: Allow → 56, Deny → drop; a DNS name's rule
//	                     matches the addresses the agent resolved it to. An unenforceable policy (two in one
//	                     namespace, a rule that does not parse) drops everything. No rule matched → 56.
//	56 egress-ip         the namespace's egress IPs (owner egress/<namespace>): commit the connection in
//	                     the service zone (its replies come back as replies), tun_dst = the egress IP
//	                     (with several, a hash of the destination address picks one: a destination always
//	                     sees one source per namespace) → 57. Egress IPs but none usable: drop.
//	                     No egress IP (a firewall only): commit, → 60, out through this node's address.
//	57 egress-out        an egress IP held here: the packet goes to the host (tun0) with eth_src
//	                     EgressMAC(IP), which the host's nf_tables SNATs to that IP (agent/nodenet);
//	                     tunnelled traffic for an egress IP not held here is dropped (never sent from a
//	                     node address); anything else is tunnelled (VXLAN, whatever the encapsulation)
//	                     to the egress IP itself.
//
// A move of an egress IP changes no flow on a source node: its flows send to the IP, whichever node
// holds it. The new holder adds the address to its uplink and announces it (gratuitous ARP), and every
// node's ovs-vswitchd, which snoops ARP for its tunnels' next hops, sends there at once; only the old and
// the new holder change flows (57) and their host's SNAT.
//
// The way back: the outside answers the egress IP at its holder, whose host un-SNATs the reply to the
// pod's address and routes it into br0, which sends it to the pod's node like any traffic for that
// subnet — with a source outside the cluster, which the tunnel guard of tables 10 and 15 refuses from a
// node. So those tables send what they refuse from a known node to
//
//	16 egress-return     accepted only as a reply (or related ICMP) of a connection this node's br0
//	                     committed, in the service zone — which only egress traffic (56) commits towards
//	                     outside the cluster — and never with a source inside the cluster: the guard still
//	                     holds for every pod and node address. tun_id → reg0 (or the pod MAC from the
//	                     address, from the uplink) → 30.
//
// Nothing here renders until some namespace of the cluster has an egress IP or an egress firewall.

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// EgressState is what a node's egress flows depend on (besides the node's pods and peers).
type EgressState struct {
	// Namespaces with an egress IP or an egress firewall, sorted by name; only those with pods on this
	// node render flows.
	Namespaces []EgressNamespace
	// ServiceNetwork is inside the cluster too (with NodeState.ClusterNetworks and every node's address).
	ServiceNetwork netip.Prefix
	// Held are the egress IPs this node holds now.
	Held []netip.Addr
}

// EgressNamespace is one namespace's egress: its usable egress IPs and its firewall.
type EgressNamespace struct {
	Name string
	// IPs are its usable egress IPs, in the NetNamespace's order. NoUsableIP: it has egress IPs, none
	// of them usable (a conflict, an address inside the cluster, no node may hold it): its traffic
	// leaving the cluster is dropped.
	IPs        []netip.Addr
	NoUsableIP bool
	// Firewall is its EgressNetworkPolicy, nil for none.
	Firewall *EgressFirewall
}

// EgressFirewall is a namespace's EgressNetworkPolicy, resolved.
type EgressFirewall struct {
	Policy string // the EgressNetworkPolicy's name
	Rules  []EgressRule
	// DenyAll: the namespace's policies cannot be enforced as written (several policies, a rule that
	// does not parse): everything leaving the cluster is dropped.
	DenyAll bool
}

// EgressRule is one rule: its destinations are its CIDR, or the addresses its DNS name resolved to.
type EgressRule struct {
	Allow   bool
	DNSName string // "" for a CIDR rule
	Dsts    []netip.Prefix
}

// The egress tables' flows that are the pipeline's own (exclusions, the holder's, the way back).
var EgressOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "egress"}

// Priorities of the egress tables.
const (
	egressReplyPriority    = 300 // 54: replies, related, service-DNATed
	egressInboundPriority  = 260 // 54: a connection the host opens to a local pod is committed
	egressGuardPriority    = 250 // 54: UDP to a tunnel port: the guard of 60 decides
	egressInsidePriority   = 200 // 54: destinations inside the cluster
	egressTunnelPriority   = 150 // 54: tunnelled traffic to outside: held here? (57)
	egressPodPriority      = 100 // 54: a local pod of an egress namespace
	egressRuleTopPriority  = 200 // 55: rule i at 200-i
	egressDenyAllPriority  = 100 // 55: an unenforceable firewall
	egressIPPriority       = 100 // 56: the namespace's egress IPs
	egressIPPickPriority   = 110 // 56: the IP the hash picked
	egressHeldPriority     = 200 // 57: held here
	egressForeignPriority  = 100 // 57: tunnelled in, not held here
	egressOutPriority      = 10  // 57: tunnel to the egress IP
	egressReturnPriority   = 50  // 10, 15: refused by the guard, from a known node
	egressReturnInside     = 300 // 16: sources inside the cluster never come back this way
	egressReturnReplyPrior = 200 // 16: replies and related
)

// Metadata carries a packet's namespace egress ID (bits 0-31) and, for a namespace with several egress
// IPs, the hash's pick (bits 32-47, bit 48 set once picked) from 54 to 57. Nothing else in the pipeline
// uses it.
var (
	egressIDBits    = Bits(FieldMetadata, 0, 31)
	egressPickBits  = Bits(FieldMetadata, 32, 47)
	egressPickedBit = Bits(FieldMetadata, 48, 48)
)

// egressPickedFlag is egressPickedBit as a value: the pick bits hold the hash's choice.
const egressPickedFlag uint64 = 1 << 48

// egressPickBasis is the basis of the hash that picks one of several egress IPs.
const egressPickBasis = 0xe9

// EgressMAC is the source MAC with which br0 hands a packet to the host to leave from egress IP ip:
// 0e:45 followed by the address (locally administered; pods are 0a:58 and uplinks 0e:58). The host's
// nf_tables matches it to SNAT (agent/nodenet).
func EgressMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.Unmap().As4()
	return net.HardwareAddr{0x0e, 0x45, b[0], b[1], b[2], b[3]}
}

// EgressMACPrefix is what every EgressMAC starts with.
var EgressMACPrefix = [2]byte{0x0e, 0x45}

// EgressNamespaceOwner owns a namespace's egress classification (its local pods) and egress IP flows.
func EgressNamespaceOwner(namespace string) reconcile.Owner {
	return Object{Kind: KindNetNamespace, Name: namespace}.Owner()
}

// EgressFirewallOwner owns the flows of a namespace's EgressNetworkPolicy.
func EgressFirewallOwner(namespace, policy string) reconcile.Owner {
	return Object{Kind: KindEgressNetworkPolicy, Namespace: namespace, Name: policy}.Owner()
}

// enabled reports whether anything egress renders.
func (e *EgressState) enabled() bool { return len(e.Namespaces) > 0 }

// renderEgress adds the egress owners to out.
func renderEgress(s NodeState, out map[reconcile.Owner]reconcile.OwnerState) {
	e := &s.Egress
	if !e.enabled() {
		return
	}
	out[EgressOwner] = reconcile.OwnerState{Flows: sampleDrops(renderEgressBase(s))}
	podsOf := map[string][]PodState{}
	for _, p := range s.Pods {
		podsOf[p.Namespace] = append(podsOf[p.Namespace], p)
	}
	ids := newIDAllocator()
	namespaces := slices.Clone(e.Namespaces)
	slices.SortFunc(namespaces, func(a, b EgressNamespace) int { return cmp.Compare(a.Name, b.Name) })
	for _, ns := range namespaces {
		pods := podsOf[ns.Name]
		if len(pods) == 0 {
			continue
		}
		id, err := ids.get(ns.Name)
		if err != nil {
			continue // 64 collisions in a row: cannot happen with fewer than 2^31 namespaces
		}
		out[EgressNamespaceOwner(ns.Name)] = reconcile.OwnerState{Flows: sampleDrops(renderEgressNamespace(ns, id, pods))}
		if fw := ns.Firewall; fw != nil {
			out[EgressFirewallOwner(ns.Name, fw.Policy)] = reconcile.OwnerState{Flows: sampleDrops(renderEgressFirewall(*fw, id))}
		}
	}
}

// inside lists the destinations inside the cluster: cluster networks, the service network, every node's
// address.
func (s *NodeState) inside() []netip.Prefix {
	out := slices.Clone(s.ClusterNetworks)
	if s.Egress.ServiceNetwork.IsValid() {
		out = append(out, s.Egress.ServiceNetwork)
	}
	nodes := []netip.Addr{s.NodeIP}
	for _, n := range s.RemoteNodes {
		nodes = append(nodes, n.NodeIP)
	}
	slices.SortFunc(nodes, netip.Addr.Compare)
	for _, a := range slices.Compact(nodes) {
		if a.Is4() {
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	for i := range out {
		out[i] = out[i].Masked()
	}
	return out
}

// renderEgressBase renders the egress plumbing: 54's exclusions and the holder's entry, 57, and the way
// back (10, 15 → 16).
func renderEgressBase(s NodeState) []Flow {
	toRouting := Goto{Table: TableRouting}
	out := []Flow{
		F(TableEgressClassify, egressReplyPriority, M(append(IP, CtState(CtRpl|CtTrk, 0))...), toRouting),
		F(TableEgressClassify, egressReplyPriority, M(append(IP, CtState(CtRel|CtTrk, 0))...), toRouting),
		F(TableEgressClassify, egressReplyPriority, M(append(IP, RegBits(flagServiceDNAT, 1))...), toRouting),
		// Another node's egress traffic for an egress IP: 57 knows whether it is held here.
		F(TableEgressClassify, egressTunnelPriority, M(append(IP, InPort(PortVXLAN))...), Goto{Table: TableEgressOut}),
		// Tunnelled in for an egress IP this node does not hold (an ARP cache not updated yet): dropped,
		// never sent from this node's address.
		F(TableEgressOut, egressForeignPriority, M(append(IP, InPort(PortVXLAN))...)),
		// Everything else was given its egress IP in tun_dst by 56: tunnel it to the IP's holder.
		F(TableEgressOut, egressOutPriority, M(IP...), Move{Src: Whole(RegSrcVNID), Dst: Bits(FieldTunID, 0, 31)}, Output{Port: PortVXLAN}),
	}
	for _, port := range s.tunnelPorts() {
		out = append(out, F(TableEgressClassify, egressGuardPriority, M(append(slices.Clone(UDP), UDPDst(port))...), toRouting))
	}
	inside := s.inside()
	for _, p := range inside {
		out = append(out, F(TableEgressClassify, egressInsidePriority, M(append(IP, IPDstNet(p))...), toRouting),
			F(TableEgressReturn, egressReturnInside, M(append(IP, IPSrcNet(p))...)))
	}
	// Held here: to the host, which SNATs by the source MAC.
	for _, ip := range sortedAddrs(s.Egress.Held) {
		acts := []Action{SetField{Field: FieldEthSrc, Value: MACValue(EgressMAC(ip))}}
		if len(s.GatewayMAC) == 6 {
			acts = append(acts, SetField{Field: FieldEthDst, Value: MACValue(s.GatewayMAC)})
		}
		acts = append(acts, LoadReg(RegDstVNID, GlobalVNID), LoadReg(RegOutPort, PortTun0), Goto{Table: TableIngressIsolation})
		out = append(out, F(TableEgressOut, egressHeldPriority, M(append(IP, TunDst(ip))...), acts...))
	}
	// The way back: from a known node, what its prefix flows refused, through conntrack to 16.
	toReturn := CT{Table: TableEgressReturn, Zone: ZoneService}
	for _, n := range s.RemoteNodes {
		if !n.NodeIP.Is4() {
			continue
		}
		out = append(out, F(TableTunnelIngress, egressReturnPriority, M(append(IP, TunSrc(n.NodeIP))...), toReturn))
		if s.Uplink {
			out = append(out, F(TableUplinkIngress, egressReturnPriority, M(append(IP, EthSrc(UplinkMAC(n.NodeIP)))...), toReturn))
		}
	}
	fromTunnel := Move{Src: Bits(FieldTunID, 0, 31), Dst: Whole(RegSrcVNID)}
	for _, st := range []MatchField{CtState(CtEst|CtRpl|CtTrk, 0), CtState(CtRel|CtTrk, 0)} {
		out = append(out, F(TableEgressReturn, egressReturnReplyPrior, M(append(IP, st, InPort(PortVXLAN))...), fromTunnel, Goto{Table: TableConntrack}))
		if s.Uplink {
			out = append(out, F(TableEgressReturn, egressReturnReplyPrior, M(append(IP, st, InPort(PortUplink))...),
				append(slices.Clone(podMACFromIPDst), Goto{Table: TableConntrack})...))
		}
	}
	return out
}

// renderEgressNamespace renders a namespace's classification of its local pods and its egress IPs.
func renderEgressNamespace(ns EgressNamespace, id uint32, pods []PodState) []Flow {
	var out []Flow
	for _, p := range pods {
		out = append(out,
			F(TableEgressClassify, egressPodPriority, M(append(IP, InPort(p.OFPort))...), Load{Dst: egressIDBits, Value: uint64(id)},
				Goto{Table: TableEgressFirewall}),
			// A connection the host opens to the pod (a hostPort): committed, so the pod's replies are
			// replies in 54 and neither take an egress IP nor meet the firewall.
			F(TableEgressClassify, egressInboundPriority, M(append(IP, InPort(PortTun0), CtState(CtNew|CtTrk, 0), IPDst(p.IP))...),
				commitService, Goto{Table: TableRouting}))
	}
	ours := Masked(FieldMetadata, uint64(id), 0xffffffff)
	commit := commitService
	switch {
	case ns.NoUsableIP:
		out = append(out, F(TableEgressIP, egressIPPriority, M(append(IP, ours)...)))
	case len(ns.IPs) == 0:
		// A firewall only: out through this node's address, the connection committed all the same,
		// so its replies are replies in 54 (never taken for a connection the outside opened) and
		// every later packet meets the rules again.
		out = append(out, F(TableEgressIP, egressIPPriority, M(append(IP, ours)...), commit, Goto{Table: TableRouting}))
	case len(ns.IPs) == 1:
		out = append(out, F(TableEgressIP, egressIPPriority, M(append(IP, ours)...), commit, SetTunDst(ns.IPs[0]), Goto{Table: TableEgressOut}))
	case len(ns.IPs) > 1:
		// Hash the destination into the pick bits, flag it picked, and look again: the pick's flow
		// (above, matching the flag) names the IP.
		unpicked := Masked(FieldMetadata, uint64(id), egressPickedFlag|0xffffffff)
		out = append(out, F(TableEgressIP, egressIPPriority, M(append(IP, unpicked)...), commit,
			Multipath{Fields: HashNWDst, Basis: egressPickBasis, Algorithm: MultipathModuloN, Links: uint32(len(ns.IPs)), Dst: egressPickBits},
			Load{Dst: egressPickedBit, Value: 1}, Resubmit{Table: TableEgressIP}))
		for i, ip := range ns.IPs {
			pick := Masked(FieldMetadata, uint64(id)|uint64(i)<<32|egressPickedFlag, egressPickedFlag|0xffff_ffffffff)
			out = append(out, F(TableEgressIP, egressIPPickPriority, M(append(IP, pick)...), SetTunDst(ip), Goto{Table: TableEgressOut}))
		}
	}
	return out
}

// renderEgressFirewall renders a namespace's EgressNetworkPolicy: rule i at EgressRulePriority(i).
func renderEgressFirewall(fw EgressFirewall, id uint32) []Flow {
	ours := Masked(FieldMetadata, uint64(id), 0xffffffff)
	if fw.DenyAll {
		return []Flow{F(TableEgressFirewall, egressDenyAllPriority, M(append(IP, ours)...))}
	}
	var out []Flow
	for i, r := range fw.Rules {
		prio := EgressRulePriority(i)
		var acts []Action
		if r.Allow {
			acts = []Action{Goto{Table: TableEgressIP}}
		}
		dsts := slices.Clone(r.Dsts)
		slices.SortFunc(dsts, func(a, b netip.Prefix) int {
			if c := a.Addr().Compare(b.Addr()); c != 0 {
				return c
			}
			return cmp.Compare(a.Bits(), b.Bits())
		})
		for _, d := range slices.Compact(dsts) {
			if d.Addr().Is4() {
				out = append(out, F(TableEgressFirewall, prio, M(append(IP, ours, IPDstNet(d.Masked()))...), acts...))
			}
		}
	}
	return out
}

// EgressRulePriority is the priority of rule i (0-based) of an EgressNetworkPolicy in table 55, and
// EgressRuleOf reads it back (flowctl names the rule that drops a packet).
func EgressRulePriority(i int) uint16 { return uint16(egressRuleTopPriority - i) }

// EgressRuleOf returns the rule index of a table-55 priority (false: not a rule's).
func EgressRuleOf(priority uint16) (int, bool) {
	i := egressRuleTopPriority - int(priority)
	if priority == egressDenyAllPriority || i < 0 || i >= 100 {
		return 0, false
	}
	return i, true
}

func sortedAddrs(in []netip.Addr) []netip.Addr {
	out := slices.Clone(in)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// String names an egress rule as the API writes it.
func (r EgressRule) String() string {
	verb := "Deny"
	if r.Allow {
		verb = "Allow"
	}
	if r.DNSName != "" {
		return fmt.Sprintf("%s %s (%d addresses)", verb, r.DNSName, len(r.Dsts))
	}
	if len(r.Dsts) == 1 {
		return verb + " " + r.Dsts[0].String()
	}
	return fmt.Sprintf("%s %v", verb, r.Dsts)
}
