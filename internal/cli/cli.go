// Package cli holds the command lines of ofsdn's Kubernetes-facing binaries, so that one executable can
// carry several of them. The image ships ofsdn-agent, ofsdn-controller and flowctl as three names (hard
// links) of one multi-call binary, cmd/ofsdn-multicall: the three share one copy of client-go, which
// makes the image about a third of the size of three separate binaries. cmd/ofsdn-agent,
// cmd/ofsdn-controller and cmd/flowctl build each command on its own for development and the lab.
package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
)

// Commands are the multi-call binary's commands, by the name it runs under.
var Commands = map[string]func(args []string) int{
	"ofsdn-agent":      Agent,
	"ofsdn-controller": Controller,
	"flowctl":          Flowctl,
}

// Names lists the commands in a stable order.
func Names() []string {
	names := make([]string, 0, len(Commands))
	for n := range Commands {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Dispatch runs the command that argv[0] names (busybox style: the binary runs under one of its hard
// links), or else the one argv[1] names (`ofsdn-multicall flowctl dump`), and returns its exit code.
func Dispatch(argv []string, stderr io.Writer) int {
	if len(argv) > 0 {
		if cmd, ok := Commands[filepath.Base(argv[0])]; ok {
			return cmd(argv[1:])
		}
	}
	if len(argv) > 1 {
		if cmd, ok := Commands[argv[1]]; ok {
			return cmd(argv[2:])
		}
	}
	self := "ofsdn-multicall"
	if len(argv) > 0 {
		self = filepath.Base(argv[0])
	}
	fmt.Fprintf(stderr, "usage: %s COMMAND [ARGS...], or run it under a COMMAND's name\ncommands: %s\n", self, strings.Join(Names(), ", "))
	return 2
}
