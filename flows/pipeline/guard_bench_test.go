package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// BenchmarkTunnelGuardFlows reports what the tunnel guard and the tunnel source checks cost a node in
// flows, for clusters of 3, 100 and 1,000 nodes with 30 local pods, in multitenant mode with VXLAN and
// with encapsulation none: the guard's own flows (a fixed number: per tunnel port, one default and one
// masked match of every gateway) and the flows the source checks add per peer (its own address as a
// tunnel source in table 10, and in table 15 with an uplink port), against the node's whole render.
func BenchmarkTunnelGuardFlows(b *testing.B) {
	for _, encap := range []Encapsulation{EncapVXLAN, EncapNone} {
		for _, nodes := range []int{3, 100, 1000} {
			b.Run(fmt.Sprintf("%s/%d-nodes", encap, nodes), func(b *testing.B) {
				s := NodeState{Mode: ModeMultitenant, NodeName: "n0", NodeIP: netip.MustParseAddr("192.0.2.10"),
					LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"), ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/12")},
					Encapsulation: encap, Uplink: encap == EncapNone}
				for i := range 30 {
					ip := netip.AddrFrom4([4]byte{10, 128, 0, byte(2 + i)})
					s.Pods = append(s.Pods, PodState{Namespace: "ns", Name: fmt.Sprint("p", i), IP: ip,
						MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(2 + i)}, OFPort: uint32(3 + i), VNID: uint32(10 + i%3)})
				}
				for i := 1; i < nodes; i++ {
					subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + (2*i)>>8), byte(2 * i), 0}), 23)
					s.RemoteNodes = append(s.RemoteNodes, RemoteNode{Name: fmt.Sprint("n", i), OnSegment: true,
						NodeIP: netip.AddrFrom4([4]byte{192, 0, byte(2 + i>>8), byte(i)}), Subnet: subnet})
				}
				var total, guard, sourceChecks int
				for b.Loop() {
					owners, err := Render(s)
					if err != nil {
						b.Fatal(err)
					}
					total, guard, sourceChecks = 0, len(owners[TunnelGuardOwner].Flows), 0
					for _, st := range owners {
						total += len(st.Flows)
					}
					for _, n := range s.RemoteNodes {
						for _, f := range owners[NodeOwner(n.Name)].Flows {
							src, ok := f.Match.Get(FieldIPSrc)
							if (f.Table == TableTunnelIngress || f.Table == TableUplinkIngress) && ok && !src.Masked && src.Value == ipValue(n.NodeIP) {
								sourceChecks++
							}
						}
					}
				}
				added := guard + sourceChecks
				b.ReportMetric(float64(total), "flows/node")
				b.ReportMetric(float64(guard), "guard-flows")
				b.ReportMetric(float64(sourceChecks)/float64(max(nodes-1, 1)), "added-flows/peer")
				b.ReportMetric(100*float64(added)/float64(total-added), "added-%")
			})
		}
	}
}

func ipValue(a netip.Addr) uint64 { v, _ := IPv4Value(a); return v }
