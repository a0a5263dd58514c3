package pipeline

// Networks: pod networks besides the cluster network (network.ofsdn.io Network). Each is a segment of
// its own across the nodes, and its flows never meet the cluster network's:
//
//   - Its VNI (MinNetworkVNI..MaxNetworkVNI, above every tenant's VNID) is its tun_id on the wire and
//     its ID in br0: classification loads it into reg0 (the source's VNI, as for tenants), and every
//     address match of the network tables qualifies on it, so two pods with the same address on two
//     networks are two different destinations. From table 20 (a pod's attachment port, anti-spoofed by
//     port, MAC and address) and table 10 (tun_id = the VNI from a known node, the inner source in that
//     node's subnet of the network) a network's packets go to the network tables 130-145 and never to
//     the cluster network's 30-105; a tunnelled packet with a VNI in the networks' range that no flow
//     claims is dropped (priority 140 in table 10), never taken for the cluster network's.
//   - Its connections are committed to conntrack in a zone of its own (NetworkZone) where they are
//     delivered, so a network's connections are apart from every other network's and the cluster
//     network's even at the same addresses (`ovs-appctl dpctl/dump-conntrack zone=N` lists one).
//   - Cross-talk: two networks whose addresses do not overlap and that the controller lets talk
//     (status.crossTalk) are routed to each other in br0. Table 130 decides the destination's network
//     (reg1): the source's own, or a cross-talk peer's (then eth_src = the peer's gateway MAC, TTL - 1),
//     anything else is dropped. The packet travels on the destination network's segment (tun_id = its
//     VNI), so the receiving node accepts, for that network, sources in the sending node's subnets of
//     the network and of its cross-talk peers, delivers them on that network only (never routed
//     again), and drops the rest.
//   - Every network's traffic goes through the VXLAN tunnel, in both encapsulations: network addresses
//     may overlap each other and the cluster network's, so the underlay could not route them (with
//     encapsulation none the cluster network is unencapsulated and networks still tunnel).
//   - A pod reaches its network's other pods on-link (ARP crosses the overlay as on the cluster network)
//     and a cross-talk peer through its node's gateway on the network (the first address of the node's
//     subnet, answered by proxy ARP with NetworkGatewayMAC). Nothing on a network reaches the host, the
//     cluster network, services or the outside: a network is closed unless cross-talk opens it.
//
// Owners: a network's own flows (tunnels to and from its nodes, cross-talk, gateway) are NetworkOwner's;
// an attachment's (anti-spoofing, delivery, ARP) its pod interface's, AttachmentOwner.

import (
	"net"
	"net/netip"
	"slices"
	"strings"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// NetworkState is one Network as this node renders it.
type NetworkState struct {
	Name string
	VNI  uint32
	CIDR netip.Prefix
	// LocalSubnet is this node's subnet of the network (its NetworkSubnet); invalid until the
	// controller gave one. Its first address is the pods' gateway on the network.
	LocalSubnet netip.Prefix
	// Remotes are the other nodes' subnets of the network.
	Remotes []NetworkRemote
	// CrossTalk names the networks this one exchanges traffic with (the Network's status.crossTalk:
	// non-overlapping, either side asked). Names not among NodeState.Networks are ignored.
	CrossTalk []string
}

// NetworkRemote is another node's subnet of a network and where to tunnel to reach it.
type NetworkRemote struct {
	Node   string
	NodeIP netip.Addr
	Subnet netip.Prefix
}

// AttachmentState is a local pod's interface on a network.
type AttachmentState struct {
	Namespace, Name string
	Interface       string // in the pod: net1, ...
	Network         string
	VNI             uint32 // the network's
	IP              netip.Addr
	MAC             net.HardwareAddr
	OFPort          uint32
}

// NetworkOwner owns a network's own flows on this node.
func NetworkOwner(name string) reconcile.Owner { return Object{Kind: KindNetwork, Name: name}.Owner() }

// AttachmentOwner owns one pod interface's flows on a network: "pod/ns/name@net1".
func AttachmentOwner(namespace, name, iface string) reconcile.Owner {
	return Object{Kind: KindPod, Namespace: namespace, Name: name, Interface: iface}.Owner()
}

// IsNetworkVNI says whether a VNI is a Network's rather than a tenant's.
func IsNetworkVNI(vni uint32) bool {
	return vni >= networkv1.MinNetworkVNI && vni <= networkv1.MaxNetworkVNI
}

// NetworkZone is a network's conntrack zone: 0xe000 plus the VNI's offset in the networks' range, apart
// from the services' zones (ZoneService...) and every other network's.
func NetworkZone(vni uint32) uint16 { return 0xe000 | uint16((vni-networkv1.MinNetworkVNI)&0xfff) }

// NetworkGatewayMAC is the MAC every node's gateway on a network answers ARP with: locally
// administered, 0a:59 and the VNI, never a pod's (0a:58...).
func NetworkGatewayMAC(vni uint32) net.HardwareAddr {
	return net.HardwareAddr{0x0a, 0x59, 0, byte(vni >> 16), byte(vni >> 8), byte(vni)}
}

// Priorities of the network flows in table 10 (the cluster network's are 100).
const (
	networkTunnelPriority     = 150 // a network's tunnels from its nodes
	networkTunnelDropPriority = 140 // any other VNI of the networks' range
)

// networkVNIRange matches a tun_id in the networks' range (MinNetworkVNI's bits set).
var networkVNIRange = Masked(FieldTunID, uint64(networkv1.MinNetworkVNI), uint64(networkv1.MinNetworkVNI))

// renderNetworksBase renders the networks' plumbing every node has, networks or not: no tunnelled
// packet with a network's VNI is ever taken for the cluster network's, and nothing from the tunnel goes
// back into it.
func renderNetworksBase() []Flow {
	return []Flow{
		F(TableTunnelIngress, networkTunnelDropPriority, M(networkVNIRange)),
		F(TableNetTunnel, 300, M(InPort(PortVXLAN))),
	}
}

// NetworkPeers returns the networks n (one of s.Networks) exchanges traffic with, in n.CrossTalk's order. Two networks talk
// when each names the other (status.crossTalk is symmetric), their addresses do not overlap, and
// neither has another candidate whose addresses overlap the other's: a destination address must name
// one network, and the rule gives the same answer from either side.
func (s *NodeState) NetworkPeers(n *NetworkState) []*NetworkState {
	var out []*NetworkState
	candidates := s.talkCandidates(n)
	for _, p := range candidates {
		if !overlapsAnyBut(candidates, p, p.CIDR) && !overlapsAnyBut(s.talkCandidates(p), n, n.CIDR) {
			out = append(out, p)
		}
	}
	return out
}

// talkCandidates are the networks n and they name each other, with addresses apart from n's.
func (s *NodeState) talkCandidates(n *NetworkState) []*NetworkState {
	var out []*NetworkState
	for _, name := range n.CrossTalk {
		p := s.network(name)
		if p != nil && p != n && p.VNI != n.VNI && p.CIDR.IsValid() && !p.CIDR.Overlaps(n.CIDR) && slices.Contains(p.CrossTalk, n.Name) &&
			!slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (s *NodeState) network(name string) *NetworkState {
	for i := range s.Networks {
		if s.Networks[i].Name == name {
			return &s.Networks[i]
		}
	}
	return nil
}

// overlapsAnyBut says whether a network of nets other than but has addresses overlapping p.
func overlapsAnyBut(nets []*NetworkState, but *NetworkState, p netip.Prefix) bool {
	for _, q := range nets {
		if q != but && q.CIDR.Overlaps(p) {
			return true
		}
	}
	return false
}

// RenderNetwork renders a network's own flows: its tunnels from and to the nodes that have a subnet of
// it, cross-talk with peers (the networks it talks to, as NetworkPeers gives them), its gateway's
// proxy ARP and its delivery into its conntrack zone.
func RenderNetwork(n NetworkState, peers []*NetworkState) []Flow {
	vni := n.VNI
	zone := NetworkZone(vni)
	out := []Flow{
		// The destination is on the source's own network...
		F(TableNetCrossTalk, 100, M(append(IP, Reg(RegSrcVNID, vni), IPDstNet(n.CIDR))...),
			LoadReg(RegDstVNID, vni), Goto{Table: TableNetRouting}),
		// ... and delivered, committed in the network's own zone.
		F(TableNetOutput, 100, M(append(IP, Reg(RegDstVNID, vni))...),
			CT{Commit: true, Table: NoTable, Zone: zone}, OutputReg{Src: Whole(RegOutPort)}),
	}
	if n.LocalSubnet.IsValid() {
		// The pods' gateway on this node, for cross-talk routes: answered here, never a host address
		// (only to this node's pods: ARP from the tunnel leaves reg0 zero).
		out = append(out, F(TableNetARP, 300, M(append(ARP, Reg(RegSrcVNID, vni), ARPOp(ARPRequest), ARPTPA(Gateway(n.LocalSubnet)))...),
			arpReply(SetField{Field: FieldEthSrc, Value: MACValue(NetworkGatewayMAC(vni))})...))
	}
	for _, p := range peers {
		// Routed to a cross-talk peer: from here on the packet is on the peer's segment.
		out = append(out, F(TableNetCrossTalk, 100, M(append(IP, Reg(RegSrcVNID, vni), IPDstNet(p.CIDR))...),
			LoadReg(RegDstVNID, p.VNI), SetField{Field: FieldEthSrc, Value: MACValue(NetworkGatewayMAC(p.VNI))}, DecTTL{},
			Goto{Table: TableNetRouting}))
	}
	for _, r := range n.Remotes {
		if !r.NodeIP.IsValid() || !r.Subnet.IsValid() {
			continue
		}
		toNode := []Action{Move{Src: Whole(RegDstVNID), Dst: Bits(FieldTunID, 0, 31)}, SetTunDst(r.NodeIP), Output{Port: PortVXLAN}}
		// A tunnelled packet is on its destination's network already (the sending node routed it):
		// it is delivered on that network or dropped, never routed again.
		fromNode := []Action{LoadReg(RegDstVNID, vni), Goto{Table: TableNetRouting}}
		out = append(out,
			F(TableTunnelIngress, networkTunnelPriority, M(append(IP, TunSrc(r.NodeIP), TunID(uint64(vni)), IPSrcNet(r.Subnet))...), fromNode...),
			// ARP from another node loads only the destination's network: the gateway answers this node's pods.
			F(TableTunnelIngress, networkTunnelPriority, M(append(ARP, TunSrc(r.NodeIP), TunID(uint64(vni)), ARPSPANet(r.Subnet))...),
				LoadReg(RegDstVNID, vni), Goto{Table: TableNetARP}),
			F(TableNetTunnel, 100, M(append(IP, Reg(RegDstVNID, vni), IPDstNet(r.Subnet))...), toNode...),
			F(TableNetTunnel, 100, M(append(ARP, Reg(RegDstVNID, vni), ARPTPANet(r.Subnet))...), toNode...),
		)
		// What that node routed to this network from its cross-talk peers' subnets.
		for _, p := range peers {
			for _, pr := range p.Remotes {
				if pr.Node == r.Node && pr.NodeIP == r.NodeIP && pr.Subnet.IsValid() {
					out = append(out, F(TableTunnelIngress, networkTunnelPriority,
						M(append(IP, TunSrc(r.NodeIP), TunID(uint64(vni)), IPSrcNet(pr.Subnet))...), fromNode...))
				}
			}
		}
	}
	return out
}

// RenderAttachment renders a pod's interface on a network: anti-spoofing by port, MAC and address on
// the way in (its packets then carry the network's VNI), delivery and ARP towards it.
func RenderAttachment(a AttachmentState) []Flow {
	return []Flow{
		F(TablePodIngress, 100, M(append(IP, InPort(a.OFPort), EthSrc(a.MAC), IPSrc(a.IP))...),
			LoadReg(RegSrcVNID, a.VNI), Goto{Table: TableNetCrossTalk}),
		F(TablePodIngress, 100, M(append(ARP, InPort(a.OFPort), EthSrc(a.MAC), ARPSPA(a.IP), ARPSHA(a.MAC))...),
			LoadReg(RegSrcVNID, a.VNI), LoadReg(RegDstVNID, a.VNI), Goto{Table: TableNetARP}),
		F(TableNetRouting, 100, M(append(IP, Reg(RegDstVNID, a.VNI), IPDst(a.IP))...),
			SetField{Field: FieldEthDst, Value: MACValue(a.MAC)}, LoadReg(RegOutPort, a.OFPort), Goto{Table: TableNetOutput}),
		F(TableNetARP, 100, M(append(ARP, Reg(RegDstVNID, a.VNI), ARPTPA(a.IP))...), Output{Port: a.OFPort}),
	}
}

// memoKey is the key of a network's owner: the network and its cross-talk peers as RenderNetwork
// reads them.
func (n *NetworkState) memoKey(peers []*NetworkState) digest {
	var w keyWriter
	w.init()
	n.writeKey(&w)
	w.u64(uint64(len(peers)))
	for _, p := range peers {
		p.writeKey(&w)
	}
	return w.sum()
}

func (n *NetworkState) writeKey(w *keyWriter) {
	w.str(n.Name)
	w.u64(uint64(n.VNI))
	w.prefix(n.CIDR)
	w.prefix(n.LocalSubnet)
	w.u64(uint64(len(n.Remotes)))
	for _, r := range n.Remotes {
		w.str(r.Node)
		w.addr(r.NodeIP)
		w.prefix(r.Subnet)
	}
	w.u64(uint64(len(n.CrossTalk)))
	for _, c := range n.CrossTalk {
		w.str(c)
	}
}

func (a AttachmentState) memoKey() digest {
	var w keyWriter
	w.init()
	a.writeKey(&w)
	return w.sum()
}

func (a AttachmentState) writeKey(w *keyWriter) {
	w.str(a.Namespace)
	w.str(a.Name)
	w.str(a.Interface)
	w.str(a.Network)
	w.u64(uint64(a.VNI))
	w.addr(a.IP)
	w.mac(a.MAC)
	w.u64(uint64(a.OFPort))
}

// renderNetworks renders every network's and every attachment's owner into out, reusing unchanged ones.
// An attachment whose network is not in s (deleted, not admitted any more) has no flows: its traffic
// dies in table 20.
func (r *Renderer) renderNetworks(s NodeState, out map[reconcile.Owner]reconcile.OwnerState) {
	nets := make(memos, len(s.Networks))
	present := make(map[string]uint32, len(s.Networks))
	for i := range s.Networks {
		n := &s.Networks[i]
		if !IsNetworkVNI(n.VNI) || !n.CIDR.IsValid() {
			continue
		}
		present[n.Name] = n.VNI
		peers := s.NetworkPeers(n)
		o := NetworkOwner(n.Name)
		out[o] = r.networks.render(nets, o, n.memoKey(peers), func() reconcile.OwnerState {
			return reconcile.OwnerState{Flows: RenderNetwork(*n, peers)}
		})
	}
	r.networks = nets
	atts := make(memos, len(s.Attachments))
	for _, a := range s.Attachments {
		if vni, ok := present[a.Network]; !ok || vni != a.VNI || a.OFPort == 0 || !a.IP.IsValid() {
			continue
		}
		o := AttachmentOwner(a.Namespace, a.Name, a.Interface)
		out[o] = r.attachments.render(atts, o, a.memoKey(), func() reconcile.OwnerState {
			return reconcile.OwnerState{Flows: RenderAttachment(a)}
		})
	}
	r.attachments = atts
}

// SortNetworks orders networks by name and their remotes by node, as Render's callers hand them.
func SortNetworks(nets []NetworkState) {
	slices.SortFunc(nets, func(a, b NetworkState) int { return strings.Compare(a.Name, b.Name) })
	for i := range nets {
		slices.SortFunc(nets[i].Remotes, func(a, b NetworkRemote) int { return strings.Compare(a.Node, b.Node) })
	}
}
