package flows

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"

	"k8s.io/klog/v2"
)

// Switch is everything the Reconciler needs from a bridge. ofswitch.Session provides it over an
// OpenFlow 1.3 connection; tests may use a fake.
type Switch interface {
	// Bundle applies complete OpenFlow messages atomically: all of them or none.
	Bundle(ctx context.Context, msgs [][]byte) error
	// DumpFlows returns the raw ofp_flow_stats entries of every flow whose cookie matches cookie/mask.
	DumpFlows(ctx context.Context, cookie, mask uint64) ([][]byte, error)
	// DumpGroups returns the raw ofp_group_desc entries of every group.
	DumpGroups(ctx context.Context) ([][]byte, error)
}

// FailedMessageError is implemented by a Switch's bundle error that knows which message failed.
type FailedMessageError interface {
	error
	FailedMessage() int // index into the msgs given to Bundle, or -1
}

// ownerState is one owner's desired flows and groups, and what of it is installed.
type ownerState struct {
	owner     Owner
	cookie    Cookie
	desired   map[string]*compiledFlow
	installed map[string]*compiledFlow
	dGroups   map[uint32]*compiledGroup
	iGroups   map[uint32]*compiledGroup
}

func (o *ownerState) empty() bool {
	return len(o.desired) == 0 && len(o.installed) == 0 && len(o.dGroups) == 0 && len(o.iGroups) == 0
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Round is this run's round, carried in every cookie (see Cookie). A restarted agent uses the
	// bridge's stored round + 1.
	Round uint16
	// PipelineVersion is stamped in table 253; a bridge holding another version is rebuilt from scratch.
	PipelineVersion uint32
	// OwnerIndexPath, when set, is where the owner index is saved after syncs that changed owners.
	OwnerIndexPath string
	Logger         klog.Logger
}

// Reconciler keeps a bridge's flows and groups equal to the desired state, one owner at a time.
//
// Desired state is set per owner (SetDesired); SyncOwners diffs those owners against what is installed
// and sends one atomic bundle; SyncAll does it for every owner and also deletes what nobody owns.
// What is installed is known from the Reconciler's own successful bundles, and from the switch itself
// after LoadInstalled or ResyncFromSwitch. Diffs are keyed by table + priority + canonical match, the
// identity OpenFlow itself uses, so an owner-hash collision can never delete another owner's flow.
type Reconciler struct {
	mu     sync.Mutex
	sw     Switch
	cfg    ReconcilerConfig
	log    klog.Logger
	owners map[Owner]*ownerState
	// byIdentity finds owners from a cookie's category and owner hash (several on a collision).
	byIdentity map[uint64][]*ownerState
	// desired and installed flows of every owner, by key.
	desired   map[string]*compiledFlow
	installed map[string]*compiledFlow
	dGroups   map[uint32]*compiledGroup
	iGroups   map[uint32]*compiledGroup
	// orphans are installed flows and groups no registered owner has claimed (yet).
	orphans       map[string]*compiledFlow
	orphanGroups  map[uint32]*compiledGroup
	rebuild       bool
	index         *OwnerIndex
	indexDirty    bool
	lastSyncStats SyncStats
}

// SyncStats counts what one sync sent.
type SyncStats struct {
	FlowAdds, FlowModifies, FlowDeletes    int
	GroupAdds, GroupModifies, GroupDeletes int
	Messages                               int
	Bytes                                  int
}

// Changes is the number of flow and group mods in the sync.
func (s SyncStats) Changes() int {
	return s.FlowAdds + s.FlowModifies + s.FlowDeletes + s.GroupAdds + s.GroupModifies + s.GroupDeletes
}

func (s SyncStats) String() string {
	return fmt.Sprintf("flows +%d ~%d -%d, groups +%d ~%d -%d, %d messages, %d bytes",
		s.FlowAdds, s.FlowModifies, s.FlowDeletes, s.GroupAdds, s.GroupModifies, s.GroupDeletes, s.Messages, s.Bytes)
}

// NewReconciler makes a reconciler for one bridge.
func NewReconciler(sw Switch, cfg ReconcilerConfig) *Reconciler {
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	return &Reconciler{
		sw: sw, cfg: cfg, log: log.WithName("reconciler"),
		owners:       make(map[Owner]*ownerState),
		byIdentity:   make(map[uint64][]*ownerState),
		desired:      make(map[string]*compiledFlow),
		installed:    make(map[string]*compiledFlow),
		dGroups:      make(map[uint32]*compiledGroup),
		iGroups:      make(map[uint32]*compiledGroup),
		orphans:      make(map[string]*compiledFlow),
		orphanGroups: make(map[uint32]*compiledGroup),
		index:        NewOwnerIndex(),
	}
}

// Round is the round this reconciler stamps into cookies.
func (r *Reconciler) Round() uint16 { return r.cfg.Round }

// OwnerIndex maps cookies of this reconciler's owners back to owner keys.
func (r *Reconciler) OwnerIndex() *OwnerIndex { return r.index }

func (r *Reconciler) ownerFor(o Owner) *ownerState {
	st, ok := r.owners[o]
	if !ok {
		st = &ownerState{owner: o, cookie: MakeCookie(r.cfg.Round, o),
			desired: map[string]*compiledFlow{}, installed: map[string]*compiledFlow{},
			dGroups: map[uint32]*compiledGroup{}, iGroups: map[uint32]*compiledGroup{}}
		r.owners[o] = st
		id := st.cookie.identity()
		r.byIdentity[id] = append(r.byIdentity[id], st)
		if r.index.Add(o) {
			r.log.Info("owner hash collision: dumps name both owners; diffs stay exact", "owner", o.String(),
				"others", r.index.Name(st.cookie))
		}
		r.indexDirty = true
		r.claimOrphans(st)
	}
	return st
}

// claimOrphans hands an owner the installed flows and groups whose cookie carries its identity, when
// no other owner shares that identity.
func (r *Reconciler) claimOrphans(st *ownerState) {
	if len(r.byIdentity[st.cookie.identity()]) != 1 {
		return
	}
	for k, c := range r.orphans {
		if c.cookie.identity() == st.cookie.identity() {
			c.owner = st
			st.installed[k] = c
			delete(r.orphans, k)
		}
	}
}

func (r *Reconciler) dropOwnerIfEmpty(st *ownerState) {
	if !st.empty() {
		return
	}
	delete(r.owners, st.owner)
	id := st.cookie.identity()
	list := r.byIdentity[id]
	for i, e := range list {
		if e == st {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(r.byIdentity, id)
	} else {
		r.byIdentity[id] = list
	}
	r.index.Remove(st.owner)
	r.indexDirty = true
}

// OwnerState is one owner's desired flows and groups, for SetDesiredBatch.
type OwnerState struct {
	Flows  []Flow
	Groups []GroupEntry
}

// SetDesiredBatch is SetDesired for many owners at once, compiling on every core: what an agent does
// at start-up, when it renders its whole state. It stops at the first owner that fails and returns
// that error; owners set before it stay set.
func (r *Reconciler) SetDesiredBatch(states map[Owner]OwnerState) error {
	type job struct {
		owner  Owner
		state  OwnerState
		flows  map[string]*compiledFlow
		groups map[uint32]*compiledGroup
		err    error
	}
	jobs := make([]*job, 0, len(states))
	for o, st := range states {
		jobs = append(jobs, &job{owner: o, state: st})
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(jobs); i += workers {
				j := jobs[i]
				j.flows, j.groups, j.err = compileOwner(j.owner, r.cfg.Round, j.state.Flows, j.state.Groups)
			}
		}(w)
	}
	wg.Wait()
	for _, j := range jobs {
		if j.err != nil {
			return j.err
		}
		if err := r.setCompiled(j.owner, j.flows, j.groups); err != nil {
			return err
		}
	}
	return nil
}

// SetDesired replaces an owner's desired flows and groups. Nothing is sent until a sync. Flows get the
// owner's cookie for this round. A flow that another owner already wants (same table, priority and
// match), or two identical flows, are a rendering bug and return an error that names them; the
// owner's previous desired state then stays.
func (r *Reconciler) SetDesired(o Owner, flows []Flow, groups []GroupEntry) error {
	compiled, cgroups, err := compileOwner(o, r.cfg.Round, flows, groups)
	if err != nil {
		return err
	}
	return r.setCompiled(o, compiled, cgroups)
}

// compileOwner compiles an owner's flows with its cookie for the round, rejecting duplicates.
func compileOwner(o Owner, round uint16, flows []Flow, groups []GroupEntry) (map[string]*compiledFlow, map[uint32]*compiledGroup, error) {
	compiled := make(map[string]*compiledFlow, len(flows))
	cookie := MakeCookie(round, o)
	for _, f := range flows {
		f.Cookie = cookie
		c, err := compileFlow(f)
		if err != nil {
			return nil, nil, fmt.Errorf("owner %s: %w", o, err)
		}
		if prev, dup := compiled[c.key]; dup {
			return nil, nil, fmt.Errorf("owner %s: two flows with one table, priority and match: %s and %s", o, prev.flow(), f)
		}
		compiled[c.key] = c
	}
	cgroups := make(map[uint32]*compiledGroup, len(groups))
	for _, g := range groups {
		c, err := compileGroup(g)
		if err != nil {
			return nil, nil, fmt.Errorf("owner %s: %w", o, err)
		}
		if _, dup := cgroups[g.ID]; dup {
			return nil, nil, fmt.Errorf("owner %s: group %d given twice", o, g.ID)
		}
		cgroups[g.ID] = c
	}
	return compiled, cgroups, nil
}

func (r *Reconciler) setCompiled(o Owner, compiled map[string]*compiledFlow, cgroups map[uint32]*compiledGroup) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, c := range compiled {
		if other, ok := r.desired[k]; ok && other.owner.owner != o {
			return fmt.Errorf("owner %s wants flow %s, which owner %s already wants", o, c.flow(), other.owner.owner)
		}
	}
	for id := range cgroups {
		if other, ok := r.dGroups[id]; ok && other.owner.owner != o {
			return fmt.Errorf("owner %s wants group %d, which owner %s already wants", o, id, other.owner.owner)
		}
	}
	if len(compiled) == 0 && len(cgroups) == 0 {
		if st, ok := r.owners[o]; ok {
			r.clearDesired(st)
			r.dropOwnerIfEmpty(st)
		}
		return nil
	}
	st := r.ownerFor(o)
	r.clearDesired(st)
	for k, c := range compiled {
		c.owner = st
		r.desired[k] = c
	}
	for id, c := range cgroups {
		c.owner = st
		r.dGroups[id] = c
	}
	st.desired, st.dGroups = compiled, cgroups
	return nil
}

func (r *Reconciler) clearDesired(st *ownerState) {
	for k := range st.desired {
		delete(r.desired, k)
	}
	for id := range st.dGroups {
		delete(r.dGroups, id)
	}
	st.desired, st.dGroups = map[string]*compiledFlow{}, map[uint32]*compiledGroup{}
}

// DeleteOwner forgets an owner's desired state; its flows go at the next sync of that owner.
func (r *Reconciler) DeleteOwner(o Owner) { _ = r.SetDesired(o, nil, nil) }

// Owners lists the owners with desired or installed state.
func (r *Reconciler) Owners() []Owner {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Owner, 0, len(r.owners))
	for o := range r.owners {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// DesiredFlows returns every desired flow, sorted by table, priority (high first) and match.
func (r *Reconciler) DesiredFlows() []Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedFlows(r.desired)
}

// InstalledFlows returns what the reconciler believes is installed, in the same order.
func (r *Reconciler) InstalledFlows() []Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := make(map[string]*compiledFlow, len(r.installed))
	for k, c := range r.installed {
		all[k] = c
	}
	return sortedFlows(all)
}

func sortedFlows(m map[string]*compiledFlow) []Flow {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortKeys(keys)
	out := make([]Flow, len(keys))
	for i, k := range keys {
		out[i] = m[k].flow()
	}
	return out
}

// sortKeys orders flow keys by table, then priority high to low, then match bytes.
func sortKeys(keys []string) {
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		if a[1:3] != b[1:3] {
			return a[1:3] > b[1:3]
		}
		return a[3:] < b[3:]
	})
}

// plan is one bundle's worth of changes: the messages, laid out back to back in one buffer, and for
// each what it does, so memory can follow once the switch has accepted the bundle.
type plan struct {
	buf   []byte
	ends  []int
	items []planItem
	stats SyncStats
	// endsRebuild is set when the bundle clears and rebuilds the bridge.
	endsRebuild bool
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
	flow  *compiledFlow
	group *compiledGroup
	round uint16
}

func (it planItem) String() string {
	switch {
	case it.flow != nil:
		return it.verb + " " + it.flow.flow().String()
	case it.group != nil:
		return fmt.Sprintf("%s group %d", it.verb, it.group.id)
	case it.op == opDeleteRound:
		return fmt.Sprintf("%s round %d", it.verb, it.round)
	}
	return it.verb
}

// added records the message just appended to p.buf.
func (p *plan) added(it planItem) {
	p.ends = append(p.ends, len(p.buf))
	p.items = append(p.items, it)
	p.stats.Messages++
}

func (p *plan) flowMod(c *compiledFlow, cmd uint8, cookie, mask uint64, it planItem) {
	p.buf = appendFlowMod(p.buf, c, cmd, cookie, mask)
	p.added(it)
}

func (p *plan) groupMod(g *compiledGroup, cmd uint16, it planItem) {
	p.buf = appendGroupMod(p.buf, g, cmd)
	p.added(it)
}

// planFlow decides what one desired flow needs against what is installed under its key.
func (r *Reconciler) planFlow(p *plan, d *compiledFlow) {
	inst := r.installed[d.key]
	switch {
	case inst == nil:
		p.flowMod(d, cmdAdd, uint64(d.cookie), 0, planItem{op: opInstallFlow, verb: "add", flow: d})
		p.stats.FlowAdds++
	case inst.cookie != d.cookie:
		// A new cookie (a new round, or another owner): an add replaces the entry in place, atomically,
		// keeping its counters, so traffic never sees a gap.
		p.flowMod(d, cmdAdd, uint64(d.cookie), 0, planItem{op: opInstallFlow, verb: "replace", flow: d})
		p.stats.FlowAdds++
	case !inst.sameBody(d):
		p.flowMod(d, cmdModifyStrict, uint64(d.cookie), ^uint64(0), planItem{op: opInstallFlow, verb: "modify", flow: d})
		p.stats.FlowModifies++
	case inst != d:
		r.markInstalled(d) // same flow on the switch; remember the desired object to share memory
	}
}

// planDelete removes an installed flow that nobody (or not its owner) wants, matching its cookie
// exactly so a flow another owner has meanwhile replaced is never touched.
func (r *Reconciler) planDelete(p *plan, inst *compiledFlow) {
	p.flowMod(inst, cmdDeleteStrict, uint64(inst.cookie), ^uint64(0), planItem{op: opDeleteFlow, verb: "delete", flow: inst})
	p.stats.FlowDeletes++
}

func (r *Reconciler) markInstalled(d *compiledFlow) {
	if old := r.installed[d.key]; old != nil {
		r.forgetInstalled(old)
	}
	r.installed[d.key] = d
	d.owner.installed[d.key] = d
}

func (r *Reconciler) markDeleted(inst *compiledFlow) {
	if r.installed[inst.key] == inst {
		r.forgetInstalled(inst)
		delete(r.installed, inst.key)
	}
}

func (r *Reconciler) forgetInstalled(c *compiledFlow) {
	if c.owner != nil {
		if c.owner.installed[c.key] == c {
			delete(c.owner.installed, c.key)
		}
	} else if r.orphans[c.key] == c {
		delete(r.orphans, c.key)
	}
}

func (r *Reconciler) planGroup(p *plan, d *compiledGroup) {
	inst := r.iGroups[d.id]
	switch {
	case inst == nil:
		p.groupMod(d, groupCmdAdd, planItem{op: opInstallGroup, verb: "add", group: d})
		p.stats.GroupAdds++
	case inst.typ != d.typ || inst.buckets != d.buckets:
		p.groupMod(d, groupCmdModify, planItem{op: opInstallGroup, verb: "modify", group: d})
		p.stats.GroupModifies++
	case inst != d:
		r.markGroup(d)
	}
}

func (r *Reconciler) markGroup(d *compiledGroup) {
	if old := r.iGroups[d.id]; old != nil {
		r.forgetGroup(old)
	}
	r.iGroups[d.id] = d
	d.owner.iGroups[d.id] = d
}

func (r *Reconciler) forgetGroup(g *compiledGroup) {
	if g.owner != nil {
		if g.owner.iGroups[g.id] == g {
			delete(g.owner.iGroups, g.id)
		}
	} else if r.orphanGroups[g.id] == g {
		delete(r.orphanGroups, g.id)
	}
}

func (r *Reconciler) planGroupDelete(p *plan, g *compiledGroup) {
	p.groupMod(g, groupCmdDelete, planItem{op: opDeleteGroup, verb: "delete", group: g})
	p.stats.GroupDeletes++
}

// apply makes memory follow a message the switch accepted.
func (r *Reconciler) apply(it planItem) {
	switch it.op {
	case opInstallFlow:
		r.markInstalled(it.flow)
	case opDeleteFlow:
		r.markDeleted(it.flow)
	case opInstallGroup:
		r.markGroup(it.group)
	case opDeleteGroup:
		if r.iGroups[it.group.id] == it.group {
			r.forgetGroup(it.group)
			delete(r.iGroups, it.group.id)
		}
	case opDeleteRound:
		for k, c := range r.installed {
			if c.cookie.Round() == it.round {
				r.forgetInstalled(c)
				delete(r.installed, k)
			}
		}
	}
}

// SyncOwners brings the given owners' flows and groups on the switch in line with their desired state,
// in one atomic bundle. Owners without desired state have their installed flows removed.
func (r *Reconciler) SyncOwners(ctx context.Context, owners ...Owner) (SyncStats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rebuild {
		return r.syncAllLocked(ctx, false)
	}
	groupsFirst, flows, last := &plan{}, &plan{}, &plan{}
	seen := make(map[Owner]bool, len(owners))
	var touched []*ownerState
	for _, o := range owners {
		if seen[o] {
			continue
		}
		seen[o] = true
		st, ok := r.owners[o]
		if !ok {
			// Unknown owner: flows of a previous run may still carry its identity.
			st = r.ownerFor(o)
		}
		touched = append(touched, st)
		for _, g := range sortedGroups(st.dGroups) {
			r.planGroup(groupsFirst, g)
		}
		for _, k := range sortedKeysOf(st.desired) {
			r.planFlow(flows, st.desired[k])
		}
		for _, k := range sortedKeysOf(st.installed) {
			if _, want := st.desired[k]; want {
				continue
			}
			if other := r.desired[k]; other != nil {
				r.planFlow(flows, other) // another owner wants this entry now: hand it over, no gap
			} else {
				r.planDelete(flows, st.installed[k])
			}
		}
		for _, g := range sortedGroups(st.iGroups) {
			if _, want := st.dGroups[g.id]; !want {
				r.planGroupDelete(last, g)
			}
		}
	}
	stats, err := r.send(ctx, groupsFirst, flows, last)
	for _, st := range touched {
		r.dropOwnerIfEmpty(st)
	}
	return stats, err
}

// SyncAll brings every owner in line and deletes installed flows and groups that no owner wants.
func (r *Reconciler) SyncAll(ctx context.Context) (SyncStats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncAllLocked(ctx, false)
}

// syncAllLocked diffs everything. With maskOldRounds, orphaned flows of earlier rounds go with one
// delete by cookie mask per round (after the adds that re-cookie the flows still wanted) instead of one
// delete each.
func (r *Reconciler) syncAllLocked(ctx context.Context, maskOldRounds bool) (SyncStats, error) {
	first, flows, last := &plan{}, &plan{}, &plan{}
	if r.rebuild {
		// Another pipeline version: clear the bridge and install everything in the same atomic bundle.
		// Memory forgets the old contents now; should the bundle fail, the next sync rebuilds again.
		first.buf = appendDeleteByCookie(first.buf, 0, 0)
		first.added(planItem{verb: "delete all flows"})
		first.groupMod(&compiledGroup{id: ofpGroupAll}, groupCmdDelete, planItem{verb: "delete all groups"})
		r.installed, r.iGroups = map[string]*compiledFlow{}, map[uint32]*compiledGroup{}
		r.orphans, r.orphanGroups = map[string]*compiledFlow{}, map[uint32]*compiledGroup{}
		for _, st := range r.owners {
			st.installed, st.iGroups = map[string]*compiledFlow{}, map[uint32]*compiledGroup{}
		}
		last.endsRebuild = true
	}
	for _, id := range sortedGroupIDs(r.dGroups) {
		r.planGroup(first, r.dGroups[id])
	}
	// Bundle order among flow adds does not matter (the bundle is atomic); not sorting 50,000 keys
	// saves a tenth of a full install. Size the buffers for the common large case, a first install.
	if len(r.installed) == 0 && len(r.desired) > 0 {
		r.installed = make(map[string]*compiledFlow, len(r.desired))
		flows.buf = make([]byte, 0, len(r.desired)*(flowModFixedLen+96))
		flows.ends = make([]int, 0, len(r.desired))
		flows.items = make([]planItem, 0, len(r.desired))
	}
	for _, d := range r.desired {
		r.planFlow(flows, d)
	}
	var stale []string
	oldRounds := map[uint16]bool{}
	for k, c := range r.installed {
		if _, want := r.desired[k]; want {
			continue
		}
		if maskOldRounds && c.owner == nil && c.cookie.Round() != r.cfg.Round {
			oldRounds[c.cookie.Round()] = true
			continue
		}
		stale = append(stale, k)
	}
	sortKeys(stale)
	for _, k := range stale {
		r.planDelete(flows, r.installed[k])
	}
	rounds := make([]int, 0, len(oldRounds))
	for rd := range oldRounds {
		rounds = append(rounds, int(rd))
	}
	sort.Ints(rounds)
	for _, rd := range rounds {
		rd := uint16(rd)
		last.buf = appendDeleteByCookie(last.buf, uint64(rd)<<cookieRoundShift, CookieRoundMask)
		last.added(planItem{op: opDeleteRound, verb: "delete", round: rd})
		last.stats.FlowDeletes++
	}
	for _, id := range sortedGroupIDs(r.iGroups) {
		if _, want := r.dGroups[id]; !want {
			r.planGroupDelete(last, r.iGroups[id])
		}
	}
	stats, err := r.send(ctx, first, flows, last)
	for _, st := range r.owners {
		r.dropOwnerIfEmpty(st)
	}
	return stats, err
}

// send sends plans as one bundle, and on success makes memory follow.
func (r *Reconciler) send(ctx context.Context, plans ...*plan) (SyncStats, error) {
	var stats SyncStats
	var msgs [][]byte
	var items []planItem
	rebuilt := false
	for _, p := range plans {
		start := 0
		for _, end := range p.ends {
			msgs = append(msgs, p.buf[start:end:end])
			start = end
		}
		items = append(items, p.items...)
		rebuilt = rebuilt || p.endsRebuild
		stats.FlowAdds += p.stats.FlowAdds
		stats.FlowModifies += p.stats.FlowModifies
		stats.FlowDeletes += p.stats.FlowDeletes
		stats.GroupAdds += p.stats.GroupAdds
		stats.GroupModifies += p.stats.GroupModifies
		stats.GroupDeletes += p.stats.GroupDeletes
		stats.Messages += p.stats.Messages
		stats.Bytes += len(p.buf)
	}
	if len(msgs) > 0 {
		if err := r.sw.Bundle(ctx, msgs); err != nil {
			var fm FailedMessageError
			if errors.As(err, &fm) && fm.FailedMessage() >= 0 && fm.FailedMessage() < len(items) {
				return stats, fmt.Errorf("bundle of %d messages rejected at %q: %w", len(msgs), items[fm.FailedMessage()].String(), err)
			}
			return stats, fmt.Errorf("bundle of %d messages: %w", len(msgs), err)
		}
	}
	for _, it := range items {
		r.apply(it)
	}
	if rebuilt {
		r.rebuild = false
	}
	r.lastSyncStats = stats
	if r.indexDirty && r.cfg.OwnerIndexPath != "" {
		if err := r.index.Save(r.cfg.OwnerIndexPath); err != nil {
			r.log.Error(err, "saving owner index")
		} else {
			r.indexDirty = false
		}
	}
	return stats, nil
}

func sortedKeysOf(m map[string]*compiledFlow) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortKeys(keys)
	return keys
}

func sortedGroupIDs(m map[uint32]*compiledGroup) []uint32 {
	ids := make([]uint32, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

func sortedGroups(m map[uint32]*compiledGroup) []*compiledGroup {
	out := make([]*compiledGroup, 0, len(m))
	for _, id := range sortedGroupIDs(m) {
		out = append(out, m[id])
	}
	return out
}

// LoadInstalled replaces what the reconciler believes is installed with what the switch holds. Flows
// whose cookie carries a registered owner's identity are that owner's; the rest are orphans until an
// owner claims them or SyncAll / FinishRound deletes them. It also reads the pipeline version note and
// schedules a clean rebuild when the bridge holds flows of another version.
func (r *Reconciler) LoadInstalled(ctx context.Context) error {
	raw, err := r.sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		return fmt.Errorf("load installed flows: %w", err)
	}
	rawGroups, err := r.sw.DumpGroups(ctx)
	if err != nil {
		return fmt.Errorf("load installed groups: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()

	previous := r.installed
	r.installed = make(map[string]*compiledFlow, len(raw))
	for _, st := range r.owners {
		st.installed = map[string]*compiledFlow{}
		st.iGroups = map[uint32]*compiledGroup{}
	}
	r.orphans = make(map[string]*compiledFlow)
	version, sawVersion := uint32(0), false
	for _, b := range raw {
		c, err := r.canonicalInstalled(b, previous)
		if err != nil {
			r.log.V(2).Info("installed flow not fully decodable; kept raw so a sync can replace or delete it", "err", err)
		}
		if c == nil {
			continue
		}
		if c.cookie.Category() == CategoryLearned {
			continue // the switch's own memory (learn actions): not ours to diff or delete
		}
		if c.table() == TableVersion {
			if v, ok := versionOf(c); ok {
				version, sawVersion = v, true
			}
		}
		r.adoptInstalled(c)
	}
	r.iGroups = make(map[uint32]*compiledGroup, len(rawGroups))
	r.orphanGroups = make(map[uint32]*compiledGroup)
	for _, b := range rawGroups {
		g, err := decodeGroupDescCompiled(b)
		if g == nil {
			r.log.Error(err, "skipping undecodable group")
			continue
		}
		if d := r.dGroups[g.id]; d != nil {
			g.owner = d.owner
			d.owner.iGroups[g.id] = g
		} else {
			r.orphanGroups[g.id] = g
		}
		r.iGroups[g.id] = g
	}
	r.rebuild = len(raw) > 0 && (!sawVersion || version != r.cfg.PipelineVersion)
	if r.rebuild {
		r.log.Info("bridge holds flows of another pipeline version: the next sync rebuilds it in one bundle",
			"found", version, "foundNote", sawVersion, "want", r.cfg.PipelineVersion)
	}
	return nil
}

// canonicalInstalled turns a dumped flow into the canonical compiled form. When the switch echoed the
// exact bytes of a flow we know, reuse that object (no decoding, shared memory).
func (r *Reconciler) canonicalInstalled(b []byte, known map[string]*compiledFlow) (*compiledFlow, error) {
	if k, instr, cookie, ok := rawFlowParts(b); ok {
		if c := known[k]; c != nil && c.instr == instr && c.cookie == cookie {
			return c, nil
		}
		if c := r.desired[k]; c != nil && c.instr == instr && c.cookie == cookie {
			return c, nil
		}
	}
	c, _, err := decodeFlowStatsCompiled(b)
	return c, err
}

// rawFlowParts slices a flow-stats entry into the key and instructions it would have if the switch
// encoded it exactly as we do.
func rawFlowParts(b []byte) (key, instr string, cookie Cookie, ok bool) {
	if len(b) < flowStatsFixed+4 {
		return "", "", 0, false
	}
	n := int(b[0])<<8 | int(b[1])
	if n > len(b) || n < flowStatsFixed+4 {
		return "", "", 0, false
	}
	b = b[:n]
	m := b[flowStatsFixed:]
	mlen := int(m[2])<<8 | int(m[3])
	if mlen < 4 || matchLen(mlen-4) > len(m) {
		return "", "", 0, false
	}
	k := make([]byte, 0, 3+mlen-4)
	k = append(k, b[2], b[12], b[13])
	k = append(k, m[4:mlen]...)
	c := Cookie(uint64(b[24])<<56 | uint64(b[25])<<48 | uint64(b[26])<<40 | uint64(b[27])<<32 |
		uint64(b[28])<<24 | uint64(b[29])<<16 | uint64(b[30])<<8 | uint64(b[31]))
	return string(k), string(m[matchLen(mlen-4):]), c, true
}

func (r *Reconciler) adoptInstalled(c *compiledFlow) {
	owners := r.byIdentity[c.cookie.identity()]
	r.installed[c.key] = c
	if len(owners) == 1 {
		c.owner = owners[0]
		owners[0].installed[c.key] = c
		return
	}
	c.owner = nil
	r.orphans[c.key] = c
}

func versionOf(c *compiledFlow) (uint32, bool) {
	f := c.flow()
	if len(f.Actions) != 1 {
		return 0, false
	}
	n, ok := f.Actions[0].(Note)
	if !ok || len(n.Data) > 4 {
		return 0, false
	}
	var v uint32
	for _, b := range n.Data {
		v = v<<8 | uint32(b)
	}
	// trimNote dropped trailing zero bytes: restore the 4-byte big-endian value.
	v <<= 8 * uint(4-len(n.Data))
	return v, true
}

// FinishRound completes a restart: a full sync in which the flows of earlier rounds that no owner wants
// go by cookie mask (one delete per old round) and unclaimed groups are deleted, in one bundle. Call it
// once the agent's state has synced; until then the old round's flows keep forwarding.
func (r *Reconciler) FinishRound(ctx context.Context) (SyncStats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncAllLocked(ctx, true)
}

// ResyncFromSwitch re-reads the switch and repairs any drift (flows changed or deleted behind the
// agent's back, a restarted ovs-vswitchd) with a full sync.
func (r *Reconciler) ResyncFromSwitch(ctx context.Context) (SyncStats, error) {
	if err := r.LoadInstalled(ctx); err != nil {
		return SyncStats{}, err
	}
	return r.SyncAll(ctx)
}

// Rebuilding reports whether the next sync will clear and rebuild the bridge.
func (r *Reconciler) Rebuilding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rebuild
}
