package openflow

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// Ethernet types and IP protocols that matches and the printer know by name.
const (
	EthTypeIPv4 uint16 = 0x0800
	EthTypeARP  uint16 = 0x0806
	EthTypeIPv6 uint16 = 0x86dd
	IPProtoICMP uint8  = 1
	IPProtoTCP  uint8  = 6
	IPProtoUDP  uint8  = 17
	IPProtoSCTP uint8  = 132
)

// ARP opcodes.
const (
	ARPRequest uint16 = 1
	ARPReply   uint16 = 2
)

// MatchField is one field of a match: a value and, when Masked, a mask. Values of fields narrower than
// 64 bits sit in the low bits; IPv4 addresses and MACs are stored as big-endian integers.
type MatchField struct {
	Field  Field
	Value  uint64
	Mask   uint64
	Masked bool
	// none marks a fully wildcarded field (a /0 prefix): it matches everything and is dropped.
	none bool
}

// Match is a normalised, canonically ordered set of match fields. Build one with M.
type Match struct {
	fields []MatchField
	err    error
}

// M builds a match from fields in any order: wildcards are dropped, all-ones masks become exact
// matches, and the fields are sorted into canonical order. A field given twice is an error that
// surfaces when the flow is compiled.
func M(fields ...MatchField) Match {
	out := make([]MatchField, 0, len(fields))
	var err error
	for _, f := range fields {
		if f.none {
			continue
		}
		if !f.Field.valid() {
			err = fmt.Errorf("match: invalid field %d", f.Field)
			continue
		}
		all := f.Field.allOnes()
		f.Value &= all
		if f.Masked {
			f.Mask &= all
			if f.Mask == all {
				f.Masked, f.Mask = false, 0
			} else if f.Mask == 0 {
				continue
			} else {
				f.Value &= f.Mask
			}
		}
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b MatchField) int { return cmp.Compare(a.Field, b.Field) })
	for i := 1; i < len(out); i++ {
		if out[i].Field == out[i-1].Field {
			err = fmt.Errorf("match: field %s given twice", out[i].Field)
		}
	}
	return Match{fields: out, err: err}
}

// Fields returns the match's fields in canonical order.
func (m Match) Fields() []MatchField { return m.fields }

// Get returns the field f of the match, if present.
func (m Match) Get(f Field) (MatchField, bool) {
	for _, mf := range m.fields {
		if mf.Field == f {
			return mf, true
		}
	}
	return MatchField{}, false
}

// Err reports a field given twice or an invalid field.
func (m Match) Err() error { return m.err }

// With returns a copy of m with more fields.
func (m Match) With(fields ...MatchField) Match {
	all := make([]MatchField, 0, len(m.fields)+len(fields))
	all = append(append(all, m.fields...), fields...)
	nm := M(all...)
	if nm.err == nil {
		nm.err = m.err
	}
	return nm
}

// Exact matches a whole field against v.
func Exact(f Field, v uint64) MatchField { return MatchField{Field: f, Value: v} }

// Masked matches the bits of f that are set in mask against v.
func Masked(f Field, v, mask uint64) MatchField {
	return MatchField{Field: f, Value: v, Mask: mask, Masked: true}
}

// Protocol shorthands, as ovs-ofctl's "ip", "arp", "ipv6", "tcp", "udp", "sctp", "icmp". IPv6 is
// matched only to drop it (ofsdn carries IPv4).
var (
	IP   = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4))}
	ARP  = []MatchField{Exact(FieldEthType, uint64(EthTypeARP))}
	IPv6 = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv6))}
	TCP  = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4)), Exact(FieldIPProto, uint64(IPProtoTCP))}
	UDP  = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4)), Exact(FieldIPProto, uint64(IPProtoUDP))}
	SCTP = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4)), Exact(FieldIPProto, uint64(IPProtoSCTP))}
	ICMP = []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4)), Exact(FieldIPProto, uint64(IPProtoICMP))}
)

// Proto returns the shorthand fields for an IP protocol number.
func Proto(p uint8) []MatchField {
	return []MatchField{Exact(FieldEthType, uint64(EthTypeIPv4)), Exact(FieldIPProto, uint64(p))}
}

// InPort matches the OpenFlow ingress port.
func InPort(port uint32) MatchField { return Exact(FieldInPort, uint64(port)) }

// EthSrc and EthDst match a MAC address exactly.
func EthSrc(hw net.HardwareAddr) MatchField { return Exact(FieldEthSrc, MACValue(hw)) }
func EthDst(hw net.HardwareAddr) MatchField { return Exact(FieldEthDst, MACValue(hw)) }

// ARPSHA and ARPTHA match ARP hardware addresses.
func ARPSHA(hw net.HardwareAddr) MatchField { return Exact(FieldARPSHA, MACValue(hw)) }
func ARPTHA(hw net.HardwareAddr) MatchField { return Exact(FieldARPTHA, MACValue(hw)) }

// ipField matches an IPv4 address; a non-IPv4 address yields an invalid field so the error surfaces.
func ipField(f Field, a netip.Addr) MatchField {
	v, ok := IPv4Value(a)
	if !ok {
		return MatchField{Field: FieldInvalid}
	}
	return Exact(f, v)
}

// prefixField matches an IPv4 prefix; /0 matches everything and is dropped from the match.
func prefixField(f Field, p netip.Prefix) MatchField {
	v, ok := IPv4Value(p.Addr())
	if !ok || !p.IsValid() {
		return MatchField{Field: FieldInvalid}
	}
	if p.Bits() == 0 {
		return MatchField{Field: f, none: true}
	}
	mask := uint64(^uint32(0) << (32 - p.Bits()))
	return Masked(f, v, mask)
}

// IPSrc, IPDst, ARPSPA, ARPTPA, TunSrc and TunDst match an IPv4 address exactly; the *Net forms a prefix.
func IPSrc(a netip.Addr) MatchField       { return ipField(FieldIPSrc, a) }
func IPDst(a netip.Addr) MatchField       { return ipField(FieldIPDst, a) }
func IPSrcNet(p netip.Prefix) MatchField  { return prefixField(FieldIPSrc, p) }
func IPDstNet(p netip.Prefix) MatchField  { return prefixField(FieldIPDst, p) }
func ARPSPA(a netip.Addr) MatchField      { return ipField(FieldARPSPA, a) }
func ARPTPA(a netip.Addr) MatchField      { return ipField(FieldARPTPA, a) }
func ARPSPANet(p netip.Prefix) MatchField { return prefixField(FieldARPSPA, p) }
func ARPTPANet(p netip.Prefix) MatchField { return prefixField(FieldARPTPA, p) }
func TunSrc(a netip.Addr) MatchField      { return ipField(FieldTunSrc, a) }
func TunDst(a netip.Addr) MatchField      { return ipField(FieldTunDst, a) }
func CtNwDst(a netip.Addr) MatchField     { return ipField(FieldCtNwDst, a) }

// ARPOp matches the ARP opcode.
func ARPOp(op uint16) MatchField { return Exact(FieldARPOp, uint64(op)) }

// TunID matches the VXLAN VNI.
func TunID(id uint64) MatchField { return Exact(FieldTunID, id) }

// L4 port matches; the protocol shorthand must be in the match too.
func TCPDst(p uint16) MatchField  { return Exact(FieldTCPDst, uint64(p)) }
func TCPSrc(p uint16) MatchField  { return Exact(FieldTCPSrc, uint64(p)) }
func UDPDst(p uint16) MatchField  { return Exact(FieldUDPDst, uint64(p)) }
func UDPSrc(p uint16) MatchField  { return Exact(FieldUDPSrc, uint64(p)) }
func SCTPDst(p uint16) MatchField { return Exact(FieldSCTPDst, uint64(p)) }
func SCTPSrc(p uint16) MatchField { return Exact(FieldSCTPSrc, uint64(p)) }

// ICMPType and ICMPCode match ICMPv4 headers.
func ICMPType(t uint8) MatchField { return Exact(FieldICMPType, uint64(t)) }
func ICMPCode(c uint8) MatchField { return Exact(FieldICMPCode, uint64(c)) }

// Reg matches a whole register; RegBits matches a sub-field of one.
func Reg(r Field, v uint32) MatchField { return Exact(r, uint64(v)) }
func RegBits(sf SubField, v uint32) MatchField {
	mask := (uint64(1)<<uint(sf.NBits()) - 1) << sf.Start
	return Masked(sf.Field, uint64(v)<<sf.Start, mask)
}

// CtZone, CtMark, PktMark and ConjID match connection-tracking and metadata fields.
func CtZone(z uint16) MatchField         { return Exact(FieldCtZone, uint64(z)) }
func CtMark(v, mask uint32) MatchField   { return Masked(FieldCtMark, uint64(v), uint64(mask)) }
func PktMark(v, mask uint32) MatchField  { return Masked(FieldPktMark, uint64(v), uint64(mask)) }
func ConjID(id uint32) MatchField        { return Exact(FieldConjID, uint64(id)) }
func TCPFlags(v, mask uint16) MatchField { return Masked(FieldTCPFlags, uint64(v), uint64(mask)) }

// Connection-tracking state bits (NXM_NX_CT_STATE).
const (
	CtNew uint32 = 1 << iota
	CtEst
	CtRel
	CtRpl
	CtInv
	CtTrk
	CtSNAT
	CtDNAT
)

// CtState matches ct_state: bits in set must be on, bits in clear must be off (e.g. +trk+new-rpl).
func CtState(set, clear uint32) MatchField {
	return Masked(FieldCtState, uint64(set), uint64(set|clear))
}

// String prints the match the way ovs-ofctl dump-flows does (without the priority).
func (m Match) String() string {
	parts := make([]string, 0, len(m.fields)+1)
	ethType, hasEth := m.Get(FieldEthType)
	ipProto, hasProto := m.Get(FieldIPProto)
	shorthand := ""
	if hasEth && !ethType.Masked {
		switch uint16(ethType.Value) {
		case EthTypeIPv4:
			shorthand = "ip"
			if hasProto && !ipProto.Masked {
				switch uint8(ipProto.Value) {
				case IPProtoTCP:
					shorthand = "tcp"
				case IPProtoUDP:
					shorthand = "udp"
				case IPProtoSCTP:
					shorthand = "sctp"
				case IPProtoICMP:
					shorthand = "icmp"
				}
			}
		case EthTypeARP:
			shorthand = "arp"
		case EthTypeIPv6:
			shorthand = "ipv6"
		}
	}
	protoConsumed := shorthand != "" && shorthand != "ip" && shorthand != "arp" && shorthand != "ipv6"
	emit := func(mf MatchField) {
		info := fieldTable[mf.Field]
		if mf.Masked {
			parts = append(parts, info.match+"="+mf.Field.formatMasked(mf.Value, mf.Mask))
		} else if info.format == fmtCtState || info.format == fmtTCPFlags {
			parts = append(parts, info.match+"="+mf.Field.formatMasked(mf.Value, mf.Field.allOnes()))
		} else {
			parts = append(parts, info.match+"="+mf.Field.formatValue(mf.Value))
		}
	}
	// ovs-ofctl puts the protocol shorthand after the conntrack fields and before registers, and a bare
	// dl_type / nw_proto after the Ethernet and IP addresses.
	for _, mf := range m.fields {
		switch {
		case mf.Field == FieldEthType:
			if shorthand != "" {
				parts = append(parts, shorthand)
			}
		case mf.Field == FieldIPProto:
		case mf.Field == FieldEthDst:
			emit(mf)
			if shorthand == "" && hasEth {
				emit(ethType)
			}
		case mf.Field == FieldARPTPA || mf.Field == FieldIPDst:
			emit(mf)
		default:
			if mf.Field > FieldIPDst && mf.Field > FieldARPTPA && hasProto && !protoConsumed {
				// nw_proto belongs right after the network addresses.
				emit(ipProto)
				protoConsumed = true
			}
			if mf.Field > FieldEthDst && shorthand == "" && hasEth && !containsAfter(parts, "dl_type=") {
				emit(ethType)
			}
			emit(mf)
		}
	}
	if hasProto && !protoConsumed {
		emit(ipProto)
	}
	if shorthand == "" && hasEth && !containsAfter(parts, "dl_type=") {
		emit(ethType)
	}
	return strings.Join(parts, ",")
}

func containsAfter(parts []string, prefix string) bool {
	for _, p := range parts {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}
