package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// BenchmarkNetworkFlows reports what Networks cost a node in flows and render time: the flows of one
// attachment (a pod's interface), of one Network per node that has a subnet of it (with and without a
// cross-talk peer), and the time to render a node of 100 pods with 3 interfaces each where one
// attachment changed, against the same node rendered from scratch.
func BenchmarkNetworkFlows(b *testing.B) {
	for _, nodes := range []int{3, 100} {
		b.Run(fmt.Sprintf("%d-nodes", nodes), func(b *testing.B) {
			s := NodeState{Mode: ModeNetworkPolicy, NodeName: "n0", NodeIP: netip.MustParseAddr("192.0.2.10"),
				LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"), ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/12")}}
			red := NetworkState{Name: "red", VNI: 0xfff001, CIDR: netip.MustParsePrefix("10.200.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.200.0.0/24"),
				CrossTalk: []string{"green"}}
			blue := NetworkState{Name: "blue", VNI: 0xfff002, CIDR: netip.MustParsePrefix("10.200.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.200.0.0/24")}
			green := NetworkState{Name: "green", VNI: 0xfff003, CIDR: netip.MustParsePrefix("10.201.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.201.0.0/24"),
				CrossTalk: []string{"red"}}
			for i := 1; i < nodes; i++ {
				ip := netip.AddrFrom4([4]byte{192, 0, byte(2 + i>>8), byte(i)})
				for _, n := range []*NetworkState{&red, &blue, &green} {
					sub := netip.PrefixFrom(netip.AddrFrom4([4]byte{n.CIDR.Addr().As4()[0], n.CIDR.Addr().As4()[1], byte(i), 0}), 24)
					n.Remotes = append(n.Remotes, NetworkRemote{Node: fmt.Sprint("n", i), NodeIP: ip, Subnet: sub})
				}
			}
			s.Networks = []NetworkState{blue, green, red}
			for i := range 100 {
				ip := netip.AddrFrom4([4]byte{10, 128, 0, byte(2 + i)})
				s.Pods = append(s.Pods, PodState{Namespace: "ns", Name: fmt.Sprint("p", i), IP: ip, MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, byte(2 + i)}, OFPort: uint32(3 + 3*i)})
				for j, n := range []NetworkState{red, blue} {
					nip := netip.AddrFrom4([4]byte{10, 200, 0, byte(2 + i)})
					s.Attachments = append(s.Attachments, AttachmentState{Namespace: "ns", Name: fmt.Sprint("p", i), Interface: fmt.Sprint("net", j+1),
						Network: n.Name, VNI: n.VNI, IP: nip, MAC: net.HardwareAddr{0x0a, 0x58, 10, 200, 0, byte(2 + i)}, OFPort: uint32(4 + 3*i + j)})
				}
			}
			owners, err := Render(s)
			if err != nil {
				b.Fatal(err)
			}
			att := len(owners[AttachmentOwner("ns", "p0", "net1")].Flows)
			netBlue, netRed := len(owners[NetworkOwner("blue")].Flows), len(owners[NetworkOwner("red")].Flows)
			var r Renderer
			if _, _, err := r.Render(s); err != nil {
				b.Fatal(err)
			}
			for i := 0; b.Loop(); i++ {
				s.Attachments = append([]AttachmentState(nil), s.Attachments...)
				s.Attachments[0].IP = netip.AddrFrom4([4]byte{10, 200, 1, byte(i)})
				if _, _, err := r.Render(s); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(att), "flows/attachment")
			b.ReportMetric(float64(netBlue-3)/float64(max(nodes-1, 1)), "network-flows/remote-node")
			b.ReportMetric(float64(netRed-netBlue)/float64(max(nodes-1, 1)), "cross-talk-flows/remote-node")
			b.ReportMetric(float64(netBlue), "network-flows")
		})
	}
}
