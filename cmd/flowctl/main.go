// Command flowctl inspects an ofsdn bridge and administers pod networks. See flowctl/ and internal/cli.
package main

import (
	"os"

	"github.com/ofsdn/ofsdn/internal/cli"
)

func main() { os.Exit(cli.Flowctl(os.Args[1:])) }
