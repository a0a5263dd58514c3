// Package drops turns the drop samples br0 sends the agent (packet-ins of the drop flows of
// flows/pipeline/drops.go) into records that name the cause and the deciding object, keeps the recent
// ones in a bounded ring, counts them per cause and streams them to the debug API's followers.
//
// Decode is pure: a packet-in and a snapshot of what the node renders (its last synced NodeState and
// the owner index that names cookies) in, a record out. Sampler is the edge: it takes packet-ins from
// the OpenFlow session's reader without blocking it, decodes them in its own goroutine, and keeps the
// ring.
package drops

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Snapshot is what a sample is decoded against: the node's last synced state and its owners.
type Snapshot struct {
	Node  string
	State pipeline.NodeState
	// Owners names a cookie's owners (reconcile.OwnerIndex.Lookup); nil names none.
	Owners func(reconcile.Cookie) []reconcile.Owner
}

// Packet is what a sample's first bytes say: the addresses, protocol and ports.
type Packet struct {
	Src, Dst         netip.Addr
	Proto            string
	SrcPort, DstPort uint16
}

// ParsePacket reads Ethernet (an 802.1Q tag skipped), then IPv4 with its ports, or ARP, or IPv6's
// addresses (a pod's IPv6 is dropped unsampled at table 20; an IPv6 frame sent to the uplink still
// reaches table 15's sampled miss, and reads better with its addresses than as an ethertype).
func ParsePacket(b []byte) (Packet, error) {
	var p Packet
	if len(b) < 14 {
		return p, fmt.Errorf("frame of %d bytes", len(b))
	}
	typ, off := binary.BigEndian.Uint16(b[12:]), 14
	if typ == 0x8100 && len(b) >= 18 {
		typ, off = binary.BigEndian.Uint16(b[16:]), 18
	}
	b = b[off:]
	switch typ {
	case 0x0806:
		p.Proto = "arp"
		if len(b) >= 28 {
			p.Src, p.Dst = netip.AddrFrom4([4]byte(b[14:18])), netip.AddrFrom4([4]byte(b[24:28]))
		}
		return p, nil
	case 0x0800:
	case 0x86dd:
		p.Proto = "ipv6"
		if len(b) >= 40 {
			p.Src, p.Dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		}
		return p, nil
	default:
		p.Proto = fmt.Sprintf("ethertype %#04x", typ)
		return p, nil
	}
	if len(b) < 20 || b[0]>>4 != 4 {
		return p, fmt.Errorf("IPv4 header of %d bytes", len(b))
	}
	ihl := int(b[0]&0xf) * 4
	proto := b[9]
	p.Src, p.Dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
	p.Proto = openflow.ProtoName(proto)
	fragment := binary.BigEndian.Uint16(b[6:])&0x1fff != 0
	if ihl < 20 || len(b) < ihl+4 || fragment {
		return p, nil
	}
	switch proto {
	case openflow.IPProtoTCP, openflow.IPProtoUDP, openflow.IPProtoSCTP:
		p.SrcPort, p.DstPort = binary.BigEndian.Uint16(b[ihl:]), binary.BigEndian.Uint16(b[ihl+2:])
	case openflow.IPProtoICMP:
		p.Proto = fmt.Sprintf("icmp type %d", b[ihl])
	}
	return p, nil
}

// Decode turns a drop sample into a record; false when the packet-in is not a drop sample (its table
// has no cause).
func Decode(pin openflow.PacketIn, snap *Snapshot, now time.Time) (debugapi.Drop, bool) {
	causes := pipeline.DropCauseOfTable(pin.Table)
	if len(causes) == 0 {
		return debugapi.Drop{}, false
	}
	pkt, _ := ParsePacket(pin.Data)
	d := debugapi.Drop{Time: now, Node: snap.Node, SrcIP: pkt.Src, DstIP: pkt.Dst, Proto: pkt.Proto, SrcPort: pkt.SrcPort,
		Port: pkt.DstPort, Table: pipeline.TableName(pin.Table), TableID: uint8(pin.Table)}
	var owner reconcile.Owner
	if snap.Owners != nil {
		if os := snap.Owners(reconcile.Cookie(pin.Cookie)); len(os) == 1 {
			owner = os[0]
			d.Owner = owner.String()
		}
	}
	st := &snap.State
	cause := causes[0]
	switch pin.Table {
	case pipeline.TableTunnelIngress:
		if pipeline.IsNetworkVNI(uint32(pin.TunID)) {
			cause = pipeline.CauseNetworkVNI
		} else {
			cause = pipeline.CauseTunnelSource
		}
	case pipeline.TableIngressIsolation:
		if owner.Category == reconcile.CategoryPod {
			cause = pipeline.CausePolicyIngress
		} else {
			cause = pipeline.CauseTenantIsolation
		}
	}
	d.Cause = string(cause)
	info, _ := pipeline.LookupDropCause(cause)
	network := pin.Table >= pipeline.TableNetCrossTalk && pin.Table <= pipeline.TableNetOutput || cause == pipeline.CauseNetworkVNI
	d.Src = nameOf(st, pkt.Src, pin.InPort, network, pin.Regs[0])
	d.Dst = nameOf(st, pkt.Dst, 0, network, pin.Regs[1])
	switch cause {
	case pipeline.CauseTenantIsolation:
		src, dst := pin.Regs[pipeline.RegSrcVNID-openflow.FieldReg0], pin.Regs[pipeline.RegDstVNID-openflow.FieldReg0]
		d.Object = fmt.Sprintf("tenant isolation %d → %d", src, dst)
		d.Verdict = fmt.Sprintf("dropped by tenant isolation: VNID %d%s may not reach VNID %d%s", src, tenantNames(st, src), dst, tenantNames(st, dst))
	case pipeline.CausePolicyIngress, pipeline.CausePolicyEgress:
		ingress := cause == pipeline.CausePolicyIngress
		port, pod, dir := pin.Regs[pipeline.RegOutPort-openflow.FieldReg0], d.Dst, "ingress"
		if !ingress {
			port, pod, dir = pin.InPort, d.Src, "egress"
		}
		d.Policies = pipeline.IsolatingPolicies(st.Policies, port, ingress)
		d.Object = "NetworkPolicy " + strings.Join(d.Policies, ", NetworkPolicy ")
		if len(d.Policies) == 0 {
			d.Object = "NetworkPolicy isolation of pod " + pod
		}
		d.Verdict = fmt.Sprintf("dropped by the NetworkPolicy %s isolation of pod %s (%s; no policy allows %s)", dir, pod,
			isolatedBy(d.Policies), l4(pkt))
	case pipeline.CauseServiceNoEndpoints:
		d.Object = "service"
		if obj, ok := pipeline.ObjectOf(owner); ok && obj.Kind == pipeline.KindService {
			d.Object = fmt.Sprintf("Service %s/%s (port %s)", obj.Namespace, obj.Name, obj.Port)
		}
		d.Verdict = fmt.Sprintf("rejected: %s has no ready endpoint", d.Object)
	case pipeline.CauseAntiSpoofing:
		d.Object = fmt.Sprintf("anti-spoofing of port %d", pin.InPort)
		if name := portName(st, pin.InPort); name != "" {
			d.Object = "anti-spoofing of pod " + name
		}
		d.Verdict = fmt.Sprintf("dropped by %s: the frame is not the port's own MAC and address", d.Object)
	case pipeline.CauseTunnelGuard:
		d.Object = "tunnel guard"
		d.Verdict = fmt.Sprintf("dropped by the tunnel guard: %s to tunnel port %d of %s", pkt.Proto, pkt.DstPort, pkt.Dst)
	case pipeline.CauseTunnelSource:
		from := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, pin.TunSrc)))
		d.Object = "tunnel from " + from.String()
		d.Verdict = fmt.Sprintf("dropped at tunnel ingress: %s is not a known node, or %s is outside its subnet", from, pkt.Src)
	case pipeline.CauseNetworkVNI:
		from := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, pin.TunSrc)))
		d.Object = fmt.Sprintf("Network VNI %d from %s", pin.TunID, from)
		d.Verdict = fmt.Sprintf("dropped at tunnel ingress: VNI %d from %s, which has no subnet of that Network", pin.TunID, from)
	case pipeline.CauseNetworkIsolation:
		net := networkOf(st, pin.Regs[0])
		d.Object = "Network " + net
		d.Verdict = fmt.Sprintf("dropped by Network isolation: Network %s does not reach %s", net, pkt.Dst)
	case pipeline.CauseAdminPolicy:
		tier, dir := "Admin", "ingress"
		if pin.Table == pipeline.TableBaselineEgress || pin.Table == pipeline.TableBaselineIngress {
			tier = "Baseline"
		}
		if pin.Table == pipeline.TableAdminEgress || pin.Table == pipeline.TableBaselineEgress {
			dir = "egress"
		}
		d.Object = "ClusterNetworkPolicy"
		if obj, ok := pipeline.ObjectOf(owner); ok && obj.Kind == pipeline.KindClusterNetworkPolicy {
			d.Object = "ClusterNetworkPolicy " + obj.Name
		}
		d.Verdict = fmt.Sprintf("dropped by a Deny rule of %s (%s tier, %s)", d.Object, tier, dir)
	case pipeline.CauseEgressFirewall:
		d.Object, d.Verdict = egressFirewall(st, owner, pkt.Dst)
	default:
		d.Object = info.Words
		d.Verdict = "dropped by " + info.Words
	}
	return d, true
}

// egressFirewall names the EgressNetworkPolicy (from the flow's owner) and the rule that denied dst:
// the first rule whose destinations hold it, as the firewall decides.
func egressFirewall(st *pipeline.NodeState, owner reconcile.Owner, dst netip.Addr) (object, verdict string) {
	obj, ok := pipeline.ObjectOf(owner)
	if !ok || obj.Kind != pipeline.KindEgressNetworkPolicy {
		return "egress firewall", fmt.Sprintf("dropped by the egress firewall: %s is denied", dst)
	}
	object = fmt.Sprintf("EgressNetworkPolicy %s/%s", obj.Namespace, obj.Name)
	for _, ns := range st.Egress.Namespaces {
		if ns.Name != obj.Namespace || ns.Firewall == nil {
			continue
		}
		if ns.Firewall.DenyAll {
			return object, fmt.Sprintf("dropped by the egress firewall of namespace %s: %s cannot be enforced as written, so it denies everything", ns.Name, object)
		}
		for i, r := range ns.Firewall.Rules {
			for _, p := range r.Dsts {
				if p.Contains(dst) {
					return object, fmt.Sprintf("dropped by the egress firewall of namespace %s: %s rule %d (%s)", ns.Name, object, i, r)
				}
			}
		}
	}
	return object, fmt.Sprintf("dropped by the egress firewall of namespace %s: %s denies %s", obj.Namespace, object, dst)
}

func isolatedBy(policies []string) string {
	if len(policies) == 0 {
		return "isolated"
	}
	return "isolated by NetworkPolicy " + strings.Join(policies, ", ")
}

func l4(p Packet) string {
	if p.DstPort != 0 {
		return fmt.Sprintf("%s/%d", p.Proto, p.DstPort)
	}
	return p.Proto
}

// nameOf names an end of the packet: the local pod (or Network attachment) at its port or address,
// else the address.
func nameOf(st *pipeline.NodeState, ip netip.Addr, inPort uint32, network bool, vni uint32) string {
	if network {
		for _, a := range st.Attachments {
			if (inPort != 0 && a.OFPort == inPort) || (inPort == 0 && a.IP == ip && a.VNI == vni) {
				return a.Namespace + "/" + a.Name + "@" + a.Interface
			}
		}
	} else {
		for _, p := range st.Pods {
			if (inPort != 0 && p.OFPort == inPort && p.IP == ip) || (inPort == 0 && p.IP == ip) {
				return p.Namespace + "/" + p.Name
			}
		}
		if inPort != 0 {
			return nameOf(st, ip, 0, false, vni)
		}
	}
	if !ip.IsValid() {
		return "?"
	}
	return ip.String()
}

// portName names the pod interface on an OpenFlow port.
func portName(st *pipeline.NodeState, port uint32) string {
	for _, p := range st.Pods {
		if p.OFPort == port {
			return p.Namespace + "/" + p.Name
		}
	}
	for _, a := range st.Attachments {
		if a.OFPort == port {
			return a.Namespace + "/" + a.Name + "@" + a.Interface
		}
	}
	return ""
}

// tenantNames lists the local namespaces of a VNID, " (blue)", when the node has pods of it.
func tenantNames(st *pipeline.NodeState, vnid uint32) string {
	var names []string
	for _, p := range st.Pods {
		if p.VNID == vnid && !slices.Contains(names, p.Namespace) {
			names = append(names, p.Namespace)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}

func networkOf(st *pipeline.NodeState, vni uint32) string {
	for _, n := range st.Networks {
		if n.VNI == vni {
			return n.Name
		}
	}
	return fmt.Sprintf("VNI %d", vni)
}
