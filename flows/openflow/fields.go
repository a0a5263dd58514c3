package openflow

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Field names one packet or metadata field that flows match on, load into or learn from. The order of
// the constants is the canonical order of a flow's match: Match sorts by it, so two matches with the same
// fields encode to the same bytes whatever order render code listed them in.
type Field uint8

const (
	FieldInvalid Field = iota
	FieldPktMark
	FieldConjID
	FieldCtState
	FieldCtZone
	FieldCtMark
	FieldCtNwDst
	FieldEthType
	FieldIPProto
	FieldReg0
	FieldReg1
	FieldReg2
	FieldReg3
	FieldReg4
	FieldReg5
	FieldReg6
	// FieldReg7 is the pipeline's proxy ARP scratch. FieldMetadata (below) no ofsdn flow renders: it
	// completes OpenFlow's fields, so a flow someone else put on the bridge decodes and prints like any other.
	FieldReg7
	FieldTunID
	FieldTunSrc
	FieldTunDst
	FieldMetadata
	FieldInPort
	FieldEthSrc
	FieldEthDst
	FieldIPSrc
	FieldIPDst
	FieldARPSPA
	FieldARPTPA
	FieldARPOp
	FieldTCPSrc
	FieldTCPDst
	FieldUDPSrc
	FieldUDPDst
	FieldSCTPSrc
	FieldSCTPDst
	FieldICMPType
	FieldICMPCode
	FieldARPSHA
	FieldARPTHA
	FieldTCPFlags
	fieldCount
)

// OXM classes (OpenFlow 1.3 §7.2.3.2 and Open vSwitch's NXM extensions).
const (
	classNXM0  uint16 = 0x0000
	classNXM1  uint16 = 0x0001
	classBasic uint16 = 0x8000
	// classExperimenter fields carry a 4-byte experimenter ID after the header; OVS uses it for
	// OpenFlow 1.3's tcp_flags (ONF extension 0x4f4e4600, field 42).
	classExperimenter uint16 = 0xffff
)

type valueFormat uint8

const (
	fmtHex valueFormat = iota
	fmtDec
	fmtIPv4
	fmtMAC
	fmtCtState
	fmtTCPFlags
)

// fieldInfo is everything the codec and the printer need to know about a Field.
type fieldInfo struct {
	match  string      // name in an ovs-ofctl match ("nw_src")
	nxm    string      // name in load/move/learn sub-fields ("NXM_OF_IP_SRC")
	set    string      // name after set_field's arrow ("ip_src")
	class  uint16      // OXM class used on the wire
	oxm    uint8       // OXM field number within class
	bytes  int         // value width in bytes
	format valueFormat // how ovs-ofctl prints a value
	// maskable says whether OVS accepts a mask for the field; prefixes and bitmasks need it.
	maskable bool
	// aliases are other (class, field) pairs OVS may use for the same field in replies.
	aliases [][2]uint16
}

var fieldTable = [fieldCount]fieldInfo{
	FieldPktMark:  {match: "pkt_mark", nxm: "NXM_NX_PKT_MARK", set: "pkt_mark", class: classNXM1, oxm: 33, bytes: 4, format: fmtHex, maskable: true},
	FieldConjID:   {match: "conj_id", nxm: "NXM_NX_CONJ_ID", set: "conj_id", class: classNXM1, oxm: 37, bytes: 4, format: fmtDec},
	FieldCtState:  {match: "ct_state", nxm: "NXM_NX_CT_STATE", set: "ct_state", class: classNXM1, oxm: 105, bytes: 4, format: fmtCtState, maskable: true},
	FieldCtZone:   {match: "ct_zone", nxm: "NXM_NX_CT_ZONE", set: "ct_zone", class: classNXM1, oxm: 106, bytes: 2, format: fmtDec},
	FieldCtMark:   {match: "ct_mark", nxm: "NXM_NX_CT_MARK", set: "ct_mark", class: classNXM1, oxm: 107, bytes: 4, format: fmtHex, maskable: true},
	FieldCtNwDst:  {match: "ct_nw_dst", nxm: "NXM_NX_CT_NW_DST", set: "ct_nw_dst", class: classNXM1, oxm: 121, bytes: 4, format: fmtIPv4, maskable: true},
	FieldEthType:  {match: "dl_type", nxm: "NXM_OF_ETH_TYPE", set: "eth_type", class: classBasic, oxm: 5, bytes: 2, format: fmtHex, aliases: [][2]uint16{{classNXM0, 3}}},
	FieldIPProto:  {match: "nw_proto", nxm: "NXM_OF_IP_PROTO", set: "nw_proto", class: classBasic, oxm: 10, bytes: 1, format: fmtDec, aliases: [][2]uint16{{classNXM0, 6}}},
	FieldReg0:     {match: "reg0", nxm: "NXM_NX_REG0", set: "reg0", class: classNXM1, oxm: 0, bytes: 4, format: fmtHex, maskable: true},
	FieldReg1:     {match: "reg1", nxm: "NXM_NX_REG1", set: "reg1", class: classNXM1, oxm: 1, bytes: 4, format: fmtHex, maskable: true},
	FieldReg2:     {match: "reg2", nxm: "NXM_NX_REG2", set: "reg2", class: classNXM1, oxm: 2, bytes: 4, format: fmtHex, maskable: true},
	FieldReg3:     {match: "reg3", nxm: "NXM_NX_REG3", set: "reg3", class: classNXM1, oxm: 3, bytes: 4, format: fmtHex, maskable: true},
	FieldReg4:     {match: "reg4", nxm: "NXM_NX_REG4", set: "reg4", class: classNXM1, oxm: 4, bytes: 4, format: fmtHex, maskable: true},
	FieldReg5:     {match: "reg5", nxm: "NXM_NX_REG5", set: "reg5", class: classNXM1, oxm: 5, bytes: 4, format: fmtHex, maskable: true},
	FieldReg6:     {match: "reg6", nxm: "NXM_NX_REG6", set: "reg6", class: classNXM1, oxm: 6, bytes: 4, format: fmtHex, maskable: true},
	FieldReg7:     {match: "reg7", nxm: "NXM_NX_REG7", set: "reg7", class: classNXM1, oxm: 7, bytes: 4, format: fmtHex, maskable: true},
	FieldTunID:    {match: "tun_id", nxm: "NXM_NX_TUN_ID", set: "tun_id", class: classBasic, oxm: 38, bytes: 8, format: fmtHex, maskable: true, aliases: [][2]uint16{{classNXM1, 16}}},
	FieldTunSrc:   {match: "tun_src", nxm: "NXM_NX_TUN_IPV4_SRC", set: "tun_src", class: classNXM1, oxm: 31, bytes: 4, format: fmtIPv4, maskable: true},
	FieldTunDst:   {match: "tun_dst", nxm: "NXM_NX_TUN_IPV4_DST", set: "tun_dst", class: classNXM1, oxm: 32, bytes: 4, format: fmtIPv4, maskable: true},
	FieldMetadata: {match: "metadata", nxm: "OXM_OF_METADATA", set: "metadata", class: classBasic, oxm: 2, bytes: 8, format: fmtHex, maskable: true},
	FieldInPort:   {match: "in_port", nxm: "NXM_OF_IN_PORT", set: "in_port", class: classBasic, oxm: 0, bytes: 4, format: fmtDec},
	FieldEthSrc:   {match: "dl_src", nxm: "NXM_OF_ETH_SRC", set: "eth_src", class: classBasic, oxm: 4, bytes: 6, format: fmtMAC, maskable: true, aliases: [][2]uint16{{classNXM0, 2}}},
	FieldEthDst:   {match: "dl_dst", nxm: "NXM_OF_ETH_DST", set: "eth_dst", class: classBasic, oxm: 3, bytes: 6, format: fmtMAC, maskable: true, aliases: [][2]uint16{{classNXM0, 1}}},
	FieldIPSrc:    {match: "nw_src", nxm: "NXM_OF_IP_SRC", set: "ip_src", class: classBasic, oxm: 11, bytes: 4, format: fmtIPv4, maskable: true, aliases: [][2]uint16{{classNXM0, 7}}},
	FieldIPDst:    {match: "nw_dst", nxm: "NXM_OF_IP_DST", set: "ip_dst", class: classBasic, oxm: 12, bytes: 4, format: fmtIPv4, maskable: true, aliases: [][2]uint16{{classNXM0, 8}}},
	FieldARPSPA:   {match: "arp_spa", nxm: "NXM_OF_ARP_SPA", set: "arp_spa", class: classBasic, oxm: 22, bytes: 4, format: fmtIPv4, maskable: true, aliases: [][2]uint16{{classNXM0, 16}}},
	FieldARPTPA:   {match: "arp_tpa", nxm: "NXM_OF_ARP_TPA", set: "arp_tpa", class: classBasic, oxm: 23, bytes: 4, format: fmtIPv4, maskable: true, aliases: [][2]uint16{{classNXM0, 17}}},
	FieldARPOp:    {match: "arp_op", nxm: "NXM_OF_ARP_OP", set: "arp_op", class: classBasic, oxm: 21, bytes: 2, format: fmtDec, aliases: [][2]uint16{{classNXM0, 15}}},
	FieldTCPSrc:   {match: "tp_src", nxm: "NXM_OF_TCP_SRC", set: "tcp_src", class: classBasic, oxm: 13, bytes: 2, format: fmtDec, maskable: true, aliases: [][2]uint16{{classNXM0, 9}}},
	FieldTCPDst:   {match: "tp_dst", nxm: "NXM_OF_TCP_DST", set: "tcp_dst", class: classBasic, oxm: 14, bytes: 2, format: fmtDec, maskable: true, aliases: [][2]uint16{{classNXM0, 10}}},
	FieldUDPSrc:   {match: "tp_src", nxm: "NXM_OF_UDP_SRC", set: "udp_src", class: classBasic, oxm: 15, bytes: 2, format: fmtDec, maskable: true, aliases: [][2]uint16{{classNXM0, 11}}},
	FieldUDPDst:   {match: "tp_dst", nxm: "NXM_OF_UDP_DST", set: "udp_dst", class: classBasic, oxm: 16, bytes: 2, format: fmtDec, maskable: true, aliases: [][2]uint16{{classNXM0, 12}}},
	FieldSCTPSrc:  {match: "tp_src", nxm: "OXM_OF_SCTP_SRC", set: "sctp_src", class: classBasic, oxm: 17, bytes: 2, format: fmtDec, maskable: true},
	FieldSCTPDst:  {match: "tp_dst", nxm: "OXM_OF_SCTP_DST", set: "sctp_dst", class: classBasic, oxm: 18, bytes: 2, format: fmtDec, maskable: true},
	FieldICMPType: {match: "icmp_type", nxm: "NXM_OF_ICMP_TYPE", set: "icmp_type", class: classBasic, oxm: 19, bytes: 1, format: fmtDec, aliases: [][2]uint16{{classNXM0, 13}}},
	FieldICMPCode: {match: "icmp_code", nxm: "NXM_OF_ICMP_CODE", set: "icmp_code", class: classBasic, oxm: 20, bytes: 1, format: fmtDec, aliases: [][2]uint16{{classNXM0, 14}}},
	FieldARPSHA:   {match: "arp_sha", nxm: "NXM_NX_ARP_SHA", set: "arp_sha", class: classBasic, oxm: 24, bytes: 6, format: fmtMAC, maskable: true, aliases: [][2]uint16{{classNXM1, 17}}},
	FieldARPTHA:   {match: "arp_tha", nxm: "NXM_NX_ARP_THA", set: "arp_tha", class: classBasic, oxm: 25, bytes: 6, format: fmtMAC, maskable: true, aliases: [][2]uint16{{classNXM1, 18}}},
	FieldTCPFlags: {match: "tcp_flags", nxm: "NXM_NX_TCP_FLAGS", set: "tcp_flags", class: classNXM1, oxm: 34, bytes: 2, format: fmtTCPFlags, maskable: true},
}

// fieldByWire finds a Field from an OXM class and field number, accepting OVS's aliases.
var fieldByWire = func() map[[2]uint16]Field {
	m := make(map[[2]uint16]Field)
	for f := Field(1); f < fieldCount; f++ {
		info := fieldTable[f]
		m[[2]uint16{info.class, uint16(info.oxm)}] = f
		for _, a := range info.aliases {
			m[a] = f
		}
	}
	return m
}()

func (f Field) valid() bool { return f > FieldInvalid && f < fieldCount }

// Bits is the field's width in bits.
func (f Field) Bits() int {
	if !f.valid() {
		return 0
	}
	return fieldTable[f].bytes * 8
}

// String is the field's name in an ovs-ofctl match.
func (f Field) String() string {
	if !f.valid() {
		return fmt.Sprintf("field(%d)", uint8(f))
	}
	return fieldTable[f].match
}

// nxmID is the (class, field) NX actions name the field by: the NXM one where the field has one, as
// ovs-vswitchd encodes it in replies, else the OXM one.
func (f Field) nxmID() (uint16, uint8) {
	info := fieldTable[f]
	for _, a := range info.aliases {
		if a[0] == classNXM0 || a[0] == classNXM1 {
			return a[0], uint8(a[1])
		}
	}
	return info.class, info.oxm
}

func fieldByHeader(h uint32) (Field, bool) {
	f, ok := fieldByWire[[2]uint16{uint16(h >> 16), uint16(h>>9) & 0x7f}]
	return f, ok
}

func (f Field) allOnes() uint64 {
	if f.Bits() >= 64 {
		return ^uint64(0)
	}
	return 1<<uint(f.Bits()) - 1
}

// formatValue prints a value the way ovs-ofctl does for this field.
func (f Field) formatValue(v uint64) string {
	switch fieldTable[f].format {
	case fmtDec:
		return fmt.Sprintf("%d", v)
	case fmtIPv4:
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	case fmtMAC:
		return macString(v)
	default:
		return hexString(v)
	}
}

// hexString prints like C's "%#x", as ovs-ofctl does: 0 is "0", not "0x0".
func hexString(v uint64) string {
	if v == 0 {
		return "0"
	}
	return fmt.Sprintf("%#x", v)
}

// formatMasked prints value/mask the way ovs-ofctl does: IPv4 masks as prefixes where they are one.
func (f Field) formatMasked(v, m uint64) string {
	switch fieldTable[f].format {
	case fmtIPv4:
		if bits, ok := prefixLen(uint32(m)); ok {
			return fmt.Sprintf("%s/%d", f.formatValue(v), bits)
		}
		return f.formatValue(v) + "/" + f.formatValue(m)
	case fmtMAC:
		return macString(v) + "/" + macString(m)
	case fmtCtState:
		return formatFlags(ctStateNames, v, m)
	case fmtTCPFlags:
		return formatFlags(tcpFlagNames, v, m)
	case fmtDec:
		// Masked L4 ports: ovs-ofctl prints both halves as 0x-prefixed hex, zero included.
		return fmt.Sprintf("%#x/%#x", v, m)
	default:
		return hexString(v) + "/" + hexString(m)
	}
}

func prefixLen(m uint32) (int, bool) {
	ones := 0
	for ones < 32 && m&(1<<(31-ones)) != 0 {
		ones++
	}
	if ones < 32 && m<<ones != 0 {
		return 0, false
	}
	return ones, true
}

func macString(v uint64) string {
	hw := net.HardwareAddr{byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	return hw.String()
}

// MACValue is a MAC address as the 48-bit value of an eth_src/eth_dst/arp_sha field.
func MACValue(hw net.HardwareAddr) uint64 {
	var v uint64
	for i := 0; i < 6 && i < len(hw); i++ {
		v = v<<8 | uint64(hw[i])
	}
	return v
}

// IPv4Value is an IPv4 address as the 32-bit value of an IP field; false for anything else.
func IPv4Value(a netip.Addr) (uint64, bool) {
	a = a.Unmap()
	if !a.Is4() {
		return 0, false
	}
	b := a.As4()
	return uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3]), true
}

// ct_state and tcp_flags bits in the order ovs-ofctl prints them.
var ctStateNames = []string{"new", "est", "rel", "rpl", "inv", "trk", "snat", "dnat"}
var tcpFlagNames = []string{"fin", "syn", "rst", "psh", "ack", "urg", "ece", "cwr", "ns"}

func formatFlags(names []string, v, m uint64) string {
	var b strings.Builder
	for i, n := range names {
		bit := uint64(1) << i
		if m&bit == 0 {
			continue
		}
		if v&bit != 0 {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
		}
		b.WriteString(n)
	}
	return b.String()
}

// SubField is a bit range of a field, as NXM load/move/output:reg and learn name it ("NXM_NX_REG0[0..15]").
type SubField struct {
	Field Field
	Start uint8 // first bit, 0 = least significant
	End   uint8 // last bit, inclusive
}

// Whole names all bits of f.
func Whole(f Field) SubField {
	if !f.valid() {
		return SubField{Field: f}
	}
	return SubField{Field: f, Start: 0, End: uint8(f.Bits() - 1)}
}

// Bits names bits start..end (inclusive) of f.
func Bits(f Field, start, end uint8) SubField { return SubField{Field: f, Start: start, End: end} }

// NBits is the width of the sub-field.
func (s SubField) NBits() int { return int(s.End) - int(s.Start) + 1 }

func (s SubField) whole() bool { return s.Start == 0 && s.NBits() == s.Field.Bits() }

func (s SubField) validate() error {
	if !s.Field.valid() {
		return fmt.Errorf("invalid field %d", s.Field)
	}
	if s.End < s.Start || int(s.End) >= s.Field.Bits() {
		return fmt.Errorf("bits %d..%d outside %s (%d bits)", s.Start, s.End, fieldTable[s.Field].nxm, s.Field.Bits())
	}
	return nil
}

// String prints the sub-field in ovs-ofctl's NXM syntax.
func (s SubField) String() string {
	if !s.Field.valid() {
		return fmt.Sprintf("field(%d)[]", uint8(s.Field))
	}
	name := fieldTable[s.Field].nxm
	switch {
	case s.whole():
		return name + "[]"
	case s.Start == s.End:
		return fmt.Sprintf("%s[%d]", name, s.Start)
	default:
		return fmt.Sprintf("%s[%d..%d]", name, s.Start, s.End)
	}
}

// ofsNbits is the NXM encoding of a bit range: offset in the top 10 bits, width-1 in the low 6.
func (s SubField) ofsNbits() uint16 { return uint16(s.Start)<<6 | uint16(s.NBits()-1) }

func subFieldFromWire(header uint32, ofs, nbits int) (SubField, error) {
	f, ok := fieldByHeader(header)
	if !ok {
		return SubField{}, fmt.Errorf("unknown field header %#x", header)
	}
	sf := SubField{Field: f, Start: uint8(ofs), End: uint8(ofs + nbits - 1)}
	if ofs < 0 || nbits < 1 || ofs+nbits > f.Bits() {
		return SubField{}, fmt.Errorf("bits %d+%d outside %s", ofs, nbits, fieldTable[f].nxm)
	}
	return sf, nil
}
