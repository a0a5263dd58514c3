// Package pipeline is ofsdn's flow pipeline: the tables and registers of br0, and Render, which turns a
// node's state (NodeState: pods, remote nodes, tenants, services, policies, Networks, egress) into every
// owner's desired flows and groups. It is pure: no I/O, no logging, and a state always renders the same
// flows (a Renderer only remembers earlier renders to skip owners whose inputs did not change: memo.go).
// The agent hands Render's output to flows/reconcile, which installs it; the words of the flows are
// flows/openflow's.
//
// Where each flow comes from: render_base.go (dispatch, table defaults, version note), render.go
// (the local subnet, pods, tenants, remote nodes), guard.go (the tunnel guard: no pod injects into the
// overlay), uplink.go (encapsulation none: the uplink port, and why it is that rather than host
// routes), services.go (services, their groups and learned affinity), services_affinity.go
// (sessionAffinity's choice), netpol.go (NetworkPolicy), adminpolicy.go (ClusterNetworkPolicy: the
// Admin and Baseline tiers), networks.go (Networks: pods' interfaces besides eth0, each network a
// segment of its own, and cross-talk between networks), egress.go (egress IPs and the egress
// firewall), owners.go (who owns what: each owner names its API object), ports.go (br0's own ports and
// their roles: tunnel, host, uplink; the rest are pods'), drops.go (drop attribution: the registry of
// drop flows and their causes, whose flows send a metered sample to the agent).
//
// The pipeline (table numbers are fixed so dumps stay comparable across versions):
//
//	  0 classifier        by the ingress port's role (Ports): vxlan0 (tunnel) → 10, tun0 (host) → 25,
//	                      the uplink port (encapsulation none) → 15 when addressed to our uplink MAC
//	                      (else drop), any other port → 20 (pods)
//	 10 tunnel-ingress    tun_src must be a known node and the inner source inside its subnet or its own
//	                      address (guard.go); tun_id → reg0 (source VNID); else drop
//	 15 uplink-ingress    unencapsulated from a known node's uplink MAC (uplink.go): a source address of
//	                      its pods → reg0 = that pod's VNID (its gateway and own address: 0), eth_dst = the
//	                      pod MAC of the destination; else drop
//	 16 egress-return     from 10/15, what their guard refused from a known node: a reply (or related
//	                      ICMP) of an egress connection committed here, with a source outside the cluster,
//	                      sent back by the egress IP's holder (egress.go); else drop
//	 20 pod-ingress       anti-spoofing: in_port + MAC + IP (and ARP sha/spa) must be the pod's; reg0 = pod VNID;
//	                      IPv6 (ofsdn carries IPv4 only; pods' kernels send router solicitations and MLD by
//	                      themselves) is dropped unsampled at priority 1, the rest by the sampled miss
//	 25 host-ingress      from tun0 (host, hostNetwork pods): reg0 = 0 (global)
//	 30 conntrack         ct(nat) in ofsdn's zones so replies are un-NATed before routing: replies to the
//	                      hairpin address through the hairpin zone (un-SNAT), replies to the gateway through
//	                      the masquerade zone (un-SNAT), then every IP packet through the service zone
//	                      (un-DNAT; an established connection's DNAT re-applied); a new connection from the
//	                      host with a source outside the cluster networks is flagged for masquerade (reg3)
//	 40 services          established/related connections bypass selection (→ 45); ClusterIP and NodePort
//	                      addresses: reg6 = the service port's load-balancer ID, → 42 (affinity first
//	                      resubmits 41); NodePorts set or clear the masquerade flag (externalTrafficPolicy);
//	                      a service without endpoints is rejected (DNAT to the host's reject ports)
//	 41 service-affinity  learned flows only (sessionAffinity ClientIP): reg6 + client IP → reg4/reg5 endpoint
//	 42 service-lb        reg6 + reg4/reg5 (an endpoint) → ct(commit, DNAT to it, ct_mark = the masquerade
//	                      flag) → 45; reg6 alone → select group, whose buckets load reg4/reg5 and resubmit 42
//	                      (big services: several groups); with sessionAffinity, reg6 → a hash of the
//	                      client's address (multipath) into reg7 and on to 43
//	 43 service-hash      sessionAffinity's choice: the hash's slot → its endpoint in reg4/reg5, resubmit 42;
//	                      an empty slot hashes again. A hash of the whole address (not its low bits, which
//	                      put every node's .1 on one endpoint) with one slot per endpoint: exactly uniform
//	                      (measured chi-square inside its 99.99% quantile for 2..1000 endpoints), and an
//	                      endpoint change touches its own slot, 3-7 flow-mods where the address-bit slots
//	                      took 45-70 (services_affinity.go has the measurements and the alternatives)
//	 45 service-l2        a DNATed packet (flagged in reg3 for the hairpin check) towards a pod gets the pod's
//	                      MAC (0a:58 + its IP); a connection marked for masquerade is SNATed to the gateway
//	                      in the masquerade zone, after the endpoint was chosen
//	 48 admin-egress      ClusterNetworkPolicy Admin tier, egress (every mode, adminpolicy.go): replies
//	                      and related packets → 60 (an Admin-accepted connection's as global, reg0 = 0);
//	                      each rule a conjunction at a priority of its own, in precedence order: Accept
//	                      → 54, Deny drops, Pass → 50; no rule → 50
//	 50 egress-policy     NetworkPolicy egress (networkpolicy mode, netpol.go): replies/related pass; a
//	                      policy's rules are conjunctions (pods × ports × peers) at its own priority; an
//	                      egress-isolated pod's default deny; the connections its policies allow → 54;
//	                      a pod no policy isolates is undecided → 52
//	 52 baseline-egress   ClusterNetworkPolicy Baseline tier, egress: Accept or Pass → 54, Deny drops;
//	                      no rule → 54
//	 54 egress-classify   traffic leaving the cluster (egress.go), whichever policy layer let it go (an
//	                      Admin Accept too: the egress firewall and egress IPs apply to every connection
//	                      out): a local pod of a namespace with an egress IP or EgressNetworkPolicy loads
//	                      its egress ID (metadata) → 55; another node's egress traffic → 57; replies,
//	                      services, the cluster's own addresses → 60
//	 55 egress-firewall   EgressNetworkPolicy: the first matching rule allows (→ 56) or drops
//	 56 egress-ip         commit; tun_dst = the namespace's egress IP → 57 (none usable: drop)
//	 57 egress-out        an egress IP held here: eth_src EgressMAC(IP), reg2 = tun0 → 80, the host SNATs
//	                      to it; another node's traffic for an egress IP not held here: drop; else VXLAN
//	                      to the egress IP itself, wherever it is held
//	 60 routing           the tunnel guard first (guard.go): UDP to the tunnel port of any gateway or of
//	                      anything not a pod is dropped, replies excepted, so no pod injects into the
//	                      overlay; local pod → reg1 = its VNID, reg2 = its port, → 78; remote subnet →
//	                      90 (committing the connection to conntrack first); the gateway → tun0 (with
//	                      tun0's MAC, through 78); else → tun0
//	 70 arp               ARP for local pods, the gateway, and remote subnets (through the tunnel; for a
//	                      peer reached through the uplink, requests are answered here with the pod MAC)
//	 78 admin-ingress     ClusterNetworkPolicy Admin tier, ingress (every mode): replies and related
//	                      packets → 80; rules as in 48 (pods by reg2, peers by nw_src): Accept → commit
//	                      (ct_mark bit 1: its replies leave as global) → 100, skipping 80; Deny drops;
//	                      Pass → 80; no rule → 80
//	 80 ingress-isolation multitenant: reg0 vs reg1, same VNID or either 0 is undecided → 82, else drop.
//	                      networkpolicy: replies/related pass; the node (tun0, gateway address) passes;
//	                      policies' rules as conjunctions (pods by reg2 × ports × peers by nw_src),
//	                      committed → 100; an ingress-isolated pod's default deny; a pod no policy
//	                      isolates is undecided → 82. subnet: everything → 82
//	 82 baseline-ingress  ClusterNetworkPolicy Baseline tier, ingress: replies/related → 100; Accept or
//	                      Pass → commit → 100, Deny drops; no rule: commit → 100 (Kubernetes' default
//	                      allow). Connections are committed in every mode, here and in 60 for another
//	                      node, so replies are known at both ends
//	 90 tunnel-egress     reg0 → tun_id, remote node IP → tun_dst, output vxlan0; encapsulation none, a
//	                      peer on the uplink segment: our and its uplink MACs, output the uplink port
//	100 output            output:reg2; a packet leaving by the port it came in by (hairpin: a pod reaching
//	                      itself through a service, the host through tun0) is SNATed to the hairpin
//	                      address in the hairpin zone when reg3 says it went through a service DNAT, and
//	                      goes to 105
//	105 hairpin-output    swap MACs and send back out of the ingress port
//
//	Networks (networks.go): a pod's interface on a Network (table 20) or a tunnelled packet with the
//	network's VNI from a node with a subnet of it (table 10, priority 150, straight to 135 with reg1 = the
//	VNI; any other VNI of the networks' range: dropped at 140) comes here, and never meets 30-105:
//	130 net-crosstalk     from a local pod (reg0 = its network's VNI): the destination's network into reg1,
//	                      the source's own (its CIDR), or a cross-talk peer's (eth_src = the peer's
//	                      gateway MAC, TTL - 1); else drop
//	135 net-routing       reg1 + a local attachment's address → eth_dst = its MAC, reg2 = its port → 145;
//	                      else → 140
//	138 net-arp           ARP within reg1's network: a local attachment's address → its port; the node's
//	                      gateway on the network (requests from local pods) answered here; else → 140
//	140 net-tunnel        reg1 + another node's subnet of the network → tun_id = the VNI, tun_dst = the
//	                      node, vxlan0; nothing from the tunnel goes back into it
//	145 net-output        commit to the network's conntrack zone (NetworkZone), output:reg2
//	253 version           a note carrying the pipeline version; never matched by traffic
//
// Every table ends in an explicit default (miss) flow, so drop counters in `flowctl dump` show where
// packets die. A drop with a cause (drops.go's registry) also sends its packet's first bytes to the
// agent through its cause's meter: controller(max_len=128,meter_id=M) first in its actions (`flowctl
// dump` reads it as "drop (sampled: cause)"). Table 20's IPv6 drop has no cause and is not sampled.
//
// Registers: reg0 = source VNID (a tenant's, or a Network's VNI), reg1 = destination VNID, reg2 = output
// port (openshift-sdn's convention), reg3 = flags, reg4/reg5/reg6 = the chosen endpoint's IP and port
// and the service's load-balancer ID, reg7 = sessionAffinity's hash (IP packets) or the proxy ARP
// responder's scratch (ARP packets: never both in one packet); see the Reg* names below. metadata = the egress ID and pick
// between 54 and 57 (egress.go). ct_mark (service zone): bit 0 the masquerade flag (services.go), bit 1
// an Admin-accepted connection (adminpolicy.go).
package pipeline

import (
	"fmt"
	"strconv"
	"strings"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// The pipeline's tables. Numbers never change once shipped: flowctl output and drop counters depend on them.
const (
	TableClassifier       TableID = 0
	TableTunnelIngress    TableID = 10
	TableUplinkIngress    TableID = 15
	TableEgressReturn     TableID = 16
	TablePodIngress       TableID = 20
	TableHostIngress      TableID = 25
	TableConntrack        TableID = 30
	TableServices         TableID = 40
	TableServiceAffinity  TableID = 41
	TableServiceLB        TableID = 42
	TableServiceHash      TableID = 43
	TableServiceL2        TableID = 45
	TableAdminEgress      TableID = 48
	TableEgressPolicy     TableID = 50
	TableBaselineEgress   TableID = 52
	TableEgressClassify   TableID = 54
	TableEgressFirewall   TableID = 55
	TableEgressIP         TableID = 56
	TableEgressOut        TableID = 57
	TableRouting          TableID = 60
	TableARP              TableID = 70
	TableAdminIngress     TableID = 78
	TableIngressIsolation TableID = 80
	TableBaselineIngress  TableID = 82
	TableTunnelEgress     TableID = 90
	TableOutput           TableID = 100
	TableHairpinOutput    TableID = 105
	TableNetCrossTalk     TableID = 130
	TableNetRouting       TableID = 135
	TableNetARP           TableID = 138
	TableNetTunnel        TableID = 140
	TableNetOutput        TableID = 145
	TableVersion          TableID = 253
)

// Named registers, so a reader never has to remember which number carries what.
const (
	RegSrcVNID = FieldReg0 // VNID of the packet's source (0 = global)
	RegDstVNID = FieldReg1 // VNID of the destination pod
	RegOutPort = FieldReg2 // OpenFlow port the packet leaves by
	// RegFlags are per-packet flags: bit 0, an original-direction packet of a service-DNATed connection
	// (table 45 sets it; the hairpin check in 100 reads it, as a policy commit in between clears the
	// ct_state it came from); bit 1, masquerade this new connection after its endpoint is chosen.
	RegFlags = FieldReg3
	// Services: the endpoint a packet is DNATed to, and which service port's load balancer chose it.
	RegEndpointIP   = FieldReg4
	RegEndpointPort = FieldReg5
	RegServiceLB    = FieldReg6
	// RegAffinityHash: bits 0..15 a hash of a sessionAffinity client's address, 16..23 how many were taken.
	RegAffinityHash = FieldReg7
	// RegARPScratch holds an address while the proxy ARP responder swaps sender and target
	// (uplink.go). It shares reg7 with RegAffinityHash: ARP never reaches the services tables.
	RegARPScratch = FieldReg7
)

// Table documents one table: its name, what it is for, and what happens to a packet that matches
// nothing else in it.
type Table struct {
	ID      TableID
	Name    string
	Purpose string
	// Next is where the default flow sends a packet; NoTable means the default is drop.
	Next TableID
}

// Tables is the registry of the pipeline, in packet order.
var Tables = []Table{
	{TableClassifier, "classifier", "dispatch by ingress port: tunnel, host (tun0), else a pod", TablePodIngress},
	{TableTunnelIngress, "tunnel-ingress", "accept VXLAN only from known nodes, from their subnet or own address; tun_id becomes the source VNID", NoTable},
	{TableUplinkIngress, "uplink-ingress", "accept unencapsulated traffic only from known nodes' uplink MACs and their pods' addresses; the address gives the source VNID", NoTable},
	{TableEgressReturn, "egress-return", "replies from outside the cluster to local pods' egress connections, sent back by the egress IP's holder: replies of connections committed here only", NoTable},
	{TablePodIngress, "pod-ingress", "anti-spoofing: a pod sends only from its own port, MAC and IP; load its VNID; IPv6 dropped unsampled (IPv4 only)", NoTable},
	{TableHostIngress, "host-ingress", "traffic from the host through tun0 is global (VNID 0)", TableConntrack},
	{TableConntrack, "conntrack", "send IP through conntrack so replies of NATed connections are un-NATed", TableServices},
	{TableServices, "services", "service VIPs and NodePorts: established traffic bypasses; new picks a load balancer or is rejected", TableAdminEgress},
	{TableServiceAffinity, "service-affinity", "learned sessionAffinity: client IP → endpoint (resubmitted; a miss does nothing)", NoTable},
	{TableServiceLB, "service-lb", "select an endpoint (select group, or with affinity a hash of the client's address) and DNAT to it in conntrack", NoTable},
	{TableServiceHash, "service-hash", "sessionAffinity: the slot of the client address's hash → its endpoint; an empty slot hashes again", NoTable},
	{TableServiceL2, "service-l2", "after DNAT: address the endpoint pod's MAC", TableAdminEgress},
	{TableAdminEgress, "admin-egress", "ClusterNetworkPolicy Admin tier, egress: replies pass; the first matching rule accepts (→ 54), denies, or passes to the namespace's layer", TableEgressPolicy},
	{TableEgressPolicy, "egress-policy", "NetworkPolicy egress: the source pod's policies allow the connection (→ 54), or its isolation drops it; an unselected pod goes on to the baseline tier", TableBaselineEgress},
	{TableBaselineEgress, "baseline-egress", "ClusterNetworkPolicy Baseline tier, egress: what the namespace's layer left undecided; the first matching rule accepts or denies", TableEgressClassify},
	{TableEgressClassify, "egress-classify", "traffic leaving the cluster: a pod of a namespace with an egress IP or firewall loads its egress ID; another node's egress traffic to 57", TableRouting},
	{TableEgressFirewall, "egress-firewall", "EgressNetworkPolicy: the first rule matching the destination allows or drops", TableEgressIP},
	{TableEgressIP, "egress-ip", "commit the connection and pick the namespace's egress IP into tun_dst", TableRouting},
	{TableEgressOut, "egress-out", "an egress IP held here: to the host, which SNATs to it; else tunnel to the egress IP", NoTable},
	{TableRouting, "routing", "drop UDP to a tunnel port outside the pod network (tunnel guard); find the destination: local pod, remote node subnet, or the host", NoTable},
	{TableARP, "arp", "answer and deliver ARP for pods, the gateway and remote subnets", NoTable},
	{TableAdminIngress, "admin-ingress", "ClusterNetworkPolicy Admin tier, ingress: replies go on; the first matching rule accepts (commit → 100), denies, or passes to the namespace's layer", TableIngressIsolation},
	{TableIngressIsolation, "ingress-isolation", "tenant isolation (reg0 vs reg1) or NetworkPolicy ingress (the destination pod's policies); what neither denied nor a policy allowed goes on to the baseline tier", NoTable},
	{TableBaselineIngress, "baseline-ingress", "ClusterNetworkPolicy Baseline tier, ingress: what the namespace's layer left undecided; the first matching rule accepts or denies; the rest is committed and delivered", TableOutput},
	{TableTunnelEgress, "tunnel-egress", "encapsulate towards the node that hosts the destination subnet", NoTable},
	{TableOutput, "output", "deliver to the port in reg2; hairpin back out of the ingress port via 105", NoTable},
	{TableHairpinOutput, "hairpin-output", "send a hairpinned packet back out of its ingress port", NoTable},
	{TableNetCrossTalk, "net-crosstalk", "Networks: the destination's network, the source's own or a cross-talk peer's (routed); else drop", NoTable},
	{TableNetRouting, "net-routing", "Networks: deliver to a local attachment of the destination's network, else to the tunnel", TableNetTunnel},
	{TableNetARP, "net-arp", "Networks: ARP for local attachments and the node's gateway on the network; else to the tunnel", TableNetTunnel},
	{TableNetTunnel, "net-tunnel", "Networks: VXLAN with the network's VNI to the node that has the destination's subnet", NoTable},
	{TableNetOutput, "net-output", "Networks: commit to the network's conntrack zone and deliver to the port in reg2", NoTable},
	{TableVersion, "version", "records the pipeline version; never matched by traffic", NoTable},
}

var tableByID = func() map[TableID]Table {
	m := make(map[TableID]Table, len(Tables))
	for _, t := range Tables {
		m[t.ID] = t
	}
	return m
}()

// Next returns where a table's default flow sends a packet (NoTable: it drops), for flows that continue
// as the default would.
func Next(id TableID) TableID { return tableByID[id].Next }

// LookupTable returns the registry entry of a table number.
func LookupTable(id TableID) (Table, bool) {
	t, ok := tableByID[id]
	return t, ok
}

// TableName returns a table's name, or its number when it is not in the registry.
func TableName(id TableID) string {
	if t, ok := tableByID[id]; ok {
		return t.Name
	}
	return strconv.Itoa(int(id))
}

// ParseTable accepts a table name or number.
func ParseTable(s string) (TableID, error) {
	for _, t := range Tables {
		if t.Name == s {
			return t.ID, nil
		}
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		names := make([]string, len(Tables))
		for i, t := range Tables {
			names[i] = t.Name
		}
		return 0, fmt.Errorf("unknown table %q (a number, or one of %s)", s, strings.Join(names, ", "))
	}
	return TableID(n), nil
}

// DefaultFlows are the miss flows of every table: priority 0, drop or continue to the next table.
func DefaultFlows() []Flow {
	out := make([]Flow, 0, len(Tables))
	for _, t := range Tables {
		if t.ID == TableVersion {
			continue
		}
		f := Flow{Table: t.ID, Priority: 0}
		if t.Next != NoTable {
			f.Actions = []Action{Goto{Table: t.Next}}
		}
		out = append(out, f)
	}
	return out
}

// VersionFlow stamps the pipeline version into table 253, where a restarted agent can read it back.
func VersionFlow(version uint32) Flow {
	return Flow{
		Table:    TableVersion,
		Priority: 0,
		Actions:  []Action{Uint32Note(version)},
	}
}
