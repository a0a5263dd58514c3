package flowctl

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// TestCommandLineConvention holds every subcommand to one convention: asked for help, it describes
// itself (synopsis, what it does, its flags) on stdout and exits 0; given a command line that does not
// parse, it exits 2 with the error and its usage on stderr.
func TestCommandLineConvention(t *testing.T) {
	ctx := context.Background()
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = Run(ctx, args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	type invocation struct {
		args []string
		// synopsis is how the usage printed must start.
		synopsis string
	}
	var help, bad []invocation
	for _, c := range commands() {
		synopsis := "usage: flowctl " + c.name
		for _, h := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			help = append(help, invocation{h, synopsis})
		}
		bad = append(bad, invocation{[]string{c.name, "--no-such-flag"}, synopsis})
	}
	help = append(help, invocation{[]string{"pod-network", "join-projects", "--help"}, "usage: flowctl pod-network"},
		invocation{[]string{"pod-network", "help"}, "usage: flowctl pod-network"})
	bad = append(bad,
		invocation{[]string{"dump", "--table", "nosuch"}, "usage: flowctl dump"},
		invocation{[]string{"dump", "--category", "hostport"}, "usage: flowctl dump"},
		invocation{[]string{"dump", "stray-argument"}, "usage: flowctl dump"},
		invocation{[]string{"dump", "--owner", "alpha"}, "usage: flowctl dump"},
		invocation{[]string{"dump", "--owner", "net/alpha", "--cookie", "0x1"}, "usage: flowctl dump"},
		invocation{[]string{"diff", "-o", "yaml"}, "usage: flowctl diff"},
		invocation{[]string{"trace", "blue/a"}, "usage: flowctl trace"},
		invocation{[]string{"trace", "--proto", "gre", "blue/a", "blue/b"}, "usage: flowctl trace"},
		invocation{[]string{"trace", "--port", "70000", "blue/a", "blue/b"}, "usage: flowctl trace"},
		invocation{[]string{"pod-network"}, "usage: flowctl pod-network"},
		invocation{[]string{"pod-network", "merge-projects", "a"}, "usage: flowctl pod-network"},
		invocation{[]string{"pod-network", "isolate-projects"}, "usage: flowctl pod-network"},
		invocation{[]string{"pod-network", "isolate-projects", "--timeout=soon", "a"}, "usage: flowctl pod-network"},
		invocation{nil, "usage: flowctl <command>"},
		invocation{[]string{"frobnicate"}, "usage: flowctl <command>"},
	)
	for _, h := range help {
		t.Run(strings.Join(h.args, " "), func(t *testing.T) {
			code, stdout, stderr := run(h.args...)
			if code != 0 || stderr != "" {
				t.Errorf("exit %d, stderr %q; want 0 and nothing on stderr", code, stderr)
			}
			if !strings.HasPrefix(stdout, h.synopsis) || !describes(stdout) || !strings.Contains(stdout, "\nflags:\n") {
				t.Errorf("help does not describe the command (synopsis, a description, flags):\n%s", stdout)
			}
		})
	}
	for _, b := range bad {
		t.Run(strings.Join(append([]string{"bad:"}, b.args...), " "), func(t *testing.T) {
			code, stdout, stderr := run(b.args...)
			if code != 2 || stdout != "" {
				t.Errorf("exit %d, stdout %q; want 2 and nothing on stdout", code, stdout)
			}
			if !strings.HasPrefix(stderr, "flowctl") || !strings.Contains(stderr, b.synopsis) {
				t.Errorf("stderr does not say what is wrong and how to call the command:\n%s", stderr)
			}
		})
	}
	// flowctl's own help lists every command.
	code, stdout, _ := run("--help")
	for _, c := range commands() {
		if code != 0 || !strings.Contains(stdout, "  "+c.name+" ") {
			t.Errorf("flowctl --help (exit %d) does not list %s:\n%s", code, c.name, stdout)
		}
	}
}

// describes reports whether a usage text has prose after its synopsis, before its flags.
func describes(usage string) bool {
	body, _, _ := strings.Cut(usage, "\nflags:\n")
	lines := strings.Split(body, "\n")
	for _, l := range lines[1:] {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "flowctl ") {
			return true
		}
	}
	return false
}

// The help of dump names every owner category from the registry, and no retired one.
func TestDumpCategoryHelpFromRegistry(t *testing.T) {
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"dump", "--help"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := out.String()
	if !strings.Contains(help, "-category") || !strings.Contains(help, categoryNames()) || strings.Contains(help, "hostport") {
		t.Errorf("dump --help does not list the categories %s (or lists a retired one):\n%s", categoryNames(), help)
	}
	// Networks' flows: their category, and an owner of either kind.
	if !strings.Contains(categoryNames(), reconcile.CategoryNetwork.String()) || !strings.Contains(help, "-owner") || !strings.Contains(help, "pod/NS/NAME@net1") {
		t.Errorf("dump --help does not say how to select a Network's or an attachment's flows:\n%s", help)
	}
}

// TestDropsHelpListsEveryCause: flowctl drops --help lists the drop registry's causes, every one.
func TestDropsHelpListsEveryCause(t *testing.T) {
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"drops", "--help"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, c := range pipeline.DropCauses {
		if !strings.Contains(out.String(), "\n  "+c.Words+"\n") {
			t.Errorf("drops --help does not list %s (%q):\n%s", c.Cause, c.Words, out.String())
		}
	}
}

// TestAgentSocketPath: flowctl looks for the local agent's debug socket where the agent serves it,
// debugapi.DefaultSocket of --rundir and --bridge, unless --socket names another.
func TestAgentSocketPath(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rundir", "/run/ovs", "--bridge", "br1"}, "/run/ovs/br1.ofsdn.sock"},
		{[]string{"--rundir", "/run/ovs"}, "/run/ovs/br0.ofsdn.sock"},
		{[]string{"--rundir", "/run/ovs", "--socket", "/tmp/agent.sock"}, "/tmp/agent.sock"},
	} {
		var n nodeFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		n.register(fs, true)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := n.socketPath(); got != tc.want {
			t.Errorf("%v: socket %q, want %q", tc.args, got, tc.want)
		}
		if tc.want != debugapi.DefaultSocket(n.rundir, n.bridge) && n.socket == "" {
			t.Errorf("%v: %q is not the agent's default socket", tc.args, tc.want)
		}
	}
}
