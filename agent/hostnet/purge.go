package hostnet

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/unixctl"
)

// Why the agent purges ovs-vswitchd's datapath flow cache after NetworkPolicy changes, on the
// userspace (netdev) datapath only:
//
// The lab's NetworkPolicy suite found UDP verdicts that stayed wrong for as long as it looked (11 s,
// 8 probe rounds, every round a new source port) after a policy change, both ways: allowed where the
// new policy denies, denied where it allows. br0's OpenFlow tables were right (flowctl dump; ofproto/
// trace gave the policy's verdict), and the datapath still held megaflows translated before the change
// (dpctl/dump-flows: ct(commit),tnl_push for a pair the policy now isolates, still being hit); after
// `revalidator/purge` every cell matched the model at once. So ovs-vswitchd 3.1's revalidators left
// those flows in place on the netdev datapath. Until that is understood in OVS, the agent purges the
// cache once the policy state it synced has changed: every later packet is translated afresh against
// the tables now installed (a slow-path cost for the node's traffic for a moment, only when policies
// or the set of pods they select change). The kernel datapath was not seen to need it and is left
// alone.

// policyFingerprint is a hash of everything in st that decides NetworkPolicy verdicts: the policies
// as resolved for this node and which pods are isolated; and the egress firewalls' rules
// (EgressNetworkPolicy verdicts stay as cached just the same).
func policyFingerprint(st pipeline.NodeState) uint64 {
	h := fnv.New64a()
	fw := false
	for _, ns := range st.Egress.Namespaces {
		if ns.Firewall != nil {
			fmt.Fprintf(h, "|egress firewall %s %+v", ns.Name, *ns.Firewall)
			fw = true
		}
	}
	if st.Mode != pipeline.ModeNetworkPolicy {
		if !fw {
			return 0
		}
		return h.Sum64()
	}
	fmt.Fprintf(h, "%+v", st.Policies)
	for _, p := range st.Pods {
		fmt.Fprintf(h, "|%s/%s %d %s %v %v", p.Namespace, p.Name, p.OFPort, p.IP, p.IngressIsolated, p.EgressIsolated)
	}
	return h.Sum64()
}

// DatapathPurger purges the datapath flow cache when the policy fingerprint of a synced state differs
// from the last one it saw (the first state only records it: nothing was cached under ofsdn's older
// policies in a fresh datapath, and after a restart the flows were re-translated at reconnection).
type DatapathPurger struct {
	purge func(ctx context.Context) error
	seen  bool
	last  uint64
}

func NewDatapathPurger(ovsRunDir string) *DatapathPurger {
	ctl := unixctl.New(ovsRunDir, "ovs-vswitchd")
	return &DatapathPurger{purge: func(ctx context.Context) error {
		_, err := ctl.Call(ctx, "revalidator/purge")
		return err
	}}
}

// synced is called with each state hostSync carries; it reports whether it purged.
func (d *DatapathPurger) Synced(ctx context.Context, st pipeline.NodeState) (bool, error) {
	fp := policyFingerprint(st)
	first := !d.seen
	d.seen = true
	if first || fp == d.last {
		d.last = fp
		return false, nil
	}
	if err := d.purge(ctx); err != nil {
		return false, fmt.Errorf("purge the datapath flow cache after a policy change: %w", err)
	}
	d.last = fp
	return true, nil
}
