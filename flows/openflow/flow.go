package openflow

import (
	"fmt"
	"strings"
	"time"
)

// TableID is an OpenFlow table number. The pipeline names its tables (flows/pipeline).
type TableID uint8

// Flow is one OpenFlow flow entry. Rendering fills Table, Priority, Match and Actions; the reconciler
// stamps the Cookie from the owner and round. Dumped flows also carry their counters.
type Flow struct {
	Table       TableID
	Priority    uint16
	Match       Match
	Actions     []Action
	Cookie      uint64
	IdleTimeout uint16
	HardTimeout uint16

	// Counters, filled only for flows dumped from a switch.
	Packets  uint64
	Bytes    uint64
	Duration time.Duration
}

// F is shorthand for rendering code: F(table, priority, M(...), actions...).
func F(table TableID, priority uint16, m Match, actions ...Action) Flow {
	return Flow{Table: table, Priority: priority, Match: m, Actions: actions}
}

// String prints the flow as `ovs-ofctl -O OpenFlow13 dump-flows --no-stats` does, with the table always
// shown and without the cookie (which the reconciler sets, and dumps print decoded).
func (f Flow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table=%d, ", f.Table)
	if f.IdleTimeout != 0 {
		fmt.Fprintf(&b, "idle_timeout=%d, ", f.IdleTimeout)
	}
	if f.HardTimeout != 0 {
		fmt.Fprintf(&b, "hard_timeout=%d, ", f.HardTimeout)
	}
	fmt.Fprintf(&b, "priority=%d", f.Priority)
	if m := f.Match.String(); m != "" {
		b.WriteString("," + m)
	}
	b.WriteString(" actions=" + actionsString(f.Actions))
	return b.String()
}

// GroupType is an OpenFlow group type.
type GroupType uint8

const (
	GroupAll          GroupType = 0
	GroupSelect       GroupType = 1
	GroupIndirect     GroupType = 2
	GroupFastFailover GroupType = 3
)

func (t GroupType) String() string {
	switch t {
	case GroupAll:
		return "all"
	case GroupSelect:
		return "select"
	case GroupIndirect:
		return "indirect"
	case GroupFastFailover:
		return "ff"
	}
	return fmt.Sprintf("type%d", uint8(t))
}

// Bucket is one group bucket; Weight matters for select groups.
type Bucket struct {
	Weight  uint16
	Actions []Action
}

// GroupEntry is one OpenFlow group (a service's endpoints, a flood list).
type GroupEntry struct {
	ID      uint32
	Type    GroupType
	Buckets []Bucket
}

// String prints the group as `ovs-ofctl -O OpenFlow13 dump-groups` does.
func (g GroupEntry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "group_id=%d,type=%s", g.ID, g.Type)
	for _, bk := range g.Buckets {
		b.WriteString(",bucket=")
		if g.Type == GroupSelect && bk.Weight != 1 {
			fmt.Fprintf(&b, "weight:%d,", bk.Weight)
		}
		b.WriteString("actions=" + actionsString(bk.Actions))
	}
	return b.String()
}
