package flowctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ofsdn/ofsdn/ofswitch"
	"k8s.io/klog/v2"
)

const usage = `usage: flowctl <command> [flags]

commands:
  dump         print the bridge's flows grouped by table, with owners, rounds and counters
  diff         what differs between the flows and groups the agent wants and what the bridge holds, by owner
  trace        follow a packet from SRC to DST through the nodes' bridges and say why it is delivered or dropped
  pod-network  join-projects --to=A B..., isolate-projects A..., make-projects-global A...:
               change projects' VNIDs through the controller (as oc adm pod-network)
`

// Main dispatches flowctl's subcommands.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return nil
	}
	switch args[0] {
	case "dump":
		return RunDump(ctx, args[1:], stdout, stderr, DialBridge)
	case "diff":
		return RunDiff(ctx, args[1:], stdout, stderr)
	case "trace":
		return RunTrace(ctx, args[1:], stdout, stderr)
	case "pod-network":
		return RunPodNetwork(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// DialBridge opens an OpenFlow session for a one-shot command.
func DialBridge(ctx context.Context, socket, bridge string) (FlowSource, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := ofswitch.Dial(ctx, ofswitch.Config{Socket: socket, Bridge: bridge, Logger: klog.Background().V(4)})
	if err != nil {
		return nil, nil, err
	}
	return ofswitch.FlowsSwitch(s), func() { _ = s.Close() }, nil
}
