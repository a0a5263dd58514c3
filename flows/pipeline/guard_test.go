package pipeline

import (
	"net"
	"net/netip"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// offline renders s and returns an evaluator over its flows, every flow stamped with its owner's cookie.
func offline(t *testing.T, s NodeState) *trace.Bridge {
	t.Helper()
	owners, err := Render(s)
	if err != nil {
		t.Fatal(err)
	}
	var flows []Flow
	var groups []GroupEntry
	for o, st := range owners {
		for _, f := range st.Flows {
			f.Cookie = uint64(reconcile.MakeCookie(1, o))
			flows = append(flows, f)
		}
		groups = append(groups, st.Groups...)
	}
	return trace.NewBridge(flows, groups)
}

// TestTunnelGuard follows packets through every mode's pipeline offline: no pod datagram reaches a
// tunnel port outside the pod network (own node, remote node, any gateway, through a Service), and the
// tunnel guard names itself as the owner of the drop; the same datagrams to another port, to pods on
// the tunnel's port and replies go where routing sends them. Tunnelled traffic from a node is accepted
// from its subnet and its own address only.
func TestTunnelGuard(t *testing.T) {
	const tunnel, other = 4789, 4790
	base := sampleNodeState()
	nodeIP, peer := base.NodeIP, base.RemoteNodes[0]
	localGW, remoteGW := Gateway(base.LocalSubnet), Gateway(peer.Subnet)
	remotePod := netip.MustParseAddr("10.128.2.7")
	outside := netip.MustParseAddr("203.0.113.9")
	toNodes := netip.MustParseAddr("172.30.0.99")
	web := base.Pods[0] // a/web, VNID 11, port 3
	base.Services = append(base.Services, ServiceState{Namespace: "a", Name: "to-the-nodes", ClusterIP: toNodes,
		Ports: []ServicePort{{Name: "vxlan", Protocol: IPProtoUDP, Port: tunnel, Endpoints: []Endpoint{
			{IP: peer.NodeIP, Port: tunnel, Ready: true, Serving: true}}}}})
	fromPod := func(dst netip.Addr, dport uint16) trace.Packet {
		return trace.Packet{InPort: web.OFPort, EthSrc: trace.MAC(web.MAC), EthDst: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 1}),
			Proto: "udp", IPSrc: web.IP, IPDst: dst, SrcPort: 40000, DstPort: dport}
	}
	fromPeer := func(src, dst netip.Addr) trace.Packet {
		return trace.Packet{InPort: PortVXLAN, TunID: 11, TunSrc: peer.NodeIP, TunDst: nodeIP, EthSrc: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 2, 7}),
			EthDst: trace.MAC(web.MAC), Proto: "udp", IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: other}
	}
	guardCookie := uint64(reconcile.MakeCookie(1, TunnelGuardOwner))
	type fate struct {
		out    uint32 // 0: dropped
		dropAt TableID
		guard  bool // dropped by the tunnel guard's flow
	}
	tunnelled := fate{out: PortVXLAN}
	toHost := fate{out: PortTun0}
	guarded := fate{dropAt: TableRouting, guard: true}
	cases := []struct {
		name  string
		p     trace.Packet
		reply bool // a reply of a connection the other side opened
		want  fate
	}{
		{"to the own node's tunnel port", fromPod(nodeIP, tunnel), false, guarded},
		{"to a remote node's tunnel port", fromPod(peer.NodeIP, tunnel), false, guarded},
		{"to the local gateway's tunnel port", fromPod(localGW, tunnel), false, guarded},
		{"to a remote gateway's tunnel port", fromPod(remoteGW, tunnel), false, guarded},
		{"to an outside address's tunnel port", fromPod(outside, tunnel), false, guarded},
		{"through a Service to a node's tunnel port", fromPod(toNodes, tunnel), false, guarded},
		{"to a remote node's other port", fromPod(peer.NodeIP, other), false, toHost},
		{"to the local gateway's other port", fromPod(localGW, other), false, toHost},
		{"to a remote pod's tunnel port", fromPod(remotePod, tunnel), false, tunnelled},
		{"a reply to a node's tunnel port", fromPod(peer.NodeIP, tunnel), true, toHost},
		{"tunnelled from the peer's subnet", fromPeer(remotePod, web.IP), false, fate{out: web.OFPort}},
		{"tunnelled from the peer's own address", fromPeer(peer.NodeIP, web.IP), false, fate{out: web.OFPort}},
		{"tunnelled from a third node's subnet", fromPeer(netip.MustParseAddr("10.128.4.3"), web.IP), false, fate{dropAt: TableTunnelIngress}},
		{"tunnelled from the receiving node's subnet", fromPeer(netip.MustParseAddr("10.128.0.9"), web.IP), false, fate{dropAt: TableTunnelIngress}},
		{"tunnelled from outside", fromPeer(outside, web.IP), false, fate{dropAt: TableTunnelIngress}},
	}
	for _, mode := range []Mode{ModeSubnet, ModeMultitenant, ModeNetworkPolicy} {
		s := base
		s.Mode = mode
		s.Policies = nil // policy is not what is tested here
		b := offline(t, s)
		for _, tc := range cases {
			t.Run(string(mode)+"/"+tc.name, func(t *testing.T) {
				p := tc.p
				if mode == ModeMultitenant && p.InPort == PortVXLAN {
					p.TunID = 0 // VNID 0 reaches web in any mode: only the source check decides
				}
				var path *trace.Path
				var err error
				if tc.reply {
					path, err = b.Evaluate(p, []trace.CtFlags{{"trk", "est", "rpl"}})
				} else {
					path, _, err = trace.Run(t.Context(), trace.Offline{Bridge: b}, p, nil)
				}
				if err != nil {
					t.Fatal(err)
				}
				last, _ := path.Last()
				if tc.want.out == 0 {
					if !path.Dropped() || last.Table != tc.want.dropAt {
						t.Fatalf("want a drop in table %d; outputs %v, last step %+v\n%v", tc.want.dropAt, path.Outputs, last, path.Key())
					}
					if (last.Cookie == guardCookie) != tc.want.guard {
						t.Errorf("dropped by the flow of cookie %#x (%s); the guard's is %#x", last.Cookie, last.Match, guardCookie)
					}
					return
				}
				if len(path.Outputs) != 1 || path.Outputs[0].Port != tc.want.out {
					t.Fatalf("outputs %+v, want port %d\n%v", path.Outputs, tc.want.out, path.Key())
				}
			})
		}
	}
}

// TestTunnelGuardCoversEveryGateway: the masked gateway match covers the first address of every node
// subnet of the cluster network's length, and nothing else of it: checked address by address.
func TestTunnelGuardCoversEveryGateway(t *testing.T) {
	s := NodeState{ClusterNetworks: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14"), netip.MustParsePrefix("172.16.0.0/16")},
		LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"),
		RemoteNodes: []RemoteNode{{Subnet: netip.MustParsePrefix("10.128.6.0/23")}, {Subnet: netip.MustParsePrefix("172.16.4.0/24")},
			{Subnet: netip.MustParsePrefix("192.168.7.0/24")}}} // outside every cluster network
	matches := gatewayMatches(s)
	covered := func(a netip.Addr) bool {
		v, _ := IPv4Value(a)
		for _, m := range matches {
			mask := m.Mask
			if !m.Masked {
				mask = 0xffffffff
			}
			if v&mask == m.Value {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		network netip.Prefix
		bits    int
	}{{netip.MustParsePrefix("10.128.0.0/14"), 23}, {netip.MustParsePrefix("172.16.0.0/16"), 24}} {
		for a := tc.network.Addr(); tc.network.Contains(a); a = a.Next() {
			subnet := netip.PrefixFrom(a, tc.bits).Masked()
			if want := a == Gateway(subnet); covered(a) != want {
				t.Fatalf("%s: covered %v, want %v (gateway of %s: %s)", a, covered(a), want, subnet, Gateway(subnet))
			}
		}
	}
	for a, want := range map[string]bool{"192.168.7.1": true, "192.168.7.2": false, "10.132.0.1": false, "172.17.0.1": false} {
		if covered(netip.MustParseAddr(a)) != want {
			t.Errorf("%s: covered %v, want %v", a, !want, want)
		}
	}
}
