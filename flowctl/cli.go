package flowctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// One convention for every subcommand: `flowctl CMD --help` (or -h, or `flowctl help CMD`) prints
// what CMD does, its synopsis and its flags on stdout and exits 0; a command line that does not parse
// (an unknown flag, a bad flag value, missing or extra arguments) prints the error and the usage on
// stderr and exits 2; a command that fails exits 1, as does diff when the bridge differs (diff(1)).
// Flags may come before, between or after arguments, as with kubectl; "--" ends them.

// command is one subcommand.
type command struct {
	name    string
	summary string // one line, for flowctl's own usage
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands are flowctl's subcommands, in the order its usage lists them.
func commands() []command {
	return []command{
		{"dump", "print the bridge's flows grouped by table, with owners, rounds and counters",
			func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
				return RunDump(ctx, args, stdout, stderr, DialBridge)
			}},
		{"diff", "what differs between the flows and groups the agent wants and what the bridge holds, by owner", RunDiff},
		{"trace", "follow a packet from SRC to DST through the nodes' bridges and say why it is delivered or dropped", RunTrace},
		{"drops", "the cluster's recent drops with their causes, merged over the nodes; -f follows", RunDrops},
		{"pod-network", "join, isolate or make global projects' VNIDs through the controller (as oc adm pod-network)", RunPodNetwork},
		{"ui", "serve the web console (networks, tenants, nodes, policies, trace, drops) on this machine", RunUI},
	}
}

func mainUsage() string {
	var b strings.Builder
	b.WriteString("usage: flowctl <command> [flags] [arguments]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-12s %s\n", c.name, c.summary)
	}
	b.WriteString("\n'flowctl <command> --help' (or 'flowctl help <command>') describes a command and its flags.\n")
	return b.String()
}

// UsageError is a command line that does not parse; the command's usage has been printed with it.
// It exits with status 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Main runs flowctl's command line. Help that was asked for is no error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return mainUsageError(stderr, errors.New("no command given"))
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, mainUsage())
		return nil
	case "help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, mainUsage())
			return nil
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, c := range commands() {
		if c.name == name {
			err := c.run(ctx, rest, stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	return mainUsageError(stderr, fmt.Errorf("unknown command %q", name))
}

func mainUsageError(stderr io.Writer, err error) error {
	fmt.Fprintf(stderr, "flowctl: %v\n\n%s", err, mainUsage())
	return &UsageError{err}
}

// Run is flowctl as a program: it runs the command line, reports a failure on stderr, and returns the
// exit status (see the convention above).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Main(ctx, args, stdout, stderr)
	var usage *UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrDifferences):
		return 1 // the report says what differs
	case errors.As(err, &usage):
		return 2 // the error and the usage are printed already
	}
	fmt.Fprintln(stderr, "flowctl:", err)
	return 1
}

// cmdLine is one subcommand's command line: its flags and the text that describes it.
type cmdLine struct {
	name   string // "dump", "pod-network isolate-projects"
	usage  string // synopsis and description, printed before the flags
	fs     *flag.FlagSet
	stdout io.Writer
	stderr io.Writer
}

func newCmdLine(name, usage string, stdout, stderr io.Writer) *cmdLine {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse prints, as the convention says
	fs.Usage = func() {}
	return &cmdLine{name: name, usage: usage, fs: fs, stdout: stdout, stderr: stderr}
}

// printUsage writes the description, the synopsis and every flag with its default.
func (c *cmdLine) printUsage(w io.Writer) {
	fmt.Fprint(w, c.usage)
	hasFlags := false
	c.fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprint(w, "\nflags:\n")
		c.fs.SetOutput(w)
		c.fs.PrintDefaults()
		c.fs.SetOutput(io.Discard)
	}
}

// parse parses args and returns the arguments that are not flags. --help prints the usage on stdout
// and returns flag.ErrHelp; a bad flag prints the error and the usage on stderr and returns a
// *UsageError.
func (c *cmdLine) parse(args []string) ([]string, error) {
	var positional []string
	for {
		err := c.fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.printUsage(c.stdout)
			return nil, flag.ErrHelp
		}
		if err != nil {
			return nil, c.fail(err)
		}
		if c.fs.NArg() == 0 {
			return positional, nil
		}
		if consumed := len(args) - c.fs.NArg(); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, c.fs.Args()...), nil // everything after "--" is an argument
		}
		positional = append(positional, c.fs.Arg(0))
		args = c.fs.Args()[1:]
	}
}

// usageErrorf reports a command line that parsed but asks for something the command does not take.
func (c *cmdLine) usageErrorf(format string, a ...any) error {
	return c.fail(fmt.Errorf(format, a...))
}

func (c *cmdLine) fail(err error) error {
	fmt.Fprintf(c.stderr, "flowctl %s: %v\n\n", c.name, err)
	c.printUsage(c.stderr)
	return &UsageError{fmt.Errorf("%s: %w", c.name, err)}
}

// choice is a flag whose value is one of a fixed list (-o text|json).
type choice struct {
	value   string
	allowed []string
}

func (c *choice) String() string { return c.value }
func (c *choice) Set(s string) error {
	for _, a := range c.allowed {
		if s == a {
			c.value = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(c.allowed, " or "))
}

// outputFlag adds -o text|json.
func (c *cmdLine) outputFlag() *choice {
	o := &choice{value: "text", allowed: []string{"text", "json"}}
	c.fs.Var(o, "o", "output `format`: text or json")
	return o
}
