package flowctl

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// Traces on Networks (network.ofsdn.io): a pod's interface on a Network, namespace/name@net1, as SRC
// or DST. Its port, MAC and address are the node agent's record of it (NodeInfo.Attachments: MACs may
// be static, so never derived from the address). Addresses overlap across Networks and with the
// cluster network, so an address traced from an attachment is an address on its Network (or on a
// cross-talk peer's, when that CIDR holds it), never a cluster pod's; the packet reaches the
// destination on-link when its Network's CIDR holds it, else through the node's gateway on the
// Network (pipeline.NetworkGatewayMAC), where table 130 routes it to a cross-talk peer or drops it.

// broadcastMAC is the eth_dst of a packet to an on-link address nobody answers ARP for.
var broadcastMAC = trace.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// attachment is a local pod's interface on a Network as the node's agent records it.
func (n *traceNode) attachment(namespace, name, iface string) (debugapi.Attachment, error) {
	var have []string
	for _, a := range n.info.Attachments {
		if a.Namespace == namespace && a.Name == name {
			if a.Interface == iface {
				return a, nil
			}
			have = append(have, a.Interface+" (Network "+a.Network+")")
		}
	}
	if len(have) == 0 {
		return debugapi.Attachment{}, fmt.Errorf("node %s's agent knows no interface of pod %s/%s on a Network", n.info.Name, namespace, name)
	}
	return debugapi.Attachment{}, fmt.Errorf("pod %s/%s has no interface %s on a Network (node %s: %s)", namespace, name, iface, n.info.Name, strings.Join(have, ", "))
}

// network is a Network the node renders.
func (n *traceNode) network(name string) (debugapi.Network, bool) {
	for _, nw := range n.info.Networks {
		if nw.Name == name {
			return nw, true
		}
	}
	return debugapi.Network{}, false
}

func (n *traceNode) networkByVNI(vni uint32) (debugapi.Network, bool) {
	for _, nw := range n.info.Networks {
		if nw.VNI == vni {
			return nw, true
		}
	}
	return debugapi.Network{}, false
}

// attachmentAt is the node's attachment on a Network with an address.
func (n *traceNode) attachmentAt(network string, ip netip.Addr) (debugapi.Attachment, bool) {
	for _, a := range n.info.Attachments {
		if a.Network == network && a.IP == ip {
			return a, true
		}
	}
	return debugapi.Attachment{}, false
}

// attachmentOnPort is the attachment whose port a number is: OVSDB's record of the port, else the
// agent's.
func (n *traceNode) attachmentOnPort(port uint32) (debugapi.Attachment, bool) {
	for _, p := range n.info.Ports {
		if uint32(p.OFPort) == port && p.Network != "" {
			for _, a := range n.info.Attachments {
				if a.Key() == p.Pod {
					return a, true
				}
			}
			ns, rest, _ := strings.Cut(p.Pod, "/")
			name, iface, _ := strings.Cut(rest, "@")
			return debugapi.Attachment{Namespace: ns, Name: name, Interface: iface, Network: p.Network, OFPort: port}, true
		}
	}
	for _, a := range n.info.Attachments {
		if a.OFPort == port {
			return a, true
		}
	}
	return debugapi.Attachment{}, false
}

// networkPeers are the Networks a Network exchanges traffic with on the node.
func (n *traceNode) networkPeers(nw debugapi.Network) []debugapi.Network {
	var out []debugapi.Network
	for _, name := range nw.CrossTalk {
		if p, ok := n.network(name); ok {
			out = append(out, p)
		}
	}
	return out
}

// attachmentSpec is an attachment as a SRC or DST.
func attachmentSpec(node string, a debugapi.Attachment) endpointSpec {
	return endpointSpec{kind: "attachment", pod: a.Key(), node: node, ip: a.IP, network: a.Network, mac: a.MAC}
}

// addressOnNetwork reads an IP DST traced from an attachment on Network netName: an address on that
// Network, or on the cross-talk peer whose CIDR holds it, and the attachment that has it there when
// the node whose subnet of that Network holds it says so. An address no such CIDR holds is on no
// Network: the trace shows table 130 dropping it.
func addressOnNetwork(ctx context.Context, w world, n *traceNode, netName string, ip netip.Addr, withPeers bool) endpointSpec {
	out := endpointSpec{kind: "ip", ip: ip}
	nw, ok := n.network(netName)
	if !ok {
		return out
	}
	candidates := []debugapi.Network{nw}
	if withPeers {
		candidates = append(candidates, n.networkPeers(nw)...)
	}
	for _, c := range candidates {
		if !c.CIDR.Contains(ip) {
			continue
		}
		out.network = c.Name
		node := ""
		if inNet(ip, c.Subnet) {
			node = n.info.Name
		}
		for _, r := range c.Remotes {
			if r.Subnet.Contains(ip) {
				node = r.Node
			}
		}
		if node == "" {
			return out
		}
		holder, err := w.node(ctx, node)
		if err != nil {
			return out // not dumped, or its agent does not answer: the trace follows the packet there and says so
		}
		if a, ok := holder.attachmentAt(c.Name, ip); ok {
			return attachmentSpec(node, a)
		}
		return out
	}
	return out
}

// attachmentPacket fills in the packet a pod sends from its interface on a Network (src) to dst:
// in_port, MAC and address from the agent's record; eth_dst the on-link destination's MAC or the
// node's gateway on the Network. It returns how the packet enters the bridge.
func attachmentPacket(ctx context.Context, w world, n *traceNode, src, dst endpointSpec, p *trace.Packet, spoof netip.Addr, res *TraceResult) (string, error) {
	ns, rest, _ := strings.Cut(src.pod, "/")
	name, iface, _ := strings.Cut(rest, "@")
	a, err := n.attachment(ns, name, iface)
	if err != nil {
		return "", fmt.Errorf("SRC: %w", err)
	}
	port := a.OFPort
	portLabel := "pod " + src.pod
	for _, pt := range n.info.Ports {
		if pt.Pod == src.pod && pt.OFPort > 0 {
			port, portLabel = uint32(pt.OFPort), pt.Name+", pod "+src.pod
		}
	}
	if port == 0 {
		return "", fmt.Errorf("SRC: pod %s has no port on node %s's bridge, so its packets never reach br0", src.pod, n.info.Name)
	}
	mac, err := parseMAC(a.MAC)
	if err != nil {
		return "", fmt.Errorf("SRC: node %s's agent records no MAC for pod %s", n.info.Name, src.pod)
	}
	p.InPort, p.EthSrc, p.IPSrc = port, mac, a.IP
	if spoof.IsValid() {
		p.IPSrc = spoof
		res.From += " sending as " + spoof.String()
	}
	nw, known := n.network(a.Network)
	vni := a.VNI
	if known {
		vni = nw.VNI
	}
	if dst.kind == "attachment" && dst.network != a.Network && !(known && dstIsPeer(n, nw, dst.network)) {
		res.Notes = append(res.Notes, fmt.Sprintf("%s is on Network %s, which Network %s does not exchange traffic with: the packet goes to %s on Network %s",
			dst.pod, dst.network, a.Network, dst.ip, a.Network))
	}
	switch {
	case known && nw.CIDR.Contains(p.IPDst):
		// On-link: the pod ARPs for the address on its Network, and its owner there answers.
		onLink := dst
		if dst.kind != "attachment" || dst.network != a.Network {
			onLink = addressOnNetwork(ctx, w, n, a.Network, p.IPDst, false)
		}
		if m, err := parseMAC(onLink.mac); onLink.kind == "attachment" && err == nil {
			p.EthDst = m
		} else {
			p.EthDst = broadcastMAC
			res.Notes = append(res.Notes, fmt.Sprintf("no pod of Network %s has %s (its ARP goes unanswered): traced with eth_dst %s", a.Network, p.IPDst, broadcastMAC))
		}
	default:
		// Off-link: through the node's gateway on the Network (its route for cross-talk peers).
		p.EthDst = trace.MAC(pipeline.NetworkGatewayMAC(vni))
	}
	return fmt.Sprintf("in_port %d (%s, on Network %s)", port, portLabel, a.Network), nil
}

func dstIsPeer(n *traceNode, nw debugapi.Network, network string) bool {
	for _, p := range n.networkPeers(nw) {
		if p.Name == network {
			return true
		}
	}
	return false
}

// networkDropVerdict explains a drop that Networks account for; false when it is none of theirs.
func networkDropVerdict(n *traceNode, path *trace.Path, where string) (string, bool) {
	info, f := n.info, path.Final
	last, _ := path.Last()
	switch last.Table {
	case pipeline.TablePodIngress:
		a, ok := n.attachmentOnPort(f.InPort)
		if !ok {
			return "", false
		}
		if !hasFlowFor(n, pipeline.TablePodIngress, openflow.FieldInPort, f.InPort) {
			why := a.Reason
			if a.Carrying || why == "" {
				why = fmt.Sprintf("Network %s does not admit namespace %s (or has no VNI yet)", a.Network, a.Namespace)
			}
			return fmt.Sprintf("%s: pod %s carries no traffic: %s", where, a.Key(), why), true
		}
		return fmt.Sprintf("%s: pod %s sent it from %s / %s, not its own address on Network %s (anti-spoofing)", where, a.Key(), f.EthSrc, f.IPSrc, a.Network), true
	case pipeline.TableTunnelIngress:
		vni := uint32(f.TunID)
		if !pipeline.IsNetworkVNI(vni) || f.TunID>>32 != 0 {
			return "", false
		}
		nw, ok := n.networkByVNI(vni)
		if !ok {
			return fmt.Sprintf("%s: no Network here has VNI %#x (tunnelled from %s: a Network this node has not seen yet, or one deleted here)", where, vni, tunnelPeer(n, f.TunSrc)), true
		}
		return fmt.Sprintf("%s: a packet of Network %s (VNI %#x) from %s, whose inner source %s is in none of that node's subnets of Network %s or of the Networks it exchanges traffic with",
			where, nw.Name, vni, tunnelPeer(n, f.TunSrc), f.IPSrc, nw.Name), true
	case pipeline.TableNetCrossTalk:
		nw, ok := n.networkByVNI(f.Regs[0])
		if !ok {
			return fmt.Sprintf("%s: no Network here has VNI %#x", where, f.Regs[0]), true
		}
		talk := "none"
		if len(nw.CrossTalk) > 0 {
			talk = strings.Join(nw.CrossTalk, ", ")
		}
		return fmt.Sprintf("%s: Network %s does not reach %s: outside its CIDR %s and every Network it exchanges traffic with (crossTalk: %s)",
			where, nw.Name, f.IPDst, nw.CIDR, talk), true
	case pipeline.TableNetRouting, pipeline.TableNetTunnel:
		nw, ok := n.networkByVNI(f.Regs[1])
		if !ok {
			return "", false
		}
		text := fmt.Sprintf("%s: no pod of Network %s has %s on node %s", where, nw.Name, f.IPDst, info.Name)
		if f.InPort != n.roleNumber(pipeline.RoleTunnel) {
			text += ", and no other node's subnet of it holds the address"
		} else {
			text += " (a packet from the tunnel is delivered here or dropped, never sent on)"
		}
		if a, ok := n.attachmentAt(nw.Name, f.IPDst); ok && !a.Carrying {
			text += fmt.Sprintf("; pod %s has it but carries no traffic: %s", a.Key(), a.Reason)
		}
		return text, true
	}
	return "", false
}

// tunnelPeer names the node a tunnel source address is.
func tunnelPeer(n *traceNode, ip netip.Addr) string {
	for _, r := range n.info.RemoteNodes {
		if r.NodeIP == ip {
			return fmt.Sprintf("node %s (%s)", r.Name, ip)
		}
	}
	return ip.String()
}

// hasFlowFor says whether a table of the node has a flow matching field exactly at value.
func hasFlowFor(n *traceNode, table openflow.TableID, field openflow.Field, value uint32) bool {
	for _, f := range n.flows {
		if f.Table != table {
			continue
		}
		if mf, ok := f.Match.Get(field); ok && !mf.Masked && uint32(mf.Value) == value {
			return true
		}
	}
	return false
}
