// Command sweep removes what killed test runs left behind: prefixed network namespaces, OVS and
// Kubernetes daemons found through PID files in prefixed temp dirs, real nodes' cgroups with what runs
// in them (containerd, kubelet, containers), and the dirs. It never touches anything a running test
// process owns (names carry the owner's PID).
package main

import (
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/lab"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	"github.com/ofsdn/ofsdn/lab/kubenode"
)

func main() {
	ovstest.Sweep()
	kubelab.Sweep()
	// Before the lab's sweep: a node's containers live in its cgroups, not only in its namespaces.
	kubenode.Sweep("")
	lab.Sweep("")
}
