package flows

// The codec: typed flows and groups to OpenFlow 1.3 wire bytes and back. This is the one place that
// knows the wire format. Actions and match fields are encoded with libOpenflow's openflow13 types; the
// fixed flow-mod and group-mod headers are laid out here so that a compiled flow can be sent as an add,
// a modify or a delete without encoding it again. Decoding is our own strict parser: libOpenflow's
// decoder panics on NX actions it does not know and hides ct()'s nested actions, and a switch's reply
// is input that must never crash the agent.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	of "antrea.io/libOpenflow/openflow13"
	"antrea.io/libOpenflow/util"
)

// OpenFlow 1.3 constants used by the codec.
const (
	ofVersion        = 4
	ofTypeFlowMod    = 14
	ofTypeGroupMod   = 15
	flowModFixedLen  = 48 // header + fixed part of ofp_flow_mod, before the match
	groupModFixedLen = 16
	bucketFixedLen   = 16
	flowStatsFixed   = 48 // ofp_flow_stats before the match
	groupDescFixed   = 8
	// MaxMessageLen is the largest OpenFlow message; a bundle-add wraps one with 16 more bytes.
	MaxMessageLen = 0xffff - 16

	ofpBufferNone uint32 = 0xffffffff
	ofpGroupAny   uint32 = 0xffffffff
	ofpGroupAll   uint32 = 0xfffffffc // group-mod delete of every group

	instrGotoTable    = 1
	instrApplyActions = 4
)

// Flow-mod commands.
const (
	cmdAdd          uint8 = 0
	cmdModify       uint8 = 1
	cmdModifyStrict uint8 = 2
	cmdDelete       uint8 = 3
	cmdDeleteStrict uint8 = 4
)

// Group-mod commands.
const (
	groupCmdAdd    uint16 = 0
	groupCmdModify uint16 = 1
	groupCmdDelete uint16 = 2
)

// compiledFlow is a flow in wire form, computed once when desired state is set. Its key is OpenFlow's
// own identity of a flow entry (table, priority, exact match), so Diff can never confuse two flows, and
// it is also the prefix of every message that adds, modifies or deletes it.
type compiledFlow struct {
	key    string // table(1) priority(2) canonical OXM match bytes
	instr  string // encoded instructions
	cookie Cookie
	idle   uint16
	hard   uint16
	owner  *ownerState // nil for flows found on the switch and not (yet) claimed by an owner
}

func (c *compiledFlow) table() TableID   { return TableID(c.key[0]) }
func (c *compiledFlow) priority() uint16 { return binary.BigEndian.Uint16([]byte(c.key[1:3])) }
func (c *compiledFlow) oxm() string      { return c.key[3:] }

// sameBody reports whether two compiled flows would behave identically (cookie aside).
func (c *compiledFlow) sameBody(o *compiledFlow) bool {
	return c.instr == o.instr && c.idle == o.idle && c.hard == o.hard
}

// flow decodes the compiled form back into a typed Flow (for errors, logs and dumps).
func (c *compiledFlow) flow() Flow {
	m, err := decodeOXM([]byte(c.oxm()))
	if err != nil {
		m = Match{err: err}
	}
	acts, err := decodeInstructions([]byte(c.instr))
	if err != nil {
		acts = []Action{Unknown{Raw: []byte(c.instr)}}
	}
	return Flow{Table: c.table(), Priority: c.priority(), Match: m, Actions: acts, Cookie: c.cookie,
		IdleTimeout: c.idle, HardTimeout: c.hard}
}

// compileFlow encodes a flow's match and instructions.
func compileFlow(f Flow) (*compiledFlow, error) {
	if err := f.Match.err; err != nil {
		return nil, fmt.Errorf("flow %s: %w", f, err)
	}
	oxm, err := encodeOXM(f.Match)
	if err != nil {
		return nil, fmt.Errorf("flow %s: %w", f, err)
	}
	instr, err := encodeInstructions(f.Actions)
	if err != nil {
		return nil, fmt.Errorf("flow %s: %w", f, err)
	}
	key := make([]byte, 3, 3+len(oxm))
	key[0] = byte(f.Table)
	binary.BigEndian.PutUint16(key[1:], f.Priority)
	key = append(key, oxm...)
	c := &compiledFlow{key: string(key), instr: string(instr), cookie: f.Cookie, idle: f.IdleTimeout, hard: f.HardTimeout}
	if n := flowModFixedLen + matchLen(len(oxm)) + len(instr); n > MaxMessageLen {
		return nil, fmt.Errorf("flow %s: encodes to %d bytes, more than an OpenFlow message holds (%d)", f, n, MaxMessageLen)
	}
	return c, nil
}

// matchLen is the padded length of an ofp_match holding oxmLen bytes of fields.
func matchLen(oxmLen int) int { return (4 + oxmLen + 7) / 8 * 8 }

// appendFlowMod lays out an OFPT_FLOW_MOD for c. cookie/cookieMask filter deletes and modifies; for
// adds, cookie is the new flow's cookie.
func appendFlowMod(dst []byte, c *compiledFlow, cmd uint8, cookie, cookieMask uint64) []byte {
	oxm := c.oxm()
	withInstr := cmd == cmdAdd || cmd == cmdModify || cmd == cmdModifyStrict
	total := flowModFixedLen + matchLen(len(oxm))
	if withInstr {
		total += len(c.instr)
	}
	start := len(dst)
	dst = append(dst, make([]byte, total)...)
	b := dst[start:]
	b[0], b[1] = ofVersion, ofTypeFlowMod
	binary.BigEndian.PutUint16(b[2:], uint16(total))
	binary.BigEndian.PutUint64(b[8:], cookie)
	binary.BigEndian.PutUint64(b[16:], cookieMask)
	b[24] = byte(c.table())
	b[25] = cmd
	if withInstr {
		binary.BigEndian.PutUint16(b[26:], c.idle)
		binary.BigEndian.PutUint16(b[28:], c.hard)
	}
	binary.BigEndian.PutUint16(b[30:], c.priority())
	binary.BigEndian.PutUint32(b[32:], ofpBufferNone)
	binary.BigEndian.PutUint32(b[36:], PortAny)
	binary.BigEndian.PutUint32(b[40:], ofpGroupAny)
	// flags (44..46) stay 0: an add that replaces an identical flow keeps its counters (OF1.3 §6.4).
	m := b[flowModFixedLen:]
	binary.BigEndian.PutUint16(m[0:], 1) // OFPMT_OXM
	binary.BigEndian.PutUint16(m[2:], uint16(4+len(oxm)))
	copy(m[4:], oxm)
	if withInstr {
		copy(b[flowModFixedLen+matchLen(len(oxm)):], c.instr)
	}
	return dst
}

// appendDeleteByCookie lays out a non-strict delete of every flow (all tables) whose cookie matches.
func appendDeleteByCookie(dst []byte, cookie, mask uint64) []byte {
	c := &compiledFlow{key: string([]byte{0xff, 0, 0})} // table 0xff = OFPTT_ALL
	return appendFlowMod(dst, c, cmdDelete, cookie, mask)
}

// EncodeFlowMod encodes a flow as an OFPT_FLOW_MOD add (for tests and tools).
func EncodeFlowMod(f Flow) ([]byte, error) {
	c, err := compileFlow(f)
	if err != nil {
		return nil, err
	}
	return appendFlowMod(nil, c, cmdAdd, uint64(f.Cookie), 0), nil
}

// ---- match ----

// nxmField names a field inside an NX action (load, move, output:reg, ct zone, learn).
func nxmField(f Field) *of.MatchField {
	class, field := f.nxmID()
	return &of.MatchField{Class: class, Field: field, Length: uint8(fieldTable[f].bytes)}
}

func putValue(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte(v)
		v >>= 8
	}
}

func getValue(src []byte) uint64 {
	var v uint64
	for _, b := range src {
		v = v<<8 | uint64(b)
	}
	return v
}

func fieldValueMessage(f Field, v uint64) *util.Buffer {
	b := make([]byte, fieldTable[f].bytes)
	putValue(b, v)
	return util.NewBuffer(b)
}

// encodeOXM appends match fields, in canonical order, as OXM TLVs. This is the one piece of the wire
// format laid out here rather than through libOpenflow's MatchField: it runs for every flow of every
// render, and a TLV written in place costs one allocation where libOpenflow's costs four per field.
func encodeOXM(m Match) ([]byte, error) {
	size := 0
	for _, mf := range m.fields {
		n := fieldTable[mf.Field].bytes
		if mf.Masked {
			n *= 2
		}
		size += 4 + n
	}
	out := make([]byte, 0, size)
	var order [int(fieldCount)]MatchField
	fields := order[:0]
	fields = append(fields, m.fields...)
	for i := 1; i < len(fields); i++ { // insertion sort: a handful of fields, no allocation
		for j := i; j > 0 && wireRank[fields[j].Field] < wireRank[fields[j-1].Field]; j-- {
			fields[j], fields[j-1] = fields[j-1], fields[j]
		}
	}
	for _, mf := range fields {
		info := fieldTable[mf.Field]
		if mf.Masked && !info.maskable {
			return nil, fmt.Errorf("field %s cannot be masked", mf.Field)
		}
		n := info.bytes
		hdr := info.oxm << 1
		if mf.Masked {
			n *= 2
			hdr |= 1
		}
		out = append(out, byte(info.class>>8), byte(info.class), hdr, byte(n))
		out = appendValue(out, mf.Value, info.bytes)
		if mf.Masked {
			out = appendValue(out, mf.Mask, info.bytes)
		}
	}
	return out, nil
}

// wireRank is the order in which ovs-vswitchd itself encodes match fields in its replies. Encoding in
// the same order means a dumped flow's bytes equal what we sent, so resyncs compare bytes instead of
// decoding (TestWireOrderMatchesOVS keeps this true).
var wireRank = func() [fieldCount]int {
	order := []Field{FieldConjID, FieldInPort, FieldEthSrc, FieldEthDst, FieldEthType,
		FieldIPSrc, FieldIPDst, FieldIPProto, FieldTCPSrc, FieldTCPDst, FieldUDPSrc, FieldUDPDst,
		FieldSCTPSrc, FieldSCTPDst, FieldICMPType, FieldICMPCode, FieldTCPFlags,
		FieldARPOp, FieldARPSPA, FieldARPTPA, FieldARPSHA, FieldARPTHA,
		FieldTunID, FieldTunSrc, FieldTunDst,
		FieldReg0, FieldReg1, FieldReg2, FieldReg3, FieldReg4, FieldReg5, FieldReg6, FieldReg7,
		FieldPktMark, FieldCtState, FieldCtZone, FieldCtMark, FieldCtNwDst, FieldMetadata}
	var rank [fieldCount]int
	for i, f := range order {
		rank[f] = i + 1
	}
	return rank
}()

func appendValue(dst []byte, v uint64, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		if i >= 8 {
			dst = append(dst, 0)
			continue
		}
		dst = append(dst, byte(v>>(8*uint(i))))
	}
	return dst
}

// decodeOXM parses OXM TLVs back into a canonical Match.
func decodeOXM(b []byte) (Match, error) {
	var fields []MatchField
	for len(b) > 0 {
		if len(b) < 4 {
			return Match{}, fmt.Errorf("oxm: %d trailing bytes", len(b))
		}
		class := binary.BigEndian.Uint16(b)
		fieldNum := uint16(b[2] >> 1)
		hasMask := b[2]&1 == 1
		n := int(b[3])
		if len(b) < 4+n {
			return Match{}, fmt.Errorf("oxm field %#x/%d: length %d beyond the match", class, fieldNum, n)
		}
		payload := b[4 : 4+n]
		b = b[4+n:]
		if class == classExperimenter {
			if len(payload) < 4 {
				return Match{}, errors.New("oxm experimenter field too short")
			}
			if binary.BigEndian.Uint32(payload) == onfExperimenterID && fieldNum == 42 {
				class, fieldNum, payload = classNXM1, uint16(fieldTable[FieldTCPFlags].oxm), payload[4:]
				n = len(payload)
			} else {
				return Match{}, fmt.Errorf("oxm experimenter %#x field %d not supported", binary.BigEndian.Uint32(payload), fieldNum)
			}
		}
		f, ok := fieldByWire[[2]uint16{class, fieldNum}]
		if !ok {
			return Match{}, fmt.Errorf("oxm field class %#x field %d not supported", class, fieldNum)
		}
		width := fieldTable[f].bytes
		mf := MatchField{Field: f}
		switch {
		case !hasMask && n == width:
			mf.Value = getValue(payload)
		case hasMask && n == 2*width:
			mf.Value, mf.Mask, mf.Masked = getValue(payload[:width]), getValue(payload[width:]), true
		default:
			return Match{}, fmt.Errorf("oxm field %s: unexpected length %d", f, n)
		}
		fields = append(fields, mf)
	}
	m := M(fields...)
	return m, m.err
}

// ---- actions ----

func encodeInstructions(acts []Action) ([]byte, error) {
	apply := acts
	var gotoTable *Goto
	for i, a := range acts {
		if g, ok := a.(Goto); ok {
			if i != len(acts)-1 {
				return nil, errors.New("goto_table must be the last action")
			}
			gotoTable, apply = &g, acts[:i]
		}
	}
	out := make([]byte, 0, 64)
	if len(apply) > 0 {
		out = append(out, 0, instrApplyActions, 0, 0, 0, 0, 0, 0)
		var err error
		if out, err = appendActions(out, apply); err != nil {
			return nil, err
		}
		binary.BigEndian.PutUint16(out[2:], uint16(len(out)))
	}
	if gotoTable != nil {
		out = append(out, 0, instrGotoTable, 0, 8, byte(gotoTable.Table), 0, 0, 0)
	}
	return out, nil
}

func encodeActions(acts []Action) ([]byte, error) { return appendActions(nil, acts) }

func appendActions(out []byte, acts []Action) ([]byte, error) {
	for _, a := range acts {
		oa, err := toLibAction(a)
		if err != nil {
			return nil, fmt.Errorf("action %s: %w", a, err)
		}
		b, err := oa.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("action %s: %w", a, err)
		}
		out = append(out, b...)
	}
	return out, nil
}

func checkSub(s SubField) (*of.MatchField, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	return nxmField(s.Field), nil
}

// toLibAction maps one typed action to its libOpenflow encoder.
func toLibAction(a Action) (of.Action, error) {
	switch a := a.(type) {
	case Output:
		o := of.NewActionOutput(a.Port)
		o.MaxLen = 0
		if a.Port == PortController {
			o.MaxLen = a.MaxLen
		}
		return o, nil
	case OutputReg:
		f, err := checkSub(a.Src)
		if err != nil {
			return nil, err
		}
		return of.NewOutputFromField(f, a.Src.ofsNbits()), nil
	case ToGroup:
		return of.NewActionGroup(a.ID), nil
	case Resubmit:
		return of.NewNXActionResubmitTableAction(of.OFPP_IN_PORT, uint8(a.Table)), nil
	case Load:
		f, err := checkSub(a.Dst)
		if err != nil {
			return nil, err
		}
		if a.Dst.NBits() < 64 && a.Value>>uint(a.Dst.NBits()) != 0 {
			return nil, fmt.Errorf("value %#x does not fit %d bits", a.Value, a.Dst.NBits())
		}
		return of.NewNXActionRegLoad(a.Dst.ofsNbits(), f, a.Value), nil
	case SetField:
		if !a.Field.valid() {
			return nil, errors.New("invalid field")
		}
		info := fieldTable[a.Field]
		return of.NewActionSetField(of.MatchField{Class: info.class, Field: info.oxm, Length: uint8(info.bytes),
			Value: fieldValueMessage(a.Field, a.Value)}), nil
	case Move:
		src, err := checkSub(a.Src)
		if err != nil {
			return nil, err
		}
		dst, err := checkSub(a.Dst)
		if err != nil {
			return nil, err
		}
		if a.Src.NBits() != a.Dst.NBits() {
			return nil, fmt.Errorf("move of %d bits into %d bits", a.Src.NBits(), a.Dst.NBits())
		}
		return of.NewNXActionRegMove(uint16(a.Src.NBits()), uint16(a.Src.Start), uint16(a.Dst.Start), src, dst), nil
	case DecTTL:
		return of.NewActionDecNwTtl(), nil
	case Conjunction:
		if a.NClauses < 2 || a.NClauses > 64 || a.Clause < 1 || a.Clause > a.NClauses {
			return nil, fmt.Errorf("clause %d/%d out of range", a.Clause, a.NClauses)
		}
		return of.NewNXActionConjunction(a.Clause-1, a.NClauses, a.ID), nil
	case Note:
		n := of.NewNXActionNote()
		n.Note = append([]byte(nil), a.Data...)
		return n, nil
	case CT:
		return ctToLib(a)
	case Learn:
		return learnToLib(a)
	case Unknown:
		return rawAction(a.Raw), nil
	case Goto:
		return nil, errors.New("goto_table is an instruction, not an action")
	}
	return nil, fmt.Errorf("unsupported action type %T", a)
}

func ctToLib(a CT) (of.Action, error) {
	ct := of.NewNXActionConnTrack()
	if a.Commit {
		ct.Commit()
	}
	ct.Table(uint8(a.Table))
	if a.ZoneSrc != nil {
		f, err := checkSub(*a.ZoneSrc)
		if err != nil {
			return nil, err
		}
		ct.ZoneRange(f, of.NewNXRange(int(a.ZoneSrc.Start), int(a.ZoneSrc.End)))
	} else {
		ct.ZoneImm(a.Zone)
	}
	if a.NAT != nil {
		nat, err := natToLib(*a.NAT)
		if err != nil {
			return nil, err
		}
		ct.AddAction(nat)
	}
	for _, e := range a.Exec {
		switch e.(type) {
		case Load, SetField, Move:
		default:
			return nil, fmt.Errorf("ct exec allows only load, set_field and move, not %s", e)
		}
		ea, err := toLibAction(e)
		if err != nil {
			return nil, err
		}
		ct.AddAction(ea)
	}
	return ct, nil
}

func natToLib(n NAT) (of.Action, error) {
	nat := of.NewNXActionCTNAT()
	switch n.Kind {
	case NATReverse:
		return nat, nil
	case NATSrc:
		_ = nat.SetSNAT()
	case NATDst:
		_ = nat.SetDNAT()
	default:
		return nil, fmt.Errorf("unknown nat kind %d", n.Kind)
	}
	if n.Random {
		if err := nat.SetRandom(); err != nil {
			return nil, err
		}
	}
	if n.Hash {
		if err := nat.SetProtoHash(); err != nil {
			return nil, err
		}
	}
	if n.Persistent {
		_ = nat.SetPersistent()
	}
	if n.AddrMin.IsValid() {
		if !n.AddrMin.Is4() {
			return nil, fmt.Errorf("nat address %s is not IPv4", n.AddrMin)
		}
		nat.SetRangeIPv4Min(net.IP(n.AddrMin.AsSlice()))
		if n.AddrMax.IsValid() && n.AddrMax != n.AddrMin {
			nat.SetRangeIPv4Max(net.IP(n.AddrMax.AsSlice()))
		}
	}
	if n.PortMin != 0 {
		// libOpenflow writes the port maximum whenever a minimum is set, so always give both.
		lo, hi := n.PortMin, n.PortMax
		if hi == 0 {
			hi = lo
		}
		nat.SetRangeProtoMin(&lo)
		nat.SetRangeProtoMax(&hi)
	}
	return nat, nil
}

func learnToLib(a Learn) (of.Action, error) {
	l := of.NewNXActionLearn()
	l.TableID = uint8(a.Table)
	l.Priority = a.Priority
	l.IdleTimeout, l.HardTimeout = a.IdleTimeout, a.HardTimeout
	l.FinIdleTimeout, l.FinHardTimeout = a.FinIdle, a.FinHard
	l.Cookie = a.Cookie
	if a.DeleteLearned {
		l.Flags |= 2 // NX_LEARN_F_DELETE_LEARNED
	}
	for _, s := range a.Specs {
		nbits := uint16(s.Dst.NBits())
		var spec of.NXLearnSpec
		var err error
		if _, err = checkSub(s.Dst); err != nil {
			return nil, fmt.Errorf("learn spec %s: %w", s, err)
		}
		dst := &of.NXLearnSpecField{Field: nxmField(s.Dst.Field), Ofs: uint16(s.Dst.Start)}
		var src *of.NXLearnSpecField
		if s.Src != nil {
			if _, err = checkSub(*s.Src); err != nil {
				return nil, fmt.Errorf("learn spec %s: %w", s, err)
			}
			if s.Src.NBits() != s.Dst.NBits() {
				return nil, fmt.Errorf("learn spec %s: widths differ", s)
			}
			src = &of.NXLearnSpecField{Field: nxmField(s.Src.Field), Ofs: uint16(s.Src.Start)}
		}
		imm := func() []byte {
			b := make([]byte, 2*((nbits+15)/16))
			putValue(b, s.SrcValue)
			return b
		}
		switch {
		case s.Kind == LearnMatch && src != nil:
			spec = of.NXLearnSpec{Header: of.NewLearnHeaderMatchFromField(nbits), SrcField: src, DstField: dst}
		case s.Kind == LearnMatch:
			spec = of.NXLearnSpec{Header: of.NewLearnHeaderMatchFromValue(nbits), SrcValue: imm(), DstField: dst}
		case s.Kind == LearnLoad && src != nil:
			spec = of.NXLearnSpec{Header: of.NewLearnHeaderLoadFromField(nbits), SrcField: src, DstField: dst}
		case s.Kind == LearnLoad:
			spec = of.NXLearnSpec{Header: of.NewLearnHeaderLoadFromValue(nbits), SrcValue: imm(), DstField: dst}
		case s.Kind == LearnOutput && src != nil:
			spec = of.NXLearnSpec{Header: of.NewLearnHeaderOutputFromField(nbits), SrcField: src}
		default:
			return nil, fmt.Errorf("learn spec %s: unsupported", s)
		}
		l.LearnSpecs = append(l.LearnSpecs, &spec)
	}
	l.Length = l.Len()
	return l, nil
}

// rawAction re-sends bytes of an action we could not decode.
type rawAction []byte

func (r rawAction) Len() uint16                     { return uint16(len(r)) }
func (r rawAction) MarshalBinary() ([]byte, error)  { return []byte(r), nil }
func (r rawAction) UnmarshalBinary(b []byte) error  { return errors.New("rawAction is write-only") }
func (r rawAction) Header() *of.ActionHeader        { return &of.ActionHeader{} }
func (r rawAction) AddAction(of.Action, bool) error { return errors.New("rawAction holds no actions") }

// ---- decoding ----

// NX action subtypes decoded here.
const (
	nxExperimenter     = 0x00002320
	nxastResubmit      = 1
	nxastRegMove       = 6
	nxastRegLoad       = 7
	nxastNote          = 8
	nxastResubmitTable = 14
	nxastOutputReg     = 15
	nxastLearn         = 16
	nxastDecTTL        = 18
	nxastConjunction   = 34
	nxastCT            = 35
	nxastNAT           = 36
)

func decodeInstructions(b []byte) ([]Action, error) {
	var acts []Action
	var gotoTable *Goto
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, fmt.Errorf("instruction: %d trailing bytes", len(b))
		}
		typ, n := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
		if n < 8 || n > len(b) {
			return nil, fmt.Errorf("instruction type %d: bad length %d", typ, n)
		}
		switch typ {
		case instrApplyActions:
			a, err := decodeActions(b[8:n])
			if err != nil {
				return nil, err
			}
			acts = append(acts, a...)
		case instrGotoTable:
			gotoTable = &Goto{Table: TableID(b[4])}
		default:
			return nil, fmt.Errorf("instruction type %d not supported", typ)
		}
		b = b[n:]
	}
	if gotoTable != nil {
		acts = append(acts, *gotoTable)
	}
	return acts, nil
}

func decodeActions(b []byte) ([]Action, error) {
	var acts []Action
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, fmt.Errorf("action: %d trailing bytes", len(b))
		}
		n := int(binary.BigEndian.Uint16(b[2:]))
		if n < 8 || n%8 != 0 || n > len(b) {
			return nil, fmt.Errorf("action type %d: bad length %d", binary.BigEndian.Uint16(b), n)
		}
		a, err := decodeAction(b[:n])
		if err != nil {
			return nil, err
		}
		acts = append(acts, a)
		b = b[n:]
	}
	return acts, nil
}

func need(b []byte, n int, what string) error {
	if len(b) < n {
		return fmt.Errorf("%s: %d bytes, want at least %d", what, len(b), n)
	}
	return nil
}

// decodeAction decodes one action whose length has been checked to be len(b).
func decodeAction(b []byte) (Action, error) {
	typ := binary.BigEndian.Uint16(b)
	switch typ {
	case 0: // OFPAT_OUTPUT
		if err := need(b, 16, "output"); err != nil {
			return nil, err
		}
		o := Output{Port: binary.BigEndian.Uint32(b[4:])}
		if o.Port == PortController {
			o.MaxLen = binary.BigEndian.Uint16(b[8:])
		}
		return o, nil
	case 22: // OFPAT_GROUP
		return ToGroup{ID: binary.BigEndian.Uint32(b[4:])}, nil
	case 24: // OFPAT_DEC_NW_TTL
		return DecTTL{}, nil
	case 25: // OFPAT_SET_FIELD
		m, err := decodeOXMPrefix(b[4:])
		if err != nil {
			return nil, fmt.Errorf("set_field: %w", err)
		}
		return SetField{Field: m.Field, Value: m.Value}, nil
	case 0xffff:
		if err := need(b, 10, "experimenter action"); err != nil {
			return nil, err
		}
		if binary.BigEndian.Uint32(b[4:]) != nxExperimenter {
			return Unknown{Raw: append([]byte(nil), b...)}, nil
		}
		return decodeNXAction(b)
	}
	return Unknown{Raw: append([]byte(nil), b...)}, nil
}

// decodeOXMPrefix decodes the single OXM TLV at the start of b (set_field's payload).
func decodeOXMPrefix(b []byte) (MatchField, error) {
	if len(b) < 4 || len(b) < 4+int(b[3]) {
		return MatchField{}, errors.New("truncated field")
	}
	m, err := decodeOXM(b[:4+int(b[3])])
	if err != nil {
		return MatchField{}, err
	}
	if len(m.fields) != 1 {
		return MatchField{}, errors.New("want exactly one field")
	}
	return m.fields[0], nil
}

func decodeNXAction(b []byte) (Action, error) {
	sub := binary.BigEndian.Uint16(b[8:])
	switch sub {
	case nxastResubmit, nxastResubmitTable:
		if err := need(b, 16, "resubmit"); err != nil {
			return nil, err
		}
		table := b[12]
		if sub == nxastResubmit {
			table = 0xff
		}
		if binary.BigEndian.Uint16(b[10:]) != of.OFPP_IN_PORT || table == 0xff {
			return Unknown{Raw: append([]byte(nil), b...)}, nil
		}
		return Resubmit{Table: TableID(table)}, nil
	case nxastRegLoad:
		if err := need(b, 24, "load"); err != nil {
			return nil, err
		}
		ofsNbits := binary.BigEndian.Uint16(b[10:])
		dst, err := subFieldFromWire(binary.BigEndian.Uint32(b[12:]), int(ofsNbits>>6), int(ofsNbits&0x3f)+1)
		if err != nil {
			return nil, fmt.Errorf("load: %w", err)
		}
		return Load{Dst: dst, Value: binary.BigEndian.Uint64(b[16:])}, nil
	case nxastRegMove:
		if err := need(b, 24, "move"); err != nil {
			return nil, err
		}
		nbits := int(binary.BigEndian.Uint16(b[10:]))
		src, err := subFieldFromWire(binary.BigEndian.Uint32(b[16:]), int(binary.BigEndian.Uint16(b[12:])), nbits)
		if err != nil {
			return nil, fmt.Errorf("move: %w", err)
		}
		dst, err := subFieldFromWire(binary.BigEndian.Uint32(b[20:]), int(binary.BigEndian.Uint16(b[14:])), nbits)
		if err != nil {
			return nil, fmt.Errorf("move: %w", err)
		}
		return Move{Src: src, Dst: dst}, nil
	case nxastOutputReg:
		if err := need(b, 24, "output_reg"); err != nil {
			return nil, err
		}
		ofsNbits := binary.BigEndian.Uint16(b[10:])
		src, err := subFieldFromWire(binary.BigEndian.Uint32(b[12:]), int(ofsNbits>>6), int(ofsNbits&0x3f)+1)
		if err != nil {
			return nil, fmt.Errorf("output_reg: %w", err)
		}
		return OutputReg{Src: src}, nil
	case nxastNote:
		return Note{Data: trimNote(b[10:])}, nil
	case nxastDecTTL:
		return DecTTL{}, nil
	case nxastConjunction:
		if err := need(b, 16, "conjunction"); err != nil {
			return nil, err
		}
		return Conjunction{Clause: b[10] + 1, NClauses: b[11], ID: binary.BigEndian.Uint32(b[12:])}, nil
	case nxastCT:
		return decodeCT(b)
	case nxastLearn:
		return decodeLearn(b)
	}
	return Unknown{Raw: append([]byte(nil), b...)}, nil
}

// trimNote drops the zero padding OVS adds after a note's data, so notes compare by content.
func trimNote(b []byte) []byte {
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return append([]byte(nil), b[:end]...)
}

func decodeCT(b []byte) (Action, error) {
	if err := need(b, 24, "ct"); err != nil {
		return nil, err
	}
	flags := binary.BigEndian.Uint16(b[10:])
	ct := CT{Commit: flags&of.NX_CT_F_COMMIT != 0, Table: TableID(b[18])}
	if flags&^uint16(of.NX_CT_F_COMMIT) != 0 || binary.BigEndian.Uint16(b[22:]) != 0 {
		return Unknown{Raw: append([]byte(nil), b...)}, nil // force, alg: not used by ofsdn
	}
	zoneSrc, zoneOfs := binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint16(b[16:])
	if zoneSrc != 0 {
		sf, err := subFieldFromWire(zoneSrc, int(zoneOfs>>6), int(zoneOfs&0x3f)+1)
		if err != nil {
			return nil, fmt.Errorf("ct zone: %w", err)
		}
		ct.ZoneSrc = &sf
	} else {
		ct.Zone = zoneOfs
	}
	nested, err := decodeActionsRaw(b[24:])
	if err != nil {
		return nil, fmt.Errorf("ct: %w", err)
	}
	for i, nb := range nested {
		if i == 0 && binary.BigEndian.Uint16(nb) == 0xffff && len(nb) >= 10 && binary.BigEndian.Uint16(nb[8:]) == nxastNAT {
			nat, err := decodeNAT(nb)
			if err != nil {
				return nil, err
			}
			ct.NAT = &nat
			continue
		}
		a, err := decodeAction(nb)
		if err != nil {
			return nil, fmt.Errorf("ct exec: %w", err)
		}
		ct.Exec = append(ct.Exec, a)
	}
	return ct, nil
}

// decodeActionsRaw splits an action list into its actions' bytes.
func decodeActionsRaw(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 8 {
			return nil, fmt.Errorf("action: %d trailing bytes", len(b))
		}
		n := int(binary.BigEndian.Uint16(b[2:]))
		if n < 8 || n%8 != 0 || n > len(b) {
			return nil, fmt.Errorf("nested action: bad length %d", n)
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out, nil
}

func decodeNAT(b []byte) (NAT, error) {
	if err := need(b, 16, "nat"); err != nil {
		return NAT{}, err
	}
	flags, present := binary.BigEndian.Uint16(b[12:]), binary.BigEndian.Uint16(b[14:])
	n := NAT{Kind: NATReverse}
	switch {
	case flags&of.NX_NAT_F_SRC != 0:
		n.Kind = NATSrc
	case flags&of.NX_NAT_F_DST != 0:
		n.Kind = NATDst
	}
	n.Random = flags&of.NX_NAT_F_PROTO_RANDOM != 0
	n.Hash = flags&of.NX_NAT_F_PROTO_HASH != 0
	n.Persistent = flags&of.NX_NAT_F_PERSISTENT != 0
	p := b[16:]
	take := func(k int) ([]byte, error) {
		if len(p) < k {
			return nil, errors.New("nat: truncated range")
		}
		v := p[:k]
		p = p[k:]
		return v, nil
	}
	if present&of.NX_NAT_RANGE_IPV4_MIN != 0 {
		v, err := take(4)
		if err != nil {
			return NAT{}, err
		}
		n.AddrMin = netip.AddrFrom4([4]byte(v))
	}
	if present&of.NX_NAT_RANGE_IPV4_MAX != 0 {
		v, err := take(4)
		if err != nil {
			return NAT{}, err
		}
		n.AddrMax = netip.AddrFrom4([4]byte(v))
	}
	if present&(of.NX_NAT_RANGE_IPV6_MIN|of.NX_NAT_RANGE_IPV6_MAX) != 0 {
		return NAT{}, errors.New("nat: IPv6 ranges not supported")
	}
	if present&of.NX_NAT_RANGE_PROTO_MIN != 0 {
		v, err := take(2)
		if err != nil {
			return NAT{}, err
		}
		n.PortMin = binary.BigEndian.Uint16(v)
	}
	if present&of.NX_NAT_RANGE_PROTO_MAX != 0 {
		v, err := take(2)
		if err != nil {
			return NAT{}, err
		}
		n.PortMax = binary.BigEndian.Uint16(v)
	}
	// Canonical form: a maximum equal to the minimum is no range at all.
	if n.AddrMax == n.AddrMin {
		n.AddrMax = netip.Addr{}
	}
	if n.PortMax == n.PortMin {
		n.PortMax = 0
	}
	return n, nil
}

func decodeLearn(b []byte) (Action, error) {
	if err := need(b, 32, "learn"); err != nil {
		return nil, err
	}
	l := Learn{
		IdleTimeout: binary.BigEndian.Uint16(b[10:]),
		HardTimeout: binary.BigEndian.Uint16(b[12:]),
		Priority:    binary.BigEndian.Uint16(b[14:]),
		Cookie:      binary.BigEndian.Uint64(b[16:]),
		Table:       TableID(b[26]),
		FinIdle:     binary.BigEndian.Uint16(b[28:]),
		FinHard:     binary.BigEndian.Uint16(b[30:]),
	}
	flags := binary.BigEndian.Uint16(b[24:])
	l.DeleteLearned = flags&2 != 0
	if flags&^uint16(2) != 0 {
		return Unknown{Raw: append([]byte(nil), b...)}, nil
	}
	p := b[32:]
	for len(p) >= 2 {
		hdr := binary.BigEndian.Uint16(p)
		if hdr == 0 {
			break // padding
		}
		p = p[2:]
		nbits := int(hdr & 0x7ff)
		srcImm := hdr&(1<<13) != 0
		dstKind := (hdr >> 11) & 3
		var s LearnSpec
		readField := func() (SubField, error) {
			if len(p) < 6 {
				return SubField{}, errors.New("learn: truncated spec")
			}
			sf, err := subFieldFromWire(binary.BigEndian.Uint32(p), int(binary.BigEndian.Uint16(p[4:])), nbits)
			p = p[6:]
			return sf, err
		}
		if srcImm {
			k := 2 * ((nbits + 15) / 16)
			if len(p) < k {
				return nil, errors.New("learn: truncated immediate")
			}
			s.SrcValue = getValue(p[:k])
			p = p[k:]
		} else {
			src, err := readField()
			if err != nil {
				return nil, err
			}
			s.Src = &src
		}
		switch dstKind {
		case 0:
			s.Kind = LearnMatch
		case 1:
			s.Kind = LearnLoad
		case 2:
			s.Kind = LearnOutput
		default:
			return nil, fmt.Errorf("learn: unknown spec destination %d", dstKind)
		}
		if s.Kind != LearnOutput {
			dst, err := readField()
			if err != nil {
				return nil, err
			}
			s.Dst = dst
		} else if s.Src != nil {
			s.Dst = *s.Src
		}
		l.Specs = append(l.Specs, s)
	}
	return l, nil
}

// ---- flow stats and groups ----

// DecodeFlowStats decodes one ofp_flow_stats entry of a flow-stats reply.
func DecodeFlowStats(b []byte) (Flow, error) {
	c, st, err := decodeFlowStatsCompiled(b)
	if err != nil {
		return Flow{}, err
	}
	f := c.flow()
	f.Packets, f.Bytes, f.Duration = st.packets, st.bytes, st.duration
	return f, nil
}

type flowCounters struct {
	packets, bytes uint64
	duration       time.Duration
}

// decodeFlowStatsCompiled decodes a flow-stats entry straight into the canonical compiled form the
// reconciler compares with: typed decoding and re-encoding normalise any encoding choice of the switch.
func decodeFlowStatsCompiled(b []byte) (*compiledFlow, flowCounters, error) {
	var st flowCounters
	if len(b) < flowStatsFixed+4 {
		return nil, st, fmt.Errorf("flow stats: %d bytes", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > len(b) || n < flowStatsFixed+4 {
		return nil, st, fmt.Errorf("flow stats: bad length %d", n)
	}
	b = b[:n]
	f := Flow{
		Table:       TableID(b[2]),
		Priority:    binary.BigEndian.Uint16(b[12:]),
		IdleTimeout: binary.BigEndian.Uint16(b[14:]),
		HardTimeout: binary.BigEndian.Uint16(b[16:]),
		Cookie:      Cookie(binary.BigEndian.Uint64(b[24:])),
	}
	st.duration = time.Duration(binary.BigEndian.Uint32(b[4:]))*time.Second + time.Duration(binary.BigEndian.Uint32(b[8:]))
	st.packets, st.bytes = binary.BigEndian.Uint64(b[32:]), binary.BigEndian.Uint64(b[40:])
	m := b[flowStatsFixed:]
	mlen := int(binary.BigEndian.Uint16(m[2:]))
	if binary.BigEndian.Uint16(m) != 1 || mlen < 4 || matchLen(mlen-4) > len(m) {
		return nil, st, fmt.Errorf("flow stats: bad match (type %d, length %d)", binary.BigEndian.Uint16(m), mlen)
	}
	oxm, instr := m[4:mlen], m[matchLen(mlen-4):]
	match, merr := decodeOXM(oxm)
	acts, aerr := decodeInstructions(instr)
	if merr != nil || aerr != nil {
		// Keep what we cannot decode as raw bytes: it still diffs (and is deleted if nobody wants it).
		c := &compiledFlow{cookie: f.Cookie, idle: f.IdleTimeout, hard: f.HardTimeout, instr: string(instr)}
		key := append([]byte{byte(f.Table), 0, 0}, oxm...)
		binary.BigEndian.PutUint16(key[1:], f.Priority)
		c.key = string(key)
		return c, st, errors.Join(merr, aerr)
	}
	f.Match, f.Actions = match, acts
	c, err := compileFlow(f)
	return c, st, err
}

type compiledGroup struct {
	id      uint32
	typ     GroupType
	buckets string
	owner   *ownerState
}

func compileGroup(g GroupEntry) (*compiledGroup, error) {
	var body []byte
	for i, bk := range g.Buckets {
		acts, err := encodeActions(bk.Actions)
		if err != nil {
			return nil, fmt.Errorf("group %d bucket %d: %w", g.ID, i, err)
		}
		h := make([]byte, bucketFixedLen)
		binary.BigEndian.PutUint16(h[0:], uint16(bucketFixedLen+len(acts)))
		w := bk.Weight
		if g.Type == GroupSelect && w == 0 {
			w = 1
		}
		if g.Type != GroupSelect {
			w = 0
		}
		binary.BigEndian.PutUint16(h[2:], w)
		binary.BigEndian.PutUint32(h[4:], PortAny)
		binary.BigEndian.PutUint32(h[8:], ofpGroupAny)
		body = append(append(body, h...), acts...)
	}
	if n := groupModFixedLen + len(body); n > MaxMessageLen {
		return nil, fmt.Errorf("group %d: %d buckets encode to %d bytes, more than an OpenFlow message holds (%d); split it into chained groups",
			g.ID, len(g.Buckets), n, MaxMessageLen)
	}
	return &compiledGroup{id: g.ID, typ: g.Type, buckets: string(body)}, nil
}

func appendGroupMod(dst []byte, c *compiledGroup, cmd uint16) []byte {
	body := c.buckets
	if cmd == groupCmdDelete {
		body = ""
	}
	total := groupModFixedLen + len(body)
	start := len(dst)
	dst = append(dst, make([]byte, total)...)
	b := dst[start:]
	b[0], b[1] = ofVersion, ofTypeGroupMod
	binary.BigEndian.PutUint16(b[2:], uint16(total))
	binary.BigEndian.PutUint16(b[8:], cmd)
	b[10] = byte(c.typ)
	binary.BigEndian.PutUint32(b[12:], c.id)
	copy(b[16:], body)
	return dst
}

// EncodeGroupMod encodes a group as an OFPT_GROUP_MOD add (for tests and tools).
func EncodeGroupMod(g GroupEntry) ([]byte, error) {
	c, err := compileGroup(g)
	if err != nil {
		return nil, err
	}
	return appendGroupMod(nil, c, groupCmdAdd), nil
}

// DecodeGroupDesc decodes one ofp_group_desc entry of a group-description reply.
func DecodeGroupDesc(b []byte) (GroupEntry, error) {
	c, err := decodeGroupDescCompiled(b)
	if err != nil {
		return GroupEntry{}, err
	}
	return decodeBuckets(c.id, c.typ, []byte(c.buckets))
}

func decodeGroupDescCompiled(b []byte) (*compiledGroup, error) {
	if len(b) < groupDescFixed {
		return nil, fmt.Errorf("group desc: %d bytes", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > len(b) || n < groupDescFixed {
		return nil, fmt.Errorf("group desc: bad length %d", n)
	}
	id, typ := binary.BigEndian.Uint32(b[4:]), GroupType(b[2])
	g, err := decodeBuckets(id, typ, b[groupDescFixed:n])
	if err != nil {
		return &compiledGroup{id: id, typ: typ, buckets: string(b[groupDescFixed:n])}, err
	}
	return compileGroup(g)
}

func decodeBuckets(id uint32, typ GroupType, b []byte) (GroupEntry, error) {
	g := GroupEntry{ID: id, Type: typ}
	for len(b) > 0 {
		if len(b) < bucketFixedLen {
			return g, fmt.Errorf("group %d: truncated bucket", id)
		}
		n := int(binary.BigEndian.Uint16(b))
		if n < bucketFixedLen || n > len(b) {
			return g, fmt.Errorf("group %d: bad bucket length %d", id, n)
		}
		acts, err := decodeActions(b[bucketFixedLen:n])
		if err != nil {
			return g, fmt.Errorf("group %d: %w", id, err)
		}
		g.Buckets = append(g.Buckets, Bucket{Weight: binary.BigEndian.Uint16(b[2:]), Actions: acts})
		b = b[n:]
	}
	return g, nil
}

// EncodeFlowStats encodes a flow as the ofp_flow_stats entry a switch returns for it, counters
// included: what fakes and golden tests of dump tools feed in place of a switch.
func EncodeFlowStats(f Flow) ([]byte, error) {
	c, err := compileFlow(f)
	if err != nil {
		return nil, err
	}
	oxm := c.oxm()
	n := flowStatsFixed + matchLen(len(oxm)) + len(c.instr)
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b, uint16(n))
	b[2] = byte(f.Table)
	binary.BigEndian.PutUint32(b[4:], uint32(f.Duration/time.Second))
	binary.BigEndian.PutUint32(b[8:], uint32(f.Duration%time.Second))
	binary.BigEndian.PutUint16(b[12:], f.Priority)
	binary.BigEndian.PutUint16(b[14:], f.IdleTimeout)
	binary.BigEndian.PutUint16(b[16:], f.HardTimeout)
	binary.BigEndian.PutUint64(b[24:], uint64(f.Cookie))
	binary.BigEndian.PutUint64(b[32:], f.Packets)
	binary.BigEndian.PutUint64(b[40:], f.Bytes)
	binary.BigEndian.PutUint16(b[flowStatsFixed:], 1)
	binary.BigEndian.PutUint16(b[flowStatsFixed+2:], uint16(4+len(oxm)))
	copy(b[flowStatsFixed+4:], oxm)
	copy(b[flowStatsFixed+matchLen(len(oxm)):], c.instr)
	return b, nil
}

// EncodeGroupDesc encodes a group as the ofp_group_desc entry a switch returns for it.
func EncodeGroupDesc(g GroupEntry) ([]byte, error) {
	c, err := compileGroup(g)
	if err != nil {
		return nil, err
	}
	b := make([]byte, groupDescFixed+len(c.buckets))
	binary.BigEndian.PutUint16(b, uint16(len(b)))
	b[2] = byte(c.typ)
	binary.BigEndian.PutUint32(b[4:], c.id)
	copy(b[groupDescFixed:], c.buckets)
	return b, nil
}
