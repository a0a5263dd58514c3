package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestDispatchPicksTheCommandByNameThenByFirstArgument(t *testing.T) {
	var ran string
	var gotArgs []string
	saved := Commands
	t.Cleanup(func() { Commands = saved })
	Commands = map[string]func([]string) int{}
	for _, name := range []string{"ofsdn-agent", "ofsdn-controller", "flowctl"} {
		Commands[name] = func(args []string) int { ran, gotArgs = name, args; return 7 }
	}
	for _, tc := range []struct {
		argv     []string
		wantCmd  string
		wantArgs []string
		wantCode int
	}{
		{[]string{"/usr/local/bin/ofsdn-agent", "--node-name=n1"}, "ofsdn-agent", []string{"--node-name=n1"}, 7},
		{[]string{"ofsdn-controller"}, "ofsdn-controller", []string{}, 7},
		{[]string{"./flowctl", "dump", "--table=0"}, "flowctl", []string{"dump", "--table=0"}, 7},
		{[]string{"/bin/ofsdn-multicall", "flowctl", "dump"}, "flowctl", []string{"dump"}, 7},
		// argv[0] wins over a first argument that happens to be a command's name.
		{[]string{"/bin/flowctl", "ofsdn-agent"}, "flowctl", []string{"ofsdn-agent"}, 7},
		{[]string{"/bin/ofsdn-multicall"}, "", nil, 2},
		{[]string{"/bin/ofsdn-multicall", "kube-proxy"}, "", nil, 2},
		{nil, "", nil, 2},
	} {
		ran, gotArgs = "", nil
		var stderr bytes.Buffer
		code := Dispatch(tc.argv, &stderr)
		if code != tc.wantCode || ran != tc.wantCmd || !slices.Equal(gotArgs, tc.wantArgs) {
			t.Errorf("Dispatch(%q) ran %q%q → %d, want %q%q → %d", tc.argv, ran, gotArgs, code, tc.wantCmd, tc.wantArgs, tc.wantCode)
		}
		if tc.wantCode == 2 && !strings.Contains(stderr.String(), "flowctl, ofsdn-agent, ofsdn-controller") {
			t.Errorf("Dispatch(%q): usage does not list the commands: %q", tc.argv, stderr.String())
		}
	}
}

func TestEveryCommandIsListed(t *testing.T) {
	if got, want := Names(), []string{"flowctl", "ofsdn-agent", "ofsdn-controller"}; !slices.Equal(got, want) {
		t.Errorf("Names() = %q, want %q", got, want)
	}
}
