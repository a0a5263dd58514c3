package trace

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Bridge is one bridge's flows and groups, ready to evaluate packets against: the offline half of
// trace, for a saved `flowctl dump -o json`.
type Bridge struct {
	tables map[openflow.TableID][]openflow.Flow // by priority, high first
	groups map[uint32]openflow.GroupEntry
}

// NewBridge indexes flows and groups. Learned flows are evaluated like any other.
func NewBridge(flows []openflow.Flow, groups []openflow.GroupEntry) *Bridge {
	b := &Bridge{tables: map[openflow.TableID][]openflow.Flow{}, groups: map[uint32]openflow.GroupEntry{}}
	for _, f := range flows {
		b.tables[f.Table] = append(b.tables[f.Table], f)
	}
	for _, fs := range b.tables {
		sort.SliceStable(fs, func(i, j int) bool { return fs[i].Priority > fs[j].Priority })
	}
	for _, g := range groups {
		b.groups[g.ID] = g
	}
	return b
}

// Group returns a group of the bridge.
func (b *Bridge) Group(id uint32) (openflow.GroupEntry, bool) {
	g, ok := b.groups[id]
	return g, ok
}

// maxDepth bounds resubmit nesting (OVS stops at 64 too) and maxPasses recirculations.
const (
	maxDepth  = 64
	maxPasses = 16
)

// Errors of an evaluation that cannot go on.
var errTooDeep = errors.New("resubmits nest deeper than 64")

// state is a packet during evaluation: every field flows match, load or move, by openflow.Field.
type state struct {
	f      map[openflow.Field]uint64
	inPort uint32
	dpHash uint32
}

// getBits reads a sub-field.
func (s *state) getBits(sf openflow.SubField) uint64 {
	return (s.f[sf.Field] >> sf.Start) & bitMask(sf.NBits())
}

// setBits writes a sub-field.
func (s *state) setBits(sf openflow.SubField, v uint64) {
	m := bitMask(sf.NBits()) << sf.Start
	s.f[sf.Field] = s.f[sf.Field]&^m | (v<<sf.Start)&m
}

func bitMask(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<uint(n) - 1
}

func (s *state) clone() *state {
	c := &state{f: make(map[openflow.Field]uint64, len(s.f)), inPort: s.inPort, dpHash: s.dpHash}
	for k, v := range s.f {
		c.f[k] = v
	}
	return c
}

// l4 returns the packet's L4 port fields for its protocol.
func (s *state) l4() (src, dst openflow.Field, ok bool) {
	switch uint8(s.f[openflow.FieldIPProto]) {
	case openflow.IPProtoTCP:
		return openflow.FieldTCPSrc, openflow.FieldTCPDst, true
	case openflow.IPProtoUDP:
		return openflow.FieldUDPSrc, openflow.FieldUDPDst, true
	case openflow.IPProtoSCTP:
		return openflow.FieldSCTPSrc, openflow.FieldSCTPDst, true
	}
	return 0, 0, false
}

func (s *state) fields() Fields {
	ip := func(f openflow.Field) netip.Addr {
		v := s.f[f]
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	out := Fields{InPort: s.inPort, EthSrc: macOf(s.f[openflow.FieldEthSrc]), EthDst: macOf(s.f[openflow.FieldEthDst]),
		IPSrc: ip(openflow.FieldIPSrc), IPDst: ip(openflow.FieldIPDst), TunID: s.f[openflow.FieldTunID]}
	if _, ok := s.f[openflow.FieldTunSrc]; ok {
		out.TunSrc = ip(openflow.FieldTunSrc)
	}
	if _, ok := s.f[openflow.FieldTunDst]; ok {
		out.TunDst = ip(openflow.FieldTunDst)
	}
	if src, dst, ok := s.l4(); ok {
		out.SrcPort, out.DstPort = uint16(s.f[src]), uint16(s.f[dst])
	}
	for i := range out.Regs {
		out.Regs[i] = uint32(s.f[openflow.FieldReg0+openflow.Field(i)])
	}
	return out
}

// newState is a packet entering the bridge.
func newState(p Packet) (*state, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	proto, _ := ProtoNumber(p.Proto)
	s := &state{f: map[openflow.Field]uint64{}, inPort: p.InPort, dpHash: p.DPHash}
	ip := func(a netip.Addr) uint64 { v, _ := openflow.IPv4Value(a); return v }
	s.f[openflow.FieldInPort] = uint64(p.InPort)
	s.f[openflow.FieldEthSrc] = openflow.MACValue([]byte(p.EthSrc))
	s.f[openflow.FieldEthDst] = openflow.MACValue([]byte(p.EthDst))
	s.f[openflow.FieldEthType] = uint64(openflow.EthTypeIPv4)
	s.f[openflow.FieldIPProto] = uint64(proto)
	s.f[openflow.FieldIPSrc], s.f[openflow.FieldIPDst] = ip(p.IPSrc), ip(p.IPDst)
	if src, dst, ok := s.l4(); ok {
		s.f[src], s.f[dst] = uint64(p.SrcPort), uint64(p.DstPort)
	}
	if proto == openflow.IPProtoICMP {
		s.f[openflow.FieldICMPType] = 8
	}
	if proto == openflow.IPProtoTCP {
		s.f[openflow.FieldTCPFlags] = 0x002 // SYN
	}
	if p.TunID != 0 || p.TunSrc.IsValid() {
		s.f[openflow.FieldTunID] = p.TunID
		s.f[openflow.FieldTunSrc], s.f[openflow.FieldTunDst] = ip(p.TunSrc), ip(p.TunDst)
	}
	return s, nil
}

// matches reports whether the packet matches every field of m.
func (s *state) matches(m openflow.Match) bool {
	for _, mf := range m.Fields() {
		v := s.f[mf.Field]
		if mf.Masked {
			if v&mf.Mask != mf.Value {
				return false
			}
		} else if v != mf.Value {
			return false
		}
	}
	return true
}

// afterCT is the packet a ct() recirculates, as the first packet of a new connection sees it: a fresh
// lookup in the action's zone, with the mark a commit's exec() gives the connection (0 when
// there is no commit: a new connection has none).
func (s *state) afterCT(a openflow.CT) (*state, error) {
	c := s.clone()
	zone := uint64(a.Zone)
	if a.ZoneSrc != nil {
		zone = s.getBits(*a.ZoneSrc)
	}
	c.f[openflow.FieldCtZone] = zone
	delete(c.f, openflow.FieldCtMark)
	if !a.Commit {
		return c, nil
	}
	for _, x := range a.Exec {
		switch x := x.(type) {
		case openflow.Load:
			c.setBits(x.Dst, x.Value)
		case openflow.SetField:
			c.f[x.Field] = x.Value
		case openflow.Move:
			c.setBits(x.Dst, s.getBits(x.Src)) // exec reads the packet as it was at the ct action
		default:
			return nil, fmt.Errorf("ct exec action %s: not modelled by the offline evaluator", x)
		}
	}
	return c, nil
}

// evaluation is one Evaluate call.
type evaluation struct {
	b       *Bridge
	path    *Path
	ctNext  []CtFlags
	pending []*recirc // recirculations to run after this pass
}

type recirc struct {
	st    *state
	table openflow.TableID
	ct    openflow.CT
}

// Evaluate follows p through the bridge as ofproto/trace does (see the package comment): ctNext are
// the flags of successive conntrack recirculations (missing ones default to trk,new, as OVS's).
func (b *Bridge) Evaluate(p Packet, ctNext []CtFlags) (*Path, error) {
	st, err := newState(p)
	if err != nil {
		return nil, err
	}
	ev := &evaluation{b: b, path: &Path{}, ctNext: ctNext}
	var final *state
	next := &recirc{st: st, table: 0}
	for pass := 0; next != nil; pass++ {
		if pass >= maxPasses {
			return nil, fmt.Errorf("more than %d recirculations", maxPasses)
		}
		ev.path.Passes = append(ev.path.Passes, Pass{ResumeTable: next.table})
		if pass > 0 {
			flags := CtFlags{"trk", "new"}
			if pass-1 < len(ctNext) {
				flags = ctNext[pass-1]
			}
			next.st.f[openflow.FieldCtState] = uint64(flags.bits())
			ev.path.Passes[pass].CtState = normaliseCtState(joinFlags(flags))
			simulateNAT(next.st, next.ct, flags)
		}
		outputsBefore := len(ev.path.Outputs)
		if err := ev.table(next.st, next.table, 0); err != nil {
			return nil, err
		}
		for i := outputsBefore; i < len(ev.path.Outputs); i++ {
			ev.path.Outputs[i].Fields = next.st.fields()
		}
		final = next.st
		next = nil
		if len(ev.pending) > 0 {
			next, ev.pending = ev.pending[0], ev.pending[1:]
		}
	}
	ev.path.Final = final.fields()
	return ev.path, nil
}

func joinFlags(f CtFlags) string {
	out := ""
	for i, x := range f {
		if i > 0 {
			out += "|"
		}
		out += x
	}
	return out
}

// simulateNAT rewrites a new connection's addresses as ofproto/trace simulates a ct(nat(...)): to the
// bottom of the range.
func simulateNAT(s *state, ct openflow.CT, flags CtFlags) {
	if ct.NAT == nil || !ct.NAT.AddrMin.IsValid() || flags.bits()&openflow.CtNew == 0 {
		return
	}
	addr, _ := openflow.IPv4Value(ct.NAT.AddrMin)
	src, dst, hasPorts := s.l4()
	switch ct.NAT.Kind {
	case openflow.NATDst:
		s.f[openflow.FieldIPDst] = addr
		if hasPorts && ct.NAT.PortMin != 0 {
			s.f[dst] = uint64(ct.NAT.PortMin)
		}
	case openflow.NATSrc:
		s.f[openflow.FieldIPSrc] = addr
		if hasPorts && ct.NAT.PortMin != 0 {
			s.f[src] = uint64(ct.NAT.PortMin)
		}
	}
}

// lookup finds the flow a packet hits in a table, conjunctions resolved as OVS does: the highest
// priority flow without conjunction actions, unless a higher priority has a complete conjunction,
// whose conj_id flow is then looked up.
func (b *Bridge) lookup(s *state, table openflow.TableID) (openflow.Flow, bool) {
	flows := b.tables[table]
	var hard *openflow.Flow
	for i := range flows {
		f := &flows[i]
		if isConjunctive(f) || !s.matches(f.Match) {
			continue
		}
		hard = f
		break
	}
	// Soft matches above the hard one, by priority.
	type clauses map[uint8]bool
	for i := 0; i < len(flows); {
		prio := flows[i].Priority
		if hard != nil && prio <= hard.Priority {
			break
		}
		got := map[uint32]clauses{}
		need := map[uint32]uint8{}
		j := i
		for ; j < len(flows) && flows[j].Priority == prio; j++ {
			f := &flows[j]
			if !isConjunctive(f) || !s.matches(f.Match) {
				continue
			}
			for _, a := range f.Actions {
				c := a.(openflow.Conjunction)
				if got[c.ID] == nil {
					got[c.ID] = clauses{}
				}
				got[c.ID][c.Clause] = true
				need[c.ID] = c.NClauses
			}
		}
		var complete []uint32
		for id, cl := range got {
			if len(cl) == int(need[id]) {
				complete = append(complete, id)
			}
		}
		sort.Slice(complete, func(a, b int) bool { return complete[a] < complete[b] })
		for _, id := range complete {
			s.f[openflow.FieldConjID] = uint64(id)
			for k := range flows {
				f := &flows[k]
				if !isConjunctive(f) && f.Priority >= prio && s.matches(f.Match) {
					if _, ok := f.Match.Get(openflow.FieldConjID); ok {
						s.f[openflow.FieldConjID] = 0
						return *f, true
					}
				}
			}
			s.f[openflow.FieldConjID] = 0
		}
		i = j
	}
	if hard != nil {
		return *hard, true
	}
	return openflow.Flow{}, false
}

func isConjunctive(f *openflow.Flow) bool {
	if len(f.Actions) == 0 {
		return false
	}
	for _, a := range f.Actions {
		if _, ok := a.(openflow.Conjunction); !ok {
			return false
		}
	}
	return true
}

// table runs the packet through a table (and on through goto_table).
func (ev *evaluation) table(s *state, table openflow.TableID, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	for {
		pass := &ev.path.Passes[len(ev.path.Passes)-1]
		f, ok := ev.b.lookup(s, table)
		if !ok {
			pass.Steps = append(pass.Steps, Step{Depth: depth, Table: table, Miss: true, Bucket: -1})
			return nil
		}
		step := Step{Depth: depth, Table: table, Priority: f.Priority, Match: f.Match.String(), Cookie: f.Cookie, Bucket: -1}
		for _, a := range f.Actions {
			step.Actions = append(step.Actions, a.String())
		}
		pass.Steps = append(pass.Steps, step)
		idx := len(pass.Steps) - 1
		next, err := ev.actions(s, f.Actions, depth, idx)
		if err != nil {
			return err
		}
		if next == openflow.NoTable {
			return nil
		}
		table = next
	}
}

// actions applies an action list; it returns the goto_table target (NoTable: none).
func (ev *evaluation) actions(s *state, acts []openflow.Action, depth, stepIdx int) (openflow.TableID, error) {
	next := openflow.NoTable
	for _, a := range acts {
		switch a := a.(type) {
		case openflow.Goto:
			next = a.Table
		case openflow.Load:
			s.setBits(a.Dst, a.Value)
		case openflow.SetField:
			s.f[a.Field] = a.Value
		case openflow.Move:
			s.setBits(a.Dst, s.getBits(a.Src))
		case openflow.Output:
			port := a.Port
			if port == openflow.PortInPort {
				port = s.inPort
			} else if port == s.inPort {
				continue // OpenFlow never outputs to the ingress port unless told IN_PORT
			}
			ev.path.Outputs = append(ev.path.Outputs, Output{Port: port})
		case openflow.OutputReg:
			port := uint32(s.getBits(a.Src))
			if port == s.inPort {
				continue
			}
			ev.path.Outputs = append(ev.path.Outputs, Output{Port: port})
		case openflow.Resubmit:
			if err := ev.table(s, a.Table, depth+1); err != nil {
				return openflow.NoTable, err
			}
		case openflow.ToGroup:
			if err := ev.group(s, a.ID, depth, stepIdx); err != nil {
				return openflow.NoTable, err
			}
		case openflow.Multipath:
			link, err := s.multipath(a)
			if err != nil {
				return openflow.NoTable, err
			}
			s.setBits(a.Dst, link)
		case openflow.CT:
			if a.Table != openflow.NoTable {
				c, err := s.afterCT(a)
				if err != nil {
					return openflow.NoTable, err
				}
				ev.pending = append(ev.pending, &recirc{st: c, table: a.Table, ct: a})
				pass := &ev.path.Passes[len(ev.path.Passes)-1]
				pass.Recirculates = a.String()
			}
			// After ct() the packet goes on untracked (OVS clears the conntrack fields).
			delete(s.f, openflow.FieldCtState)
			delete(s.f, openflow.FieldCtZone)
		case openflow.Learn, openflow.Note, openflow.DecTTL, openflow.Conjunction, openflow.Controller:
			// Controller: a drop's sample for the agent (flows/pipeline/drops.go), not a way out.
			// Nothing a trace sees: learn learns nothing without -generate.
		default:
			return openflow.NoTable, fmt.Errorf("action %s: not modelled by the offline evaluator", a)
		}
	}
	return next, nil
}

// group runs a group: a select group's bucket chosen by dp_hash as OVS maps hash values onto equal
// buckets (Webster's method hands them out in bucket order), every bucket of an all group.
func (ev *evaluation) group(s *state, id uint32, depth, stepIdx int) error {
	g, ok := ev.b.groups[id]
	pass := &ev.path.Passes[len(ev.path.Passes)-1]
	if !ok || len(g.Buckets) == 0 {
		return nil // OVS: no such group or no bucket, the packet is dropped here
	}
	switch g.Type {
	case openflow.GroupSelect:
		if s.dpHash == 0 {
			ev.path.StoppedAtGroup = id
			return nil
		}
		b := SelectBucket(len(g.Buckets), s.dpHash)
		pass.Steps[stepIdx].Bucket = b
		_, err := ev.actions(s, g.Buckets[b].Actions, depth+1, stepIdx)
		return err
	default:
		for _, bk := range g.Buckets {
			if _, err := ev.actions(s.clone(), bk.Actions, depth+1, stepIdx); err != nil {
				return err
			}
		}
		return nil
	}
}

// SelectBucket is the bucket OVS's dp_hash selection gives hash among n buckets of equal weight: the
// hash's low bits index max(16, the next power of two ≥ n) values handed to the buckets in turn.
func SelectBucket(n int, hash uint32) int {
	size := 16
	for size < n {
		size *= 2
	}
	return int(hash&uint32(size-1)) % n
}

// DPHashFor is a dp_hash that makes OVS pick bucket b of n equal buckets (never 0, which means
// "not computed").
func DPHashFor(b int) uint32 {
	if b == 0 {
		return 1 << 16 // low bits zero: bucket 0, for any size up to 2^16
	}
	return uint32(b)
}
