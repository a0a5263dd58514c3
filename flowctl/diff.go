package flowctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ofsdn/ofsdn/debugapi"
)

// ErrDifferences is RunDiff's error when the bridge differs from the desired state (exit status 1,
// as diff(1)); the report is already printed.
var ErrDifferences = errors.New("the bridge differs from the agent's desired state")

// RunDiff is `flowctl diff`: what differs between the flows and groups the node's agent wants and what
// its bridge holds, by owner — what the agent's next drift check repairs.
func RunDiff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("diff", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nf nodeFlags
	nf.register(fs, true)
	output := fs.String("o", "text", "output format: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("diff takes no arguments (got %q)", fs.Args())
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("-o %q: want text or json", *output)
	}
	agent, err := nf.agent()
	if err != nil {
		return err
	}
	d, err := agent.Diff(ctx)
	if err != nil {
		return err
	}
	if *output == "json" {
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
