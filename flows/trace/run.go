package trace

import (
	"context"
	"fmt"
	"strconv"
)

// Tracer traces a packet through one bridge with the given --ct-next flags: live through ovs-vswitchd
// (ofproto/trace, parsed by Parse) or offline (Bridge.Evaluate).
type Tracer interface {
	Trace(ctx context.Context, p Packet, ctNext []CtFlags) (*Path, error)
}

// Offline is a Tracer over a Bridge.
type Offline struct{ Bridge *Bridge }

func (o Offline) Trace(_ context.Context, p Packet, ctNext []CtFlags) (*Path, error) {
	return o.Bridge.Evaluate(p, ctNext)
}

// Chooser says which buckets of a select group the trace may follow (the ones towards the endpoint the
// user wants); nil or an empty answer: any.
type Chooser func(groupID uint32) []int

// Run traces p as the first packet of a new connection, the same way whatever the tracer: it traces
// again with --ct-next flags until they say what each ct() action really does to a new connection
// (NextCtFlags), and when the trace stops at a select group it gives a dp_hash that picks a bucket
// choose accepts. The result is the path and the flags it was traced with.
func Run(ctx context.Context, t Tracer, p Packet, choose Chooser) (*Path, []CtFlags, error) {
	var ctNext []CtFlags
	var wanted []int
	tried := 0
	const maxTraces = 80
	for n := 0; ; n++ {
		if n >= maxTraces {
			return nil, nil, fmt.Errorf("trace did not settle after %d runs (ct flags %v, dp_hash %#x)", n, ctNext, p.DPHash)
		}
		path, err := t.Trace(ctx, p, ctNext)
		if err != nil {
			return nil, nil, err
		}
		if next, changed := path.NextCtFlags(ctNext); changed {
			ctNext = next
			continue
		}
		if path.StoppedAtGroup != 0 && p.DPHash == 0 {
			if choose != nil {
				wanted = choose(path.StoppedAtGroup)
			}
			b := 0
			if len(wanted) > 0 {
				b = wanted[0]
			}
			p.DPHash = DPHashFor(b)
			continue
		}
		if len(wanted) > 0 && !containsInt(wanted, path.chosenBucket()) {
			// OVS mapped this hash to another bucket: walk the hash values until it picks a wanted one.
			tried++
			if tried > 64 {
				return path, ctNext, nil // follow what OVS chose; flowctl says which endpoint that is
			}
			p.DPHash = uint32(tried)
			continue
		}
		return path, ctNext, nil
	}
}

// chosenBucket is the bucket of the path's select group (-1: none chosen).
func (p *Path) chosenBucket() int {
	for _, pass := range p.Passes {
		for _, s := range pass.Steps {
			if s.Bucket >= 0 {
				return s.Bucket
			}
		}
	}
	return -1
}

// GroupStep returns the step whose action went to a group, and the group's ID.
func (p *Path) GroupStep() (Step, uint32, bool) {
	for _, pass := range p.Passes {
		for _, s := range pass.Steps {
			for _, a := range s.Actions {
				if id, ok := cutUint(a, "group:"); ok {
					return s, uint32(id), true
				}
			}
		}
	}
	return Step{}, 0, false
}

func cutUint(s, prefix string) (uint64, bool) {
	if len(s) <= len(prefix) || s[:len(prefix)] != prefix {
		return 0, false
	}
	v, err := strconv.ParseUint(s[len(prefix):], 10, 32)
	return v, err == nil
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
