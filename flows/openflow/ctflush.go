package openflow

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
)

// NXT_CT_FLUSH (Open vSwitch 3.1+, `ovs-ofctl ct-flush`): deletes the conntrack entries of one zone
// whose tuples match the given fields; fields left out match anything. Through OpenFlow it reaches
// the datapath's conntrack whichever it is (the kernel's, or userspace OVS's own, where netlink
// conntrack would see nothing).
const (
	nxtCTFlush       = 32
	nxCTOrigTuple    = 0
	nxCTReplyTuple   = 1
	nxCTZoneID       = 2
	nxCTTupleSrc     = 0
	nxCTTupleDst     = 1
	nxCTTupleSrcPort = 2
	nxCTTupleDstPort = 3
)

// ConntrackFlush selects conntrack entries by their original destination and their reply's source:
// for a service, the ClusterIP or NodePort address and port, and the endpoint it was DNATed to.
type ConntrackFlush struct {
	Protocol uint8
	Dst      netip.Addr // the original direction's destination
	DstPort  uint16
	ReplySrc netip.Addr // the reply direction's source (a DNAT target)
}

func (c ConntrackFlush) String() string {
	return fmt.Sprintf("%s %s:%d → %s", ProtoName(c.Protocol), c.Dst, c.DstPort, c.ReplySrc)
}

// ProtoName names an IP protocol the way ovs-ofctl's matches do.
func ProtoName(p uint8) string {
	switch p {
	case IPProtoTCP:
		return "tcp"
	case IPProtoUDP:
		return "udp"
	case IPProtoSCTP:
		return "sctp"
	case IPProtoICMP:
		return "icmp"
	}
	return strconv.Itoa(int(p))
}

// EncodeConntrackFlush encodes the flush of one ConntrackFlush in zone: entries whose original
// direction went to Dst:DstPort over Protocol and whose reply comes from ReplySrc. The xid is left 0
// for the session to set.
func EncodeConntrackFlush(zone uint16, c ConntrackFlush) []byte {
	var orig, reply []byte
	if c.Dst.IsValid() {
		orig = appendCTProp(orig, nxCTTupleDst, mapped(c.Dst))
	}
	if c.DstPort != 0 {
		orig = appendCTProp(orig, nxCTTupleDstPort, be16pad(c.DstPort))
	}
	if c.ReplySrc.IsValid() {
		reply = appendCTProp(reply, nxCTTupleSrc, mapped(c.ReplySrc))
	}
	msg := make([]byte, 8, 128)
	msg = binary.BigEndian.AppendUint32(msg, nxExperimenter)
	msg = binary.BigEndian.AppendUint32(msg, nxtCTFlush)
	msg = append(msg, c.Protocol, 0, 0, 0, 0, 0, 0, 0) // ip_proto, family (0: from the addresses), pad
	if len(orig) > 0 {
		msg = appendNested(msg, nxCTOrigTuple, orig)
	}
	if len(reply) > 0 {
		msg = appendNested(msg, nxCTReplyTuple, reply)
	}
	msg = appendCTProp(msg, nxCTZoneID, be16pad(zone))
	msg[0], msg[1] = Version, TypeExperimenter
	binary.BigEndian.PutUint16(msg[2:], uint16(len(msg)))
	return msg
}

// appendCTProp appends an OpenFlow property (type, length, value), padded to 8 bytes.
func appendCTProp(b []byte, typ uint16, value []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(4+len(value)))
	b = append(b, value...)
	return pad8(b)
}

// appendNested appends a property holding properties: its header is padded to 8 bytes before them.
func appendNested(b []byte, typ uint16, inner []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(inner)))
	b = append(b, 0, 0, 0, 0)
	return append(b, inner...)
}

func pad8(b []byte) []byte {
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

func mapped(a netip.Addr) []byte { s := netip.AddrFrom16(a.As16()).As16(); return s[:] }

// be16pad is a 16-bit property value as OVS writes one: two bytes and two of padding.
func be16pad(v uint16) []byte { return []byte{byte(v >> 8), byte(v), 0, 0} }
