// Package fakeswitch is a small in-memory OpenFlow 1.3 flow table for fast tests of reconciliation
// logic: it applies flow-mods and group-mods with OpenFlow's strict/non-strict and cookie-filter
// semantics, atomically per bundle, refuses a flow that outputs to a missing group as OVS does, and
// dumps flow-stats and group-desc entries in the wire format. Real-OVS tests are the truth; this only
// lets pure logic be tested in milliseconds. All wire parsing is flows/openflow's.
package fakeswitch

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Switch is the fake. Its zero value is not ready: use New.
type Switch struct {
	mu     sync.Mutex
	flows  map[openflow.FlowKey]openflow.CompiledFlow
	groups map[uint32]openflow.CompiledGroup
	// Bundles and Msgs count what was applied.
	Bundles, Msgs int
	// FailAt, when > 0, makes the bundle message with this 1-based index fail (once per bundle).
	FailAt int
	// Refuse, when set, is asked about every flow-mod add; a non-nil error refuses the bundle at that
	// message, naming its index (as OVS names the failed message of a bundle).
	Refuse func(openflow.Flow) error
}

// New returns an empty switch.
func New() *Switch {
	return &Switch{flows: map[openflow.FlowKey]openflow.CompiledFlow{}, groups: map[uint32]openflow.CompiledGroup{}}
}

// MessageError is the fake's bundle refusal: it names the failed message like ofswitch.BundleError.
type MessageError struct {
	Index int
	Err   error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("fake switch rejected message %d: %v", e.Index, e.Err)
}
func (e *MessageError) FailedMessage() int { return e.Index }
func (e *MessageError) Unwrap() error      { return e.Err }

// Bundle applies msgs atomically: all of them or, on the first refusal, none.
func (s *Switch) Bundle(_ context.Context, msgs [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	flows := make(map[openflow.FlowKey]openflow.CompiledFlow, len(s.flows))
	for k, v := range s.flows {
		flows[k] = v
	}
	groups := make(map[uint32]openflow.CompiledGroup, len(s.groups))
	for k, v := range s.groups {
		groups[k] = v
	}
	for i, m := range msgs {
		if s.FailAt == i+1 {
			return &MessageError{Index: i, Err: fmt.Errorf("injected failure")}
		}
		if err := s.apply(flows, groups, m); err != nil {
			return &MessageError{Index: i, Err: err}
		}
	}
	s.flows, s.groups = flows, groups
	s.Bundles++
	s.Msgs += len(msgs)
	return nil
}

func (s *Switch) apply(flows map[openflow.FlowKey]openflow.CompiledFlow, groups map[uint32]openflow.CompiledGroup, m []byte) error {
	if len(m) < openflow.HeaderLen {
		return fmt.Errorf("fake: %d-byte message", len(m))
	}
	switch m[1] {
	case openflow.TypeFlowMod:
		fm, err := openflow.ParseFlowMod(m)
		if err != nil {
			return err
		}
		k := fm.Flow.Key
		switch fm.Command {
		case openflow.FlowAdd:
			if err := s.check(&fm.Flow, groups); err != nil {
				return err
			}
			flows[k] = fm.Flow
		case openflow.FlowModifyStrict:
			if old, ok := flows[k]; ok && old.Cookie&fm.CookieMask == fm.Cookie&fm.CookieMask {
				old.Instr = fm.Flow.Instr
				flows[k] = old
			}
		case openflow.FlowDeleteStrict:
			if old, ok := flows[k]; ok && old.Cookie&fm.CookieMask == fm.Cookie&fm.CookieMask {
				delete(flows, k)
			}
		case openflow.FlowDelete:
			if k.Table() != openflow.AllTables || k != openflow.AllTablesKey() {
				return fmt.Errorf("fake: non-strict delete only for all tables and an empty match")
			}
			for fk, f := range flows {
				if f.Cookie&fm.CookieMask == fm.Cookie&fm.CookieMask {
					delete(flows, fk)
				}
			}
		default:
			return fmt.Errorf("fake: flow-mod command %d", fm.Command)
		}
	case openflow.TypeGroupMod:
		gm, err := openflow.ParseGroupMod(m)
		if err != nil {
			return err
		}
		id := gm.Group.ID
		switch gm.Command {
		case openflow.GroupAdd:
			if _, ok := groups[id]; ok {
				return fmt.Errorf("fake: OFPGMFC_GROUP_EXISTS: group %d", id)
			}
			groups[id] = gm.Group
		case openflow.GroupModify:
			if _, ok := groups[id]; !ok {
				return fmt.Errorf("fake: OFPGMFC_UNKNOWN_GROUP: group %d", id)
			}
			groups[id] = gm.Group
		case openflow.GroupDelete:
			if id == openflow.GroupAllID {
				clear(groups)
			} else {
				delete(groups, id)
			}
		}
	default:
		return fmt.Errorf("fake: message type %d", m[1])
	}
	return nil
}

// check refuses what OVS would: a flow that outputs to a missing group (OFPBAC_BAD_OUT_GROUP), and
// whatever Refuse says.
func (s *Switch) check(c *openflow.CompiledFlow, groups map[uint32]openflow.CompiledGroup) error {
	acts, err := c.Actions()
	if err != nil {
		return err
	}
	for _, a := range acts {
		if g, ok := a.(openflow.ToGroup); ok {
			if _, exists := groups[g.ID]; !exists {
				return fmt.Errorf("fake: OFPBAC_BAD_OUT_GROUP: group %d", g.ID)
			}
		}
	}
	if s.Refuse != nil {
		return s.Refuse(c.Flow())
	}
	return nil
}

// DumpFlows returns the flow-stats entries of the flows whose cookie matches cookie/mask.
func (s *Switch) DumpFlows(_ context.Context, cookie, mask uint64) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for _, f := range s.flows {
		if f.Cookie&mask == cookie&mask {
			out = append(out, openflow.EncodeFlowStatsCompiled(&f, openflow.FlowCounters{}))
		}
	}
	return out, nil
}

// DumpGroups returns every group's group-desc entry.
func (s *Switch) DumpGroups(context.Context) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for _, g := range s.groups {
		out = append(out, openflow.EncodeGroupDescCompiled(&g))
	}
	return out, nil
}

// FlowStrings lists the flows as "cookie=0x.. <flow>", sorted as dumps sort them.
func (s *Switch) FlowStrings() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]openflow.FlowKey, 0, len(s.flows))
	for k := range s.flows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	out := make([]string, len(keys))
	for i, k := range keys {
		f := s.flows[k]
		out[i] = fmt.Sprintf("cookie=%#x %s", f.Cookie, f.Flow())
	}
	return out
}

// NumFlows and NumGroups count what the switch holds.
func (s *Switch) NumFlows() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.flows)
}

func (s *Switch) NumGroups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.groups)
}

// Tamper changes the switch behind its controller's back (drift-repair tests): f gets the flows and
// groups to edit in place.
func (s *Switch) Tamper(f func(flows map[openflow.FlowKey]openflow.CompiledFlow, groups map[uint32]openflow.CompiledGroup)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.flows, s.groups)
}
