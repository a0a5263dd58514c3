package trace

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/flows/openflow"
)

// Parse reads ofproto/trace's text (OVS 3.x) into a Path. It is strict about what it needs — every
// table line, the passes and where the packet went — and skips what it does not (megaflows,
// datapath actions).
func Parse(out string) (*Path, error) {
	p := &Path{Raw: out}
	var pass *Pass
	var step *Step
	var flow Fields  // the pass's packet as it started
	var tunID uint64 // what an action note says was written into tun_id in this pass
	var tunIDWritten bool
	var ctState string // the flags the next pass resumes with (its header comes before its Flow:)
	passOutputs := 0   // outputs of the passes before this one
	lastGroup := uint32(0)
	newPass := func() {
		p.Passes = append(p.Passes, Pass{CtState: ctState})
		pass = &p.Passes[len(p.Passes)-1]
		step, ctState, tunIDWritten = nil, "", false
		passOutputs = len(p.Outputs)
	}
	// Outputs take the packet as the pass ends (the Final flow: line), the port now.
	output := func(port uint32) { p.Outputs = append(p.Outputs, Output{Port: port, Fields: flow}) }
	inCT := false // the previous action line was a ct()
	// The traced bridge is the first bridge("...") named; another one is where an output led (the
	// underlay bridge a native tunnel sends through): not this bridge's pipeline, so skipped.
	traced, elsewhere := "", false
	for n, line := range strings.Split(out, "\n") {
		trimmed := strings.TrimSpace(line)
		wasCT := inCT
		inCT = false
		bad := func(why string) error { return fmt.Errorf("ofproto/trace line %d %q: %s", n+1, trimmed, why) }
		switch {
		case trimmed == "":
		case strings.HasPrefix(trimmed, "Flow: "):
			newPass()
			flow = parseFlowFields(strings.TrimPrefix(trimmed, "Flow: "))
		case strings.HasPrefix(trimmed, "recirc(") && strings.Contains(trimmed, "ct_state="):
			if pass == nil {
				return nil, bad("a recirculation before any pass")
			}
			state := trimmed[strings.Index(trimmed, "ct_state=")+len("ct_state="):]
			state, _, _ = strings.Cut(state, " ")
			ctState = normaliseCtState(state)
		case strings.HasPrefix(trimmed, "bridge(\""):
			name := strings.TrimSuffix(strings.TrimPrefix(trimmed, "bridge(\""), "\")")
			if traced == "" {
				traced = name
			}
			elsewhere = name != traced
		case elsewhere && !strings.HasPrefix(trimmed, "Final flow: ") && !strings.HasPrefix(trimmed, "Datapath actions:") &&
			!strings.HasPrefix(trimmed, "Megaflow:"):
			// Another bridge's tables (an output's tunnel underlay): not this bridge's path.
		case strings.HasPrefix(trimmed, "Final flow: "):
			if v := strings.TrimPrefix(trimmed, "Final flow: "); v == "unchanged" {
				p.Final = flow
			} else {
				p.Final = parseFlowFields(v)
			}
			if tunIDWritten {
				p.Final.TunID = tunID
			}
			for i := passOutputs; i < len(p.Outputs); i++ {
				p.Outputs[i].Fields = p.Final
			}
		case strings.HasPrefix(trimmed, "Resuming from table "):
			if pass == nil {
				return nil, bad("resuming outside a pass")
			}
			t, err := strconv.Atoi(strings.TrimPrefix(trimmed, "Resuming from table "))
			if err != nil {
				return nil, bad("no table number")
			}
			pass.ResumeTable = openflow.TableID(t)
		case tableLine.MatchString(line):
			if pass == nil {
				return nil, bad("a table before any Flow: line")
			}
			m := tableLine.FindStringSubmatch(line)
			table, _ := strconv.Atoi(m[2])
			s := Step{Depth: (len(m[1]) + len(m[2])) / 4, Table: openflow.TableID(table), Bucket: -1}
			rest := m[3]
			if strings.HasPrefix(rest, "No match") {
				s.Miss = true
			} else {
				r := rulePart.FindStringSubmatch(rest)
				if r == nil {
					return nil, bad("no priority")
				}
				prio, _ := strconv.Atoi(r[2])
				s.Match, s.Priority = r[1], uint16(prio)
				if r[3] != "" {
					c, err := strconv.ParseUint(r[3], 0, 64)
					if err != nil {
						return nil, bad("bad cookie")
					}
					s.Cookie = c
				}
			}
			pass.Steps = append(pass.Steps, s)
			step = &pass.Steps[len(pass.Steps)-1]
		case step == nil:
			// Lines before the first table of a pass: bridge("br0"), dashes, thaw.
		case strings.HasPrefix(trimmed, "->"):
			note := strings.TrimSpace(strings.TrimPrefix(trimmed, "->"))
			switch {
			case strings.HasPrefix(note, "output port is "):
				port, err := strconv.ParseUint(strings.TrimPrefix(note, "output port is "), 10, 32)
				if err != nil {
					return nil, bad("bad port")
				}
				output(uint32(port))
			case strings.HasPrefix(note, "using bucket "):
				b, _ := strconv.Atoi(strings.TrimPrefix(note, "using bucket "))
				step.Bucket = b
			case note == "no live bucket":
				p.StoppedAtGroup = lastGroup
			case strings.HasPrefix(note, "NXM_NX_TUN_ID") && strings.Contains(note, " is now "):
				v := note[strings.Index(note, " is now ")+len(" is now "):]
				id, err := strconv.ParseUint(v, 0, 64)
				if err != nil {
					return nil, bad("bad tun_id")
				}
				tunID, tunIDWritten = id, true
			case strings.HasPrefix(note, "skipping output to input port"):
				// OpenFlow drops output to the ingress port; the output already counted goes.
				if len(p.Outputs) > 0 {
					p.Outputs = p.Outputs[:len(p.Outputs)-1]
				}
			}
		case strings.HasPrefix(trimmed, "bucket "):
			b, err := strconv.Atoi(strings.TrimPrefix(trimmed, "bucket "))
			if err == nil && step.Bucket < 0 {
				step.Bucket = b
			}
		case strings.HasPrefix(trimmed, "Megaflow:"), strings.HasPrefix(trimmed, "Datapath actions:"),
			strings.HasPrefix(trimmed, "===="), strings.HasPrefix(trimmed, "Replacing src/dst"),
			strings.HasPrefix(trimmed, "Initial flow:"), strings.HasPrefix(trimmed, "Modified flow:"),
			strings.Trim(trimmed, "-") == "":
		case wasCT && (trimmed == "drop" || trimmed == "nat" || strings.HasPrefix(trimmed, "nat(")):
			// ofproto/trace lists a ct()'s nested actions after it ("drop" when there are none).
		default:
			// An action line of the current step.
			step.Actions = append(step.Actions, trimmed)
			switch {
			case strings.HasPrefix(trimmed, "group:"):
				id, _ := strconv.ParseUint(strings.TrimPrefix(trimmed, "group:"), 10, 32)
				lastGroup = uint32(id)
			case strings.HasPrefix(trimmed, "ct("):
				inCT = true
				if strings.Contains(trimmed, "table=") {
					pass.Recirculates = trimmed
				}
			case trimmed == "IN_PORT" || trimmed == "output:IN_PORT" || trimmed == "in_port":
				output(flow.InPort)
			case strings.HasPrefix(trimmed, "output:"):
				if port, err := strconv.ParseUint(strings.TrimPrefix(trimmed, "output:"), 10, 32); err == nil {
					output(uint32(port))
				}
			}
		}
	}
	if len(p.Passes) == 0 {
		return nil, fmt.Errorf("ofproto/trace: no trace in its answer: %q", firstLine(out))
	}
	return p, nil
}

var (
	// A table's line: "20. ip,in_port=3, priority 100, cookie 0x1" (indented when nested), or "No match.".
	tableLine = regexp.MustCompile(`^(\s*)(\d{1,3})\. (.*)$`)
	// The rule part of a table line: match (may be empty), priority, cookie (absent when 0).
	rulePart = regexp.MustCompile(`^(.*?),? ?priority (\d+)(?:, cookie (0x[0-9a-f]+))?$`)
)

// normaliseCtState turns OVS's "new|trk" into --ct-next's order and syntax ("trk,new").
func normaliseCtState(s string) string {
	have := map[string]bool{}
	for _, f := range strings.Split(s, "|") {
		have[f] = true
	}
	var out []string
	for _, f := range []string{"trk", "new", "est", "rel", "rpl", "inv", "snat", "dnat"} {
		if have[f] {
			out = append(out, f)
		}
	}
	return strings.Join(out, ",")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}
