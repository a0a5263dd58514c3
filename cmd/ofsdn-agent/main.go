// Command ofsdn-agent is ofsdn's node agent (a DaemonSet pod with hostNetwork). See agent/ and
// internal/cli.
package main

import (
	"os"

	"github.com/ofsdn/ofsdn/internal/cli"
)

func main() { os.Exit(cli.Agent(os.Args[1:])) }
