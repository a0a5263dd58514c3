package flows

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
)

// fakeSwitch is a small in-memory OpenFlow 1.3 flow table for fast reconciler tests: it applies
// flow-mods and group-mods with OpenFlow's strict/non-strict and cookie-filter semantics, atomically
// per bundle, and dumps flow-stats entries in the wire format. The real-OVS tests are the truth; this
// only lets pure logic be tested in milliseconds.
type fakeSwitch struct {
	mu      sync.Mutex
	flows   map[string]fakeFlow
	groups  map[uint32][]byte // group-mod body after the fixed header, with type in [0]
	bundles int
	msgs    int
	failAt  int // when > 0, the bundle message with this 1-based index fails
}

type fakeFlow struct {
	cookie     uint64
	instr      []byte
	idle, hard uint16
}

type fakeErr struct{ index int }

func (e fakeErr) Error() string      { return fmt.Sprintf("fake switch rejected message %d", e.index) }
func (e fakeErr) FailedMessage() int { return e.index }

func newFakeSwitch() *fakeSwitch {
	return &fakeSwitch{flows: map[string]fakeFlow{}, groups: map[uint32][]byte{}}
}

func (s *fakeSwitch) Bundle(_ context.Context, msgs [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	flows := make(map[string]fakeFlow, len(s.flows))
	for k, v := range s.flows {
		flows[k] = v
	}
	groups := make(map[uint32][]byte, len(s.groups))
	for k, v := range s.groups {
		groups[k] = v
	}
	for i, m := range msgs {
		if s.failAt == i+1 {
			return fakeErr{index: i}
		}
		if err := applyFake(flows, groups, m); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	s.flows, s.groups = flows, groups
	s.bundles++
	s.msgs += len(msgs)
	return nil
}

func applyFake(flows map[string]fakeFlow, groups map[uint32][]byte, m []byte) error {
	switch m[1] {
	case ofTypeFlowMod:
		cookie, mask := binary.BigEndian.Uint64(m[8:]), binary.BigEndian.Uint64(m[16:])
		table, cmd := m[24], m[25]
		prio := m[30:32]
		mlen := int(binary.BigEndian.Uint16(m[flowModFixedLen+2:]))
		oxm := m[flowModFixedLen+4 : flowModFixedLen+mlen]
		instr := m[flowModFixedLen+matchLen(mlen-4):]
		key := string(append([]byte{table, prio[0], prio[1]}, oxm...))
		ff := fakeFlow{cookie: cookie, instr: append([]byte(nil), instr...),
			idle: binary.BigEndian.Uint16(m[26:]), hard: binary.BigEndian.Uint16(m[28:])}
		switch cmd {
		case cmdAdd:
			if err := checkGroups(instr, groups); err != nil {
				return err
			}
			flows[key] = ff
		case cmdModifyStrict:
			if old, ok := flows[key]; ok && old.cookie&mask == cookie&mask {
				old.instr = ff.instr
				flows[key] = old
			}
		case cmdDeleteStrict:
			if old, ok := flows[key]; ok && old.cookie&mask == cookie&mask {
				delete(flows, key)
			}
		case cmdDelete:
			if table != 0xff || len(oxm) != 0 {
				return fmt.Errorf("fake: non-strict delete only for all tables and an empty match")
			}
			for k, f := range flows {
				if f.cookie&mask == cookie&mask {
					delete(flows, k)
				}
			}
		default:
			return fmt.Errorf("fake: flow-mod command %d", cmd)
		}
	case ofTypeGroupMod:
		cmd, id := binary.BigEndian.Uint16(m[8:]), binary.BigEndian.Uint32(m[12:])
		switch cmd {
		case groupCmdAdd:
			if _, ok := groups[id]; ok {
				return fmt.Errorf("fake: group %d exists", id)
			}
			groups[id] = append([]byte{m[10]}, m[16:]...)
		case groupCmdModify:
			if _, ok := groups[id]; !ok {
				return fmt.Errorf("fake: group %d does not exist", id)
			}
			groups[id] = append([]byte{m[10]}, m[16:]...)
		case groupCmdDelete:
			if id == ofpGroupAll {
				for g := range groups {
					delete(groups, g)
				}
			} else {
				delete(groups, id)
			}
		}
	default:
		return fmt.Errorf("fake: message type %d", m[1])
	}
	return nil
}

// checkGroups fails like OVS does (OFPBAC_BAD_OUT_GROUP) when a flow outputs to a missing group.
func checkGroups(instr []byte, groups map[uint32][]byte) error {
	acts, err := decodeInstructions(instr)
	if err != nil {
		return err
	}
	for _, a := range acts {
		if g, ok := a.(ToGroup); ok {
			if _, exists := groups[g.ID]; !exists {
				return fmt.Errorf("fake: OFPBAC_BAD_OUT_GROUP: group %d", g.ID)
			}
		}
	}
	return nil
}

func (s *fakeSwitch) DumpFlows(_ context.Context, cookie, mask uint64) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for k, f := range s.flows {
		if f.cookie&mask != cookie&mask {
			continue
		}
		oxm := []byte(k[3:])
		n := flowStatsFixed + matchLen(len(oxm)) + len(f.instr)
		b := make([]byte, n)
		binary.BigEndian.PutUint16(b, uint16(n))
		b[2] = k[0]
		b[12], b[13] = k[1], k[2]
		binary.BigEndian.PutUint16(b[14:], f.idle)
		binary.BigEndian.PutUint16(b[16:], f.hard)
		binary.BigEndian.PutUint64(b[24:], f.cookie)
		binary.BigEndian.PutUint16(b[flowStatsFixed:], 1)
		binary.BigEndian.PutUint16(b[flowStatsFixed+2:], uint16(4+len(oxm)))
		copy(b[flowStatsFixed+4:], oxm)
		copy(b[flowStatsFixed+matchLen(len(oxm)):], f.instr)
		out = append(out, b)
	}
	return out, nil
}

func (s *fakeSwitch) DumpGroups(context.Context) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for id, body := range s.groups {
		b := make([]byte, groupDescFixed+len(body)-1)
		binary.BigEndian.PutUint16(b, uint16(len(b)))
		b[2] = body[0]
		binary.BigEndian.PutUint32(b[4:], id)
		copy(b[groupDescFixed:], body[1:])
		out = append(out, b)
	}
	return out, nil
}

func (s *fakeSwitch) flowStrings() []string {
	raw, _ := s.DumpFlows(context.Background(), 0, 0)
	m := map[string]*compiledFlow{}
	for _, b := range raw {
		c, _, err := decodeFlowStatsCompiled(b)
		if err != nil {
			panic(err)
		}
		m[c.key] = c
	}
	var out []string
	for _, f := range sortedFlows(m) {
		out = append(out, fmt.Sprintf("cookie=%s %s", f.Cookie, f))
	}
	return out
}
