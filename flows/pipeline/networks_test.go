package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/ofsdn/ofsdn/flows/trace"
)

// netModel is the tests' own account of what Networks promise, from the API's words rather than the
// flows: a pod reaches its own network's addresses and those of a network that talks to its own (both
// name each other, addresses apart); an address is delivered where a pod of that network has it (here,
// or through the tunnel to the node whose subnet of the network holds it, tun_id = that network's VNI);
// nothing else is reached: not another network at the same address, not the cluster network, not the
// node.
type netModel struct {
	nets  map[string]NetworkState
	local map[string][]AttachmentState // by network
}

func newNetModel(s NodeState) netModel {
	m := netModel{nets: map[string]NetworkState{}, local: map[string][]AttachmentState{}}
	for _, n := range s.Networks {
		m.nets[n.Name] = n
	}
	for _, a := range s.Attachments {
		m.local[a.Network] = append(m.local[a.Network], a)
	}
	return m
}

func (m netModel) talk(a, b string) bool {
	na, nb := m.nets[a], m.nets[b]
	return a != b && slices.Contains(na.CrossTalk, b) && slices.Contains(nb.CrossTalk, a) && !na.CIDR.Overlaps(nb.CIDR)
}

// fate of a packet: out 0 is a drop; tunnelled packets name the node and VNI.
type netFate struct {
	out    uint32
	ethDst string
	tunID  uint64
	tunDst netip.Addr
}

// from says where a packet from a pod on network src to dst goes.
func (m netModel) from(src string, dst netip.Addr) netFate {
	for name, n := range m.nets {
		if (name != src && !m.talk(src, name)) || !n.CIDR.Contains(dst) {
			continue
		}
		return m.on(name, dst)
	}
	return netFate{}
}

// on says where a packet on network name to dst goes: a local attachment, another node, or nowhere.
func (m netModel) on(name string, dst netip.Addr) netFate {
	for _, a := range m.local[name] {
		if a.IP == dst {
			return netFate{out: a.OFPort, ethDst: a.MAC.String()}
		}
	}
	for _, r := range m.nets[name].Remotes {
		if r.Subnet.Contains(dst) {
			return netFate{out: PortVXLAN, tunID: uint64(m.nets[name].VNI), tunDst: r.NodeIP}
		}
	}
	return netFate{}
}

// TestNetworksReachability follows packets offline through every mode's pipeline, from each of the
// sample node's attachments (two networks share 10.200.0.0/16; green talks to red) and from a cluster
// pod, to every kind of address: pods of the same network here and on other nodes, the same address
// on another network, the cross-talk peer, the cluster network, the node and its gateways, outside.
// Every fate comes from netModel.
func TestNetworksReachability(t *testing.T) {
	base := sampleNodeState()
	m := newNetModel(base)
	dsts := []string{"10.200.1.5", "10.200.0.5", "10.200.0.6", "10.200.0.9", "10.200.1.9", "10.200.2.9", "10.201.0.9",
		"10.201.3.5", "10.128.2.7", "10.128.0.3", "192.0.2.11", "192.0.2.12", "10.200.1.1", "10.200.0.1", "203.0.113.9", "172.30.0.10"}
	for _, mode := range []Mode{ModeSubnet, ModeMultitenant, ModeNetworkPolicy} {
		s := base
		s.Mode = mode
		b := offline(t, s)
		reached := 0
		for _, a := range s.Attachments {
			for _, d := range dsts {
				dst := netip.MustParseAddr(d)
				if dst == a.IP {
					continue // a pod's own address never leaves it
				}
				want := m.from(a.Network, dst)
				p := trace.Packet{InPort: a.OFPort, EthSrc: trace.MAC(a.MAC), EthDst: trace.MAC(NetworkGatewayMAC(a.VNI)),
					Proto: "udp", IPSrc: a.IP, IPDst: dst, SrcPort: 40000, DstPort: 5000}
				t.Run(fmt.Sprintf("%s/%s@%s(%s)->%s", mode, a.Name, a.Interface, a.Network, d), func(t *testing.T) {
					checkNetFate(t, b, p, want)
				})
				if want.out != 0 {
					reached++
				}
			}
			// Nor does the cluster network reach a network, even at an address it routes.
			web := s.Pods[0]
			p := trace.Packet{InPort: web.OFPort, EthSrc: trace.MAC(web.MAC), EthDst: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 1}),
				Proto: "udp", IPSrc: web.IP, IPDst: a.IP, SrcPort: 40000, DstPort: 5000}
			path, _, err := trace.Run(t.Context(), trace.Offline{Bridge: b}, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range path.Outputs {
				if o.Port == a.OFPort {
					t.Errorf("%s: the cluster pod a/web reached %s's %s", mode, a.Name, a.Interface)
				}
			}
		}
		if reached < 8 {
			t.Fatalf("%s: only %d packets are delivered: the matrix proves little", mode, reached)
		}
	}
}

func checkNetFate(t *testing.T, b *trace.Bridge, p trace.Packet, want netFate) {
	t.Helper()
	path, _, err := trace.Run(t.Context(), trace.Offline{Bridge: b}, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want.out == 0 {
		if !path.Dropped() {
			t.Fatalf("want a drop; outputs %+v\n%v", path.Outputs, path.Key())
		}
		return
	}
	if len(path.Outputs) != 1 || path.Outputs[0].Port != want.out {
		t.Fatalf("outputs %+v, want port %d\n%v", path.Outputs, want.out, path.Key())
	}
	got := path.Outputs[0].Fields
	if want.ethDst != "" && got.EthDst != want.ethDst {
		t.Errorf("delivered with eth_dst %s, want the pod's %s", got.EthDst, want.ethDst)
	}
	if want.out == PortVXLAN && (got.TunID != want.tunID || got.TunDst != want.tunDst) {
		t.Errorf("tunnelled with tun_id %#x to %s, want %#x to %s", got.TunID, got.TunDst, want.tunID, want.tunDst)
	}
}

// TestNetworksTunnelIngress: what another node tunnels with a network's VNI is delivered on that
// network only, from that node's subnet of it or of a network that talks to it, and only to a pod of
// that network; a VNI of the networks' range that no network here has is dropped, never taken for the
// cluster network's (whose pods it would reach from a cluster source in flat modes).
func TestNetworksTunnelIngress(t *testing.T) {
	base := sampleNodeState()
	m := newNetModel(base)
	node2 := netip.MustParseAddr("192.0.2.12")
	node3 := netip.MustParseAddr("192.0.2.13")
	// nodeNetworkOf says which network's subnet of a node holds src ("" none): the model of what the
	// node may send from.
	nodeNetworkOf := func(node, src netip.Addr) []string {
		var out []string
		for name, n := range m.nets {
			for _, r := range n.Remotes {
				if r.NodeIP == node && r.Subnet.Contains(src) {
					out = append(out, name)
				}
			}
		}
		return out
	}
	vnis := []uint32{0xfff001, 0xfff002, 0xfff003, 0xfff0ff, 0xffffff, 11, 0}
	srcs := []string{"10.200.0.9", "10.200.1.9", "10.200.2.9", "10.201.0.9", "10.128.2.7", "192.0.2.12"}
	dsts := []netip.Addr{base.Pods[0].IP} // a cluster pod: a network's VNI never reaches it
	for _, a := range base.Attachments {
		dsts = append(dsts, a.IP)
	}
	for _, mode := range []Mode{ModeSubnet, ModeMultitenant, ModeNetworkPolicy} {
		s := base
		s.Mode = mode
		b := offline(t, s)
		delivered := 0
		for _, vni := range vnis {
			for _, node := range []netip.Addr{node2, node3} {
				for _, src := range srcs {
					for _, dst := range dsts {
						srcAddr := netip.MustParseAddr(src)
						want := netFate{}
						if IsNetworkVNI(vni) {
							var onNet string
							for name, n := range m.nets {
								if n.VNI == vni {
									onNet = name
								}
							}
							for _, from := range nodeNetworkOf(node, srcAddr) {
								if onNet != "" && (from == onNet || m.talk(from, onNet)) {
									if f := m.on(onNet, dst); f.out != PortVXLAN { // never back into the tunnel
										want = f
									}
								}
							}
						}
						p := trace.Packet{InPort: PortVXLAN, TunID: uint64(vni), TunSrc: node, TunDst: s.NodeIP,
							EthSrc: trace.MAC(net.HardwareAddr{0x0a, 0x58, 1, 2, 3, 4}), EthDst: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 200, 1, 5}),
							Proto: "udp", IPSrc: srcAddr, IPDst: dst, SrcPort: 40000, DstPort: 5000}
						if !IsNetworkVNI(vni) {
							// The cluster network's own rules decide these; only a network's pod must stay unreached.
							path, _, err := trace.Run(t.Context(), trace.Offline{Bridge: b}, p, nil)
							if err != nil {
								t.Fatal(err)
							}
							for _, o := range path.Outputs {
								for _, a := range s.Attachments {
									if o.Port == a.OFPort {
										t.Errorf("%s: VNI %d from %s (%s) reached %s@%s", mode, vni, node, src, a.Name, a.Interface)
									}
								}
							}
							continue
						}
						t.Run(fmt.Sprintf("%s/vni=%#x/%s/%s->%s", mode, vni, node, src, dst), func(t *testing.T) {
							checkNetFate(t, b, p, want)
						})
						if want.out != 0 {
							delivered++
						}
					}
				}
			}
		}
		if delivered < 4 {
			t.Fatalf("%s: only %d tunnelled packets are delivered: the matrix proves little", mode, delivered)
		}
	}
}

// TestNetworkPeersAreSymmetric: cross-talk needs both sides to name each other and addresses apart; a
// network whose candidates overlap each other talks to neither of them, and they not to it, so one
// destination address never names two networks and both ends of a pair agree.
func TestNetworkPeersAreSymmetric(t *testing.T) {
	n := func(name, cidr string, vni uint32, talks ...string) NetworkState {
		return NetworkState{Name: name, VNI: vni, CIDR: netip.MustParsePrefix(cidr), CrossTalk: talks}
	}
	s := NodeState{Networks: []NetworkState{
		n("red", "10.1.0.0/16", 0xfff001, "green", "purple", "blue", "orange"),
		n("green", "10.2.0.0/16", 0xfff002, "red"),
		n("purple", "10.2.128.0/17", 0xfff003, "red"), // overlaps green: red talks to neither
		n("blue", "10.3.0.0/16", 0xfff004),            // does not name red
		n("orange", "10.1.0.0/24", 0xfff005, "red"),   // overlaps red
		n("grey", "10.4.0.0/16", 0xfff006, "white"),
		n("white", "10.5.0.0/16", 0xfff007, "grey", "ghost"),
	}}
	want := map[string][]string{"grey": {"white"}, "white": {"grey"}}
	for i := range s.Networks {
		var got []string
		for _, p := range s.NetworkPeers(&s.Networks[i]) {
			got = append(got, p.Name)
		}
		if !slices.Equal(got, want[s.Networks[i].Name]) {
			t.Errorf("%s talks to %v, want %v", s.Networks[i].Name, got, want[s.Networks[i].Name])
		}
	}
}
