// Command ofsdn-controller is ofsdn's control plane (a Deployment of two replicas; one leads). See
// controller/ and internal/cli.
package main

import (
	"os"

	"github.com/ofsdn/ofsdn/internal/cli"
)

func main() { os.Exit(cli.Controller(os.Args[1:])) }
