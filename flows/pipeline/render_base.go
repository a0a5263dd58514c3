package pipeline

import (
	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// PipelineVersion identifies the shape of the flows ofsdn renders. It is stamped into table 253; an
// agent that finds another version on its bridge rebuilds the bridge in one bundle instead of
// diffing against flows it no longer understands. TestPipelineGolden fails when rendering changes
// without a bump.
const PipelineVersion uint32 = 15

// podIPv6DropPriority is table 20's unsampled IPv6 drop: above the sampled miss (priority 0, anti-spoofing),
// below a pod's own flows (100), which match IPv4 and ARP only.
const podIPv6DropPriority = 1

// Fixed OpenFlow port numbers of the node's own ports (requested through OVSDB's ofport_request).
const (
	PortVXLAN uint32 = 1
	PortTun0  uint32 = 2
)

// RenderBase renders the flows every node has whatever its pods: the classifier's dispatch by ingress
// port, every table's default flow, and the version note.
func RenderBase() []Flow {
	out := []Flow{
		F(TableClassifier, 200, M(InPort(PortVXLAN)), Goto{Table: TableTunnelIngress}),
		F(TableClassifier, 200, M(InPort(PortTun0)), Goto{Table: TableHostIngress}),
		// Host traffic is global (VNID 0: registers start zeroed, so reg0 needs no load). Its ARP
		// goes straight to the ARP table; the rest takes the table's default on to conntrack.
		F(TableHostIngress, 200, M(ARP...), Goto{Table: TableARP}),
		// IPv6 from a pod (its kernel's router solicitations and MLD reports, every few seconds): ofsdn
		// carries IPv4 only, so it is dropped here, above table 20's sampled miss, and not sampled: it
		// says nothing about anyone's policy and would drown the drop records (drops.go).
		F(TablePodIngress, podIPv6DropPriority, M(IPv6...)),
		// Never send a packet that came from the tunnel back into it.
		F(TableTunnelEgress, 300, M(InPort(PortVXLAN))),
		// Deliver: the routing and ARP stages leave the output port in reg2.
		F(TableOutput, 100, M(), OutputReg{Src: Whole(RegOutPort)}),
	}
	out = append(out, DefaultFlows()...)
	return append(out, VersionFlow(PipelineVersion))
}

// VersionOf reads the pipeline version from the version note (reconcile.Config.VersionOf).
func VersionOf(f Flow) (uint32, bool) {
	if f.Table != TableVersion || len(f.Actions) != 1 {
		return 0, false
	}
	n, ok := f.Actions[0].(Note)
	if !ok {
		return 0, false
	}
	return n.Uint32()
}
