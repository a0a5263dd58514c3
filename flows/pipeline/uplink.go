package pipeline

// Encapsulation "none": pod traffic to another node leaves br0 unencapsulated, pod addresses untouched,
// through an uplink port, as flannel's host-gw routes it — but in OVS, not in the host.
//
// The uplink port (PortUplink) is a patch port from br0 into the OVS bridge that holds the node's
// address (the "uplink bridge": br-ex, or the lab's br-ul), whose NORMAL switching carries the frame to
// the peer node's uplink bridge and through its patch port into its br0. Each node's br0 has a MAC of
// its own on the segment, UplinkMAC(node IP), so NORMAL learns it behind the patch port and the host's
// own MAC is never seen from two ports. On the way out (table 90) a packet for a peer on the segment
// gets eth_src = our uplink MAC and eth_dst = the peer's, and leaves by the uplink port; ARP for such a
// peer's subnet is answered at once in table 70 with the address's pod MAC (0a:58 + IP, as every pod
// MAC is), so nothing but IP crosses. On the way in, the classifier takes only frames addressed to our
// uplink MAC (other nodes' frames flooded to us are dropped), and table 15 (uplink-ingress) accepts a
// packet only from a known node's uplink MAC and from an address of that node's pods, its gateway or its own address:
//
//   - its source VNID: VXLAN carried it in tun_id; here it comes from the source address. In
//     multitenant mode every remote pod's address loads its namespace's VNID (one flow per pod, kept
//     by the node that hosts it: RemoteNode.Pods), the peer's gateway and its own address (its host)
//     load 0 (global), and
//     an address the node does not know yet is dropped — isolation fails closed, never open. In the
//     flat modes the peer's subnet is one flow with VNID 0.
//   - the MAC the destination needs: the pod MAC of the destination address (0a:58 + IP); traffic for
//     the gateway gets tun0's real MAC in table 60 (GatewayMAC).
//
// From there on the packet takes the same tables as a tunnelled one: conntrack, services, policy,
// routing, isolation (reg0 vs reg1), output. NetworkPolicy's ingress check (table 80) matches the
// source address, which is intact. Nothing else changes: services, NodePorts, hostPorts, SNAT to the
// outside and host→pod traffic enter and leave br0 exactly as with VXLAN, and replies to a host's
// service connections come back to the host's br0 to be un-NATed, because the uplink carries every
// address of the peer's subnet, its gateway included, into the peer's br0.
//
// Peers that cannot be reached that way still get VXLAN: vxlan0 stays, tunnel ingress stays open for
// every known node, and table 90 encapsulates for a peer that is not on the segment (RemoteNode.
// OnSegment: the agent finds the peer's address on-link through the uplink bridge's interface) or when
// this node has no uplink port (its address is not on an OVS bridge of its ovs-vswitchd). So a node
// accepts both forms from every peer, whatever either chose, and a change of encapsulation on a running
// cluster converges node by node without a gap in either direction.
//
// Why not host routes through tun0 (flannel's host-gw literally: br0 hands the packet to the host, which
// routes the peer's subnet to the peer's address)? Measured in the lab (lab
// BenchmarkCrossNodePaths, userspace datapath, one TCP stream, ratios to NORMAL switching alone): the
// uplink port 0.63, VXLAN 0.41, host routes through tun0 0.18 on one machine (NORMAL 46 MB/s); on a
// faster one the uplink port 0.91, VXLAN 1.04, host routes 0.67 (NORMAL 94 MB/s), where one stream is
// bound by the datapath's CPU, not by the encapsulation. Host routes lose on both: each packet crosses
// two tap devices and the host's stack on both nodes. And it is not simpler: a host
// that routes pod subnets to its peers delivers a reply addressed to its own gateway address to itself,
// around br0, which must un-NAT it (a host's connection to a ClusterIP or a NodePort whose endpoint is
// on the peer), so it needs policy routing ahead of the local table or a reserved address per subnet;
// the uplink port keeps every such packet in OVS.
//
// The price: the node's address must sit on an OVS bridge of br0's ovs-vswitchd (the userspace
// datapath's VXLAN needs the same), and the segment sees each node's uplink MAC with pod source
// addresses (clouds with port security need both allowed on the node's port).

import (
	"net"
	"net/netip"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// Encapsulation is how pod traffic crosses to other nodes (ClusterNetwork.encapsulation).
type Encapsulation string

const (
	EncapVXLAN Encapsulation = "vxlan" // every peer through vxlan0 ("" means the same)
	EncapNone  Encapsulation = "none"  // peers on the uplink segment unencapsulated, others through vxlan0
)

// PortUplink is br0's patch port into the uplink bridge (encapsulation none), requested high so it never
// takes a number OVS would give a pod.
const PortUplink uint32 = 65000

// RemotePod is another node's pod as the uplink-ingress table needs it: its address and VNID.
type RemotePod struct {
	IP   netip.Addr
	VNID uint32
}

// UplinkMAC is the MAC a node's br0 uses on the uplink segment: 0e:58 followed by the node's IPv4
// address (locally administered; pods use 0a:58 + their address).
func UplinkMAC(nodeIP netip.Addr) net.HardwareAddr {
	b := nodeIP.Unmap().As4()
	return net.HardwareAddr{0x0e, 0x58, b[0], b[1], b[2], b[3]}
}

// direct reports whether a peer gets its traffic through the uplink port.
func (s *NodeState) direct(n RemoteNode) bool {
	return s.Encapsulation == EncapNone && s.Uplink && n.OnSegment
}

// renderUplinkBase renders the classifier's dispatch of the uplink port (when br0 has one).
func renderUplinkBase(s NodeState) []Flow {
	if !s.Uplink {
		return nil
	}
	return []Flow{
		F(TableClassifier, 200, M(InPort(PortUplink), EthDst(UplinkMAC(s.NodeIP))), Goto{Table: TableUplinkIngress}),
		// Frames the segment flooded to us for another node's br0, broadcasts included.
		F(TableClassifier, 190, M(InPort(PortUplink))),
		// Never send a packet that came from the uplink back out of it.
		F(TableTunnelEgress, 300, M(InPort(PortUplink))),
	}
}

// podMACFromIPDst sets eth_dst to the pod MAC of the destination address (0a:58 + IP).
var podMACFromIPDst = []Action{Move{Src: Whole(FieldIPDst), Dst: Bits(FieldEthDst, 0, 31)}, Load{Dst: Bits(FieldEthDst, 32, 47), Value: 0x0a58}}

// renderUplinkIngress renders what table 15 accepts from one peer: its pods' addresses (with their
// VNIDs in multitenant mode) and its gateway, from its uplink MAC.
func renderUplinkIngress(s NodeState, n RemoteNode) []Flow {
	if !s.Uplink {
		return nil
	}
	from := func(src MatchField) Match { return M(append(IP, EthSrc(UplinkMAC(n.NodeIP)), src)...) }
	accept := func(vnid uint32) []Action {
		acts := append([]Action{}, podMACFromIPDst...)
		if vnid != GlobalVNID {
			acts = append([]Action{LoadReg(RegSrcVNID, vnid)}, acts...)
		}
		return append(acts, Goto{Table: TableConntrack})
	}
	// The peer's host (its gateway address, or its own address when a host process chose that source)
	// is global, as its tunnelled traffic is (tun_id 0); nothing else outside the peer's subnet is
	// accepted from it, as in table 10.
	host := F(TableUplinkIngress, 110, from(IPSrc(n.NodeIP)), accept(GlobalVNID)...)
	if s.Mode != ModeMultitenant {
		return []Flow{host, F(TableUplinkIngress, 100, from(IPSrcNet(n.Subnet)), accept(GlobalVNID)...)}
	}
	out := make([]Flow, 0, len(n.Pods)+2)
	out = append(out, host, F(TableUplinkIngress, 110, from(IPSrc(Gateway(n.Subnet))), accept(GlobalVNID)...))
	for _, p := range n.Pods {
		if n.Subnet.Contains(p.IP) {
			out = append(out, F(TableUplinkIngress, 100, from(IPSrc(p.IP)), accept(p.VNID)...))
		}
	}
	return out
}

// renderUplinkEgress renders the way to a peer on the segment: ARP for its subnet answered here, IP
// out of the uplink port to its uplink MAC.
func renderUplinkEgress(s NodeState, n RemoteNode) []Flow {
	return []Flow{
		proxyARP(n.Subnet),
		F(TableTunnelEgress, 110, M(append(IP, IPDstNet(n.Subnet))...),
			SetField{Field: FieldEthSrc, Value: MACValue(UplinkMAC(s.NodeIP))}, SetField{Field: FieldEthDst, Value: MACValue(UplinkMAC(n.NodeIP))},
			Output{Port: PortUplink}),
	}
}

// proxyARP answers ARP requests for any address of p with that address's pod MAC (0a:58 + IP), from
// br0 itself: the MAC a pod there has, so a pod's ARP cache is right whichever way the packets go.
func proxyARP(p netip.Prefix) Flow {
	return F(TableARP, 110, M(append(ARP, ARPOp(ARPRequest), ARPTPANet(p))...),
		arpReply(Move{Src: Whole(FieldARPTPA), Dst: Bits(FieldEthSrc, 0, 31)}, Load{Dst: Bits(FieldEthSrc, 32, 47), Value: 0x0a58})...)
}

// arpReply turns an ARP request into its answer and sends it back where it came from: setMAC leaves
// the answering MAC in eth_src (after the requester's moved to eth_dst), which becomes the sender's
// hardware address; the sender and target addresses swap through RegARPScratch.
func arpReply(setMAC ...Action) []Action {
	out := append([]Action{Move{Src: Whole(FieldEthSrc), Dst: Whole(FieldEthDst)}}, setMAC...)
	return append(out,
		SetField{Field: FieldARPOp, Value: uint64(ARPReply)},
		Move{Src: Whole(FieldARPSHA), Dst: Whole(FieldARPTHA)}, Move{Src: Whole(FieldEthSrc), Dst: Whole(FieldARPSHA)},
		Move{Src: Whole(FieldARPTPA), Dst: Whole(RegARPScratch)}, Move{Src: Whole(FieldARPSPA), Dst: Whole(FieldARPTPA)},
		Move{Src: Whole(RegARPScratch), Dst: Whole(FieldARPSPA)},
		Output{Port: PortInPort})
}
