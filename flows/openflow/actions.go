package openflow

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
)

// Action is one OpenFlow action (or the goto_table instruction, which must come last). Each type prints
// itself in ovs-ofctl syntax; codec.go turns it into libOpenflow messages and back.
type Action interface {
	String() string
	isAction()
}

// Reserved OpenFlow 1.3 port numbers.
const (
	PortInPort     uint32 = 0xfffffff8
	PortTable      uint32 = 0xfffffff9
	PortNormal     uint32 = 0xfffffffa
	PortFlood      uint32 = 0xfffffffb
	PortAll        uint32 = 0xfffffffc
	PortController uint32 = 0xfffffffd
	PortLocal      uint32 = 0xfffffffe
	PortAny        uint32 = 0xffffffff
)

var portNames = map[uint32]string{
	PortInPort: "IN_PORT", PortTable: "TABLE", PortNormal: "NORMAL", PortFlood: "FLOOD",
	PortAll: "ALL", PortController: "CONTROLLER", PortLocal: "LOCAL", PortAny: "ANY",
}

// Output sends the packet out of a port. MaxLen matters only for the controller port.
type Output struct {
	Port   uint32
	MaxLen uint16
}

func (a Output) String() string {
	if a.Port == PortController {
		return fmt.Sprintf("CONTROLLER:%d", a.MaxLen)
	}
	if n, ok := portNames[a.Port]; ok {
		return n
	}
	return fmt.Sprintf("output:%d", a.Port)
}

// Controller sends the packet's first MaxLen bytes to the controller connections as a packet-in,
// through OpenFlow meter MeterID (0: no meter). It is Open vSwitch's controller(max_len=N,meter_id=M)
// (NXAST_CONTROLLER2): the meter limits the packet-ins alone, never the flow's other actions, so a
// flow that forwards (or rejects) keeps doing so over the meter's rate. Drop sampling uses it
// (flows/pipeline/drops.go).
type Controller struct {
	MaxLen  uint16
	MeterID uint32
}

func (a Controller) String() string {
	if a.MeterID == 0 {
		return fmt.Sprintf("controller(max_len=%d)", a.MaxLen)
	}
	return fmt.Sprintf("controller(max_len=%d,meter_id=%d)", a.MaxLen, a.MeterID)
}

// OutputReg sends the packet out of the port held in a register (openshift-sdn keeps it in reg2).
type OutputReg struct{ Src SubField }

func (a OutputReg) String() string { return "output:" + a.Src.String() }

// ToGroup hands the packet to a group (select for services, all for flooding).
type ToGroup struct{ ID uint32 }

func (a ToGroup) String() string { return fmt.Sprintf("group:%d", a.ID) }

// Goto continues in a later table; it is an instruction and must be the last action.
type Goto struct{ Table TableID }

func (a Goto) String() string { return fmt.Sprintf("goto_table:%d", a.Table) }

// Resubmit runs the packet through a table and comes back (resubmit(,N)).
type Resubmit struct{ Table TableID }

func (a Resubmit) String() string { return fmt.Sprintf("resubmit(,%d)", a.Table) }

// Load writes a constant into a sub-field (NXAST_REG_LOAD).
type Load struct {
	Dst   SubField
	Value uint64
}

func (a Load) String() string {
	if a.Value == 0 {
		return "load:0->" + a.Dst.String()
	}
	return fmt.Sprintf("load:%#x->%s", a.Value, a.Dst.String())
}

// SetField writes a whole field (OFPAT_SET_FIELD): tunnel destination, MACs, tun_id.
type SetField struct {
	Field Field
	Value uint64
}

func (a SetField) String() string {
	if !a.Field.valid() {
		return fmt.Sprintf("set_field:%#x->field(%d)", a.Value, uint8(a.Field))
	}
	return "set_field:" + a.Field.formatValue(a.Value) + "->" + fieldTable[a.Field].set
}

// Move copies one sub-field into another of the same width.
type Move struct{ Src, Dst SubField }

func (a Move) String() string { return "move:" + a.Src.String() + "->" + a.Dst.String() }

// DecTTL decrements the IP TTL (routing between subnets).
type DecTTL struct{}

func (DecTTL) String() string { return "dec_ttl" }

// Conjunction marks clause Clause (1-based) of NClauses of conjunctive match ID.
type Conjunction struct {
	ID       uint32
	Clause   uint8
	NClauses uint8
}

func (a Conjunction) String() string {
	return fmt.Sprintf("conjunction(%d,%d/%d)", a.ID, a.Clause, a.NClauses)
}

// Note carries opaque bytes; ofsdn uses one to stamp the pipeline version into the bridge.
type Note struct{ Data []byte }

// String prints the note as ovs-ofctl does, including the zero padding to 8-byte action alignment.
func (a Note) String() string {
	n := noteLen(len(a.Data))
	padded := make([]byte, n)
	copy(padded, a.Data)
	parts := make([]string, n)
	for i, b := range padded {
		parts[i] = hex.EncodeToString([]byte{b})
	}
	return "note:" + strings.Join(parts, ".")
}

// Uint32Note carries a 32-bit value in a note (big-endian), e.g. a pipeline version.
func Uint32Note(v uint32) Note {
	return Note{Data: []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}}
}

// Uint32 reads back a value Uint32Note wrote, as a switch returns it: OVS pads a note with zeros and
// decoding trims them, so the trailing zero bytes are restored here.
func (a Note) Uint32() (uint32, bool) {
	if len(a.Data) > 4 {
		return 0, false
	}
	var v uint32
	for _, b := range a.Data {
		v = v<<8 | uint32(b)
	}
	return v << (8 * uint(4-len(a.Data))), true
}

// noteLen is how many note bytes fit once the 10-byte NX header is padded to a multiple of 8.
func noteLen(n int) int { return (10+n+7)/8*8 - 10 }

// NATKind says what a ct nat() action rewrites.
type NATKind uint8

const (
	// NATReverse is a bare "nat": apply the NAT of an existing connection (un-DNAT replies).
	NATReverse NATKind = iota
	NATSrc
	NATDst
)

// NAT is conntrack's nat() inside ct().
type NAT struct {
	Kind             NATKind
	AddrMin, AddrMax netip.Addr // AddrMax optional
	PortMin, PortMax uint16     // PortMax optional
	Random           bool
	Persistent       bool
	Hash             bool
}

func (n NAT) String() string {
	if n.Kind == NATReverse {
		return "nat"
	}
	var b strings.Builder
	b.WriteString("nat(")
	if n.Kind == NATSrc {
		b.WriteString("src")
	} else {
		b.WriteString("dst")
	}
	if n.AddrMin.IsValid() {
		b.WriteString("=" + n.AddrMin.String())
		if n.AddrMax.IsValid() && n.AddrMax != n.AddrMin {
			b.WriteString("-" + n.AddrMax.String())
		}
		if n.PortMin != 0 {
			fmt.Fprintf(&b, ":%d", n.PortMin)
			if n.PortMax != 0 && n.PortMax != n.PortMin {
				fmt.Fprintf(&b, "-%d", n.PortMax)
			}
		}
	}
	var flags []string
	if n.Random {
		flags = append(flags, "random")
	}
	if n.Hash {
		flags = append(flags, "hash")
	}
	if n.Persistent {
		flags = append(flags, "persistent")
	}
	if len(flags) > 0 {
		b.WriteString("," + strings.Join(flags, ","))
	}
	b.WriteString(")")
	return b.String()
}

// NoTable in CT.Table means "don't recirculate".
const NoTable TableID = 0xff

// CT sends the packet through conntrack. Zone comes from ZoneSrc when it names a field, else Zone.
type CT struct {
	Commit  bool
	Table   TableID // NoTable: continue with the next action instead of recirculating
	Zone    uint16
	ZoneSrc *SubField
	NAT     *NAT
	Exec    []Action // only Load/SetField/Move on ct_mark or ct_label are valid here
}

func (a CT) String() string {
	var parts []string
	if a.Commit {
		parts = append(parts, "commit")
	}
	if a.Table != NoTable {
		parts = append(parts, fmt.Sprintf("table=%d", a.Table))
	}
	if a.ZoneSrc != nil {
		parts = append(parts, "zone="+a.ZoneSrc.String())
	} else if a.Zone != 0 {
		parts = append(parts, fmt.Sprintf("zone=%d", a.Zone))
	}
	// OVS prints (and ofsdn encodes) nat first, outside the exec() envelope.
	if a.NAT != nil {
		parts = append(parts, a.NAT.String())
	}
	if len(a.Exec) > 0 {
		parts = append(parts, "exec("+actionsString(a.Exec)+")")
	}
	return "ct(" + strings.Join(parts, ",") + ")"
}

// LearnSpec is one element of a learn() action: what the learned flow matches or loads.
type LearnSpec struct {
	Kind LearnKind
	Dst  SubField // the learned flow's match field, or the load destination
	// Exactly one source: a field of the current packet, or a constant.
	Src      *SubField
	SrcValue uint64
	// OutputSrc is for LearnOutput: the learned flow outputs to the port in this sub-field.
}

// LearnKind says what a learn spec contributes to the learned flow.
type LearnKind uint8

const (
	LearnMatch LearnKind = iota
	LearnLoad
	LearnOutput
)

func (s LearnSpec) String() string {
	switch s.Kind {
	case LearnMatch:
		if s.Src == nil {
			if s.Dst.whole() {
				return fieldTable[s.Dst.Field].set + "=" + s.Dst.Field.formatValue(s.SrcValue)
			}
			return fmt.Sprintf("%s=%#x", s.Dst.String(), s.SrcValue)
		}
		if *s.Src == s.Dst {
			return s.Dst.String()
		}
		return s.Dst.String() + "=" + s.Src.String()
	case LearnLoad:
		if s.Src == nil {
			return fmt.Sprintf("load:%#x->%s", s.SrcValue, s.Dst.String())
		}
		return "load:" + s.Src.String() + "->" + s.Dst.String()
	default:
		if s.Src == nil {
			return "output:?"
		}
		return "output:" + s.Src.String()
	}
}

// Learn adds or refreshes a flow from the current packet (session affinity's memory).
type Learn struct {
	Table         TableID
	Priority      uint16
	IdleTimeout   uint16
	HardTimeout   uint16
	FinIdle       uint16
	FinHard       uint16
	Cookie        uint64
	DeleteLearned bool
	Specs         []LearnSpec
}

func (a Learn) String() string {
	parts := []string{fmt.Sprintf("table=%d", a.Table)}
	if a.IdleTimeout != 0 {
		parts = append(parts, fmt.Sprintf("idle_timeout=%d", a.IdleTimeout))
	}
	if a.HardTimeout != 0 {
		parts = append(parts, fmt.Sprintf("hard_timeout=%d", a.HardTimeout))
	}
	if a.FinIdle != 0 {
		parts = append(parts, fmt.Sprintf("fin_idle_timeout=%d", a.FinIdle))
	}
	if a.FinHard != 0 {
		parts = append(parts, fmt.Sprintf("fin_hard_timeout=%d", a.FinHard))
	}
	if a.Priority != 0x8000 {
		parts = append(parts, fmt.Sprintf("priority=%d", a.Priority))
	}
	if a.DeleteLearned {
		parts = append(parts, "delete_learned")
	}
	if a.Cookie != 0 {
		parts = append(parts, fmt.Sprintf("cookie=%#x", a.Cookie))
	}
	for _, s := range a.Specs {
		parts = append(parts, s.String())
	}
	return "learn(" + strings.Join(parts, ",") + ")"
}

// HashFields says what a multipath action hashes (Open vSwitch's NX_HASH_FIELDS_*).
type HashFields uint16

// The fields multipath can hash; ofsdn uses HashNWSrc (the whole source address, jhash).
const (
	HashEthSrc HashFields = iota
	HashSymmetricL4
	HashSymmetricL3L4
	HashSymmetricL3L4UDP
	HashNWSrc
	HashNWDst
	HashSymmetricL3
)

var hashFieldNames = []string{"eth_src", "symmetric_l4", "symmetric_l3l4", "symmetric_l3l4+udp", "nw_src", "nw_dst", "symmetric_l3"}

func (h HashFields) String() string {
	if int(h) < len(hashFieldNames) {
		return hashFieldNames[h]
	}
	return "<unknown>"
}

// MultipathAlgorithm is how multipath turns the hash into a link number (NX_MP_ALG_*).
type MultipathAlgorithm uint16

// Multipath's link choices. MultipathModuloN with 65536 links stores the raw low 16 bits of the hash.
const (
	MultipathModuloN MultipathAlgorithm = iota
	MultipathHashThreshold
	MultipathHRW
	MultipathIterHash
)

var multipathAlgorithmNames = []string{"modulo_n", "hash_threshold", "hrw", "iter_hash"}

func (a MultipathAlgorithm) String() string {
	if int(a) < len(multipathAlgorithmNames) {
		return multipathAlgorithmNames[a]
	}
	return "<unknown>"
}

// Multipath hashes Fields with Basis as the universal hash's parameter, picks a link in [0, Links)
// with Algorithm (Arg is the algorithm's argument) and writes it into Dst (NXAST_MULTIPATH). Different
// bases give independent hashes of the same fields.
type Multipath struct {
	Fields    HashFields
	Basis     uint16
	Algorithm MultipathAlgorithm
	Links     uint32 // 1..65536
	Arg       uint32
	Dst       SubField
}

func (a Multipath) String() string {
	return fmt.Sprintf("multipath(%s,%d,%s,%d,%d,%s)", a.Fields, a.Basis, a.Algorithm, a.Links, a.Arg, a.Dst)
}

// Unknown is an action ofsdn cannot decode, kept as raw bytes so dumps still show and diffs still
// compare it.
type Unknown struct{ Raw []byte }

func (a Unknown) String() string { return "unknown(" + hex.EncodeToString(a.Raw) + ")" }

func (Output) isAction()      {}
func (OutputReg) isAction()   {}
func (ToGroup) isAction()     {}
func (Goto) isAction()        {}
func (Controller) isAction()  {}
func (Resubmit) isAction()    {}
func (Load) isAction()        {}
func (SetField) isAction()    {}
func (Move) isAction()        {}
func (DecTTL) isAction()      {}
func (Conjunction) isAction() {}
func (Note) isAction()        {}
func (CT) isAction()          {}
func (Learn) isAction()       {}
func (Multipath) isAction()   {}
func (Unknown) isAction()     {}

// actionsString prints an action list as ovs-ofctl does; an empty list is "drop".
func actionsString(acts []Action) string {
	if len(acts) == 0 {
		return "drop"
	}
	parts := make([]string, len(acts))
	for i, a := range acts {
		parts[i] = a.String()
	}
	return strings.Join(parts, ",")
}

// Convenience constructors used throughout rendering.

// LoadReg loads a whole register.
func LoadReg(r Field, v uint32) Load { return Load{Dst: Whole(r), Value: uint64(v)} }

// SetTunDst sets the VXLAN destination (the remote node's IP).
func SetTunDst(a netip.Addr) SetField {
	v, ok := IPv4Value(a)
	if !ok {
		return SetField{Field: FieldInvalid}
	}
	return SetField{Field: FieldTunDst, Value: v}
}
