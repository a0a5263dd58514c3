package pipeline

// Services in br0, without kube-proxy. One owner per service port (svc/ns/name:port) renders:
//
//   - table 40: the ClusterIP:port (and every NodePort address:nodePort) loads the port's load-balancer
//     ID into reg6 and goes to 42 (after a resubmit to 41 when sessionAffinity is ClientIP). With no
//     endpoint at all the connection is DNATed to the host's reject ports instead (see below).
//   - table 42: per endpoint, reg6+reg4+reg5 → ct(commit, DNAT to it) → 45 (and, with affinity, learn
//     the client → endpoint mapping into 41); reg6 alone → the select group, whose buckets load
//     reg4/reg5 and resubmit 42. A group holds at most MaxBucketsPerGroup buckets (an OpenFlow 1.3
//     message holds 64 KiB); bigger services get 2^k groups chosen by k low bits of the client's
//     source port (from bit 1), which is independent of the datapath hash the groups select by. UDP
//     always gets several rotated copies chosen that way, as OVS's select hash ignores UDP ports.
//   - with affinity there is no group: a hash of the client's whole address picks a slot in table 43
//     that names the endpoint, the same on every node and for every connection of the client, spread
//     as a uniform hash over the endpoints, at 3-7 flow-mods per endpoint change (services_affinity.go).
//   - its group(s), with IDs derived from the owner key (collisions probed away, see idAllocator).
//
// The shared plumbing (owner pipeline/services) sends every IP packet through conntrack in
// ZoneService, so replies are un-DNATed and established connections skip selection; DNATed packets
// towards pods get the pod's MAC (pod MACs are 0a:58 + IP), as a pod addresses a service through its
// gateway's MAC. Isolation needs nothing of its own: after DNAT the packet still carries the client's
// VNID in reg0 through routing (60) and ingress-isolation (80), locally or on the endpoint's node.
//
// Masquerade after the choice, as kube-proxy does it: the host DNATs NodePorts (node IP:nodePort →
// ServiceNodePortIP:nodePort) without touching the source, so br0 chooses the endpoint — affinity
// included — by the client's real address. Then a connection that needs it is SNATed to the gateway in
// ZoneMasquerade (table 45), so the endpoint's replies, on whichever node, return through this node
// to be un-NATed (table 30: un-masquerade, then un-DNAT): NodePorts with externalTrafficPolicy
// Cluster, and connections from the host (hostNetwork clients) whose source lies outside the cluster
// networks (table 30 flags them in reg3 bit 1; the DNAT commit keeps the flag as ct_mark bit 0, so
// every later packet is masqueraded too). externalTrafficPolicy Local keeps the client's address,
// except for the node's own connections to its NodePort (source the node's address), which take any
// endpoint, masqueraded, as kube-proxy short-circuits them.
// Masquerading uses MasqueradePortMin..Max, ports the host never picks for its own connections from
// the gateway, which br0's zone cannot see. Pods reaching a NodePort through their own node's address
// are masqueraded by the host (nodenet), as their replies must pass the host's un-DNAT.
//
// Hairpin: a packet about to leave by the port it came in by (a pod reaching itself through its
// service, or the host through tun0) is SNATed to ServiceHairpinIP in ZoneHairpin, so the reply comes
// back through br0, where table 30 un-SNATs and un-DNATs it; table 105 sends both directions back out
// of the ingress port with the MACs swapped. Whether the packet went through a service DNAT is a flag
// in reg3 set by table 45, not its ct_state, which a later ct (masquerade, a policy's commit) replaces.
// Those flows live with each pod (and tun0 in pipeline/services).
//
// Reject: OVS has no reject action and cannot set TCP flags, and ofsdn runs no controller. A service
// without endpoints DNATs the connection to the node's gateway (tun0's address) at a port in
// RejectPortMin..RejectPortMax, where the host's nftables input chain refuses it: a TCP SYN gets a
// reset and a UDP datagram ICMP port unreachable, which br0 un-DNATs on the way back (related ICMP
// included), so the client sees "connection refused" from the service address at once. From the
// host (NodePorts, hostNetwork clients) the packet goes back out of tun0, so it is hairpinned and the
// refusal comes back through br0 as well.

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strconv"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Conntrack zones of ofsdn: services (DNAT), hairpin (SNAT) and masquerade (SNAT), apart from the
// host's zone 0.
const (
	ZoneService    uint16 = 0xfff0
	ZoneHairpin    uint16 = 0xfff1
	ZoneMasquerade uint16 = 0xfff2
)

// MasqueradePortMin..MasqueradePortMax are the source ports masqueraded connections get at the
// gateway's address. The host's own connections from the gateway (kubelet probes, hostNetwork
// clients) are tracked by the kernel, not by br0's masquerade zone, so the two must not pick the same
// ports: this range lies below Linux's ephemeral ports (ip_local_port_range, 32768-60999 by default)
// and the NodePort range.
const (
	MasqueradePortMin uint16 = 1024
	MasqueradePortMax uint16 = 29999
)

// The flags services keep in RegFlags, and the service zone's ct_mark bit that remembers masquerade.
var (
	flagServiceDNAT  = Bits(RegFlags, 0, 0)
	flagMasquerade   = Bits(RegFlags, 1, 1)
	ctMarkMasquerade = Bits(FieldCtMark, 0, 0)
)

const ctMarkMasqueradeBit uint32 = 1

// The gateway ports a service without endpoints is DNATed to; the host kernel refuses them.
const (
	RejectPortMin uint16 = 65400
	RejectPortMax uint16 = 65499
)

// MaxBucketsPerGroup keeps a group-mod well inside an OpenFlow 1.3 message: a bucket of two register
// loads and a resubmit is 80 bytes, so 512 buckets take 41 KiB of the 64 KiB.
const MaxBucketsPerGroup = 512

// udpRotations is how many rotated copies of its group a UDP load balancer has (see renderLB).
const udpRotations = 8

// Addresses br0 answers for itself (ARP from tun0 included), from the link-local range no pod or node uses.
var (
	// ServiceHairpinIP is the source of hairpinned service traffic; the host routes it via tun0.
	ServiceHairpinIP = netip.AddrFrom4([4]byte{169, 254, 169, 2})
	// ServiceNodePortIP is where the host DNATs NodePort traffic (node IP:nodePort → this:nodePort)
	// into br0; the agent lists it in NodeState.NodePortAddresses.
	ServiceNodePortIP = netip.AddrFrom4([4]byte{169, 254, 169, 3})
	// ServiceMAC answers ARP for those addresses and is the source MAC of hairpinned packets.
	ServiceMAC = net.HardwareAddr{0x0a, 0x58, 169, 254, 169, 2}
)

// ServicesOwner owns the plumbing every service relies on (conntrack, bypass, MACs, hairpin via tun0).
var ServicesOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "services"}

// ServiceState is one Service with a ClusterIP and its endpoints, as the agent assembles it from the
// Service and its EndpointSlices.
type ServiceState struct {
	Namespace, Name string
	ClusterIP       netip.Addr // not valid: headless, nothing to render
	Ports           []ServicePort
	// AffinityTimeout is sessionAffinity ClientIP's timeout in seconds; 0 means no affinity. OpenFlow
	// timeouts are 16 bits: longer ones are capped at 65535 s.
	AffinityTimeout uint32
	ExternalLocal   bool // externalTrafficPolicy: Local (NodePort: local endpoints, client IP kept)
	InternalLocal   bool // internalTrafficPolicy: Local (ClusterIP: local endpoints only)
}

// ServicePort is one port of a service and the endpoints that serve it.
type ServicePort struct {
	Name      string // may be empty for a single-port service
	Protocol  uint8  // IPProtoTCP, IPProtoUDP or IPProtoSCTP
	Port      uint16
	NodePort  uint16 // 0: none
	Endpoints []Endpoint
}

// Endpoint is one address serving a service port (an EndpointSlice endpoint with the port resolved).
type Endpoint struct {
	IP                          netip.Addr
	Port                        uint16
	Ready, Serving, Terminating bool
	NodeName                    string
	Local                       bool   // on this node
	VNID                        uint32 // its namespace's VNID (informative: isolation is enforced after DNAT)
}

// key names the port inside its owner: the port's name, or number/protocol when it has none.
func (p ServicePort) key() string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Port)) + "/" + ProtoName(p.Protocol)
}

// ServicePortOwner is the owner of one service port's flows and groups.
func ServicePortOwner(svc ServiceState, p ServicePort) reconcile.Owner {
	return ServiceOwner(svc.Namespace, svc.Name, p.key())
}

// l4Dst and l4Src return the protocol's port fields, or false for a protocol services do not carry.
func l4Fields(proto uint8) (dst, src Field, ok bool) {
	switch proto {
	case IPProtoTCP:
		return FieldTCPDst, FieldTCPSrc, true
	case IPProtoUDP:
		return FieldUDPDst, FieldUDPSrc, true
	case IPProtoSCTP:
		return FieldSCTPDst, FieldSCTPSrc, true
	}
	return 0, 0, false
}

// eligible picks the endpoints that take new connections, as kube-proxy does: the ready ones, or
// when there are none, the serving ones that are terminating. Sorted and deduplicated, so buckets and
// flows are stable whatever order the EndpointSlices came in. Ready is what the EndpointSlice says,
// terminating or not: a Service with publishNotReadyAddresses keeps its terminating pods ready (the
// upstream test "should create endpoints for unready pods" found them refused).
func eligible(eps []Endpoint, localOnly bool) []Endpoint {
	var ready, terminating []Endpoint
	for _, e := range eps {
		if !e.IP.Is4() || e.Port == 0 || (localOnly && !e.Local) {
			continue
		}
		switch {
		case e.Ready:
			ready = append(ready, e)
		case e.Serving && e.Terminating:
			terminating = append(terminating, e)
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	return slices.CompactFunc(out, func(a, b Endpoint) bool { return a.IP == b.IP && a.Port == b.Port })
}

// frontend is one address:port a service port is reached at, and what serves it there.
type frontend struct {
	addr     netip.Addr
	port     uint16
	local    bool       // served by the local-endpoints load balancer
	eps      []Endpoint // eligible endpoints for this frontend
	reject   bool       // the service has no endpoint at all
	nodePort bool
}

// frontends lists where a service port is reached: its ClusterIP, and with a nodePort every NodePort
// address. Traffic policies choose cluster-wide or local endpoints per kind.
func frontends(s NodeState, svc ServiceState, p ServicePort) []frontend {
	all := eligible(p.Endpoints, false)
	var local []Endpoint
	if svc.InternalLocal || svc.ExternalLocal {
		local = eligible(p.Endpoints, true)
	}
	mk := func(addr netip.Addr, port uint16, useLocal, nodePort bool) frontend {
		f := frontend{addr: addr, port: port, local: useLocal, eps: all, reject: len(all) == 0, nodePort: nodePort}
		if useLocal {
			f.eps = local
		}
		return f
	}
	out := []frontend{mk(svc.ClusterIP, p.Port, svc.InternalLocal, false)}
	if p.NodePort != 0 {
		for _, a := range s.NodePortAddresses {
			if a.Is4() {
				out = append(out, mk(a, p.NodePort, svc.ExternalLocal, true))
			}
		}
	}
	return out
}

// idAllocator hands out group and load-balancer IDs derived from keys (FNV-1a), so IDs survive
// restarts and re-renders. A collision with another key is detected and probed away deterministically
// (keys are allocated in sorted order within a render).
type idAllocator struct {
	used   map[uint32]string
	record []idGrant // the grants since it was last emptied (a memo's IDs)
}

func newIDAllocator() *idAllocator { return &idAllocator{used: map[uint32]string{}} }

// maxGroupID stays below OFPG_MAX (0xffffff00) and leaves the top bit to anything else.
const maxGroupID = 0x7fffffff

func (a *idAllocator) get(key string) (uint32, error) {
	id, err := a.peek(key)
	if err == nil {
		a.used[id] = key
		a.record = append(a.record, idGrant{key, id})
	}
	return id, err
}

// peek returns the ID get would grant key, granting nothing.
func (a *idAllocator) peek(key string) (uint32, error) {
	for i := 0; i < 64; i++ {
		k := key
		if i > 0 {
			k = key + "#" + strconv.Itoa(i)
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(k))
		id := h.Sum32() & maxGroupID
		if id == 0 {
			continue
		}
		if prev, taken := a.used[id]; taken && prev != key {
			continue
		}
		return id, nil
	}
	return 0, fmt.Errorf("no free group ID for %s", key)
}

// serviceMemo is one service port's last render: the key of its inputs, the IDs it was given and its
// output.
type serviceMemo struct {
	memo
	ids []idGrant
}

// servicePortKey is the key of what a service port's owner renders from: the service (its other ports
// aside), the port, and of the node its address, gateway and NodePort addresses (frontends, the node's
// own NodePort clients, the reject target).
func servicePortKey(s *NodeState, svc *ServiceState, p *ServicePort) digest {
	var w keyWriter
	w.init()
	svc.writeKey(&w)
	p.writeKey(&w)
	w.prefix(s.LocalSubnet)
	w.addr(s.NodeIP)
	w.u64(uint64(len(s.NodePortAddresses)))
	for _, a := range s.NodePortAddresses {
		w.addr(a)
	}
	return w.sum()
}

// idGrant is one ID an owner's render asked the allocator for.
type idGrant struct {
	key string
	id  uint32
}

// reusable reports whether the memo still renders it: the same key, and the allocator grants the same
// IDs in the same order (a collision with a new key would move them).
func (m *serviceMemo) reusable(key digest, ids *idAllocator) bool {
	if m.key != key {
		return false
	}
	// Grant as the render did, in order; a fresh render after a mismatch asks for the same keys again
	// and gets the same IDs for those already granted.
	for _, g := range m.ids {
		if id, err := ids.peek(g.key); err != nil || id != g.id {
			return false
		}
		_, _ = ids.get(g.key)
	}
	return true
}

// renderServices adds the services' owners to out (each local pod's hairpin flows are its own, see
// Render). A service port that cannot be rendered is recorded in failed, and the others render.
func (r *Renderer) renderServices(s NodeState, out map[reconcile.Owner]reconcile.OwnerState, failed map[reconcile.Owner]error) {
	type item struct {
		owner reconcile.Owner
		key   string // owner.String(), the sort key
		svc   *ServiceState
		port  *ServicePort
	}
	var items []item
	for i := range s.Services {
		svc := &s.Services[i]
		if !svc.ClusterIP.Is4() {
			continue // headless, or IPv6 which ofsdn does not carry yet
		}
		for j := range svc.Ports {
			p := &svc.Ports[j]
			if _, _, ok := l4Fields(p.Protocol); !ok || p.Port == 0 {
				continue
			}
			o := ServicePortOwner(*svc, *p)
			items = append(items, item{o, o.String(), svc, p})
		}
	}
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.key, b.key) })
	ids := newIDAllocator()
	memos := make(map[reconcile.Owner]serviceMemo, len(items))
	for _, it := range items {
		if _, dup := out[it.owner]; dup {
			failed[it.owner] = fmt.Errorf("two ports of service %s/%s are both %s", it.svc.Namespace, it.svc.Name, it.owner)
			delete(out, it.owner)
			continue
		}
		if failed[it.owner] != nil {
			continue
		}
		key := servicePortKey(&s, it.svc, it.port)
		if m, ok := r.services[it.owner]; ok && m.reusable(key, ids) {
			out[it.owner] = m.out
			memos[it.owner] = m
			continue
		}
		ids.record = ids.record[:0]
		st, err := renderServicePort(s, *it.svc, *it.port, ids)
		if err != nil {
			failed[it.owner] = err
			continue
		}
		sampleDrops(st.Flows)
		out[it.owner] = st
		memos[it.owner] = serviceMemo{memo: memo{key: key, out: st}, ids: slices.Clone(ids.record)}
	}
	r.services = memos
}

// renderServicesBase renders the shared service plumbing of a node.
func renderServicesBase(s NodeState) []Flow {
	gw := Gateway(s.LocalSubnet)
	unNAT := func(table TableID, zone uint16) CT {
		return CT{Table: table, Zone: zone, NAT: &NAT{Kind: NATReverse}}
	}
	nets := s.ClusterNetworks
	if len(nets) == 0 {
		nets = []netip.Prefix{s.LocalSubnet}
	}
	masquerade := CT{Commit: true, Table: TableAdminEgress, Zone: ZoneMasquerade,
		NAT: &NAT{Kind: NATSrc, AddrMin: gw, PortMin: MasqueradePortMin, PortMax: MasqueradePortMax}}
	markDNAT := Load{Dst: flagServiceDNAT, Value: 1}
	dnatOriginal := CtState(CtDNAT|CtTrk, CtRpl)
	toPodMAC := []Action{Move{Src: Whole(FieldIPDst), Dst: Bits(FieldEthDst, 0, 31)}, Load{Dst: Bits(FieldEthDst, 32, 47), Value: 0x0a58}}
	out := []Flow{
		// Replies to the hairpin address: un-SNAT first (only untracked packets, so it runs once),
		// then back into this table for the other zones.
		F(TableConntrack, 200, M(append(IP, IPDst(ServiceHairpinIP), CtState(0, CtTrk))...), unNAT(TableConntrack, ZoneHairpin)),
		// Replies to the gateway, straight or un-hairpinned: un-masquerade (nothing happens to the
		// host's own traffic, which the masquerade zone never saw), then back for the service zone.
		F(TableConntrack, 190, M(append(IP, IPDst(gw), CtState(0, CtTrk))...), unNAT(TableConntrack, ZoneMasquerade)),
		F(TableConntrack, 190, M(append(IP, IPDst(gw), CtZone(ZoneHairpin))...), unNAT(TableConntrack, ZoneMasquerade)),
		// A connection from the host (hostNetwork clients, NodePorts) whose source is outside the
		// cluster networks is masqueraded once its endpoint is chosen, as kube-proxy does: the
		// endpoint's replies, wherever it is, come back to this node's gateway to be un-NATed.
		F(TableConntrack, 110, M(append(IP, InPort(PortTun0))...), Load{Dst: flagMasquerade, Value: 1}, unNAT(TableServices, ZoneService)),
		F(TableConntrack, 100, M(IP...), unNAT(TableServices, ZoneService)),
		// Established and related traffic, and any later packet of a DNATed connection (a SYN
		// retransmitted, a second UDP datagram before the first reply) was translated by table 30.
		F(TableServices, 300, M(CtState(CtEst|CtTrk, 0)), Goto{Table: TableServiceL2}),
		F(TableServices, 300, M(CtState(CtRel|CtTrk, 0)), Goto{Table: TableServiceL2}),
		F(TableServices, 300, M(CtState(CtDNAT|CtTrk, 0)), Goto{Table: TableServiceL2}),
		// Every original-direction packet of a DNATed connection is flagged for the hairpin check.
		// A rejected connection goes to the host as it is: it was addressed to the gateway's MAC.
		F(TableServiceL2, 300, M(append(IP, dnatOriginal, IPDst(gw))...), markDNAT, Goto{Table: TableAdminEgress}),
		// Marked for masquerade when it was committed (ct_mark, from reg3 bit 1): SNAT to the gateway
		// after the choice, in a zone of its own, at ports the host never picks as its own.
		F(TableServiceL2, 240, M(append(IP, dnatOriginal, CtMark(ctMarkMasqueradeBit, ctMarkMasqueradeBit))...), markDNAT, masquerade),
		F(TableServiceL2, 100, M(append(IP, dnatOriginal)...), markDNAT, Goto{Table: TableAdminEgress}),
		F(TableHairpinOutput, 100, M(),
			Move{Src: Whole(FieldEthSrc), Dst: Whole(FieldEthDst)}, SetField{Field: FieldEthSrc, Value: MACValue(ServiceMAC)},
			Output{Port: PortInPort}),
	}
	for _, cn := range nets {
		if !cn.Addr().Is4() {
			continue
		}
		cn = cn.Masked()
		out = append(out,
			F(TableConntrack, 120, M(append(IP, InPort(PortTun0), IPSrcNet(cn))...), unNAT(TableServices, ZoneService)),
			F(TableServiceL2, 250, M(append(IP, dnatOriginal, CtMark(ctMarkMasqueradeBit, ctMarkMasqueradeBit), IPDstNet(cn))...),
				append(append(slices.Clone(toPodMAC), markDNAT), masquerade)...),
			F(TableServiceL2, 200, M(append(IP, dnatOriginal, IPDstNet(cn))...),
				append(append(slices.Clone(toPodMAC), markDNAT), Goto{Table: TableAdminEgress})...))
	}
	for _, a := range []netip.Addr{ServiceHairpinIP, ServiceNodePortIP} {
		out = append(out, arpResponder(a, ServiceMAC))
	}
	out = append(out, affinityRehash()...)
	return append(out, HairpinFlows(PortTun0)...)
}

// arpResponder answers ARP requests for ip with mac, from br0 itself.
func arpResponder(ip netip.Addr, mac net.HardwareAddr) Flow {
	v, _ := IPv4Value(ip)
	return F(TableARP, 250, M(append(ARP, ARPOp(ARPRequest), ARPTPA(ip))...),
		Move{Src: Whole(FieldEthSrc), Dst: Whole(FieldEthDst)}, SetField{Field: FieldEthSrc, Value: MACValue(mac)},
		SetField{Field: FieldARPOp, Value: uint64(ARPReply)},
		Move{Src: Whole(FieldARPSHA), Dst: Whole(FieldARPTHA)}, SetField{Field: FieldARPSHA, Value: MACValue(mac)},
		Move{Src: Whole(FieldARPSPA), Dst: Whole(FieldARPTPA)}, SetField{Field: FieldARPSPA, Value: v},
		Output{Port: PortInPort})
}

// HairpinFlows are a port's hairpin flows in table 100: a packet routed back out of the port it came
// in by is SNATed to ServiceHairpinIP when it is the original direction of a service-DNATed connection
// (reg3 bit 0, set in table 45), and leaves through table 105 either way (OpenFlow drops output to the
// ingress port otherwise).
func HairpinFlows(port uint32) []Flow {
	if port == 0 {
		return nil
	}
	back := M(append(IP, InPort(port), Reg(RegOutPort, port))...)
	return []Flow{
		F(TableOutput, 300, back.With(RegBits(flagServiceDNAT, 1)),
			CT{Commit: true, Table: TableHairpinOutput, Zone: ZoneHairpin, NAT: &NAT{Kind: NATSrc, AddrMin: ServiceHairpinIP}}),
		F(TableOutput, 290, back, Goto{Table: TableHairpinOutput}),
	}
}

// RenderServicePort renders one service port's flows and groups. ids hands out the group and
// load-balancer IDs; Render shares one allocator over all services so IDs never collide.
func renderServicePort(s NodeState, svc ServiceState, p ServicePort, ids *idAllocator) (reconcile.OwnerState, error) {
	dstField, srcField, ok := l4Fields(p.Protocol)
	if !ok {
		return reconcile.OwnerState{}, fmt.Errorf("protocol %d not supported", p.Protocol)
	}
	owner := ServicePortOwner(svc, p)
	key := owner.String()
	proto := Proto(p.Protocol)
	var st reconcile.OwnerState
	lbs := map[bool]uint32{} // local? → load-balancer ID
	// lbFor renders the cluster-wide or the local load balancer once, and returns its ID.
	lbFor := func(local bool, eps []Endpoint) (uint32, error) {
		if lb, seen := lbs[local]; seen {
			return lb, nil
		}
		variant := "cluster"
		if local {
			variant = "local"
		}
		lb, err := ids.get(key + "#" + variant)
		if err != nil {
			return 0, err
		}
		lbs[local] = lb
		flows, groups, err := renderLB(owner, lb, p.Protocol, srcField, eps, svc.AffinityTimeout, ids, key+"#"+variant)
		if err != nil {
			return 0, err
		}
		st.Flows = append(st.Flows, flows...)
		st.Groups = append(st.Groups, groups...)
		return lb, nil
	}
	// toLB sends a frontend's new connections to load balancer lb; masquerade is for NodePorts only.
	toLB := func(m Match, priority uint16, lb uint32, nodePort bool, masquerade uint64) {
		acts := []Action{LoadReg(RegServiceLB, lb)}
		if nodePort {
			acts = append(acts, Load{Dst: flagMasquerade, Value: masquerade})
		}
		if svc.AffinityTimeout > 0 {
			acts = append(acts, Resubmit{Table: TableServiceAffinity})
		}
		st.Flows = append(st.Flows, F(TableServices, priority, m, append(acts, Goto{Table: TableServiceLB})...))
	}
	all := eligible(p.Endpoints, false)
	for _, fe := range frontends(s, svc, p) {
		m := M(append(proto, IPDst(fe.addr), Exact(dstField, uint64(fe.port)))...)
		if fe.reject {
			st.Flows = append(st.Flows, F(TableServices, 100, m, CT{Commit: true, Table: TableServiceL2, Zone: ZoneService,
				NAT: &NAT{Kind: NATDst, AddrMin: Gateway(s.LocalSubnet), PortMin: RejectPortMin, PortMax: RejectPortMax}}))
			continue
		}
		if fe.nodePort && fe.local && s.NodeIP.Is4() {
			// externalTrafficPolicy Local does not hold for the node's own connections (their source
			// is the node's address), as kube-proxy short-circuits them: any endpoint, masqueraded so
			// that its replies come back here (found by the upstream Services tests).
			lb, err := lbFor(false, all)
			if err != nil {
				return reconcile.OwnerState{}, err
			}
			toLB(m.With(IPSrc(s.NodeIP)), 110, lb, true, 1)
		}
		if len(fe.eps) == 0 {
			// Local traffic policy and no local endpoint: drop, as kube-proxy does.
			st.Flows = append(st.Flows, F(TableServices, 100, m))
			continue
		}
		lb, err := lbFor(fe.local, fe.eps)
		if err != nil {
			return reconcile.OwnerState{}, err
		}
		// externalTrafficPolicy Cluster masquerades NodePorts (the endpoint may be on another node, and
		// its replies must come back here), Local keeps the client's address (table 30 flagged a client
		// outside the cluster networks).
		masquerade := uint64(1)
		if fe.local {
			masquerade = 0
		}
		toLB(m, 100, lb, fe.nodePort, masquerade)
	}
	return st, nil
}

// renderLB renders one load balancer: a DNAT flow per endpoint, and the select group(s) that pick one.
func renderLB(owner reconcile.Owner, lb uint32, proto uint8, srcField Field, eps []Endpoint, affinity uint32, ids *idAllocator, key string) ([]Flow, []GroupEntry, error) {
	var flows []Flow
	for _, e := range eps {
		ip, _ := IPv4Value(e.IP)
		var acts []Action
		if affinity > 0 {
			acts = append(acts, affinityLearn(owner, affinity))
		}
		acts = append(acts, CT{Commit: true, Table: TableServiceL2, Zone: ZoneService,
			NAT: &NAT{Kind: NATDst, AddrMin: e.IP, PortMin: e.Port}, Exec: []Action{Move{Src: flagMasquerade, Dst: ctMarkMasquerade}}})
		flows = append(flows, F(TableServiceLB, 200,
			M(append(Proto(proto), Reg(RegServiceLB, lb), Reg(RegEndpointIP, uint32(ip)), Reg(RegEndpointPort, uint32(e.Port)))...),
			acts...))
	}
	if affinity > 0 {
		choice, err := affinityChoice(proto, lb, eps)
		return append(flows, choice...), nil, err
	}
	// Split into 2^k groups by bits 1..k of the client's source port: part i holds every
	// endpoint j with j mod parts = i, so no group outgrows a message.
	parts := 1
	for len(eps) > parts*MaxBucketsPerGroup {
		parts *= 2
	}
	// OVS hashes a select group's packet with sym_l4, which leaves UDP ports out: one client's UDP
	// flows would all land on one endpoint. So UDP gets udpRotations copies of each part, its buckets
	// rotated, picked by more source-port bits: the port then matters after all.
	n := parts
	if proto == IPProtoUDP {
		n = parts * udpRotations
	}
	var groups []GroupEntry
	for i := 0; i < n; i++ {
		gid := lb
		m := M(append(Proto(proto), Reg(RegServiceLB, lb))...)
		if n > 1 {
			var err error
			if gid, err = ids.get(key + "#group" + strconv.Itoa(i)); err != nil {
				return nil, nil, err
			}
			// Bits 1..k, not 0: Linux gives connect() even source ports.
			m = m.With(Masked(srcField, uint64(i)<<1, uint64(n-1)<<1))
		}
		var members []Endpoint
		for j := i % parts; j < len(eps); j += parts {
			members = append(members, eps[j])
		}
		rot := (i / parts) * len(members) / (n / parts)
		members = append(members[rot:], members[:rot]...)
		g := GroupEntry{ID: gid, Type: GroupSelect}
		for _, e := range spreadBuckets(members) {
			ip, _ := IPv4Value(e.IP)
			g.Buckets = append(g.Buckets, Bucket{Weight: 1, Actions: []Action{
				LoadReg(RegEndpointIP, uint32(ip)), LoadReg(RegEndpointPort, uint32(e.Port)),
				Resubmit{Table: TableServiceLB}}})
		}
		groups = append(groups, g)
		flows = append(flows, F(TableServiceLB, 100, m, ToGroup{ID: gid}))
	}
	return flows, groups, nil
}

// evenBuckets is how many buckets a small load balancer is stretched to. OVS's select groups map 2^k
// hash values (at least 16) onto the buckets, so with few buckets the remainder skews the split: 3
// endpoints get 6, 5 and 5 of 16 (37.5% for the first), 10 get 2 or 1 of 16 (twice as much for some).
// Interleaved copies of the endpoint list up to 64 buckets make OVS use 64 values and give each
// endpoint at most one value more than another (3 endpoints: 34.4/32.8/32.8%).
const evenBuckets = 64

// spreadBuckets interleaves copies of eps (a, b, c, a, b, c, …) up to evenBuckets entries. A power of
// two of endpoints divides OVS's hash values evenly as it is.
func spreadBuckets(eps []Endpoint) []Endpoint {
	if n := len(eps); n == 0 || n&(n-1) == 0 || n > evenBuckets/2 {
		return eps
	}
	out := make([]Endpoint, 0, evenBuckets)
	for range evenBuckets / len(eps) {
		out = append(out, eps...)
	}
	return out
}

// affinityLearn remembers client IP → endpoint for this load balancer in table 41. The learned flow is
// only hit by new connections (established ones bypass table 40), so its idle timeout counts from the
// client's last new connection, as kube-proxy's does. delete_learned drops the memory with the
// endpoint's DNAT flow.
func affinityLearn(owner reconcile.Owner, timeout uint32) Learn {
	t := uint16(min(timeout, 0xffff))
	lb, eip, eport, src := Whole(RegServiceLB), Whole(RegEndpointIP), Whole(RegEndpointPort), Whole(FieldIPSrc)
	return Learn{
		Table: TableServiceAffinity, Priority: 100, IdleTimeout: t, DeleteLearned: true,
		Cookie: reconcile.LearnedCookie(owner),
		Specs: []LearnSpec{
			{Kind: LearnMatch, Dst: Whole(FieldEthType), SrcValue: uint64(EthTypeIPv4)},
			{Kind: LearnMatch, Dst: lb, Src: &lb},
			{Kind: LearnMatch, Dst: src, Src: &src},
			{Kind: LearnLoad, Dst: eip, Src: &eip},
			{Kind: LearnLoad, Dst: eport, Src: &eport},
		},
	}
}

// StaleConntrack compares two states and returns the UDP and SCTP conntrack entries to flush: for
// every service address, the endpoints (or the reject target) it DNATed to before and no longer does.
// TCP needs none: its connections end, and a reset follows a removed endpoint.
func StaleConntrack(old, new NodeState) []ConntrackFlush {
	before, after := conntrackTargets(old), conntrackTargets(new)
	var out []ConntrackFlush
	for k := range before {
		if !after[k] {
			out = append(out, k)
		}
	}
	return sortFlushes(out)
}

// StaleConntrackHeld is StaleConntrack for an agent that has no previous state (it just started): of
// the DNATed UDP and SCTP entries conntrack holds in ZoneService (each as its original destination and
// its reply's source), those s no longer DNATs to — endpoints removed, services deleted while no agent
// ran.
func StaleConntrackHeld(s NodeState, held []ConntrackFlush) []ConntrackFlush {
	now := conntrackTargets(s)
	seen := map[ConntrackFlush]bool{}
	var out []ConntrackFlush
	for _, k := range held {
		if (k.Protocol != IPProtoUDP && k.Protocol != IPProtoSCTP) || k.Dst == k.ReplySrc || now[k] || seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, k)
	}
	return sortFlushes(out)
}

// conntrackTargets lists, for every UDP and SCTP service address of s, the endpoints (or the reject
// target) its connections are DNATed to.
func conntrackTargets(s NodeState) map[ConntrackFlush]bool {
	out := map[ConntrackFlush]bool{}
	for _, svc := range s.Services {
		if !svc.ClusterIP.Is4() {
			continue
		}
		for _, p := range svc.Ports {
			if p.Protocol != IPProtoUDP && p.Protocol != IPProtoSCTP {
				continue
			}
			for _, fe := range frontends(s, svc, p) {
				k := ConntrackFlush{Protocol: p.Protocol, Dst: fe.addr, DstPort: fe.port}
				if fe.reject {
					k.ReplySrc = Gateway(s.LocalSubnet)
					out[k] = true
				}
				for _, e := range fe.eps {
					k.ReplySrc = e.IP
					out[k] = true
				}
			}
		}
	}
	return out
}

func sortFlushes(out []ConntrackFlush) []ConntrackFlush {
	slices.SortFunc(out, func(a, b ConntrackFlush) int {
		return cmp.Or(a.Dst.Compare(b.Dst), cmp.Compare(a.DstPort, b.DstPort), cmp.Compare(a.Protocol, b.Protocol),
			a.ReplySrc.Compare(b.ReplySrc))
	})
	return out
}
