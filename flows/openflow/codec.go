package openflow

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
	"math/bits"
	"net"
	"net/netip"
	"strings"
	"time"

	of "antrea.io/libOpenflow/openflow13"
	"antrea.io/libOpenflow/util"
)

// compiledFlow-level constants: the fixed parts of the messages the codec lays out itself. The rest of
// OpenFlow's numbers (message types, bundle and multipart framing) are in wire.go.
const (
	FlowModFixedLen  = 48 // header + fixed part of ofp_flow_mod, before the match
	groupModFixedLen = 16
	bucketFixedLen   = 16
	flowStatsFixed   = 48 // ofp_flow_stats before the match
	groupDescFixed   = 8

	ofpBufferNone uint32 = 0xffffffff
	ofpGroupAny   uint32 = 0xffffffff
	// GroupAllID in a group-mod delete deletes every group.
	GroupAllID uint32 = 0xfffffffc
)

// FlowModCommand is an ofp_flow_mod command.
type FlowModCommand uint8

const (
	FlowAdd          FlowModCommand = 0
	FlowModify       FlowModCommand = 1
	FlowModifyStrict FlowModCommand = 2
	FlowDelete       FlowModCommand = 3
	FlowDeleteStrict FlowModCommand = 4
)

// GroupModCommand is an ofp_group_mod command.
type GroupModCommand uint16

const (
	GroupAdd    GroupModCommand = 0
	GroupModify GroupModCommand = 1
	GroupDelete GroupModCommand = 2
)

// FlowKey is OpenFlow's own identity of a flow entry: table, priority and the canonical match bytes.
// Two flows with one key are one entry on a switch, so a diff keyed by it can never confuse two flows
// (an owner-hash collision in cookies cannot delete the wrong one). It is also the prefix of every
// message that adds, modifies or deletes the entry.
type FlowKey string

// Table is the key's table.
func (k FlowKey) Table() TableID { return TableID(k[0]) }

// Priority is the key's priority.
func (k FlowKey) Priority() uint16 { return binary.BigEndian.Uint16([]byte(k[1:3])) }

// oxm is the canonical match in wire form.
func (k FlowKey) oxm() string { return string(k[3:]) }

// Less orders keys by table, then priority high to low, then match bytes: the order dumps print in.
func (k FlowKey) Less(o FlowKey) bool {
	if k[0] != o[0] {
		return k[0] < o[0]
	}
	if k[1:3] != o[1:3] {
		return k[1:3] > o[1:3]
	}
	return k[3:] < o[3:]
}

func makeFlowKey(table TableID, priority uint16, oxm []byte) FlowKey {
	key := make([]byte, 3, 3+len(oxm))
	key[0] = byte(table)
	binary.BigEndian.PutUint16(key[1:], priority)
	return FlowKey(append(key, oxm...))
}

// CompiledFlow is a flow in wire form, computed once when desired state is set, from which every
// flow-mod for it is laid out without encoding it again.
type CompiledFlow struct {
	Key    FlowKey
	Instr  string // encoded instructions
	Cookie uint64
	Idle   uint16
	Hard   uint16
}

// SameBody reports whether two compiled flows would behave identically (cookie aside).
func (c *CompiledFlow) SameBody(o *CompiledFlow) bool {
	return c.Instr == o.Instr && c.Idle == o.Idle && c.Hard == o.Hard
}

// Flow decodes the compiled form back into a typed Flow (for errors, logs and dumps).
func (c *CompiledFlow) Flow() Flow {
	m, err := decodeOXM([]byte(c.Key.oxm()))
	if err != nil {
		m = Match{err: err}
	}
	acts, err := decodeInstructions([]byte(c.Instr))
	if err != nil {
		acts = []Action{Unknown{Raw: []byte(c.Instr)}}
	}
	return Flow{Table: c.Key.Table(), Priority: c.Key.Priority(), Match: m, Actions: acts, Cookie: c.Cookie,
		IdleTimeout: c.Idle, HardTimeout: c.Hard}
}

// Compile encodes a flow's match and instructions.
func Compile(f Flow) (CompiledFlow, error) {
	if err := f.Match.err; err != nil {
		return CompiledFlow{}, fmt.Errorf("flow %s: %w", f, err)
	}
	// Match and instructions are laid out in a scratch buffer on the stack, then copied once into the
	// string that holds both key and instructions: the agent compiles every flow of every owner a
	// change touches.
	var scratch [512]byte
	buf, err := appendOXM(scratch[:0], f.Match)
	if err != nil {
		return CompiledFlow{}, fmt.Errorf("flow %s: %w", f, err)
	}
	oxmLen := len(buf)
	if buf, err = appendInstructions(buf, f.Actions); err != nil {
		return CompiledFlow{}, fmt.Errorf("flow %s: %w", f, err)
	}
	if n := FlowModFixedLen + matchLen(oxmLen) + len(buf) - oxmLen; n > MaxBundledMessageLen {
		return CompiledFlow{}, fmt.Errorf("flow %s: encodes to %d bytes, more than a bundled OpenFlow message holds (%d)", f, n, MaxBundledMessageLen)
	}
	var b strings.Builder
	b.Grow(3 + len(buf))
	b.WriteByte(byte(f.Table))
	b.WriteByte(byte(f.Priority >> 8))
	b.WriteByte(byte(f.Priority))
	b.Write(buf)
	both := b.String()
	return CompiledFlow{Key: FlowKey(both[:3+oxmLen]), Instr: both[3+oxmLen:], Cookie: f.Cookie,
		Idle: f.IdleTimeout, Hard: f.HardTimeout}, nil
}

// matchLen is the padded length of an ofp_match holding oxmLen bytes of fields.
func matchLen(oxmLen int) int { return (4 + oxmLen + 7) / 8 * 8 }

// AppendFlowMod lays out an OFPT_FLOW_MOD for c and appends it to dst. cookie/cookieMask filter
// deletes and modifies; for adds, cookie is the new flow's cookie. The xid is left 0 for the session.
func AppendFlowMod(dst []byte, c *CompiledFlow, cmd FlowModCommand, cookie, cookieMask uint64) []byte {
	oxm := c.Key.oxm()
	withInstr := cmd == FlowAdd || cmd == FlowModify || cmd == FlowModifyStrict
	total := FlowModFixedLen + matchLen(len(oxm))
	if withInstr {
		total += len(c.Instr)
	}
	start := len(dst)
	dst = append(dst, make([]byte, total)...)
	b := dst[start:]
	PutHeader(b, TypeFlowMod, total, 0)
	binary.BigEndian.PutUint64(b[8:], cookie)
	binary.BigEndian.PutUint64(b[16:], cookieMask)
	b[24] = byte(c.Key.Table())
	b[25] = byte(cmd)
	if withInstr {
		binary.BigEndian.PutUint16(b[26:], c.Idle)
		binary.BigEndian.PutUint16(b[28:], c.Hard)
	}
	binary.BigEndian.PutUint16(b[30:], c.Key.Priority())
	binary.BigEndian.PutUint32(b[32:], ofpBufferNone)
	binary.BigEndian.PutUint32(b[36:], PortAny)
	binary.BigEndian.PutUint32(b[40:], ofpGroupAny)
	// flags (44..46) stay 0: an add that replaces an identical flow keeps its counters (OF1.3 §6.4).
	m := b[FlowModFixedLen:]
	binary.BigEndian.PutUint16(m[0:], 1) // OFPMT_OXM
	binary.BigEndian.PutUint16(m[2:], uint16(4+len(oxm)))
	copy(m[4:], oxm)
	if withInstr {
		copy(b[FlowModFixedLen+matchLen(len(oxm)):], c.Instr)
	}
	return dst
}

// AllTables is the table number of a delete or a dump over every table (OFPTT_ALL).
const AllTables TableID = 0xff

// AppendDeleteByCookie lays out a non-strict delete of every flow (all tables) whose cookie matches.
func AppendDeleteByCookie(dst []byte, cookie, mask uint64) []byte {
	c := &CompiledFlow{Key: makeFlowKey(AllTables, 0, nil)}
	return AppendFlowMod(dst, c, FlowDelete, cookie, mask)
}

// EncodeFlowMod encodes a flow as an OFPT_FLOW_MOD add (for tests and tools).
func EncodeFlowMod(f Flow) ([]byte, error) {
	c, err := Compile(f)
	if err != nil {
		return nil, err
	}
	return AppendFlowMod(nil, &c, FlowAdd, f.Cookie, 0), nil
}

// FlowMod is a parsed OFPT_FLOW_MOD: what a switch (or a fake of one) needs to apply it.
type FlowMod struct {
	Command            FlowModCommand
	Cookie, CookieMask uint64
	Flow               CompiledFlow // Key, Instr, timeouts; Cookie as the message carries it
}

// ParseFlowMod parses a complete OFPT_FLOW_MOD message.
func ParseFlowMod(m []byte) (FlowMod, error) {
	if len(m) < FlowModFixedLen+4 || m[1] != TypeFlowMod {
		return FlowMod{}, fmt.Errorf("flow-mod: %d bytes of message type %d", len(m), m[1])
	}
	mlen := int(binary.BigEndian.Uint16(m[FlowModFixedLen+2:]))
	if mlen < 4 || FlowModFixedLen+matchLen(mlen-4) > len(m) {
		return FlowMod{}, fmt.Errorf("flow-mod: bad match length %d", mlen)
	}
	fm := FlowMod{Command: FlowModCommand(m[25]), Cookie: binary.BigEndian.Uint64(m[8:]), CookieMask: binary.BigEndian.Uint64(m[16:])}
	fm.Flow = CompiledFlow{
		Key:    makeFlowKey(TableID(m[24]), binary.BigEndian.Uint16(m[30:]), m[FlowModFixedLen+4:FlowModFixedLen+mlen]),
		Instr:  string(m[FlowModFixedLen+matchLen(mlen-4):]),
		Cookie: fm.Cookie,
		Idle:   binary.BigEndian.Uint16(m[26:]),
		Hard:   binary.BigEndian.Uint16(m[28:]),
	}
	return fm, nil
}

// Actions decodes the compiled flow's instructions.
func (c *CompiledFlow) Actions() ([]Action, error) { return decodeInstructions([]byte(c.Instr)) }

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

// appendOXM appends match fields as OXM TLVs, in the order ovs-vswitchd encodes them (see wireRank).
// This is the one piece of the wire format laid out here rather than through libOpenflow's
// MatchField: it runs for every flow of every render, and a TLV written in place costs nothing where
// libOpenflow's costs four allocations per field.
func appendOXM(out []byte, m Match) ([]byte, error) {
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
			if binary.BigEndian.Uint32(payload) == ONFExperimenter && fieldNum == 42 {
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

// appendInstructions appends the instructions of a flow's actions: apply-actions, then goto_table.
func appendInstructions(out []byte, acts []Action) ([]byte, error) {
	apply := acts
	var gotoTable Goto
	hasGoto := false
	for i, a := range acts {
		if g, ok := a.(Goto); ok {
			if i != len(acts)-1 {
				return nil, errors.New("goto_table must be the last action")
			}
			gotoTable, hasGoto, apply = g, true, acts[:i]
		}
	}
	if len(apply) > 0 {
		start := len(out)
		out = append(out, 0, instrApplyActions, 0, 0, 0, 0, 0, 0)
		var err error
		if out, err = appendActions(out, apply); err != nil {
			return nil, err
		}
		binary.BigEndian.PutUint16(out[start+2:], uint16(len(out)-start))
	}
	if hasGoto {
		out = append(out, 0, instrGotoTable, 0, 8, byte(gotoTable.Table), 0, 0, 0)
	}
	return out, nil
}

func encodeActions(acts []Action) ([]byte, error) { return appendActions(nil, acts) }

func appendActions(out []byte, acts []Action) ([]byte, error) {
	for _, a := range acts {
		// The actions nearly every flow carries are laid out here, as libOpenflow lays them out (a
		// test holds them to it) but without its allocations: every change compiles every flow of the
		// owners it touches, and a first sync tens of thousands.
		if b, done, err := appendCommonAction(out, a); done || err != nil {
			if err != nil {
				return nil, fmt.Errorf("action %s: %w", a, err)
			}
			out = b
			continue
		}
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

// check refuses a clause OVS would refuse.
func (c Conjunction) check() error {
	if c.NClauses < 2 || c.NClauses > 64 || c.Clause < 1 || c.Clause > c.NClauses {
		return fmt.Errorf("clause %d/%d out of range", c.Clause, c.NClauses)
	}
	return nil
}

// appendConjunction lays out NXAST_CONJUNCTION as libOpenflow's NXActionConjunction does: the
// experimenter action header, the 0-based clause, the clause count and the ID (16 bytes).
func appendConjunction(out []byte, c Conjunction) []byte {
	out = appendNXActionHeader(out, of.NxActionHeaderLength+6, nxastConjunction)
	out = append(out, c.Clause-1, c.NClauses)
	return binary.BigEndian.AppendUint32(out, c.ID)
}

// appendCommonAction lays out a conjunction, load, move, output, group or resubmit action; done is
// false for any other action.
func appendCommonAction(out []byte, a Action) (_ []byte, done bool, _ error) {
	switch a := a.(type) {
	case Conjunction:
		if err := a.check(); err != nil {
			return nil, true, err
		}
		return appendConjunction(out, a), true, nil
	case Load:
		if err := a.Dst.validate(); err != nil {
			return nil, true, err
		}
		if a.Dst.NBits() < 64 && a.Value>>uint(a.Dst.NBits()) != 0 {
			return nil, true, fmt.Errorf("value %#x does not fit %d bits", a.Value, a.Dst.NBits())
		}
		out = appendNXActionHeader(out, 24, nxastRegLoad)
		out = binary.BigEndian.AppendUint16(out, a.Dst.ofsNbits())
		out = binary.BigEndian.AppendUint32(out, nxmHeader(a.Dst.Field))
		return binary.BigEndian.AppendUint64(out, a.Value), true, nil
	case Move:
		if err := a.Src.validate(); err != nil {
			return nil, true, err
		}
		if err := a.Dst.validate(); err != nil {
			return nil, true, err
		}
		if a.Src.NBits() != a.Dst.NBits() {
			return nil, true, fmt.Errorf("move of %d bits into %d bits", a.Src.NBits(), a.Dst.NBits())
		}
		out = appendNXActionHeader(out, 24, nxastRegMove)
		out = binary.BigEndian.AppendUint16(out, uint16(a.Src.NBits()))
		out = binary.BigEndian.AppendUint16(out, uint16(a.Src.Start))
		out = binary.BigEndian.AppendUint16(out, uint16(a.Dst.Start))
		out = binary.BigEndian.AppendUint32(out, nxmHeader(a.Src.Field))
		return binary.BigEndian.AppendUint32(out, nxmHeader(a.Dst.Field)), true, nil
	case Output:
		maxLen := uint16(0)
		if a.Port == PortController {
			maxLen = a.MaxLen
		}
		out = append(out, 0, actionOutput, 0, 16)
		out = binary.BigEndian.AppendUint32(out, a.Port)
		out = binary.BigEndian.AppendUint16(out, maxLen)
		return append(out, 0, 0, 0, 0, 0, 0), true, nil
	case Controller:
		// nx_action_controller2: the 16-byte Nicira header, then properties of 8 bytes each.
		n := uint16(24)
		if a.MeterID != 0 {
			n += 8
		}
		out = appendNXActionHeader(out, n, nxastController2)
		out = append(out, 0, 0, 0, 0, 0, 0)
		out = append(out, 0, nxac2ptMaxLen, 0, 8) // as OVS lays it out (ofpprop_put_u16: length 8)
		out = binary.BigEndian.AppendUint16(out, a.MaxLen)
		out = append(out, 0, 0)
		if a.MeterID != 0 {
			out = append(out, 0, nxac2ptMeterID, 0, 8)
			out = binary.BigEndian.AppendUint32(out, a.MeterID)
		}
		return out, true, nil
	case ToGroup:
		out = append(out, 0, actionGroup, 0, 8)
		return binary.BigEndian.AppendUint32(out, a.ID), true, nil
	case Resubmit:
		out = appendNXActionHeader(out, 16, nxastResubmitTable)
		out = binary.BigEndian.AppendUint16(out, uint16(of.OFPP_IN_PORT))
		return append(out, byte(a.Table), 0, 0, 0), true, nil
	}
	return out, false, nil
}

// appendNXActionHeader lays out a Nicira action's header: experimenter action type, length, the
// Nicira ID and the subtype (10 bytes; the action's own fields follow).
func appendNXActionHeader(out []byte, length, subtype uint16) []byte {
	out = binary.BigEndian.AppendUint16(out, actionExperimenter)
	out = binary.BigEndian.AppendUint16(out, length)
	out = binary.BigEndian.AppendUint32(out, nxExperimenter)
	return binary.BigEndian.AppendUint16(out, subtype)
}

// nxmHeader is a field's NXM/OXM header as actions name it (no mask).
func nxmHeader(f Field) uint32 {
	class, field := f.nxmID()
	return uint32(class)<<16 | uint32(field)<<9 | uint32(fieldTable[f].bytes)
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
		if err := a.check(); err != nil {
			return nil, err
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
	case Multipath:
		return multipathToWire(a)
	case Unknown:
		return rawAction(a.Raw), nil
	case Goto:
		return nil, errors.New("goto_table is an instruction, not an action")
	case Controller:
		b, _, err := appendCommonAction(nil, a)
		return rawAction(b), err
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

// multipathToWire encodes NXAST_MULTIPATH (libOpenflow has no encoder for it): 32 bytes, as
// nx_action_multipath in Open vSwitch's ofp-actions.c.
func multipathToWire(a Multipath) (of.Action, error) {
	f, err := checkSub(a.Dst)
	if err != nil {
		return nil, err
	}
	if a.Links < 1 || a.Links > 65536 {
		return nil, fmt.Errorf("multipath: %d links, want 1..65536", a.Links)
	}
	if need := bits.Len32(a.Links - 1); a.Dst.NBits() < need {
		return nil, fmt.Errorf("multipath: %d links need %d bits, %s has %d", a.Links, need, a.Dst, a.Dst.NBits())
	}
	if int(a.Fields) >= len(hashFieldNames) || int(a.Algorithm) >= len(multipathAlgorithmNames) {
		return nil, fmt.Errorf("multipath: unknown fields %d or algorithm %d", a.Fields, a.Algorithm)
	}
	b := make([]byte, 32)
	binary.BigEndian.PutUint16(b[0:], actionExperimenter)
	binary.BigEndian.PutUint16(b[2:], 32)
	binary.BigEndian.PutUint32(b[4:], nxExperimenter)
	binary.BigEndian.PutUint16(b[8:], nxastMultipath)
	binary.BigEndian.PutUint16(b[10:], uint16(a.Fields))
	binary.BigEndian.PutUint16(b[12:], a.Basis)
	binary.BigEndian.PutUint16(b[16:], uint16(a.Algorithm))
	binary.BigEndian.PutUint16(b[18:], uint16(a.Links-1))
	binary.BigEndian.PutUint32(b[20:], a.Arg)
	binary.BigEndian.PutUint16(b[26:], a.Dst.ofsNbits())
	binary.BigEndian.PutUint32(b[28:], f.MarshalHeader())
	return rawAction(b), nil
}

func decodeMultipath(b []byte) (Action, error) {
	if err := need(b, 32, "multipath"); err != nil {
		return nil, err
	}
	ofsNbits := binary.BigEndian.Uint16(b[26:])
	dst, err := subFieldFromWire(binary.BigEndian.Uint32(b[28:]), int(ofsNbits>>6), int(ofsNbits&0x3f)+1)
	if err != nil {
		return nil, fmt.Errorf("multipath: %w", err)
	}
	return Multipath{
		Fields:    HashFields(binary.BigEndian.Uint16(b[10:])),
		Basis:     binary.BigEndian.Uint16(b[12:]),
		Algorithm: MultipathAlgorithm(binary.BigEndian.Uint16(b[16:])),
		Links:     uint32(binary.BigEndian.Uint16(b[18:])) + 1,
		Arg:       binary.BigEndian.Uint32(b[20:]),
		Dst:       dst,
	}, nil
}

// rawAction re-sends bytes of an action we could not decode.
type rawAction []byte

func (r rawAction) Len() uint16                     { return uint16(len(r)) }
func (r rawAction) MarshalBinary() ([]byte, error)  { return []byte(r), nil }
func (r rawAction) UnmarshalBinary(b []byte) error  { return errors.New("rawAction is write-only") }
func (r rawAction) Header() *of.ActionHeader        { return &of.ActionHeader{} }
func (r rawAction) AddAction(of.Action, bool) error { return errors.New("rawAction holds no actions") }

// ---- decoding ----

// NX action subtypes (after the Nicira experimenter ID) laid out or decoded here.
const (
	nxastResubmit      = 1
	nxastRegMove       = 6
	nxastRegLoad       = 7
	nxastNote          = 8
	nxastMultipath     = 10
	nxastResubmitTable = 14
	nxastOutputReg     = 15
	nxastLearn         = 16
	nxastDecTTL        = 18
	nxastConjunction   = 34
	nxastCT            = 35
	nxastNAT           = 36
	nxastController2   = 37

	// nx_action_controller2's properties (ofp-actions.c, enum nx_action_controller2_prop_type).
	nxac2ptMaxLen  = 0
	nxac2ptMeterID = 5
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
	case actionOutput:
		if err := need(b, 16, "output"); err != nil {
			return nil, err
		}
		o := Output{Port: binary.BigEndian.Uint32(b[4:])}
		if o.Port == PortController {
			o.MaxLen = binary.BigEndian.Uint16(b[8:])
		}
		return o, nil
	case actionGroup:
		return ToGroup{ID: binary.BigEndian.Uint32(b[4:])}, nil
	case actionDecNwTTL:
		return DecTTL{}, nil
	case actionSetField:
		m, err := decodeOXMPrefix(b[4:])
		if err != nil {
			return nil, fmt.Errorf("set_field: %w", err)
		}
		return SetField{Field: m.Field, Value: m.Value}, nil
	case actionExperimenter:
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
	case nxastMultipath:
		return decodeMultipath(b)
	case nxastController2:
		if a, ok := decodeController2(b); ok {
			return a, nil
		}
	}
	return Unknown{Raw: append([]byte(nil), b...)}, nil
}

// decodeController2 reads a controller(...) action with the properties Controller has; any other
// (userdata, pause, a reason or controller ID) makes it Unknown.
func decodeController2(b []byte) (Controller, bool) {
	a := Controller{MaxLen: 0xffff}
	if len(b) < 16 {
		return a, false
	}
	for p := b[16:]; len(p) > 0; {
		if len(p) < 4 {
			return a, false
		}
		typ, n := binary.BigEndian.Uint16(p), int(binary.BigEndian.Uint16(p[2:]))
		padded := (n + 7) / 8 * 8
		if n < 4 || padded > len(p) {
			return a, false
		}
		switch {
		case typ == nxac2ptMaxLen && (n == 6 || n == 8):
			a.MaxLen = binary.BigEndian.Uint16(p[4:])
		case typ == nxac2ptMeterID && n == 8:
			a.MeterID = binary.BigEndian.Uint32(p[4:])
		default:
			return a, false
		}
		p = p[padded:]
	}
	return a, true
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
		if i == 0 && binary.BigEndian.Uint16(nb) == actionExperimenter && len(nb) >= 10 && binary.BigEndian.Uint16(nb[8:]) == nxastNAT {
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
	c, st, err := DecodeFlowStatsCompiled(b)
	if err != nil {
		return Flow{}, err
	}
	f := c.Flow()
	f.Packets, f.Bytes, f.Duration = st.Packets, st.Bytes, st.Duration
	return f, nil
}

// FlowCounters are a dumped flow's statistics.
type FlowCounters struct {
	Packets, Bytes uint64
	Duration       time.Duration
}

// flowStatsParts slices a flow-stats entry into its fixed fields, match and instructions.
func flowStatsParts(b []byte) (fixed, oxm, instr []byte, err error) {
	if len(b) < flowStatsFixed+4 {
		return nil, nil, nil, fmt.Errorf("flow stats: %d bytes", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > len(b) || n < flowStatsFixed+4 {
		return nil, nil, nil, fmt.Errorf("flow stats: bad length %d", n)
	}
	b = b[:n]
	m := b[flowStatsFixed:]
	mlen := int(binary.BigEndian.Uint16(m[2:]))
	if binary.BigEndian.Uint16(m) != 1 || mlen < 4 || matchLen(mlen-4) > len(m) {
		return nil, nil, nil, fmt.Errorf("flow stats: bad match (type %d, length %d)", binary.BigEndian.Uint16(m), mlen)
	}
	return b[:flowStatsFixed], m[4:mlen], m[matchLen(mlen-4):], nil
}

// RawFlowStats reads a flow-stats entry as the compiled flow it would be if the switch encoded it
// exactly as this codec does, without decoding match or actions: cheap enough to run over every flow
// of a dump and compare with what was sent. DecodeFlowStatsCompiled gives the canonical form.
func RawFlowStats(b []byte) (CompiledFlow, bool) {
	fixed, oxm, instr, err := flowStatsParts(b)
	if err != nil {
		return CompiledFlow{}, false
	}
	return CompiledFlow{
		Key:    makeFlowKey(TableID(fixed[2]), binary.BigEndian.Uint16(fixed[12:]), oxm),
		Instr:  string(instr),
		Cookie: binary.BigEndian.Uint64(fixed[24:]),
		Idle:   binary.BigEndian.Uint16(fixed[14:]),
		Hard:   binary.BigEndian.Uint16(fixed[16:]),
	}, true
}

// DecodeFlowStatsCompiled decodes a flow-stats entry straight into the canonical compiled form a
// reconciler compares with: typed decoding and re-encoding normalise any encoding choice of the switch.
// A flow that does not fully decode comes back raw, with the error: it still diffs (and is deleted if
// nobody wants it).
func DecodeFlowStatsCompiled(b []byte) (CompiledFlow, FlowCounters, error) {
	var st FlowCounters
	fixed, oxm, instr, err := flowStatsParts(b)
	if err != nil {
		return CompiledFlow{}, st, err
	}
	f := Flow{
		Table:       TableID(fixed[2]),
		Priority:    binary.BigEndian.Uint16(fixed[12:]),
		IdleTimeout: binary.BigEndian.Uint16(fixed[14:]),
		HardTimeout: binary.BigEndian.Uint16(fixed[16:]),
		Cookie:      binary.BigEndian.Uint64(fixed[24:]),
	}
	st.Duration = time.Duration(binary.BigEndian.Uint32(fixed[4:]))*time.Second + time.Duration(binary.BigEndian.Uint32(fixed[8:]))
	st.Packets, st.Bytes = binary.BigEndian.Uint64(fixed[32:]), binary.BigEndian.Uint64(fixed[40:])
	match, merr := decodeOXM(oxm)
	acts, aerr := decodeInstructions(instr)
	if merr != nil || aerr != nil {
		return CompiledFlow{Key: makeFlowKey(f.Table, f.Priority, oxm), Instr: string(instr), Cookie: f.Cookie,
			Idle: f.IdleTimeout, Hard: f.HardTimeout}, st, errors.Join(merr, aerr)
	}
	f.Match, f.Actions = match, acts
	c, err := Compile(f)
	return c, st, err
}

// CompiledGroup is a group in wire form: its buckets encoded once.
type CompiledGroup struct {
	ID      uint32
	Type    GroupType
	Buckets string
}

// CompileGroup encodes a group's buckets.
func CompileGroup(g GroupEntry) (CompiledGroup, error) {
	var body []byte
	for i, bk := range g.Buckets {
		acts, err := encodeActions(bk.Actions)
		if err != nil {
			return CompiledGroup{}, fmt.Errorf("group %d bucket %d: %w", g.ID, i, err)
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
	if n := groupModFixedLen + len(body); n > MaxBundledMessageLen {
		return CompiledGroup{}, fmt.Errorf("group %d: %d buckets encode to %d bytes, more than a bundled OpenFlow message holds (%d); split it into chained groups",
			g.ID, len(g.Buckets), n, MaxBundledMessageLen)
	}
	return CompiledGroup{ID: g.ID, Type: g.Type, Buckets: string(body)}, nil
}

// Group decodes the compiled form back into a typed group.
func (c *CompiledGroup) Group() (GroupEntry, error) {
	return decodeBuckets(c.ID, c.Type, []byte(c.Buckets))
}

// AppendGroupMod lays out an OFPT_GROUP_MOD for c (a delete carries no buckets) and appends it to dst.
func AppendGroupMod(dst []byte, c *CompiledGroup, cmd GroupModCommand) []byte {
	body := c.Buckets
	if cmd == GroupDelete {
		body = ""
	}
	total := groupModFixedLen + len(body)
	start := len(dst)
	dst = append(dst, make([]byte, total)...)
	b := dst[start:]
	PutHeader(b, TypeGroupMod, total, 0)
	binary.BigEndian.PutUint16(b[8:], uint16(cmd))
	b[10] = byte(c.Type)
	binary.BigEndian.PutUint32(b[12:], c.ID)
	copy(b[16:], body)
	return dst
}

// EncodeGroupMod encodes a group as an OFPT_GROUP_MOD add (for tests and tools).
func EncodeGroupMod(g GroupEntry) ([]byte, error) {
	c, err := CompileGroup(g)
	if err != nil {
		return nil, err
	}
	return AppendGroupMod(nil, &c, GroupAdd), nil
}

// GroupMod is a parsed OFPT_GROUP_MOD.
type GroupMod struct {
	Command GroupModCommand
	Group   CompiledGroup
}

// ParseGroupMod parses a complete OFPT_GROUP_MOD message.
func ParseGroupMod(m []byte) (GroupMod, error) {
	if len(m) < groupModFixedLen || m[1] != TypeGroupMod {
		return GroupMod{}, fmt.Errorf("group-mod: %d bytes of message type %d", len(m), m[1])
	}
	return GroupMod{Command: GroupModCommand(binary.BigEndian.Uint16(m[8:])),
		Group: CompiledGroup{ID: binary.BigEndian.Uint32(m[12:]), Type: GroupType(m[10]), Buckets: string(m[groupModFixedLen:])}}, nil
}

// DecodeGroupDesc decodes one ofp_group_desc entry of a group-description reply.
func DecodeGroupDesc(b []byte) (GroupEntry, error) {
	c, err := DecodeGroupDescCompiled(b)
	if err != nil {
		return GroupEntry{}, err
	}
	return c.Group()
}

// DecodeGroupDescCompiled decodes a group-description entry into the canonical compiled form. A
// group whose buckets do not decode comes back raw, with the error.
func DecodeGroupDescCompiled(b []byte) (CompiledGroup, error) {
	if len(b) < groupDescFixed {
		return CompiledGroup{}, fmt.Errorf("group desc: %d bytes", len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > len(b) || n < groupDescFixed {
		return CompiledGroup{}, fmt.Errorf("group desc: bad length %d", n)
	}
	id, typ := binary.BigEndian.Uint32(b[4:]), GroupType(b[2])
	g, err := decodeBuckets(id, typ, b[groupDescFixed:n])
	if err != nil {
		return CompiledGroup{ID: id, Type: typ, Buckets: string(b[groupDescFixed:n])}, err
	}
	return CompileGroup(g)
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
	c, err := Compile(f)
	if err != nil {
		return nil, err
	}
	return EncodeFlowStatsCompiled(&c, FlowCounters{Packets: f.Packets, Bytes: f.Bytes, Duration: f.Duration}), nil
}

// EncodeFlowStatsCompiled encodes a compiled flow as a flow-stats entry.
func EncodeFlowStatsCompiled(c *CompiledFlow, st FlowCounters) []byte {
	oxm := c.Key.oxm()
	n := flowStatsFixed + matchLen(len(oxm)) + len(c.Instr)
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b, uint16(n))
	b[2] = byte(c.Key.Table())
	binary.BigEndian.PutUint32(b[4:], uint32(st.Duration/time.Second))
	binary.BigEndian.PutUint32(b[8:], uint32(st.Duration%time.Second))
	binary.BigEndian.PutUint16(b[12:], c.Key.Priority())
	binary.BigEndian.PutUint16(b[14:], c.Idle)
	binary.BigEndian.PutUint16(b[16:], c.Hard)
	binary.BigEndian.PutUint64(b[24:], c.Cookie)
	binary.BigEndian.PutUint64(b[32:], st.Packets)
	binary.BigEndian.PutUint64(b[40:], st.Bytes)
	binary.BigEndian.PutUint16(b[flowStatsFixed:], 1)
	binary.BigEndian.PutUint16(b[flowStatsFixed+2:], uint16(4+len(oxm)))
	copy(b[flowStatsFixed+4:], oxm)
	copy(b[flowStatsFixed+matchLen(len(oxm)):], c.Instr)
	return b
}

// EncodeGroupDesc encodes a group as the ofp_group_desc entry a switch returns for it.
func EncodeGroupDesc(g GroupEntry) ([]byte, error) {
	c, err := CompileGroup(g)
	if err != nil {
		return nil, err
	}
	return EncodeGroupDescCompiled(&c), nil
}

// EncodeGroupDescCompiled encodes a compiled group as a group-description entry.
func EncodeGroupDescCompiled(c *CompiledGroup) []byte {
	b := make([]byte, groupDescFixed+len(c.Buckets))
	binary.BigEndian.PutUint16(b, uint16(len(b)))
	b[2] = byte(c.Type)
	binary.BigEndian.PutUint32(b[4:], c.ID)
	copy(b[groupDescFixed:], c.Buckets)
	return b
}

// AllTablesKey is the key of a non-strict delete over every table with an empty match.
func AllTablesKey() FlowKey { return makeFlowKey(AllTables, 0, nil) }
