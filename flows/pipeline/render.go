package pipeline

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Mode is the cluster's plugin mode (ClusterNetwork.pluginMode).
type Mode string

const (
	ModeSubnet        Mode = "subnet"        // one flat network
	ModeMultitenant   Mode = "multitenant"   // VNID isolation; VNID 0 is global
	ModeNetworkPolicy Mode = "networkpolicy" // flat, with NetworkPolicy enforced (netpol.go)
)

// GlobalVNID reaches and is reached by every tenant.
const GlobalVNID uint32 = 0

// NodeState is everything a node's flows depend on: plain data the agent assembles from its informers
// and OVSDB, and Render turns into flows. Nothing here does I/O.
type NodeState struct {
	Mode            Mode
	NodeName        string
	NodeIP          netip.Addr   // this node's underlay address (VXLAN source)
	LocalSubnet     netip.Prefix // this node's HostSubnet
	ClusterNetworks []netip.Prefix
	Pods            []PodState
	RemoteNodes     []RemoteNode
	// Services with a ClusterIP, and the addresses NodePorts are served at in br0 (the host DNATs
	// node IP:nodePort to ServiceNodePortIP:nodePort; see services.go).
	Services          []ServiceState
	NodePortAddresses []netip.Addr
	// Policies are the NetworkPolicies this node enforces (networkpolicy mode; see netpol.go). A
	// Renderer takes a policy handed over with the very slices of its last render as unchanged, without
	// hashing it again (policyIdentity): change a policy by giving it new slices, never by writing into
	// the old ones.
	Policies []PolicyState
	// AdminPolicies are the ClusterNetworkPolicies that select a pod of this node (every mode; see
	// adminpolicy.go).
	AdminPolicies []AdminPolicyState
	// Encapsulation between nodes; Uplink: br0 has its patch port into the uplink bridge (PortUplink),
	// so it can send and receive unencapsulated pod traffic (uplink.go).
	Encapsulation Encapsulation
	Uplink        bool
	// GatewayMAC is tun0's MAC when known: packets routed to the gateway address get it as eth_dst, so
	// the host takes them whatever MAC the sender had for its gateway.
	GatewayMAC net.HardwareAddr
	// TunnelPorts are the overlay's UDP ports, which no pod may send to outside the pod network
	// (guard.go): ClusterNetwork.vxlanPort and, while a change of it has not reached this node's
	// vxlan0 yet, the port vxlan0 was made with. Empty: DefaultTunnelPort.
	TunnelPorts []uint16
	// Networks are the Networks besides the cluster network, and Attachments the local pods'
	// interfaces on them that carry traffic (their namespace admitted): networks.go.
	Networks    []NetworkState
	Attachments []AttachmentState
	// Egress: egress IPs and firewalls (egress.go).
	Egress EgressState
}

// PodState is one local pod's network identity.
type PodState struct {
	Namespace, Name string
	IP              netip.Addr
	MAC             net.HardwareAddr
	OFPort          uint32
	VNID            uint32
	// IngressIsolated and EgressIsolated: some NetworkPolicy selects the pod for that direction, so
	// what no rule allows is dropped (networkpolicy mode).
	IngressIsolated, EgressIsolated bool
}

// RemoteNode is another node's subnet and where to tunnel to reach it.
type RemoteNode struct {
	Name   string
	NodeIP netip.Addr
	Subnet netip.Prefix
	// OnSegment: the node's address is on-link through this node's uplink bridge, so with
	// encapsulation none its traffic goes unencapsulated (uplink.go).
	OnSegment bool
	// Pods are its pods' addresses and VNIDs, for traffic that arrives from it unencapsulated
	// (multitenant mode with an uplink port; otherwise unused).
	Pods []RemotePod
}

// Gateway is the node subnet's first address: tun0's address, the pods' default gateway.
func Gateway(subnet netip.Prefix) netip.Addr { return subnet.Masked().Addr().Next() }

// LocalOwner owns the flows of the node's own subnet and gateway. It is the pipeline's (category
// pipeline), so no Node, whatever its name, can own the same flows.
var LocalOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "local-subnet"}

// Render turns a node's state into every owner's desired flows. Owners with nothing to render are
// absent; the agent deletes owners it rendered before and no longer gets. It is strict: any owner
// that fails to render is an error (the agent's Renderer isolates such owners instead).
func Render(s NodeState) (map[reconcile.Owner]reconcile.OwnerState, error) {
	owners, failed, err := (&Renderer{}).Render(s)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, o := range reconcile.SortedOwnerKeys(failed) {
		errs = append(errs, fmt.Errorf("render %s: %w", o, failed[o]))
	}
	return owners, errors.Join(errs...)
}

// Renderer renders like Render and remembers each owner's last render with the key of what it was
// made from (memo.go): an owner whose inputs did not change is not rendered again and keeps its very
// slices, so comparing it with the last render is cheap. With 1,000 services, one endpoint change
// re-renders one owner instead of all. The zero value is ready; a Renderer is not safe for concurrent
// use.
type Renderer struct {
	node        memos // the node-wide owners (writeNodeKey)
	pods        memos
	nodes       memos
	networks    memos
	attachments memos
	services    map[reconcile.Owner]serviceMemo
	// policies are the policies' memos, by pointer: a memo is bigger than a map keeps in place, and
	// an unchanged policy keeps its own instead of being copied anew into every render's map.
	policies    map[reconcile.Owner]*policyMemo
	policySpare map[reconcile.Owner]*policyMemo // the map policies replaced, kept to be filled again
	policyAlloc policyAllocators
	// policyScratch is the policy renders' working space, reused from one policy to the next.
	policyScratch policyScratch
	admin         adminRenderer
}

// writeRemoteNodeContext writes what of the node's own state a remote node's flows depend on (besides
// the remote node itself): TestRenderDependsOnlyOnKeys holds RenderRemoteNode to it.
func (s *NodeState) writeRemoteNodeContext(w *keyWriter) {
	w.str(string(s.Mode))
	w.str(string(s.Encapsulation))
	w.boolean(s.Uplink)
	w.addr(s.NodeIP)
}

// Render renders s, reusing what it can from the previous call. An owner that cannot be rendered (a
// service whose group IDs are exhausted, say) is left out of owners and named in failed, so it keeps
// its last good flows while every other owner syncs. The error is for a node that cannot render at
// all (no subnet or node IP yet).
func (r *Renderer) Render(s NodeState) (owners map[reconcile.Owner]reconcile.OwnerState, failed map[reconcile.Owner]error, err error) {
	if !s.LocalSubnet.IsValid() || !s.NodeIP.IsValid() {
		return nil, nil, fmt.Errorf("render: node %q has no subnet or node IP yet", s.NodeName)
	}
	out := make(map[reconcile.Owner]reconcile.OwnerState, 5+len(s.Pods)+len(s.RemoteNodes)+len(s.Services)+len(s.Policies)+
		len(s.Networks)+len(s.Attachments))
	failed = map[reconcile.Owner]error{}
	nodeKey := s.nodeKey()
	node := make(memos, 4)
	for o, render := range map[reconcile.Owner]func(NodeState) []Flow{
		PipelineOwner: renderPipeline, LocalOwner: renderLocal, TunnelGuardOwner: renderTunnelGuard, ServicesOwner: renderServicesBase,
	} {
		out[o] = r.node.render(node, o, nodeKey, func() reconcile.OwnerState { return reconcile.OwnerState{Flows: render(s)} })
	}
	r.node = node
	vnids := map[uint32]bool{}
	pods := make(memos, len(s.Pods))
	isolation := s.Mode == ModeNetworkPolicy
	for _, p := range s.Pods {
		o := PodOwner(p.Namespace, p.Name)
		key := p.memoKey(isolation)
		out[o] = r.pods.render(pods, o, key, func() reconcile.OwnerState {
			flows := RenderPod(p)
			if isolation {
				flows = append(flows, isolationFlows(p)...)
			}
			flows = append(flows, HairpinFlows(p.OFPort)...) // services reach the pod from itself (services.go)
			return reconcile.OwnerState{Flows: flows}
		})
		vnids[p.VNID] = true
	}
	r.pods = pods
	if s.Mode == ModeMultitenant {
		for v := range vnids {
			if v != GlobalVNID {
				out[TenantOwner(v)] = reconcile.OwnerState{Flows: sampleDrops(RenderTenant(v))}
			}
		}
	}
	nodes := make(memos, len(s.RemoteNodes))
	for _, n := range s.RemoteNodes {
		if !n.Subnet.IsValid() || !n.NodeIP.IsValid() {
			continue
		}
		o := NodeOwner(n.Name)
		key := n.memoKey(&s)
		out[o] = r.nodes.render(nodes, o, key, func() reconcile.OwnerState { return reconcile.OwnerState{Flows: RenderRemoteNode(s, n)} })
	}
	r.nodes = nodes
	r.renderNetworks(s, out)
	r.renderServices(s, out, failed)
	r.renderPolicies(s, out, failed)
	renderEgress(s, out)
	r.admin.render(s, out, failed)
	return out, failed, nil
}

// renderPipeline renders the fixed plumbing of the tables and their defaults.
func renderPipeline(s NodeState) []Flow {
	out := append(RenderBase(), renderUplinkBase(s)...)
	out = append(out, renderNetworksBase()...)
	switch s.Mode {
	case ModeNetworkPolicy:
		// Flat, with policy: what no policy allowed and no isolation dropped is undecided and goes on
		// to the baseline tier (netpol.go, adminpolicy.go). (Only IP reaches table 80: ARP is answered
		// and delivered in table 70.)
		out = append(out, renderPolicyBase(Gateway(s.LocalSubnet))...)
		out = append(out, F(TableIngressIsolation, 50, M(IP...), Goto{Table: TableBaselineIngress}))
	case ModeSubnet:
		// Flat: no tenant isolation; everything is undecided by the namespace's layer.
		out = append(out, F(TableIngressIsolation, 50, M(), Goto{Table: TableBaselineIngress}))
	default:
		// VNID 0 is global: it reaches every tenant and every tenant reaches it. What isolation does
		// not deny is undecided: the baseline tier may still decide it.
		out = append(out,
			F(TableIngressIsolation, 200, M(Reg(RegSrcVNID, GlobalVNID)), Goto{Table: TableBaselineIngress}),
			F(TableIngressIsolation, 200, M(Reg(RegDstVNID, GlobalVNID)), Goto{Table: TableBaselineIngress}))
	}
	return append(out, renderAdminBase()...)
}

// renderLocal renders what the node's own subnet needs: the gateway (tun0) for ARP and IP, the way
// out of the cluster through the host, and drops for cluster addresses nobody hosts.
func renderLocal(s NodeState) []Flow {
	gw := Gateway(s.LocalSubnet)
	toGateway := []Action{LoadReg(RegDstVNID, GlobalVNID), LoadReg(RegOutPort, PortTun0), Goto{Table: TableAdminIngress}}
	if len(s.GatewayMAC) == 6 {
		// A peer sending unencapsulated addressed the gateway by the MAC proxy ARP gave it (uplink.go).
		toGateway = append([]Action{SetField{Field: FieldEthDst, Value: MACValue(s.GatewayMAC)}}, toGateway...)
	}
	out := []Flow{
		// ARP for the gateway goes to the host, which answers with tun0's MAC.
		F(TableARP, 300, M(append(ARP, ARPTPA(gw))...), Output{Port: PortTun0}),
		// IP for the gateway, and anything outside the cluster network, leaves through the host
		// (which routes it and SNATs it to the node's IP).
		F(TableRouting, 300, M(append(IP, IPDst(gw))...), toGateway...),
		// The default route too: a reply un-NATed back to an outside client can arrive over the uplink
		// addressed to the gateway's proxy-ARP MAC, and tun0 drops frames not addressed to it.
		F(TableRouting, 10, M(IP...), toGateway...),
	}
	for _, cn := range s.ClusterNetworks {
		// A cluster address on no node: drop rather than leak it to the host's default route.
		out = append(out, F(TableRouting, 50, M(append(IP, IPDstNet(cn))...)))
	}
	return out
}

// RenderPod renders a local pod: anti-spoofing and its VNID on the way in (IP and ARP), and its
// address as a destination for routing and ARP.
func RenderPod(p PodState) []Flow {
	return []Flow{
		F(TablePodIngress, 100, M(append(IP, InPort(p.OFPort), EthSrc(p.MAC), IPSrc(p.IP))...),
			LoadReg(RegSrcVNID, p.VNID), Goto{Table: TableConntrack}),
		F(TablePodIngress, 100, M(append(ARP, InPort(p.OFPort), EthSrc(p.MAC), ARPSPA(p.IP), ARPSHA(p.MAC))...),
			LoadReg(RegSrcVNID, p.VNID), Goto{Table: TableARP}),
		F(TableRouting, 200, M(append(IP, IPDst(p.IP))...),
			LoadReg(RegDstVNID, p.VNID), LoadReg(RegOutPort, p.OFPort), Goto{Table: TableAdminIngress}),
		F(TableARP, 200, M(append(ARP, ARPTPA(p.IP))...), Output{Port: p.OFPort}),
	}
}

// RenderTenant lets one VNID's pods reach each other (multitenant mode).
func RenderTenant(vnid uint32) []Flow {
	return []Flow{F(TableIngressIsolation, 100, M(Reg(RegSrcVNID, vnid), Reg(RegDstVNID, vnid)), Goto{Table: TableBaselineIngress})}
}

// RenderRemoteNode renders another node: accept its tunnel traffic (tun_id carries the source VNID)
// from its subnet and its own address only (a node sends nothing else into the overlay, so a forgery
// that got past the tunnel guard of guard.go cannot claim another node's pods) and, with an uplink
// port, its unencapsulated traffic (the source address gives the VNID); send IP and
// ARP for its subnet through the tunnel to it, or IP through the uplink port when it is direct
// (uplink.go). A connection routed there is committed to conntrack first: its egress was allowed by
// then, and its replies must pass the policy tables.
func RenderRemoteNode(s NodeState, n RemoteNode) []Flow {
	// Committed in every mode: replies must be recognised at both ends, for the policy tiers
	// (adminpolicy.go) as for NetworkPolicy.
	route := []Action{commitService, Goto{Table: TableTunnelEgress}}
	toTunnel := func() []Action {
		return []Action{Move{Src: Whole(RegSrcVNID), Dst: Bits(FieldTunID, 0, 31)}, SetTunDst(n.NodeIP), Output{Port: PortVXLAN}}
	}
	fromTunnel := Move{Src: Bits(FieldTunID, 0, 31), Dst: Whole(RegSrcVNID)}
	out := []Flow{
		F(TableTunnelIngress, 100, M(append(IP, TunSrc(n.NodeIP), IPSrcNet(n.Subnet))...), fromTunnel, Goto{Table: TableConntrack}),
		F(TableTunnelIngress, 100, M(append(IP, TunSrc(n.NodeIP), IPSrc(n.NodeIP))...), fromTunnel, Goto{Table: TableConntrack}),
		F(TableTunnelIngress, 100, M(append(ARP, TunSrc(n.NodeIP), ARPSPANet(n.Subnet))...), fromTunnel, Goto{Table: TableARP}),
		F(TableRouting, 100, M(append(IP, IPDstNet(n.Subnet))...), route...),
		F(TableARP, 100, M(append(ARP, ARPTPANet(n.Subnet))...), Goto{Table: TableTunnelEgress}),
		F(TableTunnelEgress, 100, M(append(IP, IPDstNet(n.Subnet))...), toTunnel()...),
		F(TableTunnelEgress, 100, M(append(ARP, ARPTPANet(n.Subnet))...), toTunnel()...),
	}
	out = append(out, renderUplinkIngress(s, n)...)
	if s.direct(n) {
		out = append(out, renderUplinkEgress(s, n)...)
	}
	return out
}
