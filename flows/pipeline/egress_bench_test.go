package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// BenchmarkEgressFlows reports what egress costs a node in flows: 3, 100 and 1,000 nodes, 30 local
// pods of which 10 are in a namespace with an egress IP (held elsewhere) and 10 in one with a 10-rule
// EgressNetworkPolicy, in multitenant mode with VXLAN and with encapsulation none. The plumbing grows
// with the nodes (their addresses are inside the cluster, and the way back from each), the namespaces'
// owners with their local pods and rules; a node that holds the IP has one flow more.
func BenchmarkEgressFlows(b *testing.B) {
	for _, encap := range []Encapsulation{EncapVXLAN, EncapNone} {
		for _, nodes := range []int{3, 100, 1000} {
			b.Run(fmt.Sprintf("%s/%d-nodes", encap, nodes), func(b *testing.B) {
				s := NodeState{Mode: ModeMultitenant, NodeName: "n0", NodeIP: netip.MustParseAddr("192.0.2.10"),
					LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"), ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/12")},
					Encapsulation: encap, Uplink: encap == EncapNone, GatewayMAC: net.HardwareAddr{0x0a, 0, 0, 0, 0, 1}}
				namespaces := []string{"eip", "fw", "plain"}
				for i := range 30 {
					ip := netip.AddrFrom4([4]byte{10, 128, 0, byte(2 + i)})
					s.Pods = append(s.Pods, PodState{Namespace: namespaces[i%3], Name: fmt.Sprint("p", i), IP: ip,
						MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(2 + i)}, OFPort: uint32(3 + i), VNID: uint32(10 + i%3)})
				}
				for i := 1; i < nodes; i++ {
					subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + (2*i)>>8), byte(2 * i), 0}), 23)
					s.RemoteNodes = append(s.RemoteNodes, RemoteNode{Name: fmt.Sprint("n", i), OnSegment: true,
						NodeIP: netip.AddrFrom4([4]byte{192, 0, byte(2 + i>>8), byte(i)}), Subnet: subnet})
				}
				fw := &EgressFirewall{Policy: "fw"}
				for r := range 10 {
					fw.Rules = append(fw.Rules, EgressRule{Allow: r%2 == 0, Dsts: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(r * 8)}), 29)}})
				}
				plain := s
				s.Egress = EgressState{ServiceNetwork: netip.MustParsePrefix("172.30.0.0/16"), Namespaces: []EgressNamespace{
					{Name: "eip", IPs: []netip.Addr{netip.MustParseAddr("198.51.100.200")}}, {Name: "fw", Firewall: fw}}}
				var with, without, base, perNamespace int
				for b.Loop() {
					count := func(st NodeState) (int, map[reconcile.Owner]reconcile.OwnerState) {
						owners, err := Render(st)
						if err != nil {
							b.Fatal(err)
						}
						n := 0
						for _, o := range owners {
							n += len(o.Flows)
						}
						return n, owners
					}
					without, _ = count(plain)
					var owners map[reconcile.Owner]reconcile.OwnerState
					with, owners = count(s)
					base = len(owners[EgressOwner].Flows)
					perNamespace = len(owners[EgressNamespaceOwner("eip")].Flows) + len(owners[EgressNamespaceOwner("fw")].Flows) +
						len(owners[EgressFirewallOwner("fw", "fw")].Flows)
				}
				b.ReportMetric(float64(without), "flows-without")
				b.ReportMetric(float64(with-without), "added-flows")
				b.ReportMetric(float64(base), "plumbing-flows")
				b.ReportMetric(float64(perNamespace), "namespace-flows")
				b.ReportMetric(100*float64(with-without)/float64(without), "added-%")
			})
		}
	}
}
