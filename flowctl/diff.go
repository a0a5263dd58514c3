package flowctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
)

// ErrDifferences is RunDiff's error when the bridge differs from the desired state (exit status 1,
// as diff(1)); the report is already printed.
var ErrDifferences = errors.New("the bridge differs from the agent's desired state")

const diffUsage = `usage: flowctl diff [--node NAME | --rundir DIR] [-o text|json]

Asks a node's agent what differs between the flows and groups it wants and what its bridge holds —
missing, unexpected, different — by owner: what the agent's next drift check repairs. Exit status 1
when anything differs (as diff(1)), 0 when nothing does. On a node it asks the agent through its
socket in --rundir; --node NAME asks that node's agent through the API server's node proxy.
`

// RunDiff is `flowctl diff`: what differs between the flows and groups the node's agent wants and what
// its bridge holds, by owner — what the agent's next drift check repairs.
func RunDiff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCmdLine("diff", diffUsage, stdout, stderr)
	var nf nodeFlags
	nf.register(c.fs, true)
	output := c.outputFlag()
	rest, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return c.usageErrorf("diff takes no arguments (got %q)", rest)
	}
	agent, err := nf.agent()
	if err != nil {
		return err
	}
	d, err := agent.Diff(ctx)
	if err != nil {
		return err
	}
	if output.value == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(d); err != nil {
			return err
		}
	} else if err := WriteDiffText(stdout, d); err != nil {
		return err
	}
	if len(d.Entries) > 0 {
		return ErrDifferences
	}
	return nil
}

// WriteDiffText prints a diff grouped by owner.
func WriteDiffText(w io.Writer, d *debugapi.Diff) error {
	fmt.Fprintf(w, "node %s bridge %s round %d: desired %d flows and %d groups, installed %d flows and %d groups: ",
		d.Node, d.Bridge, d.Round, d.DesiredFlows, d.DesiredGroups, d.InstalledFlows, d.InstalledGroups)
	if len(d.Entries) == 0 {
		fmt.Fprintln(w, "no differences")
		return nil
	}
	counts := map[string]int{}
	for _, e := range d.Entries {
		counts[e.State]++
	}
	var parts []string
	for _, s := range []string{"missing", "unexpected", "different"} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	fmt.Fprintln(w, strings.Join(parts, ", "))
	last := ""
	for _, e := range d.Entries {
		if e.Owner != last {
			fmt.Fprintf(w, "\n%s:\n", e.Owner)
			last = e.Owner
		}
		switch e.State {
		case "missing":
			fmt.Fprintf(w, "  missing     %-5s %s\n", e.Kind, e.Desired)
		case "unexpected":
			fmt.Fprintf(w, "  unexpected  %-5s %s\n", e.Kind, e.Installed)
		default:
			fmt.Fprintf(w, "  different   %-5s (%s)\n", e.Kind, e.Why)
			fmt.Fprintf(w, "      want  %s\n      have  %s\n", e.Desired, e.Installed)
		}
	}
	return nil
}
