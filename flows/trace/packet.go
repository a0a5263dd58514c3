// Package trace follows a packet through ofsdn's pipeline, two ways that must agree: Parse reads what
// Open vSwitch's ofproto/trace says about a packet on a live bridge, and Evaluate computes it in pure
// Go from a dump of the bridge's flows and groups (no OVS). Both give a Path: the tables the packet
// went through, the flow it matched in each (with the cookie that names its owner), the
// recirculations through conntrack, and where it ended (an output port, a tunnel, a drop).
//
// Conntrack follows ofproto/trace's first-packet view: every ct() action that recirculates resumes with
// ct_state=trk|new (plus dnat or snat when the action NATs, as a datapath reports a new NATed
// connection; the live trace passes the same flags with --ct-next), and NAT rewrites the addresses to
// the bottom of the range, as ofproto/trace simulates it; a commit's exec() gives the recirculated
// packet its ct_mark (the masquerade mark). A multipath action (sessionAffinity's choice) computes
// OVS's own jhash of the address, bit for bit, so both follow the same endpoint. A select group picks the bucket chosen by
// Packet.DPHash (the live trace passes it as dp_hash), so both follow the same endpoint; learn actions
// learn nothing (ofproto/trace does not execute them without -generate).
//
// It is pure: no I/O. flowctl trace builds packets, asks nodes (or dumps) and writes verdicts.
package trace

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Packet is the first packet of a connection as it enters a bridge.
type Packet struct {
	InPort uint32 `json:"inPort"`
	EthSrc MAC    `json:"ethSrc"`
	EthDst MAC    `json:"ethDst"`
	// Proto is tcp, udp, sctp or icmp (an echo request).
	Proto   string     `json:"proto"`
	IPSrc   netip.Addr `json:"ipSrc"`
	IPDst   netip.Addr `json:"ipDst"`
	SrcPort uint16     `json:"srcPort,omitempty"`
	DstPort uint16     `json:"dstPort,omitempty"`
	// Tunnel metadata of a packet that arrived by VXLAN (zero: none).
	TunID  uint64     `json:"tunID,omitempty"`
	TunSrc netip.Addr `json:"tunSrc,omitzero"`
	TunDst netip.Addr `json:"tunDst,omitzero"`
	// DPHash picks a select group's bucket (0: none given; OVS's trace then stops at the group).
	DPHash uint32 `json:"dpHash,omitempty"`
}

// MAC is an Ethernet address that reads and writes itself as text (JSON).
type MAC net.HardwareAddr

func (m MAC) String() string               { return net.HardwareAddr(m).String() }
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }
func (m *MAC) UnmarshalText(b []byte) error {
	hw, err := net.ParseMAC(string(b))
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("MAC %q: not an Ethernet address", b)
	}
	*m = MAC(hw)
	return nil
}

// ProtoNumber is the IP protocol number of a protocol name.
func ProtoNumber(proto string) (uint8, error) {
	switch proto {
	case "tcp":
		return openflow.IPProtoTCP, nil
	case "udp":
		return openflow.IPProtoUDP, nil
	case "sctp":
		return openflow.IPProtoSCTP, nil
	case "icmp":
		return openflow.IPProtoICMP, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp, sctp or icmp", proto)
}

// Validate says what is wrong with a packet, if anything.
func (p Packet) Validate() error {
	if _, err := ProtoNumber(p.Proto); err != nil {
		return err
	}
	switch {
	case p.InPort == 0 || p.InPort >= openflow.PortInPort:
		return fmt.Errorf("in_port %d is not a port number", p.InPort)
	case len(p.EthSrc) != 6 || len(p.EthDst) != 6:
		return fmt.Errorf("packet needs Ethernet source and destination addresses")
	case !p.IPSrc.Is4() || !p.IPDst.Is4():
		return fmt.Errorf("packet needs IPv4 source and destination addresses (have %v → %v)", p.IPSrc, p.IPDst)
	case p.Proto != "icmp" && (p.SrcPort == 0 || p.DstPort == 0):
		return fmt.Errorf("a %s packet needs source and destination ports", p.Proto)
	case p.TunID != 0 && (!p.TunSrc.Is4() || !p.TunDst.Is4()):
		return fmt.Errorf("a tunnelled packet needs IPv4 tunnel source and destination")
	case p.TunID >= 1<<32:
		return fmt.Errorf("tun_id %#x does not fit a VXLAN VNI field", p.TunID)
	}
	return nil
}

// OVSFlow is the packet in ofproto/trace's flow syntax.
func (p Packet) OVSFlow() string {
	parts := []string{fmt.Sprintf("in_port=%d", p.InPort)}
	if p.TunID != 0 || p.TunSrc.IsValid() {
		parts = append(parts, fmt.Sprintf("tun_id=%#x", p.TunID), "tun_src="+p.TunSrc.String(), "tun_dst="+p.TunDst.String())
	}
	if p.DPHash != 0 {
		parts = append(parts, fmt.Sprintf("dp_hash=%#x", p.DPHash))
	}
	parts = append(parts, p.Proto, "dl_src="+p.EthSrc.String(), "dl_dst="+p.EthDst.String(),
		"nw_src="+p.IPSrc.String(), "nw_dst="+p.IPDst.String(), "nw_ttl=64")
	if p.Proto == "icmp" {
		parts = append(parts, "icmp_type=8", "icmp_code=0")
	} else {
		parts = append(parts, fmt.Sprintf("%s_src=%d", p.Proto, p.SrcPort), fmt.Sprintf("%s_dst=%d", p.Proto, p.DstPort))
	}
	if p.Proto == "tcp" {
		parts = append(parts, "tcp_flags=syn")
	}
	return strings.Join(parts, ",")
}

// OVSArgs are the unixctl parameters of ofproto/trace for p on bridge, with --ct-next for each
// recirculation.
func OVSArgs(bridge string, p Packet, ctNext []CtFlags) []string {
	args := make([]string, 0, 2*len(ctNext)+2)
	for _, f := range ctNext {
		args = append(args, "--ct-next", f.String())
	}
	return append(args, bridge, p.OVSFlow())
}

// CtFlags are the ct_state flags a trace resumes a recirculation with, as --ct-next takes them.
type CtFlags []string

// ctNextFlags are the flags --ct-next accepts (OVS's ct_state names).
var ctNextFlags = map[string]uint32{"new": openflow.CtNew, "est": openflow.CtEst, "rel": openflow.CtRel, "rpl": openflow.CtRpl,
	"inv": openflow.CtInv, "trk": openflow.CtTrk, "snat": openflow.CtSNAT, "dnat": openflow.CtDNAT}

// ParseCtFlags reads a --ct-next argument ("trk,new,dnat").
func ParseCtFlags(s string) (CtFlags, error) {
	var out CtFlags
	for _, f := range strings.Split(s, ",") {
		if _, ok := ctNextFlags[f]; !ok {
			return nil, fmt.Errorf("ct_state flag %q: want one of trk, new, est, rel, rpl, inv, dnat, snat", f)
		}
		out = append(out, f)
	}
	return out, nil
}

func (c CtFlags) String() string { return strings.Join(c, ",") }

// bits is the flags as a ct_state value.
func (c CtFlags) bits() uint32 {
	var v uint32
	for _, f := range c {
		v |= ctNextFlags[f]
	}
	return v
}
