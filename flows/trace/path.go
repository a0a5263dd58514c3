package trace

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Path is a packet's way through one bridge, as ofproto/trace reports it or Evaluate computes it.
type Path struct {
	// Passes are the pipeline runs: the first, then one per conntrack recirculation.
	Passes []Pass `json:"passes"`
	// Outputs are the ports the packet left by, in order; none means it was dropped.
	Outputs []Output `json:"outputs,omitempty"`
	// Final is the packet and its registers at the end of the last pass.
	Final Fields `json:"final"`
	// StoppedAtGroup is a select group the trace could not go past because Packet.DPHash was not
	// given (OVS hashes in the datapath and recirculates); 0 when it did not stop at one.
	StoppedAtGroup uint32 `json:"stoppedAtGroup,omitempty"`
	// Raw is ofproto/trace's own text, for a live trace.
	Raw string `json:"-"`
}

// Pass is one run of the pipeline.
type Pass struct {
	// ResumeTable is where a recirculation resumed (0 for the first pass).
	ResumeTable openflow.TableID `json:"resumeTable"`
	// CtState are the conntrack flags it resumed with ("" for the first pass).
	CtState string `json:"ctState,omitempty"`
	Steps   []Step `json:"steps"`
	// Recirculates is the ct() action that ended the pass by recirculating ("" if none did).
	Recirculates string `json:"recirculates,omitempty"`
}

// Step is one table lookup.
type Step struct {
	Depth    int              `json:"depth"` // 0, or nesting inside resubmits and group buckets
	Table    openflow.TableID `json:"table"`
	Priority uint16           `json:"priority"`
	Match    string           `json:"match"`
	Cookie   uint64           `json:"cookie"`
	Actions  []string         `json:"actions"`
	// Miss: no flow matched (the table's miss behaviour, drop, applied).
	Miss bool `json:"miss,omitempty"`
	// Bucket is the select group bucket this step's group action chose (-1: none).
	Bucket int `json:"bucket"`
}

// Output is one port the packet left by and the packet as it left.
type Output struct {
	Port   uint32 `json:"port"`
	Fields Fields `json:"fields"`
}

// Fields are the packet fields and metadata flowctl reads from a path.
type Fields struct {
	InPort  uint32     `json:"inPort"`
	EthSrc  string     `json:"ethSrc,omitempty"`
	EthDst  string     `json:"ethDst,omitempty"`
	IPSrc   netip.Addr `json:"ipSrc,omitzero"`
	IPDst   netip.Addr `json:"ipDst,omitzero"`
	SrcPort uint16     `json:"srcPort,omitempty"`
	DstPort uint16     `json:"dstPort,omitempty"`
	TunID   uint64     `json:"tunID,omitempty"`
	TunSrc  netip.Addr `json:"tunSrc,omitzero"`
	TunDst  netip.Addr `json:"tunDst,omitzero"`
	Regs    [8]uint32  `json:"regs"`
}

// Dropped reports whether the packet left by no port.
func (p *Path) Dropped() bool { return len(p.Outputs) == 0 }

// Last is the last step of the last pass (where a dropped packet died), if any.
func (p *Path) Last() (Step, bool) {
	for i := len(p.Passes) - 1; i >= 0; i-- {
		if s := p.Passes[i].Steps; len(s) > 0 {
			return s[len(s)-1], true
		}
	}
	return Step{}, false
}

// Key is the path's shape for comparisons: each step's pass, table, priority and cookie, and the ports
// it left by. Two tracers that agree on the key agree on every decision.
func (p *Path) Key() []string {
	var out []string
	for i, pass := range p.Passes {
		for _, s := range pass.Steps {
			if s.Miss {
				out = append(out, fmt.Sprintf("pass %d table %d: no match", i, s.Table))
				continue
			}
			out = append(out, fmt.Sprintf("pass %d table %d priority %d cookie %#x", i, s.Table, s.Priority, s.Cookie))
		}
	}
	for _, o := range p.Outputs {
		out = append(out, fmt.Sprintf("output %d", o.Port))
	}
	if p.StoppedAtGroup != 0 {
		out = append(out, fmt.Sprintf("stopped at group %d", p.StoppedAtGroup))
	}
	return out
}

// NextCtFlags computes the --ct-next list a faithful first-packet trace of this path needs: for each
// recirculation, trk,new plus the NAT the ct() action applied. It returns the list and whether it
// differs from the one the path was traced with (then trace again with it).
func (p *Path) NextCtFlags(used []CtFlags) ([]CtFlags, bool) {
	var want []CtFlags
	for _, pass := range p.Passes {
		if pass.Recirculates == "" {
			continue
		}
		want = append(want, ctFlagsOf(pass.Recirculates))
	}
	changed := len(want) > len(used)
	for i := 0; i < len(want) && i < len(used) && !changed; i++ {
		changed = want[i].String() != used[i].String()
	}
	return want, changed
}

// ctFlagsOf reads a ct() action's text (as OVS and openflow.CT print it) for the flags a new connection
// gets from it.
func ctFlagsOf(action string) CtFlags {
	flags := CtFlags{"trk", "new"}
	switch {
	case strings.Contains(action, "nat(dst="):
		flags = append(flags, "dnat")
	case strings.Contains(action, "nat(src="):
		flags = append(flags, "snat")
	}
	return flags
}

// setFlowField reads one key=value of an OVS flow string into f.
func (f *Fields) setFlowField(k, v string) {
	num := func() uint64 {
		n, _ := strconv.ParseUint(v, 0, 64)
		return n
	}
	addr := func() netip.Addr {
		a, _ := netip.ParseAddr(v)
		return a
	}
	switch k {
	case "in_port":
		f.InPort = uint32(num())
	case "dl_src":
		f.EthSrc = v
	case "dl_dst":
		f.EthDst = v
	case "nw_src":
		f.IPSrc = addr()
	case "nw_dst":
		f.IPDst = addr()
	case "tp_src":
		f.SrcPort = uint16(num())
	case "tp_dst":
		f.DstPort = uint16(num())
	case "tun_id":
		f.TunID = num()
	case "tun_src":
		f.TunSrc = addr()
	case "tun_dst":
		f.TunDst = addr()
	default:
		if r, ok := strings.CutPrefix(k, "reg"); ok {
			if i, err := strconv.Atoi(r); err == nil && i >= 0 && i < 8 {
				f.Regs[i] = uint32(num())
			}
		}
	}
}

// parseFlowFields reads the fields flowctl uses from an OVS flow string ("tcp,reg0=0xb,in_port=3,...").
func parseFlowFields(s string) Fields {
	var f Fields
	for _, kv := range strings.Split(strings.TrimSpace(s), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f.setFlowField(k, v)
		}
	}
	return f
}

func macOf(v uint64) string {
	return net.HardwareAddr{byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}.String()
}
