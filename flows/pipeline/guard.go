package pipeline

// The tunnel guard: a pod never emits tunnel traffic into the overlay.
//
// The overlay trusts the node network: table 10 takes a VXLAN packet's tun_id as the source VNID
// whenever it comes from a known node's address. A pod's own datagram to a node's VXLAN port leaves
// through tun0 and the host's SNAT, so it reaches the node from a known node's address, carrying
// whatever VNI and inner frame the pod wrote: a forged packet into any tenant (VNI 0: into every
// tenant; in networkpolicy mode with an inner source that the victim's policies allow). So br0 drops,
// from any source, every datagram to the tunnel's UDP port that routing would hand to the host or to
// another node's gateway, before it can reach tun0, vxlan0 or the uplink:
//
//   - table 60, priority 40 (below every route to a pod or a node subnet, above the default route to the
//     host): the tunnel port towards anything that is not a pod. This closes every path to a node
//     address whatever the address — the node's InternalIP, its other addresses (the kernel datapath's
//     VXLAN socket listens on all of them), the service addresses br0 keeps on tun0 — and every way a
//     pod gets there: directly, through a Service or NodePort whose endpoints are node addresses (the
//     check sits after the service DNAT of tables 40-45, on the translated destination; a NodePort
//     re-enters br0 from tun0 and is DNATed there), hairpinned through the host, in both
//     encapsulations (node addresses are never routed to the uplink port).
//   - table 60, priority 400 (above the gateway's own route): every node's gateway address (tun0's,
//     where the userspace datapath may terminate tunnels too), the local one and the remote ones that a
//     pod reaches through the overlay. Gateways are the first address of each node subnet, so one
//     masked match per cluster network and subnet length covers every node, present and future.
//
// Replies pass (ct_state +rpl): a connection a node's host opened from the tunnel's port may be
// answered. Nothing else in the cluster sends to the tunnel port of a non-pod address: a pod that must
// speak VXLAN to a VTEP outside the cluster needs a vxlanPort other than the VTEP's.
//
// Defence in depth on the receiving side (RenderRemoteNode, renderUplinkIngress): a tunnelled or
// unencapsulated packet from a node is accepted only with a source inside that node's subnet or its own
// address, so a forgery that got through anyway could not claim another node's pods.
//
// What this does not do: an attacker on the node network itself can still forge VXLAN (the overlay is
// not authenticated; encryption is future work), and hostNetwork pods are the node (README: Security).

import (
	"net/netip"
	"slices"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// TunnelGuardOwner owns the flows that keep pods' datagrams off every node's tunnel port: in
// `flowctl dump` every such drop names it.
var TunnelGuardOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "tunnel-guard"}

// DefaultTunnelPort is the IANA VXLAN port, the overlay's when NodeState.TunnelPorts is empty.
const DefaultTunnelPort uint16 = 4789

// Priorities of the guard in table 60 (routing); see the top of this file.
const (
	guardGatewayPriority = 400 // above the local gateway's route (300)
	guardDefaultPriority = 40  // above the default route (10), below pods (200), subnets (100), cluster drops (50)
)

// tunnelPorts returns the overlay's ports, sorted and without repeats.
func (s *NodeState) tunnelPorts() []uint16 {
	if len(s.TunnelPorts) == 0 {
		return []uint16{DefaultTunnelPort}
	}
	ports := slices.Clone(s.TunnelPorts)
	slices.Sort(ports)
	return slices.Compact(ports)
}

// renderTunnelGuard renders the guard's drops: each tunnel port of every gateway, and of everything
// that is not a pod.
func renderTunnelGuard(s NodeState) []Flow {
	gateways := gatewayMatches(s)
	var out []Flow
	for _, port := range s.tunnelPorts() {
		toTunnel := append(slices.Clone(UDP), UDPDst(port), CtState(0, CtRpl))
		out = append(out, F(TableRouting, guardDefaultPriority, M(toTunnel...)))
		for _, g := range gateways {
			out = append(out, F(TableRouting, guardGatewayPriority, M(append(slices.Clone(toTunnel), g)...)))
		}
	}
	return out
}

// gatewayMatches matches every node's gateway address: per cluster network and node-subnet length in
// use, the network's bits and a host part of 1 (the subnet's first address). A subnet outside every
// cluster network (not one the controller allocates) gets its own exact match.
func gatewayMatches(s NodeState) []MatchField {
	type shape struct {
		network netip.Prefix
		bits    int
	}
	var shapes []shape
	var loose []netip.Addr
	add := func(subnet netip.Prefix) {
		if !subnet.IsValid() || !subnet.Addr().Is4() {
			return
		}
		for _, cn := range s.ClusterNetworks {
			if subnet.Bits() >= 31 {
				break // no host part to match: the exact address below
			}
			if cn.Bits() <= subnet.Bits() && cn.Contains(subnet.Addr()) {
				if sh := (shape{cn.Masked(), subnet.Bits()}); !slices.Contains(shapes, sh) {
					shapes = append(shapes, sh)
				}
				return
			}
		}
		if gw := Gateway(subnet); !slices.Contains(loose, gw) {
			loose = append(loose, gw)
		}
	}
	add(s.LocalSubnet)
	for _, n := range s.RemoteNodes {
		add(n.Subnet)
	}
	slices.SortFunc(shapes, func(a, b shape) int {
		if c := a.network.Addr().Compare(b.network.Addr()); c != 0 {
			return c
		}
		return a.bits - b.bits
	})
	slices.SortFunc(loose, netip.Addr.Compare)
	out := make([]MatchField, 0, len(shapes)+len(loose))
	for _, sh := range shapes {
		base, _ := IPv4Value(sh.network.Addr())
		networkMask := uint64(^uint32(0) << (32 - sh.network.Bits()))
		hostMask := uint64(^uint32(0) >> sh.bits)
		if sh.network.Bits() == 0 {
			networkMask = 0
		}
		out = append(out, Masked(FieldIPDst, base|1, networkMask|hostMask))
	}
	for _, gw := range loose {
		out = append(out, IPDst(gw))
	}
	return out
}
