package trace

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/unixctl"
)

// TestOfflineAgreesWithOFProtoTraceEgress: the egress tables (flows/pipeline/egress.go) on a real
// ovs-vswitchd: it accepts them (metadata loads, multipath into metadata, ct into table 16), and
// ofproto/trace and the offline evaluator take the same path for each kind of packet — a pod's
// traffic tunnelled to its egress IP, handed to the host for an IP held here, a firewall's verdicts,
// another node's egress traffic, and the way back from the holder.
func TestOfflineAgreesWithOFProtoTraceEgress(t *testing.T) {
	b := ofbridge.New(t)
	addPorts(t, b, map[string]uint32{pipeline.PortNameVXLAN: pipeline.PortVXLAN, pipeline.PortNameTun0: pipeline.PortTun0, "pa": 3, "pb": 4, "pg": 5})
	l := live{c: unixctl.New(b.Inst.Dir, "ovs-vswitchd"), bridge: "br0", last: new(string)}
	eipA, eipB1, eipB2 := netip.MustParseAddr("198.51.100.40"), netip.MustParseAddr("198.51.100.41"), netip.MustParseAddr("198.51.100.42")
	pfx := netip.MustParsePrefix
	st := testState(pipeline.ModeMultitenant)
	st.GatewayMAC = net.HardwareAddr(tun0MAC)
	st.Egress = pipeline.EgressState{
		ServiceNetwork: pfx("172.30.0.0/16"),
		Held:           []netip.Addr{eipB1},
		Namespaces: []pipeline.EgressNamespace{
			{Name: "t1", IPs: []netip.Addr{eipA}, Firewall: &pipeline.EgressFirewall{Policy: "fw", Rules: []pipeline.EgressRule{
				{Allow: false, Dsts: []netip.Prefix{pfx("192.0.2.66/32")}},
				{Allow: true, Dsts: []netip.Prefix{pfx("192.0.2.0/24")}},
				{Allow: false, Dsts: []netip.Prefix{pfx("0.0.0.0/0")}}}}},
			{Name: "t2", IPs: []netip.Addr{eipB1, eipB2}},
		},
	}
	off := install(t, b, st)
	outsideB := netip.MustParseAddr("192.0.2.99")
	fromPeer := func(tunDst, src, dst netip.Addr) Packet {
		return Packet{InPort: pipeline.PortVXLAN, TunID: 12, TunSrc: peerIP, TunDst: tunDst, EthSrc: mac(src), EthDst: mac(pipeline.Gateway(pfx("10.128.2.0/23"))),
			Proto: "udp", IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: 53}
	}
	reply := []CtFlags{{"trk", "est", "rpl"}, {"trk", "est", "rpl"}}
	cases := []struct {
		name string
		p    Packet
		ct   []CtFlags // nil: a first packet (Run settles the flags)
		w    want
		or   *want
	}{
		{"allowed by the firewall, tunnelled to the egress IP", fromPod(3, ipA, outsideB, "tcp", 443), nil,
			want{out: pipeline.PortVXLAN, tunDst: eipA, tunID: 11, ipDst: outsideB, dstPort: 443}, nil},
		{"denied by the firewall's first rule", fromPod(3, ipA, netip.MustParseAddr("192.0.2.66"), "tcp", 443), nil,
			want{dropAt: pipeline.TableEgressFirewall}, nil},
		{"denied by the firewall's last rule", fromPod(3, ipA, netip.MustParseAddr("8.8.8.8"), "udp", 53), nil,
			want{dropAt: pipeline.TableEgressFirewall}, nil},
		{"inside the cluster: untouched by the firewall", fromPod(3, ipA, ipRemote, "tcp", 8080), nil,
			want{out: pipeline.PortVXLAN, tunDst: peerIP, tunID: 11, ipDst: ipRemote, dstPort: 8080}, nil},
		{"two egress IPs: the hash of the destination picks one", fromPod(4, ipB, outsideB, "tcp", 443), nil,
			want{out: pipeline.PortTun0, ipDst: outsideB, dstPort: 443}, &want{out: pipeline.PortVXLAN, tunDst: eipB2, tunID: 12, ipDst: outsideB, dstPort: 443}},
		{"two egress IPs, another destination", fromPod(4, ipB, netip.MustParseAddr("192.0.2.7"), "udp", 53), nil,
			want{out: pipeline.PortTun0, ipDst: netip.MustParseAddr("192.0.2.7"), dstPort: 53},
			&want{out: pipeline.PortVXLAN, tunDst: eipB2, tunID: 12, ipDst: netip.MustParseAddr("192.0.2.7"), dstPort: 53}},
		{"no egress IP: out through the host", fromPod(5, ipG, outsideB, "tcp", 443), nil,
			want{out: pipeline.PortTun0, ipDst: outsideB, dstPort: 443}, nil},
		{"another node's egress traffic for an IP held here", fromPeer(eipB1, ipRemote, outsideB), nil,
			want{out: pipeline.PortTun0, ipDst: outsideB, dstPort: 53}, nil},
		{"another node's egress traffic for an IP held elsewhere", fromPeer(eipA, ipRemote, outsideB), nil,
			want{dropAt: pipeline.TableEgressOut}, nil},
		{"a reply from outside, sent back by the holder", fromPeer(nodeIP, outsideB, ipB), reply,
			want{out: 4, ipDst: ipB, dstPort: 53}, nil},
		{"a new connection from outside, through the holder", fromPeer(nodeIP, outsideB, ipB), []CtFlags{{"trk", "new"}, {"trk", "new"}},
			want{dropAt: pipeline.TableEgressReturn}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var lp, op *Path
			if tc.ct == nil {
				lp, op = traceBoth(t, l, off, tc.p, nil, "")
			} else {
				var err error
				if lp, err = l.Trace(t.Context(), tc.p, tc.ct); err != nil {
					t.Fatal(err)
				}
				if op, err = off.Evaluate(tc.p, tc.ct); err != nil {
					t.Fatal(err)
				}
				if lk, ok := strings.Join(lp.Key(), "\n"), strings.Join(op.Key(), "\n"); lk != ok {
					t.Fatalf("live and offline paths differ:\nlive:\n%s\noffline:\n%s", lk, ok)
				}
			}
			for name, path := range map[string]*Path{"live": lp, "offline": op} {
				err := tc.w.fate(path)
				if err != nil && tc.or != nil && tc.or.fate(path) == nil {
					err = nil
				}
				if err != nil {
					t.Errorf("%s: %v\n%s", name, err, strings.Join(path.Key(), "\n"))
				}
				if len(path.Outputs) == 1 && path.Outputs[0].Port == pipeline.PortTun0 && tc.p.IPSrc != ipG {
					if got, want := path.Outputs[0].Fields.EthSrc, pipeline.EgressMAC(eipB1).String(); got != want {
						t.Errorf("%s: handed to the host from %s, want %s (egress IP %s held here)", name, got, want, eipB1)
					}
				}
			}
		})
	}
}
