package reconcile

import (
	"context"
	"fmt"
	"sort"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Drift states: how an entry on the switch differs from the desired state.
const (
	DriftMissing    = "missing"    // desired, not on the switch
	DriftUnexpected = "unexpected" // on the switch, desired by nobody
	DriftDifferent  = "different"  // on the switch with other actions, timeouts or cookie
)

// DriftEntry is one flow or group that differs between the desired state and the switch.
type DriftEntry struct {
	// Owner is the desired entry's owner; for an unexpected entry, the owner its cookie names (a
	// registered owner, else category/#hash).
	Owner Owner
	Kind  string // "flow" or "group"
	State string // DriftMissing, DriftUnexpected or DriftDifferent
	// Desired and Installed print the entry as wanted and as the switch holds it (ovs-ofctl syntax);
	// each is empty where there is none.
	Desired, Installed string
	// Why says what differs for DriftDifferent: actions, timeouts, cookie (another round or owner).
	Why string
}

// DriftReport is a comparison of the switch with the desired state: what a Resync would repair.
type DriftReport struct {
	Round           uint16
	DesiredFlows    int
	DesiredGroups   int
	InstalledFlows  int // learned flows (the switch's own) not counted
	InstalledGroups int
	Entries         []DriftEntry // by owner, then kind, state and entry
}

// Drift reads the switch and compares it with the desired state without changing anything: the
// entries a Resync would add, modify or delete. It holds the reconciler's lock while it reads, so no
// Apply interleaves and the report is one consistent picture.
func (r *Reconciler) Drift(ctx context.Context) (DriftReport, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := DriftReport{Round: r.cfg.Round, DesiredFlows: len(r.flows.desired), DesiredGroups: len(r.groups.desired)}
	raw, err := r.sw.DumpFlows(ctx, 0, 0)
	if err != nil {
		return rep, fmt.Errorf("drift: dump flows: %w", err)
	}
	rawGroups, err := r.sw.DumpGroups(ctx)
	if err != nil {
		return rep, fmt.Errorf("drift: dump groups: %w", err)
	}
	seen := make(map[openflow.FlowKey]bool, len(raw))
	for _, b := range raw {
		c, _, err := openflow.DecodeFlowStatsCompiled(b)
		if c.Key == "" {
			return rep, fmt.Errorf("drift: a dumped flow does not decode: %w", err)
		}
		if Cookie(c.Cookie).Category() == CategoryLearned {
			continue
		}
		rep.InstalledFlows++
		seen[c.Key] = true
		d := r.flows.desired[c.Key]
		inst := c.Flow().String()
		switch {
		case d == nil:
			rep.Entries = append(rep.Entries, DriftEntry{Owner: r.cookieOwner(Cookie(c.Cookie)), Kind: "flow", State: DriftUnexpected, Installed: inst})
		case d.c.Instr != c.Instr || err != nil:
			rep.Entries = append(rep.Entries, r.different(d, inst, "actions"))
		case d.c.Idle != c.Idle || d.c.Hard != c.Hard:
			rep.Entries = append(rep.Entries, r.different(d, inst, "timeouts"))
		case d.c.Cookie != c.Cookie:
			rep.Entries = append(rep.Entries, r.different(d, inst, fmt.Sprintf("cookie %s, want %s", Cookie(c.Cookie), Cookie(d.c.Cookie))))
		}
	}
	for k, d := range r.flows.desired {
		if !seen[k] {
			rep.Entries = append(rep.Entries, DriftEntry{Owner: d.owner.owner, Kind: "flow", State: DriftMissing, Desired: d.c.Flow().String()})
		}
	}
	seenGroups := make(map[uint32]bool, len(rawGroups))
	for _, b := range rawGroups {
		c, err := openflow.DecodeGroupDescCompiled(b)
		if err != nil && c.ID == 0 && c.Buckets == "" {
			return rep, fmt.Errorf("drift: a dumped group does not decode: %w", err)
		}
		rep.InstalledGroups++
		seenGroups[c.ID] = true
		d := r.groups.desired[c.ID]
		inst := groupString(c)
		switch {
		case d == nil:
			rep.Entries = append(rep.Entries, DriftEntry{Owner: Owner{Category: CategoryNone, Name: fmt.Sprintf("group#%d", c.ID)},
				Kind: "group", State: DriftUnexpected, Installed: inst})
		case d.c.Type != c.Type || d.c.Buckets != c.Buckets:
			rep.Entries = append(rep.Entries, DriftEntry{Owner: d.owner.owner, Kind: "group", State: DriftDifferent,
				Desired: groupString(d.c), Installed: inst, Why: "buckets"})
		}
	}
	for id, d := range r.groups.desired {
		if !seenGroups[id] {
			rep.Entries = append(rep.Entries, DriftEntry{Owner: d.owner.owner, Kind: "group", State: DriftMissing, Desired: groupString(d.c)})
		}
	}
	sort.Slice(rep.Entries, func(i, j int) bool {
		a, b := rep.Entries[i], rep.Entries[j]
		if a.Owner != b.Owner {
			return a.Owner.String() < b.Owner.String()
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.State != b.State {
			return a.State < b.State
		}
		return a.Desired+a.Installed < b.Desired+b.Installed
	})
	return rep, nil
}

func (r *Reconciler) different(d *flowEntry, installed, why string) DriftEntry {
	return DriftEntry{Owner: d.owner.owner, Kind: "flow", State: DriftDifferent, Desired: d.c.Flow().String(), Installed: installed, Why: why}
}

// cookieOwner names the owner a cookie carries: the registered owner with its identity, else its
// category and hash.
func (r *Reconciler) cookieOwner(c Cookie) Owner {
	if owners := r.byIdentity[c.identity()]; len(owners) == 1 {
		return owners[0].owner
	}
	return Owner{Category: c.Category(), Name: fmt.Sprintf("#%08x", c.OwnerHash())}
}

func groupString(c openflow.CompiledGroup) string {
	g, err := c.Group()
	if err != nil {
		return fmt.Sprintf("group_id=%d (undecodable: %v)", c.ID, err)
	}
	return g.String()
}

// CategoryCounts is how many flows and groups the owners of one category desire.
type CategoryCounts struct{ Flows, Groups int }

// Counts returns the desired flows and groups by owner category (the agent's gauges), cheaply.
func (r *Reconciler) Counts() map[Category]CategoryCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[Category]CategoryCounts{}
	for o, st := range r.owners {
		c := out[o.Category]
		c.Flows += len(st.flows.desired)
		c.Groups += len(st.groups.desired)
		out[o.Category] = c
	}
	return out
}

// Desired returns every owner's desired flows (with their cookies) and groups, decoded: what the
// reconciler keeps the switch equal to. Owners with nothing desired are left out.
func (r *Reconciler) Desired() map[Owner]OwnerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[Owner]OwnerState, len(r.owners))
	for o, st := range r.owners {
		if len(st.flows.desired) == 0 && len(st.groups.desired) == 0 {
			continue
		}
		var os OwnerState
		for _, k := range sortedKeys(st.flows.desired) {
			os.Flows = append(os.Flows, st.flows.desired[k].c.Flow())
		}
		for _, id := range sortedIDs(st.groups.desired) {
			if g, err := st.groups.desired[id].c.Group(); err == nil {
				os.Groups = append(os.Groups, g)
			}
		}
		out[o] = os
	}
	return out
}
