// Command ofsdn-multicall is ofsdn-agent, ofsdn-controller and flowctl in one binary: it runs the
// command it is named as (the image installs it under the three names as hard links), or the one its
// first argument names. One binary shares client-go between the three, which keeps the image small.
// See internal/cli.
package main

import (
	"os"

	"github.com/ofsdn/ofsdn/internal/cli"
)

func main() { os.Exit(cli.Dispatch(os.Args, os.Stderr)) }
