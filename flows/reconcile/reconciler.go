package reconcile

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Switch is everything the Reconciler needs from a bridge. ofswitch.Session provides it over an
// OpenFlow 1.3 connection (ofswitch.FlowsSwitch); tests may use a fake.
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

// Config configures a Reconciler.
type Config struct {
	// Round is this run's round, carried in every cookie (see Cookie). A restarted agent uses the
	// bridge's stored round + 1.
	Round uint16
	// PipelineVersion is the version of the flows the owners render. A bridge holding another version
	// is rebuilt from scratch in one bundle instead of diffed.
	PipelineVersion uint32
	// VersionOf reads the pipeline version from an installed flow when the flow is the pipeline's
	// version note (pipeline.VersionOf). Nil: never rebuild.
	VersionOf func(openflow.Flow) (uint32, bool)
}

// OwnerState is one owner's desired flows and groups.
type OwnerState struct {
	Flows  []openflow.Flow
	Groups []openflow.GroupEntry
}

// Reconciler keeps a bridge's flows and groups equal to the desired state of its owners.
//
// Apply sets the desired state of the owners that changed and syncs exactly those owners in one atomic
// bundle, under one lock: nothing can see (or sync) a half-applied change. An owner whose new state
// does not compile, collides with another owner's flow, or is refused by the switch keeps its last
// good (installed) flows and is reported in Result.Failed; the others sync. Resync re-reads the switch
// and repairs every difference; FinishRound completes a restart.
//
// Diffs are keyed by openflow.FlowKey (table + priority + canonical match), the identity OpenFlow
// itself uses, so an owner-hash collision can never delete another owner's flow. What is installed is
// known from the Reconciler's own successful bundles and from the switch after LoadInstalled / Resync.
// It does no logging and no file I/O: callers read Result and OwnerIndex.
type Reconciler struct {
	mu     sync.Mutex
	sw     Switch
	cfg    Config
	owners map[Owner]*ownerState
	// byIdentity finds owners from a cookie's category and owner hash (several on a collision).
	byIdentity map[uint64][]*ownerState
	flows      ledger[openflow.FlowKey, openflow.CompiledFlow]
	groups     ledger[uint32, openflow.CompiledGroup]
	rebuild    bool
	index      *OwnerIndex
	// indexGen counts changes of the owner set, so callers persist the index only when it changed.
	indexGen   uint64
	collisions []Owner
	// compiled remembers each owner's last compile by flow identity (compileCache).
	compiledMu sync.Mutex
	compiled   map[Owner]compileCache
}

// flowIdentity is a rendered flow's identity: its scalars and the backing arrays of its match and
// actions. Renderers never change a flow's slices once it is built (a memoised render hands back the
// very slices of its last one), so two flows of one identity compile the same.
type flowIdentity struct {
	table                openflow.TableID
	priority, idle, hard uint16
	match                *openflow.MatchField
	nmatch               int
	actions              *openflow.Action
	nactions             int
}

func identityOf(f *openflow.Flow) (flowIdentity, bool) {
	if f.Match.Err() != nil {
		return flowIdentity{}, false
	}
	id := flowIdentity{table: f.Table, priority: f.Priority, idle: f.IdleTimeout, hard: f.HardTimeout}
	if fs := f.Match.Fields(); len(fs) > 0 {
		id.match, id.nmatch = &fs[0], len(fs)
	}
	if len(f.Actions) > 0 {
		id.actions, id.nactions = &f.Actions[0], len(f.Actions)
	}
	return id, true
}

// compileCache is an owner's last compile: a re-rendered owner whose flows mostly are its last render's
// (a policy whose peer set changed by one) compiles only its new flows, and its unchanged flows keep
// their very entries, so staging and planning them are pointer checks (the entry desired is the entry
// installed), not map writes. Each compile replaces it.
type compileCache map[flowIdentity]*flowEntry

// entry is one compiled flow or group and its owner; nil owner: installed, claimed by no registered
// owner (an orphan) until one claims it or a full sync deletes it.
type entry[T any] struct {
	c     T
	owner *ownerState
}

type (
	flowEntry  = entry[openflow.CompiledFlow]
	groupEntry = entry[openflow.CompiledGroup]
)

// book holds desired and installed entries of one kind (flows by key, groups by ID).
type book[K comparable, T any] struct {
	desired, installed map[K]*entry[T]
}

func newBook[K comparable, T any]() book[K, T] {
	return book[K, T]{desired: map[K]*entry[T]{}, installed: map[K]*entry[T]{}}
}

// ledger is the switch-wide book of one kind plus its orphans. Every owner has a book of the same
// kind; of finds it. Flows and groups share this bookkeeping, so it exists once.
type ledger[K comparable, T any] struct {
	book[K, T]
	orphans map[K]*entry[T]
	of      func(*ownerState) *book[K, T]
}

func newLedger[K comparable, T any](of func(*ownerState) *book[K, T]) ledger[K, T] {
	return ledger[K, T]{book: newBook[K, T](), orphans: map[K]*entry[T]{}, of: of}
}

// expectInstalled and expectDesired size an empty book for n entries before a first install records
// them one by one (a map of tens of thousands of entries grown step by step rehashes at every step).
func (l *ledger[K, T]) expectInstalled(n int) {
	if len(l.installed) == 0 && n > 64 {
		l.installed = make(map[K]*entry[T], n)
	}
}

func (l *ledger[K, T]) expectDesired(n int) {
	if len(l.desired) == 0 && n > 64 {
		l.desired = make(map[K]*entry[T], n)
	}
}

// markInstalled records that e is now what the switch holds under k.
func (l *ledger[K, T]) markInstalled(k K, e *entry[T]) {
	if old := l.installed[k]; old != nil && old != e {
		l.forget(k, old)
	}
	l.installed[k] = e
	if e.owner != nil {
		b := l.of(e.owner)
		if len(b.installed) == 0 {
			b.installed = make(map[K]*entry[T], len(b.desired)) // sized for what the owner wants
		}
		b.installed[k] = e
	} else {
		l.orphans[k] = e
	}
}

// markDeleted records that the switch no longer holds e under k.
func (l *ledger[K, T]) markDeleted(k K, e *entry[T]) {
	if l.installed[k] == e {
		l.forget(k, e)
		delete(l.installed, k)
	}
}

// forget drops e from its owner's (or the orphans') installed entries.
func (l *ledger[K, T]) forget(k K, e *entry[T]) {
	if e.owner != nil {
		if b := l.of(e.owner); b.installed[k] == e {
			delete(b.installed, k)
		}
	} else if l.orphans[k] == e {
		delete(l.orphans, k)
	}
}

// forgetInstalled forgets everything installed (the switch was cleared or is about to be re-read).
func (l *ledger[K, T]) forgetInstalled(owners map[Owner]*ownerState) {
	l.installed, l.orphans = map[K]*entry[T]{}, map[K]*entry[T]{}
	for _, st := range owners {
		l.of(st).installed = map[K]*entry[T]{}
	}
}

// setDesired replaces st's desired entries with want (entries already pointing at st). An entry st
// keeps (the very one: its flow did not change) stays where it is.
func (l *ledger[K, T]) setDesired(st *ownerState, want map[K]*entry[T]) {
	b := l.of(st)
	l.release(st, want)
	for k, e := range want {
		if l.desired[k] != e {
			l.desired[k] = e
		}
	}
	b.desired = want
}

// release gives up st's desired entries but those it keeps in keep (the very entries), so other
// owners may claim them; st's book still lists them until setDesired replaces it.
func (l *ledger[K, T]) release(st *ownerState, keep map[K]*entry[T]) {
	for k, old := range l.of(st).desired {
		if keep[k] == old {
			continue
		}
		if e := l.desired[k]; e != nil && e.owner == st {
			delete(l.desired, k)
		}
	}
}

// claimed returns the owner (not st) that desires k, if any.
func (l *ledger[K, T]) claimed(k K, st *ownerState) *ownerState {
	if e := l.desired[k]; e != nil && e.owner != st {
		return e.owner
	}
	return nil
}

// ownerState is one owner's books.
type ownerState struct {
	owner  Owner
	cookie Cookie
	flows  book[openflow.FlowKey, openflow.CompiledFlow]
	groups book[uint32, openflow.CompiledGroup]
}

func (o *ownerState) empty() bool {
	return len(o.flows.desired) == 0 && len(o.flows.installed) == 0 && len(o.groups.desired) == 0 && len(o.groups.installed) == 0
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

func (s *SyncStats) add(o SyncStats) {
	s.FlowAdds += o.FlowAdds
	s.FlowModifies += o.FlowModifies
	s.FlowDeletes += o.FlowDeletes
	s.GroupAdds += o.GroupAdds
	s.GroupModifies += o.GroupModifies
	s.GroupDeletes += o.GroupDeletes
	s.Messages += o.Messages
	s.Bytes += o.Bytes
}

func (s SyncStats) String() string {
	return fmt.Sprintf("flows +%d ~%d -%d, groups +%d ~%d -%d, %d messages, %d bytes",
		s.FlowAdds, s.FlowModifies, s.FlowDeletes, s.GroupAdds, s.GroupModifies, s.GroupDeletes, s.Messages, s.Bytes)
}

// Result is what an Apply, Resync or FinishRound did.
type Result struct {
	// Stats counts what the switch accepted (the bundles of refused attempts are not counted).
	Stats SyncStats
	// Failed names the owners whose new state was not installed, and why: it did not compile, it wants
	// a flow or group another owner has, or the switch refused it. Each keeps its last good flows.
	Failed map[Owner]error
	// Collisions lists new owners whose cookie hash equals another owner's: dumps name both, diffs stay exact.
	Collisions []Owner
	// Rebuilt says the bridge was cleared and rebuilt (another pipeline version was found on it).
	Rebuilt bool
	// Repaired (Resync only) says what the resync sent, by owner: the owners whose flows or groups had
	// drifted. Entries no registered owner claims are named by their cookie (category/#hash).
	Repaired map[Owner]SyncStats
}

// New makes a reconciler for one bridge.
func New(sw Switch, cfg Config) *Reconciler {
	return &Reconciler{
		sw: sw, cfg: cfg,
		owners:     make(map[Owner]*ownerState),
		byIdentity: make(map[uint64][]*ownerState),
		flows:      newLedger(func(o *ownerState) *book[openflow.FlowKey, openflow.CompiledFlow] { return &o.flows }),
		groups:     newLedger(func(o *ownerState) *book[uint32, openflow.CompiledGroup] { return &o.groups }),
		index:      NewOwnerIndex(),
	}
}

// Round is the round this reconciler stamps into cookies.
func (r *Reconciler) Round() uint16 { return r.cfg.Round }

// OwnerIndex maps cookies of this reconciler's owners back to owner keys. IndexGeneration changes
// whenever the set of owners does.
func (r *Reconciler) OwnerIndex() *OwnerIndex { return r.index }

// IndexGeneration counts changes of the owner set (and so of the OwnerIndex).
func (r *Reconciler) IndexGeneration() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.indexGen
}

func (r *Reconciler) ownerFor(o Owner) *ownerState {
	st, ok := r.owners[o]
	if ok {
		return st
	}
	st = &ownerState{owner: o, cookie: MakeCookie(r.cfg.Round, o),
		flows: newBook[openflow.FlowKey, openflow.CompiledFlow](), groups: newBook[uint32, openflow.CompiledGroup]()}
	r.owners[o] = st
	id := st.cookie.identity()
	r.byIdentity[id] = append(r.byIdentity[id], st)
	if r.index.Add(o) {
		r.collisions = append(r.collisions, o)
	}
	r.indexGen++
	r.claimOrphans(st)
	return st
}

// claimOrphans hands an owner the installed flows whose cookie carries its identity, when no other
// owner shares that identity, and the installed groups its desired state names.
func (r *Reconciler) claimOrphans(st *ownerState) {
	if len(r.byIdentity[st.cookie.identity()]) != 1 {
		return
	}
	for k, e := range r.flows.orphans {
		if Cookie(e.c.Cookie).identity() == st.cookie.identity() {
			e.owner = st
			st.flows.installed[k] = e
			delete(r.flows.orphans, k)
		}
	}
}

func (r *Reconciler) dropOwnerIfEmpty(st *ownerState) {
	if !st.empty() || r.owners[st.owner] != st {
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
	r.indexGen++
}

// compiled is one owner's state in wire form, ready to become its desired entries.
type compiled struct {
	flows  map[openflow.FlowKey]*flowEntry
	groups map[uint32]*groupEntry
	err    error
}

// compileAll compiles every changed owner, on every core when there are many (an agent's first sync
// renders its whole state). A nil state compiles to nothing: the owner is deleted.
func (r *Reconciler) compileAll(changes map[Owner]*OwnerState) map[Owner]*compiled {
	out := make(map[Owner]*compiled, len(changes))
	owners := make([]Owner, 0, len(changes))
	for o := range changes {
		owners = append(owners, o)
		out[o] = &compiled{}
	}
	workers := 1
	if len(owners) >= 64 {
		workers = runtime.GOMAXPROCS(0)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(owners); i += workers {
				o := owners[i]
				c := out[o]
				if st := changes[o]; st != nil {
					r.compiledMu.Lock()
					prev := r.compiled[o]
					delete(r.compiled, o) // compileOwner updates it in place: no other compile may read it meanwhile
					r.compiledMu.Unlock()
					var next compileCache
					c.flows, c.groups, next, c.err = compileOwner(o, r.cfg.Round, st.Flows, st.Groups, prev)
					r.compiledMu.Lock()
					if r.compiled == nil {
						r.compiled = map[Owner]compileCache{}
					}
					r.compiled[o] = next
					r.compiledMu.Unlock()
				} else {
					r.compiledMu.Lock()
					delete(r.compiled, o)
					r.compiledMu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	return out
}

// compileOwner compiles an owner's flows with its cookie for the round, rejecting duplicates; a flow of
// the same identity as one of cache (the owner's last compile) is not compiled again. It returns the
// cache for the next compile: cache itself, updated in place (a new map of a policy's 150 identities
// for every re-render was a third of a small change's garbage), or nil after an error.
func compileOwner(o Owner, round uint16, flows []openflow.Flow, groups []openflow.GroupEntry, cache compileCache) (map[openflow.FlowKey]*flowEntry,
	map[uint32]*groupEntry, compileCache, error) {
	out := make(map[openflow.FlowKey]*flowEntry, len(flows))
	var entries []flowEntry
	if len(cache) == 0 {
		entries = make([]flowEntry, len(flows)) // one allocation for a new owner's entries, not one each
	}
	next := cache
	if next == nil {
		next = make(compileCache, len(flows))
	}
	cookie := uint64(MakeCookie(round, o))
	for i := range flows {
		f := &flows[i]
		id, cacheable := identityOf(f)
		var e *flowEntry
		if cacheable {
			e = cache[id]
		}
		if e == nil {
			g := *f
			g.Cookie = cookie
			c, err := openflow.Compile(g)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("owner %s: %w", o, err)
			}
			if entries != nil {
				e = &entries[i]
				e.c = c
			} else {
				e = &flowEntry{c: c} // one of the few new flows of a re-rendered owner
			}
		}
		if cacheable && e != next[id] {
			next[id] = e
		}
		if prev, dup := out[e.c.Key]; dup {
			return nil, nil, nil, fmt.Errorf("owner %s: two flows with one table, priority and match: %s and %s", o, prev.c.Flow(), f)
		}
		out[e.c.Key] = e
	}
	if len(next) > len(out) { // identities of the last compile this one does not have: forget them
		for id, e := range next {
			if out[e.c.Key] != e {
				delete(next, id)
			}
		}
	}
	gout := make(map[uint32]*groupEntry, len(groups))
	for _, g := range groups {
		c, err := openflow.CompileGroup(g)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("owner %s: %w", o, err)
		}
		if _, dup := gout[g.ID]; dup {
			return nil, nil, nil, fmt.Errorf("owner %s: group %d given twice", o, g.ID)
		}
		gout[g.ID] = &groupEntry{c: c}
	}
	return out, gout, next, nil
}

// Apply makes the given owners' desired state the new one and syncs exactly those owners in one
// atomic bundle (a nil state deletes the owner). All of it happens under one lock, so no other sync
// sees the owners half-changed. Owners that fail keep their last good flows and are listed in
// Result.Failed; when the switch refuses the bundle, the owner of the refused message is set back and
// the rest is sent again. The error is for a sync that failed as a whole (the switch unreachable, a
// refusal no owner can be blamed for): the new desired state stays set, and a later Apply or Resync
// installs it.
func (r *Reconciler) Apply(ctx context.Context, changes map[Owner]*OwnerState) (Result, error) {
	comp := r.compileAll(changes)
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Failed: map[Owner]error{}}
	scope := r.stage(comp, res.Failed)
	err := r.syncLocked(ctx, scope, false, &res)
	for _, st := range scope {
		r.dropOwnerIfEmpty(st)
	}
	res.Collisions, r.collisions = r.collisions, nil
	return res, err
}

// stage gives the changed owners their new desired entries, in owner order. An owner whose state did
// not compile, or that wants a flow or group another owner already wants, fails and falls back to
// what it has installed. It returns the owners to sync.
func (r *Reconciler) stage(comp map[Owner]*compiled, failed map[Owner]error) []*ownerState {
	owners := make([]Owner, 0, len(comp))
	for o := range comp {
		owners = append(owners, o)
	}
	slices.SortFunc(owners, compareOwners)
	scope := make([]*ownerState, 0, len(owners))
	// Release what every changed owner no longer wants first: a flow may move between owners in one
	// change (a deleted pod's IP given to a new pod), and each owner may only claim what no other owner
	// wants. What an owner keeps, the very entry of its last compile, stays its own: releasing and
	// claiming back every unchanged flow of a re-rendered policy was most of a small change's cost.
	for _, o := range owners {
		c := comp[o]
		if c.err == nil && len(c.flows) == 0 && len(c.groups) == 0 {
			if _, known := r.owners[o]; !known {
				continue // deleting an owner nobody has: nothing to do
			}
		}
		st := r.ownerFor(o)
		r.flows.release(st, c.flows) // a nil map keeps nothing: a failed compile releases everything
		r.groups.setDesired(st, nil)
		scope = append(scope, st)
	}
	if len(r.flows.desired) == 0 {
		n := 0
		for _, c := range comp {
			n += len(c.flows)
		}
		r.flows.expectDesired(n)
	}
	var fallbacks []*ownerState
	for _, st := range scope {
		c := comp[st.owner]
		if c.err == nil {
			c.err = r.conflict(st, c)
		}
		if c.err != nil {
			failed[st.owner] = c.err
			fallbacks = append(fallbacks, st)
			continue
		}
		for _, e := range c.flows {
			e.owner = st
		}
		for _, e := range c.groups {
			e.owner = st
		}
		r.flows.setDesired(st, c.flows)
		r.groups.setDesired(st, c.groups)
	}
	for _, st := range fallbacks {
		r.fallBack(st)
	}
	return scope
}

// conflict reports a flow or group of c that another owner already wants.
func (r *Reconciler) conflict(st *ownerState, c *compiled) error {
	for k, e := range c.flows {
		if other := r.flows.claimed(k, st); other != nil {
			return fmt.Errorf("owner %s wants flow %s, which owner %s already wants", st.owner, e.c.Flow(), other.owner)
		}
	}
	for id := range c.groups {
		if other := r.groups.claimed(id, st); other != nil {
			return fmt.Errorf("owner %s wants group %d, which owner %s already wants", st.owner, id, other.owner)
		}
	}
	return nil
}

// fallBack sets a failed owner's desired state to what it has installed — its last good flows —
// re-stamped with this round's cookie (so finishing the round keeps them), less any flow or group
// another owner now wants.
func (r *Reconciler) fallBack(st *ownerState) {
	flows := make(map[openflow.FlowKey]*flowEntry, len(st.flows.installed))
	for k, e := range st.flows.installed {
		if r.flows.claimed(k, st) != nil {
			continue
		}
		c := e.c
		c.Cookie = uint64(st.cookie)
		flows[k] = &flowEntry{c: c, owner: st}
	}
	groups := make(map[uint32]*groupEntry, len(st.groups.installed))
	for id, e := range st.groups.installed {
		if r.groups.claimed(id, st) == nil {
			groups[id] = &groupEntry{c: e.c, owner: st}
		}
	}
	r.flows.setDesired(st, flows)
	r.groups.setDesired(st, groups)
}

// syncLocked sends what scope (nil with all: every owner) needs, in one bundle. When the switch refuses
// a message whose owner can be blamed, that owner falls back to its installed state and the bundle is
// planned and sent again without its change.
func (r *Reconciler) syncLocked(ctx context.Context, scope []*ownerState, maskOldRounds bool, res *Result) error {
	all := scope == nil || r.rebuild
	for {
		var p *plan
		if all {
			p = r.planAll(maskOldRounds)
		} else {
			p = r.planOwners(scope)
		}
		err := r.send(ctx, p)
		if err == nil {
			res.Stats.add(p.stats)
			if res.Repaired != nil {
				p.attribute(res.Repaired)
			}
			if p.rebuilds {
				res.Rebuilt = true
			}
			return nil
		}
		st := p.blame(err)
		if st == nil || res.Failed[st.owner] != nil {
			return err
		}
		res.Failed[st.owner] = err
		// Every failed owner falls back again: one that gave up a flow to st's change takes it back.
		for o := range res.Failed {
			if fst := r.owners[o]; fst != nil {
				r.fallBack(fst)
			}
		}
	}
}

// Resync re-reads the switch and repairs every difference from the desired state (flows changed or
// deleted behind the agent's back, a restarted ovs-vswitchd), under the same lock as Apply.
func (r *Reconciler) Resync(ctx context.Context) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Failed: map[Owner]error{}, Repaired: map[Owner]SyncStats{}}
	if _, err := r.loadLocked(ctx); err != nil {
		return res, err
	}
	err := r.syncLocked(ctx, nil, false, &res)
	r.dropEmptyOwners()
	return res, err
}

// FinishRound completes a restart: a full sync in which the flows of earlier rounds that no owner wants
// go by cookie mask (one delete per old round) and unclaimed groups are deleted, in one bundle. Call it
// once the agent's state has been applied; until then the old round's flows keep forwarding.
func (r *Reconciler) FinishRound(ctx context.Context) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Failed: map[Owner]error{}}
	err := r.syncLocked(ctx, nil, true, &res)
	r.dropEmptyOwners()
	return res, err
}

func (r *Reconciler) dropEmptyOwners() {
	for _, st := range r.owners {
		r.dropOwnerIfEmpty(st)
	}
}

// LoadReport says what LoadInstalled found on the switch.
type LoadReport struct {
	Flows, Groups int
	// Undecodable entries are kept raw, so a sync can still replace or delete them.
	Undecodable int
	// Rebuild is set when the bridge holds flows of another pipeline version (or none stamped): the
	// next sync clears and rebuilds it in one bundle.
	Rebuild      bool
	FoundVersion uint32
	SawVersion   bool
}

// LoadInstalled replaces what the reconciler believes is installed with what the switch holds. Flows
// whose cookie carries a registered owner's identity are that owner's; the rest are orphans until an
// owner claims them or a full sync deletes them. Learned flows (CategoryLearned) are the switch's own
// and ignored.
func (r *Reconciler) LoadInstalled(ctx context.Context) (LoadReport, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked(ctx)
}

func (r *Reconciler) loadLocked(ctx context.Context) (LoadReport, error) {
	var rep LoadReport
	raw, err := r.sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		return rep, fmt.Errorf("load installed flows: %w", err)
	}
	rawGroups, err := r.sw.DumpGroups(ctx)
	if err != nil {
		return rep, fmt.Errorf("load installed groups: %w", err)
	}
	previous := r.flows.installed
	r.flows.forgetInstalled(r.owners)
	r.flows.installed = make(map[openflow.FlowKey]*flowEntry, len(raw))
	for _, b := range raw {
		e, err := r.canonicalInstalled(b, previous)
		if err != nil {
			rep.Undecodable++
		}
		if e == nil {
			continue
		}
		if Cookie(e.c.Cookie).Category() == CategoryLearned {
			continue
		}
		rep.Flows++
		if r.cfg.VersionOf != nil {
			if v, ok := r.cfg.VersionOf(e.c.Flow()); ok {
				rep.FoundVersion, rep.SawVersion = v, true
			}
		}
		r.adoptInstalled(e)
	}
	r.groups.forgetInstalled(r.owners)
	r.groups.installed = make(map[uint32]*groupEntry, len(rawGroups))
	for _, b := range rawGroups {
		c, err := openflow.DecodeGroupDescCompiled(b)
		if err != nil {
			rep.Undecodable++
			if c.Buckets == "" && c.ID == 0 {
				continue
			}
		}
		rep.Groups++
		e := &groupEntry{c: c}
		if d := r.groups.desired[c.ID]; d != nil {
			e.owner = d.owner
		}
		r.groups.markInstalled(c.ID, e)
	}
	r.rebuild = r.cfg.VersionOf != nil && len(raw) > 0 && (!rep.SawVersion || rep.FoundVersion != r.cfg.PipelineVersion)
	rep.Rebuild = r.rebuild
	return rep, nil
}

// canonicalInstalled turns a dumped flow into the canonical compiled form. When the switch echoed the
// exact bytes of a flow we know, reuse that entry (no decoding, shared memory).
func (r *Reconciler) canonicalInstalled(b []byte, known map[openflow.FlowKey]*flowEntry) (*flowEntry, error) {
	if c, ok := openflow.RawFlowStats(b); ok {
		for _, e := range []*flowEntry{known[c.Key], r.flows.desired[c.Key]} {
			if e != nil && e.c.Instr == c.Instr && e.c.Cookie == c.Cookie && e.c.Idle == c.Idle && e.c.Hard == c.Hard {
				return e, nil
			}
		}
	}
	c, _, err := openflow.DecodeFlowStatsCompiled(b)
	if c.Key == "" {
		return nil, err
	}
	return &flowEntry{c: c}, err
}

func (r *Reconciler) adoptInstalled(e *flowEntry) {
	owners := r.byIdentity[Cookie(e.c.Cookie).identity()]
	e.owner = nil
	if len(owners) == 1 {
		e.owner = owners[0]
	}
	r.flows.markInstalled(e.c.Key, e)
}

// Rebuilding reports whether the next sync will clear and rebuild the bridge.
func (r *Reconciler) Rebuilding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rebuild
}

// Owners lists the owners with desired or installed state.
func (r *Reconciler) Owners() []Owner {
	r.mu.Lock()
	defer r.mu.Unlock()
	return SortedOwnerKeys(r.owners)
}

// DesiredFlows returns every desired flow, sorted by table, priority (high first) and match.
func (r *Reconciler) DesiredFlows() []openflow.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedFlows(r.flows.desired)
}

// InstalledFlows returns what the reconciler believes is installed, in the same order.
func (r *Reconciler) InstalledFlows() []openflow.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedFlows(r.flows.installed)
}

// DesiredGroups returns every desired group, by ID.
func (r *Reconciler) DesiredGroups() []openflow.GroupEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]openflow.GroupEntry, 0, len(r.groups.desired))
	for _, id := range sortedIDs(r.groups.desired) {
		e := r.groups.desired[id]
		g, err := e.c.Group()
		if err != nil {
			continue
		}
		out = append(out, g)
	}
	return out
}

func sortedFlows(m map[openflow.FlowKey]*flowEntry) []openflow.Flow {
	keys := sortedKeys(m)
	out := make([]openflow.Flow, len(keys))
	for i, k := range keys {
		out[i] = m[k].c.Flow()
	}
	return out
}

func sortedKeys(m map[openflow.FlowKey]*flowEntry) []openflow.FlowKey {
	keys := make([]openflow.FlowKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareFlowKeys)
	return keys
}

// compareFlowKeys is FlowKey.Less as a comparison.
func compareFlowKeys(a, b openflow.FlowKey) int {
	switch {
	case a.Less(b):
		return -1
	case b.Less(a):
		return 1
	}
	return 0
}

func sortedIDs(m map[uint32]*groupEntry) []uint32 {
	ids := make([]uint32, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
