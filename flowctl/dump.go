// Package flowctl implements the flowctl command: dumps of br0 with names instead of numbers (tables,
// owners, rounds) and the pod-network admin commands. cmd/flowctl is a thin main over it.
package flowctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// FlowSource is what a dump reads: a bridge's flows and groups as raw OpenFlow stats entries.
type FlowSource interface {
	DumpFlows(ctx context.Context, cookie, mask uint64) ([][]byte, error)
	DumpGroups(ctx context.Context) ([][]byte, error)
}

// DumpOptions select and format a dump.
type DumpOptions struct {
	Table       *openflow.TableID
	Category    *reconcile.Category
	Cookie      uint64
	CookieMask  uint64
	Output      string // "text" or "json"
	Owners      *reconcile.OwnerIndex
	Bridge      string
	ShowGroups  bool
	ShowDefault bool
	// KeepRaw keeps every entry's wire encoding (JSON dumps: what flowctl trace --dump evaluates).
	KeepRaw bool
}

// DumpedFlow is one flow of a dump, with its cookie decoded.
type DumpedFlow struct {
	Table     openflow.TableID `json:"table"`
	TableName string           `json:"tableName"`
	Priority  uint16           `json:"priority"`
	Match     string           `json:"match"`
	Actions   string           `json:"actions"`
	Cookie    string           `json:"cookie"`
	Round     uint16           `json:"round"`
	Category  string           `json:"category"`
	Owner     string           `json:"owner"`
	Packets   uint64           `json:"packets"`
	Bytes     uint64           `json:"bytes"`
	Flow      string           `json:"flow"`
	// Sampled is the drop cause of a sampled drop flow (flows/pipeline/drops.go): one whose first
	// action is the controller action with its cause's meter, which sends the agent a sample and
	// does not deliver the packet. Text dumps show it as a drop, not as "sent to the controller".
	Sampled string `json:"sampled,omitempty"`
	// shown is the text dump's actions of a sampled drop: the flow's own, "drop" when it has none,
	// and the cause and meter.
	shown string
	// Raw is the ofp_flow_stats entry as the switch sent it (JSON dumps).
	Raw []byte `json:"raw,omitempty"`
}

// Dump is a bridge's flows and groups, decoded.
type Dump struct {
	Bridge string       `json:"bridge"`
	Flows  []DumpedFlow `json:"flows"`
	Groups []string     `json:"groups"`
	// RawGroups are the ofp_group_desc entries as the switch sent them (JSON dumps).
	RawGroups [][]byte `json:"rawGroups,omitempty"`
	// Undecodable counts entries the codec could not read; they are listed with raw actions.
	Undecodable int `json:"undecodable,omitempty"`
	// Owners are the owner keys that name cookies, and Node the agent's view of the node, when the
	// agent could be asked: with them a saved JSON dump answers flowctl trace --dump on its own.
	Owners []string           `json:"owners,omitempty"`
	Node   *debugapi.NodeInfo `json:"node,omitempty"`
}

// ReadDump fetches and decodes a bridge's flows and groups.
func ReadDump(ctx context.Context, src FlowSource, opts DumpOptions) (*Dump, error) {
	raw, err := src.DumpFlows(ctx, opts.Cookie, opts.CookieMask)
	if err != nil {
		return nil, fmt.Errorf("dump flows of %s: %w", opts.Bridge, err)
	}
	d := &Dump{Bridge: opts.Bridge}
	for _, b := range raw {
		f, err := openflow.DecodeFlowStats(b)
		if err != nil {
			d.Undecodable++
			continue
		}
		if opts.Table != nil && f.Table != *opts.Table {
			continue
		}
		if opts.Category != nil && reconcile.Cookie(f.Cookie).Category() != *opts.Category {
			continue
		}
		df := describe(f, opts.Owners)
		if opts.KeepRaw {
			df.Raw = b
		}
		d.Flows = append(d.Flows, df)
	}
	sort.SliceStable(d.Flows, func(i, j int) bool {
		a, b := d.Flows[i], d.Flows[j]
		if a.Table != b.Table {
			return a.Table < b.Table
		}
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.Match < b.Match
	})
	if opts.ShowGroups && opts.Table == nil && opts.Category == nil {
		rawGroups, err := src.DumpGroups(ctx)
		if err != nil {
			return nil, fmt.Errorf("dump groups of %s: %w", opts.Bridge, err)
		}
		for _, b := range rawGroups {
			g, err := openflow.DecodeGroupDesc(b)
			if err != nil {
				d.Undecodable++
				continue
			}
			d.Groups = append(d.Groups, g.String())
			if opts.KeepRaw {
				d.RawGroups = append(d.RawGroups, b)
			}
		}
		sort.Strings(d.Groups)
	}
	return d, nil
}

func describe(f openflow.Flow, owners *reconcile.OwnerIndex) DumpedFlow {
	cookie := reconcile.Cookie(f.Cookie)
	owner := ""
	if cookie != 0 {
		owner = owners.Name(cookie)
	}
	df := DumpedFlow{
		Table: f.Table, TableName: pipeline.TableName(f.Table), Priority: f.Priority,
		Match: f.Match.String(), Actions: actionsText(f), Cookie: cookie.String(), Round: cookie.Round(),
		Category: cookie.Category().String(), Owner: owner, Packets: f.Packets, Bytes: f.Bytes, Flow: f.String(),
	}
	if cause, shown, ok := sampledDropText(f); ok {
		df.Sampled, df.shown = string(cause), shown
	}
	return df
}

// sampledDropText is how flowctl's text (dump, trace and the console's trace) shows a sampled drop
// flow's actions: its own actions without the sample ("drop" when none), then the cause and meter,
// "drop (sampled: anti-spoofing, meter 4)". ok is false for any other flow, shown as it is.
func sampledDropText(f openflow.Flow) (cause pipeline.DropCause, shown string, ok bool) {
	cause, meter, rest, ok := sampledDrop(f)
	if !ok {
		return "", "", false
	}
	return cause, fmt.Sprintf("%s (sampled: %s, meter %d)", actionsText(rest), cause, meter), true
}

// actionsText is a flow's actions as ovs-ofctl prints them ("drop" for none).
func actionsText(f openflow.Flow) string {
	s := f.String()
	return s[strings.Index(s, " actions=")+len(" actions="):]
}

// sampledDrop says whether f is a sampled drop (or reject) flow of the drop registry: its first action
// the controller action with its cause's meter. rest is f without that action.
func sampledDrop(f openflow.Flow) (cause pipeline.DropCause, meter uint32, rest openflow.Flow, ok bool) {
	if len(f.Actions) == 0 {
		return "", 0, f, false
	}
	c, isCtl := f.Actions[0].(openflow.Controller)
	if !isCtl {
		return "", 0, f, false
	}
	r, attributed := pipeline.DropRuleOf(f)
	if !attributed {
		return "", 0, f, false
	}
	info, known := pipeline.LookupDropCause(r.Cause)
	if !known || info.Meter != c.MeterID {
		return "", 0, f, false
	}
	rest = f
	rest.Actions = f.Actions[1:]
	return r.Cause, c.MeterID, rest, true
}

// WriteText prints a dump grouped by table, each table headed by its name and purpose.
func (d *Dump) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bridge %s: %d flows, %d groups\n", d.Bridge, len(d.Flows), len(d.Groups))
	var last = -1
	for _, f := range d.Flows {
		if int(f.Table) != last {
			last = int(f.Table)
			if t, ok := pipeline.LookupTable(f.Table); ok {
				fmt.Fprintf(w, "\ntable %d %s: %s\n", t.ID, t.Name, t.Purpose)
			} else {
				fmt.Fprintf(w, "\ntable %d (not in ofsdn's pipeline)\n", f.Table)
			}
		}
		match := f.Match
		if match == "" {
			match = "*"
		}
		owner := f.Owner
		if owner == "" {
			owner = "-"
		}
		actions := f.Actions
		if f.shown != "" {
			actions = f.shown
		}
		fmt.Fprintf(w, "  %-5d %-48s actions=%s\n", f.Priority, match, actions)
		fmt.Fprintf(w, "        owner=%s round=%d packets=%d bytes=%d cookie=%s\n", owner, f.Round, f.Packets, f.Bytes, f.Cookie)
	}
	if len(d.Groups) > 0 {
		fmt.Fprintf(w, "\ngroups:\n")
		for _, g := range d.Groups {
			fmt.Fprintf(w, "  %s\n", g)
		}
	}
	if d.Undecodable > 0 {
		fmt.Fprintf(w, "\n%d entries could not be decoded\n", d.Undecodable)
	}
	return nil
}

// WriteJSON prints a dump as one JSON document.
func (d *Dump) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(d)
}

// Dialer connects to a bridge's OpenFlow management socket.
type Dialer func(ctx context.Context, socket, bridge string) (FlowSource, func(), error)

const dumpUsage = `usage: flowctl dump [--table T] [--category C] [--owner O] [--cookie V[/M]] [-o text|json] [--node NAME | --rundir DIR]

Prints a bridge's flows grouped by table, each table headed by its name and purpose, every flow with
its owner (decoded from its cookie: round, category, the object it renders), priority, match, actions
and counters, then the groups. A sampled drop flow (its first action the controller action with its
cause's meter) reads "drop (sampled: CAUSE, meter M)": the packet is dropped, a sample goes to the
agent (flowctl drops). On a node it reads the bridge through Open vSwitch's management socket
in --rundir; --node NAME asks that node's agent through the API server's node proxy instead. With -o
json every entry keeps its wire encoding and, when the agent answers, the file carries its view of
the node: what 'flowctl trace --dump' evaluates offline.

  flowctl dump --category net                 # every Network's own flows (tunnels, cross-talk, gateway)
  flowctl dump --owner net/red                # Network red's
  flowctl dump --owner pod/lab/x@net1         # pod lab/x's interface net1 on a Network
`

// categoryNames lists the owner categories a dump can select, from the registry.
func categoryNames() string {
	var names []string
	for _, c := range reconcile.Categories() {
		names = append(names, c.String())
	}
	return strings.Join(names, ", ")
}

// RunDump is `flowctl dump`.
func RunDump(ctx context.Context, args []string, stdout, stderr io.Writer, dial Dialer) error {
	c := newCmdLine("dump", dumpUsage, stdout, stderr)
	fs := c.fs
	var nf nodeFlags
	nf.register(fs, true)
	opts := DumpOptions{ShowGroups: true}
	fs.Func("table", "only this `table` (name or number)", func(s string) error {
		t, err := pipeline.ParseTable(s)
		opts.Table = &t
		return err
	})
	fs.Func("category", "only flows of this owner `category`: "+categoryNames()+" (or its number)", func(s string) error {
		cat, err := reconcile.ParseCategory(s)
		opts.Category = &cat
		return err
	})
	cookieSet := false
	fs.Func("cookie", "only flows whose cookie matches `VALUE[/MASK]` (hex)", func(s string) error {
		if cookieSet {
			return errors.New("give one of --owner and --cookie")
		}
		var err error
		opts.Cookie, opts.CookieMask, err = parseCookie(s)
		cookieSet = true
		return err
	})
	fs.Func("owner", "only flows of this `owner`, as dumps name it: pod/NS/NAME, pod/NS/NAME@net1 (an interface on a Network), net/NAME, node/NAME, svc/NS/NAME:PORT, netpol/NS/NAME...", func(s string) error {
		if cookieSet {
			return errors.New("give one of --owner and --cookie")
		}
		var err error
		opts.Cookie, opts.CookieMask, err = ownerCookie(s)
		cookieSet = true
		return err
	})
	output := c.outputFlag()
	ownersPath := fs.String("owners", "", "owner index written by the agent (default <rundir>/<bridge>.owners.json when present)")
	rest, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return c.usageErrorf("dump takes no arguments (got %q)", rest)
	}
	opts.Bridge, opts.Output, opts.KeepRaw = nf.bridge, output.value, output.value == "json"
	if nf.node != "" {
		// Through the agent: its dump of the bridge, its owner index and its view.
		agent, err := nf.agent()
		if err != nil {
			return err
		}
		raw, err := agent.Dump(ctx)
		if err != nil {
			return err
		}
		info, err := agent.Node(ctx)
		if err != nil {
			return err
		}
		opts.Bridge = raw.Bridge
		opts.Owners = ownerIndex(raw.Owners)
		d, err := ReadDump(ctx, fetchedDump{raw.Flows, raw.Groups}, opts)
		if err != nil {
			return err
		}
		d.Owners, d.Node = raw.Owners, info
		return writeDump(stdout, d, output.value)
	}
	path := *ownersPath
	if path == "" {
		path = filepath.Join(nf.rundir, nf.bridge+".owners.json")
		if _, err := os.Stat(path); err != nil {
			path = ""
		}
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("owner index: %w", err)
		}
		idx, err := reconcile.ParseOwnerIndex(data)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		opts.Owners = idx
	}
	socket := filepath.Join(nf.rundir, nf.bridge+".mgmt")
	if _, err := os.Stat(socket); err != nil {
		return fmt.Errorf("bridge %s: no OpenFlow management socket at %s (is ovs-vswitchd running with that run directory, and does the bridge exist?)", nf.bridge, socket)
	}
	src, closeFn, err := dial(ctx, socket, nf.bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", nf.bridge, err)
	}
	defer closeFn()
	d, err := ReadDump(ctx, src, opts)
	if err != nil {
		return err
	}
	if output.value == "json" && opts.Owners != nil {
		d.Owners = opts.Owners.Keys()
	}
	if output.value == "json" && opts.Table == nil && opts.Category == nil && opts.CookieMask == 0 {
		// A whole dump: add what the local agent knows, so the file answers flowctl trace --dump alone.
		if agent, err := nf.local(); err == nil {
			if info, err := agent.Node(ctx); err == nil {
				d.Node, d.Owners = info, info.Owners
			} else {
				fmt.Fprintf(stderr, "flowctl: the agent's view of the node is not in the dump: %v\n", err)
			}
		} else {
			fmt.Fprintf(stderr, "flowctl: the agent's view of the node is not in the dump: %v\n", err)
		}
	}
	return writeDump(stdout, d, output.value)
}

func writeDump(w io.Writer, d *Dump, output string) error {
	if output == "json" {
		return d.WriteJSON(w)
	}
	return d.WriteText(w)
}

// fetchedDump is a dump already fetched, as a FlowSource.
type fetchedDump struct{ flows, groups [][]byte }

func (s fetchedDump) DumpFlows(_ context.Context, cookie, mask uint64) ([][]byte, error) {
	if mask == 0 {
		return s.flows, nil
	}
	var out [][]byte
	for _, b := range s.flows {
		if c, ok := openflow.RawFlowStats(b); ok && c.Cookie&mask == cookie&mask {
			out = append(out, b)
		}
	}
	return out, nil
}
func (s fetchedDump) DumpGroups(context.Context) ([][]byte, error) { return s.groups, nil }

// ownerIndex builds an index from owner keys (unknown ones are skipped).
func ownerIndex(keys []string) *reconcile.OwnerIndex {
	idx := reconcile.NewOwnerIndex()
	for _, k := range keys {
		if o, err := reconcile.ParseOwner(k); err == nil {
			idx.Add(o)
		}
	}
	return idx
}

// ownerCookie is the cookie value and mask of an owner's flows in any round.
func ownerCookie(s string) (uint64, uint64, error) {
	o, err := reconcile.ParseOwner(s)
	if err != nil {
		return 0, 0, err
	}
	return uint64(reconcile.MakeCookie(0, o)) & reconcile.CookieIdentityMask, reconcile.CookieIdentityMask, nil
}

func parseCookie(s string) (uint64, uint64, error) {
	v, m, hasMask := strings.Cut(s, "/")
	value, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("cookie %q: %w", s, err)
	}
	mask := ^uint64(0)
	if hasMask {
		mask, err = strconv.ParseUint(strings.TrimPrefix(m, "0x"), 16, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cookie mask %q: %w", s, err)
		}
	}
	return value, mask, nil
}

func defaultRunDir() string {
	if d := os.Getenv("OVS_RUNDIR"); d != "" {
		return d
	}
	return "/var/run/openvswitch"
}
