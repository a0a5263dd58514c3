package flowctl

import (
	"context"
	"time"

	"github.com/ofsdn/ofsdn/ofswitch"
	"k8s.io/klog/v2"
)

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
