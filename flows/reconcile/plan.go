package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// plan is one bundle's worth of changes: the messages, laid out back to back in one buffer, and for
// each what it does, so memory can follow once the switch has accepted the bundle (and a refused
// message can be blamed on its owner). Groups are added before the flows that use them and deleted
// after the flows that used them.
type plan struct {
	groupsFirst, flows, last segment
	stats                    SyncStats
	// rebuilds is set when the bundle clears and rebuilds the bridge.
	rebuilds bool
}

type segment struct {
	buf   []byte
	ends  []int
	items []planItem
}

// planOp is what a message does to the reconciler's picture of the switch.
type planOp uint8

const (
	opNone planOp = iota
	opInstallFlow
	opDeleteFlow
	opInstallGroup
	opDeleteGroup
	opDeleteRound
)

type planItem struct {
	op    planOp
	verb  string // for errors: described only when a message fails, as decoding costs more than sending
	flow  *flowEntry
	group *groupEntry
	round uint16
}

// owner is who is to blame should the switch refuse the item.
func (it planItem) owner() *ownerState {
	switch {
	case it.flow != nil:
		return it.flow.owner
	case it.group != nil:
		return it.group.owner
	}
	return nil
}

func (it planItem) String() string {
	switch {
	case it.flow != nil:
		return it.verb + " " + it.flow.c.Flow().String()
	case it.group != nil:
		return fmt.Sprintf("%s group %d", it.verb, it.group.c.ID)
	case it.op == opDeleteRound:
		return fmt.Sprintf("%s round %d", it.verb, it.round)
	}
	return it.verb
}

func newPlan() *plan { return &plan{} }

// flowModBound bounds the length of any flow-mod of e: the fixed part, the match (its key less table
// and priority, plus the ofp_match header and padding) and the instructions.
func flowModBound(e *flowEntry) int {
	return openflow.FlowModFixedLen + len(e.c.Key) + 8 + len(e.c.Instr)
}

// reserve sizes a plan's flow buffers for n flow-mods of about bytes bytes in all.
func (p *plan) reserve(n, bytes int) {
	p.flows.buf = slices.Grow(p.flows.buf, bytes)
	p.flows.ends = slices.Grow(p.flows.ends, n)
	p.flows.items = slices.Grow(p.flows.items, n)
}

// added records the message just appended to s.buf.
func (p *plan) added(s *segment, it planItem) {
	s.ends = append(s.ends, len(s.buf))
	s.items = append(s.items, it)
	p.stats.Messages++
}

func (p *plan) flowMod(e *flowEntry, cmd openflow.FlowModCommand, cookie, mask uint64, it planItem) {
	// Double the buffer when it is full: append alone grows a big slice by 1.25x, and a full install
	// (tens of MB) then spends more time copying and clearing the buffer than encoding the flows. Grow
	// by what this message needs at most, never by a fixed 64 KiB: a 10-flow change would allocate
	// (and clear) that much, and pay the garbage collector for it.
	if need := flowModBound(e); cap(p.flows.buf)-len(p.flows.buf) < need {
		p.flows.buf = slices.Grow(p.flows.buf, max(len(p.flows.buf), need))
	}
	p.flows.buf = openflow.AppendFlowMod(p.flows.buf, &e.c, cmd, cookie, mask)
	p.added(&p.flows, it)
}

func (p *plan) groupMod(s *segment, g *groupEntry, cmd openflow.GroupModCommand, it planItem) {
	s.buf = openflow.AppendGroupMod(s.buf, &g.c, cmd)
	p.added(s, it)
}

// attribute adds what each message of the plan does to the stats of the owner it belongs to: a flow
// or group nobody registered is named by its cookie (category/#hash), a whole-bridge message by
// pipeline/bridge.
func (p *plan) attribute(into map[Owner]SyncStats) {
	for _, it := range p.items() {
		var o Owner
		switch {
		case it.owner() != nil:
			o = it.owner().owner
		case it.flow != nil:
			c := Cookie(it.flow.c.Cookie)
			o = Owner{Category: c.Category(), Name: fmt.Sprintf("#%08x", c.OwnerHash())}
		case it.group != nil:
			o = Owner{Category: CategoryNone, Name: fmt.Sprintf("group#%d", it.group.c.ID)}
		default:
			o = Owner{Category: CategoryPipeline, Name: "bridge"}
		}
		st := into[o]
		switch {
		case it.op == opInstallFlow && it.verb == "modify":
			st.FlowModifies++
		case it.op == opInstallFlow:
			st.FlowAdds++
		case it.op == opDeleteFlow || it.op == opDeleteRound:
			st.FlowDeletes++
		case it.op == opInstallGroup && it.verb == "modify":
			st.GroupModifies++
		case it.op == opInstallGroup:
			st.GroupAdds++
		case it.op == opDeleteGroup:
			st.GroupDeletes++
		}
		st.Messages++
		into[o] = st
	}
}

// items lists every message's item in bundle order.
func (p *plan) items() []planItem {
	out := make([]planItem, 0, len(p.groupsFirst.items)+len(p.flows.items)+len(p.last.items))
	out = append(out, p.groupsFirst.items...)
	out = append(out, p.flows.items...)
	return append(out, p.last.items...)
}

// blame returns the owner of the message the switch refused, if the error names one.
func (p *plan) blame(err error) *ownerState {
	var fm FailedMessageError
	if !errors.As(err, &fm) {
		return nil
	}
	items := p.items()
	if i := fm.FailedMessage(); i >= 0 && i < len(items) {
		return items[i].owner()
	}
	return nil
}

// planFlow decides what one desired flow needs against what is installed under its key.
func (r *Reconciler) planFlow(p *plan, d *flowEntry) {
	inst := r.flows.installed[d.c.Key]
	switch {
	case inst == d: // the entry installed, kept by its owner's compile
	case inst == nil:
		p.flowMod(d, openflow.FlowAdd, d.c.Cookie, 0, planItem{op: opInstallFlow, verb: "add", flow: d})
		p.stats.FlowAdds++
	case inst.c.Cookie != d.c.Cookie:
		// A new cookie (a new round, or another owner): an add replaces the entry in place, atomically,
		// keeping its counters, so traffic never sees a gap.
		p.flowMod(d, openflow.FlowAdd, d.c.Cookie, 0, planItem{op: opInstallFlow, verb: "replace", flow: d})
		p.stats.FlowAdds++
	case !inst.c.SameBody(&d.c):
		p.flowMod(d, openflow.FlowModifyStrict, d.c.Cookie, ^uint64(0), planItem{op: opInstallFlow, verb: "modify", flow: d})
		p.stats.FlowModifies++
	case inst != d:
		r.flows.markInstalled(d.c.Key, d) // same flow on the switch; remember the desired entry to share memory
	}
}

// planFlowDelete removes an installed flow that nobody (or not its owner) wants, matching its cookie
// exactly so a flow another owner has meanwhile replaced is never touched.
func (r *Reconciler) planFlowDelete(p *plan, inst *flowEntry) {
	p.flowMod(inst, openflow.FlowDeleteStrict, inst.c.Cookie, ^uint64(0), planItem{op: opDeleteFlow, verb: "delete", flow: inst})
	p.stats.FlowDeletes++
}

func (r *Reconciler) planGroup(p *plan, d *groupEntry) {
	inst := r.groups.installed[d.c.ID]
	switch {
	case inst == nil:
		p.groupMod(&p.groupsFirst, d, openflow.GroupAdd, planItem{op: opInstallGroup, verb: "add", group: d})
		p.stats.GroupAdds++
	case inst.c.Type != d.c.Type || inst.c.Buckets != d.c.Buckets:
		p.groupMod(&p.groupsFirst, d, openflow.GroupModify, planItem{op: opInstallGroup, verb: "modify", group: d})
		p.stats.GroupModifies++
	case inst != d:
		r.groups.markInstalled(d.c.ID, d)
	}
}

func (r *Reconciler) planGroupDelete(p *plan, g *groupEntry) {
	p.groupMod(&p.last, g, openflow.GroupDelete, planItem{op: opDeleteGroup, verb: "delete", group: g})
	p.stats.GroupDeletes++
}

// planOwners plans what the given owners need: their desired entries, and the removal of what they
// have installed and no longer want (handed to another owner that wants it, else deleted).
func (r *Reconciler) planOwners(scope []*ownerState) *plan {
	p := newPlan()
	inScope := make(map[*ownerState]bool, len(scope))
	n, bytes := 0, 0
	for _, st := range scope {
		inScope[st] = true
		if len(st.flows.installed) > 0 {
			// A changed owner sends what changed, most often a flow or two of its hundreds: reserving
			// for all of them was most of a small change's garbage. flowMod grows the buffer as needed.
			continue
		}
		for _, e := range st.flows.desired {
			n, bytes = n+1, bytes+flowModBound(e)
		}
	}
	p.reserve(n, bytes) // a new owner sends every desired flow
	// Flow mods go in map order: the bundle is atomic, so their order within it does not matter, and
	// sorting every key of the owners in scope was a third of a small change's cost.
	for _, st := range scope {
		for _, id := range sortedIDs(st.groups.desired) {
			r.planGroup(p, st.groups.desired[id])
		}
		for _, d := range st.flows.desired {
			r.planFlow(p, d)
		}
	}
	for _, st := range scope {
		for k, inst := range st.flows.installed {
			if _, want := st.flows.desired[k]; want {
				continue
			}
			if other := r.flows.desired[k]; other != nil {
				// Another owner wants this entry now: hand it over, no gap (planned above when in scope).
				if !inScope[other.owner] {
					r.planFlow(p, other)
				}
			} else {
				r.planFlowDelete(p, inst)
			}
		}
		for _, id := range sortedIDs(st.groups.installed) {
			if _, want := st.groups.desired[id]; want {
				continue
			}
			if other := r.groups.desired[id]; other != nil {
				if !inScope[other.owner] {
					r.planGroup(p, other)
				}
			} else {
				r.planGroupDelete(p, st.groups.installed[id])
			}
		}
	}
	return p
}

// planAll diffs everything. With maskOldRounds, orphaned flows of earlier rounds go with one delete
// by cookie mask per round (after the adds that re-cookie the flows still wanted) instead of one
// delete each. On a pipeline-version rebuild, the bundle first clears the bridge.
func (r *Reconciler) planAll(maskOldRounds bool) *plan {
	p := newPlan()
	if r.rebuild {
		// Another pipeline version: clear the bridge and install everything in the same atomic bundle.
		// Memory forgets the old contents now; should the bundle fail, the next sync rebuilds again.
		p.groupsFirst.buf = openflow.AppendDeleteByCookie(p.groupsFirst.buf, 0, 0)
		p.added(&p.groupsFirst, planItem{verb: "delete all flows"})
		p.groupMod(&p.groupsFirst, &groupEntry{c: openflow.CompiledGroup{ID: openflow.GroupAllID}}, openflow.GroupDelete, planItem{verb: "delete all groups"})
		r.flows.forgetInstalled(r.owners)
		r.groups.forgetInstalled(r.owners)
		p.rebuilds = true
	}
	for _, id := range sortedIDs(r.groups.desired) {
		r.planGroup(p, r.groups.desired[id])
	}
	// Bundle order among flow adds does not matter (the bundle is atomic); not sorting 50,000 keys
	// saves a tenth of a full install. Size the buffers for the common large case, a first install.
	if len(r.flows.installed) == 0 && len(r.flows.desired) > 0 {
		p.reserve(len(r.flows.desired), len(r.flows.desired)*(openflow.FlowModFixedLen+96))
	}
	for _, d := range r.flows.desired {
		r.planFlow(p, d)
	}
	var stale []openflow.FlowKey
	oldRounds := map[uint16]bool{}
	for k, e := range r.flows.installed {
		if _, want := r.flows.desired[k]; want {
			continue
		}
		if round := Cookie(e.c.Cookie).Round(); maskOldRounds && e.owner == nil && round != r.cfg.Round {
			oldRounds[round] = true
			continue
		}
		stale = append(stale, k)
	}
	slices.SortFunc(stale, compareFlowKeys)
	for _, k := range stale {
		r.planFlowDelete(p, r.flows.installed[k])
	}
	rounds := make([]int, 0, len(oldRounds))
	for rd := range oldRounds {
		rounds = append(rounds, int(rd))
	}
	sort.Ints(rounds)
	for _, rd := range rounds {
		p.last.buf = openflow.AppendDeleteByCookie(p.last.buf, uint64(rd)<<cookieRoundShift, CookieRoundMask)
		p.added(&p.last, planItem{op: opDeleteRound, verb: "delete", round: uint16(rd)})
		p.stats.FlowDeletes++
	}
	for _, id := range sortedIDs(r.groups.installed) {
		if _, want := r.groups.desired[id]; !want {
			r.planGroupDelete(p, r.groups.installed[id])
		}
	}
	return p
}

// apply makes memory follow a message the switch accepted.
func (r *Reconciler) apply(it planItem) {
	switch it.op {
	case opInstallFlow:
		r.flows.markInstalled(it.flow.c.Key, it.flow)
	case opDeleteFlow:
		r.flows.markDeleted(it.flow.c.Key, it.flow)
	case opInstallGroup:
		r.groups.markInstalled(it.group.c.ID, it.group)
	case opDeleteGroup:
		r.groups.markDeleted(it.group.c.ID, it.group)
	case opDeleteRound:
		for k, e := range r.flows.installed {
			if Cookie(e.c.Cookie).Round() == it.round {
				r.flows.markDeleted(k, e)
			}
		}
	}
}

// send sends a plan as one bundle and, once the switch accepted it, makes memory follow.
func (r *Reconciler) send(ctx context.Context, p *plan) error {
	msgs := make([][]byte, 0, p.stats.Messages)
	for _, s := range []*segment{&p.groupsFirst, &p.flows, &p.last} {
		start := 0
		for _, end := range s.ends {
			msgs = append(msgs, s.buf[start:end:end])
			start = end
		}
		p.stats.Bytes += len(s.buf)
	}
	if len(msgs) > 0 {
		if err := r.sw.Bundle(ctx, msgs); err != nil {
			var fm FailedMessageError
			if items := p.items(); errors.As(err, &fm) && fm.FailedMessage() >= 0 && fm.FailedMessage() < len(items) {
				return fmt.Errorf("bundle of %d messages rejected at %q: %w", len(msgs), items[fm.FailedMessage()].String(), err)
			}
			return fmt.Errorf("bundle of %d messages: %w", len(msgs), err)
		}
	}
	r.flows.expectInstalled(len(p.flows.items))
	for _, s := range []*segment{&p.groupsFirst, &p.flows, &p.last} {
		for _, it := range s.items {
			r.apply(it)
		}
	}
	if p.rebuilds {
		r.rebuild = false
	}
	return nil
}
