package pipeline

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// sampleEgressState goes with sampleNodeState: namespace a (pod web) leaves from one egress IP held
// elsewhere through a firewall; b (pod db) from two, one held here; c has no pod here; default (pod
// dns) has an unenforceable firewall; d has egress IPs, none usable.
func sampleEgressState() EgressState {
	pfx := func(s ...string) []netip.Prefix {
		out := make([]netip.Prefix, len(s))
		for i, a := range s {
			out[i] = netip.MustParsePrefix(a)
		}
		return out
	}
	return EgressState{
		ServiceNetwork: netip.MustParsePrefix("172.30.0.0/16"),
		Held:           []netip.Addr{netip.MustParseAddr("192.0.2.41")},
		Namespaces: []EgressNamespace{
			{Name: "a", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.40")}, Firewall: &EgressFirewall{Policy: "fw", Rules: []EgressRule{
				{Allow: false, Dsts: pfx("198.51.100.66/32")},
				{Allow: true, Dsts: pfx("198.51.100.0/24")},
				{Allow: true, DNSName: "api.example", Dsts: pfx("192.0.2.200/32", "192.0.2.201/32")},
				{Allow: false, Dsts: pfx("0.0.0.0/0")},
			}}},
			{Name: "b", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.41"), netip.MustParseAddr("192.0.2.42")}},
			{Name: "c", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.43")}},
			{Name: "default", Firewall: &EgressFirewall{Policy: "one", DenyAll: true}},
		},
	}
}

// egressFate is where the independent model says a packet goes.
type egressFate struct {
	kind  string // "route": as without egress; "drop"; "tunnel" to one of the namespace's egress IPs
	table TableID
}

// egressModel says what egress does to a first packet of a local pod, from the API's meaning alone:
// replies, services and destinations inside the cluster are untouched; the namespace's firewall
// decides first (first matching rule, no match allows); then an egress IP: dropped when it has egress
// IPs none of which is usable; else one of its egress IPs (held here: to the host, else tunnelled to it;
// with several, any of them, the same for the same destination), which the caller checks.
func egressModel(s NodeState, ns string, dst netip.Addr, proto string, dport uint16, reply, dnat bool) egressFate {
	if reply || dnat || (proto == "udp" && dport == DefaultTunnelPort) {
		return egressFate{kind: "route"}
	}
	for _, p := range s.ClusterNetworks {
		if p.Contains(dst) {
			return egressFate{kind: "route"}
		}
	}
	if s.Egress.ServiceNetwork.Contains(dst) || dst == s.NodeIP {
		return egressFate{kind: "route"}
	}
	for _, n := range s.RemoteNodes {
		if n.NodeIP == dst {
			return egressFate{kind: "route"}
		}
	}
	var e *EgressNamespace
	for i := range s.Egress.Namespaces {
		if s.Egress.Namespaces[i].Name == ns {
			e = &s.Egress.Namespaces[i]
		}
	}
	if e == nil {
		return egressFate{kind: "route"}
	}
	if fw := e.Firewall; fw != nil {
		if fw.DenyAll {
			return egressFate{kind: "drop", table: TableEgressFirewall}
		}
	rules:
		for _, r := range fw.Rules {
			for _, d := range r.Dsts {
				if d.Contains(dst) {
					if !r.Allow {
						return egressFate{kind: "drop", table: TableEgressFirewall}
					}
					break rules
				}
			}
		}
	}
	switch {
	case e.NoUsableIP:
		return egressFate{kind: "drop", table: TableEgressIP}
	case len(e.IPs) == 0:
		return egressFate{kind: "route"}
	}
	return egressFate{kind: "tunnel"} // which IP, and held or not, is checked against the output
}

func TestEgressPaths(t *testing.T) {
	gwMAC := trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 1})
	dsts := []string{"198.51.100.66", "198.51.100.7", "192.0.2.200", "192.0.2.201", "192.0.2.202", "198.18.0.9", "8.8.8.8",
		"10.128.2.7", "10.128.0.3", "172.30.0.53", "172.30.9.9", "192.0.2.12", "192.0.2.11", "10.130.0.1"}
	for _, variant := range []struct {
		mode  Mode
		encap Encapsulation
	}{{ModeMultitenant, EncapVXLAN}, {ModeNetworkPolicy, EncapNone}, {ModeSubnet, EncapVXLAN}} {
		base := sampleNodeState()
		base.Mode, base.Policies = variant.mode, nil
		if variant.encap == EncapNone {
			base.Encapsulation, base.Uplink = EncapNone, true
			base.RemoteNodes[0].OnSegment = true
		}
		plain := offline(t, base)
		s := base
		s.Egress = sampleEgressState()
		b := offline(t, s)
		held := s.Egress.Held
		picks := map[string]map[netip.Addr]bool{} // namespace → egress IPs seen
		for _, pod := range s.Pods {
			for _, d := range dsts {
				for _, proto := range []string{"tcp", "udp"} {
					for _, dport := range []uint16{80, DefaultTunnelPort} {
						for _, reply := range []bool{false, true} {
							name := fmt.Sprintf("%s/%s/%s %s:%d reply=%v", variant.mode, pod.Namespace, proto, d, dport, reply)
							dst := netip.MustParseAddr(d)
							p := trace.Packet{InPort: pod.OFPort, EthSrc: trace.MAC(pod.MAC), EthDst: gwMAC, Proto: proto, IPSrc: pod.IP, IPDst: dst,
								SrcPort: 40000, DstPort: dport}
							var flags []trace.CtFlags
							if reply {
								flags = []trace.CtFlags{{"trk", "est", "rpl"}, {"trk", "est", "rpl"}}
							}
							path, err := b.Evaluate(p, flags)
							if err != nil {
								t.Fatalf("%s: %v", name, err)
							}
							// A service's DNAT changes the destination first: model it through the
							// plain pipeline's own view of whether the packet was DNATed.
							plainPath, err := plain.Evaluate(p, flags)
							if err != nil {
								t.Fatal(err)
							}
							dnat := slices.ContainsFunc(plainPath.Passes, func(ps trace.Pass) bool { return strings.Contains(ps.CtState, "dnat") })
							want := egressModel(s, pod.Namespace, dst, proto, dport, reply, dnat)
							last, _ := path.Last()
							switch want.kind {
							case "route":
								if fmt.Sprint(outputsOf(path)) != fmt.Sprint(outputsOf(plainPath)) {
									t.Errorf("%s: outputs %v, want as without egress %v\n%v", name, outputsOf(path), outputsOf(plainPath), path.Key())
								}
							case "drop":
								if !path.Dropped() || last.Table != want.table {
									t.Errorf("%s: want a drop in %d, got outputs %v, last %+v", name, want.table, path.Outputs, last)
								}
							case "tunnel":
								if len(path.Outputs) != 1 {
									t.Fatalf("%s: outputs %v\n%v", name, path.Outputs, path.Key())
								}
								out := path.Outputs[0]
								var e netip.Addr
								switch out.Port {
								case PortVXLAN:
									e = out.Fields.TunDst
									if slices.Contains(held, e) || out.Fields.TunID != uint64(pod.VNID) {
										t.Errorf("%s: tunnelled to %s (VNI %d), held here %v, VNID %d", name, e, out.Fields.TunID, held, pod.VNID)
									}
								case PortTun0:
									mac, _ := net.ParseMAC(out.Fields.EthSrc)
									e = netip.AddrFrom4([4]byte(mac[2:6]))
									if !slices.Contains(held, e) || !slices.Equal(mac, EgressMAC(e)) || out.Fields.IPSrc != pod.IP ||
										out.Fields.EthDst != s.GatewayMAC.String() {
										t.Errorf("%s: to the host with %s → %s from %s, want an EgressMAC of a held IP to tun0's MAC", name, out.Fields.EthSrc, out.Fields.EthDst, out.Fields.IPSrc)
									}
								default:
									t.Fatalf("%s: left by %d", name, out.Port)
								}
								ns := s.Egress.Namespaces[slices.IndexFunc(s.Egress.Namespaces, func(n EgressNamespace) bool { return n.Name == pod.Namespace })]
								if !slices.Contains(ns.IPs, e) {
									t.Errorf("%s: left from %s, not one of %v", name, e, ns.IPs)
								}
								if picks[pod.Namespace] == nil {
									picks[pod.Namespace] = map[netip.Addr]bool{}
								}
								picks[pod.Namespace][e] = true
								// The same destination always gets the same egress IP.
								again, _ := b.Evaluate(p, flags)
								if fmt.Sprint(outputsOf(again)) != fmt.Sprint(outputsOf(path)) {
									t.Errorf("%s: a second packet took %v, the first %v", name, outputsOf(again), outputsOf(path))
								}
							}
						}
					}
				}
			}
		}
		if len(picks["b"]) != 2 {
			t.Errorf("%s: namespace b's destinations used egress IPs %v, want both", variant.mode, picks["b"])
		}
	}
}

func outputsOf(p *trace.Path) []string {
	var out []string
	for _, o := range p.Outputs {
		out = append(out, fmt.Sprintf("%d:%s>%s:%s>%s:tun=%s/%d", o.Port, o.Fields.EthSrc, o.Fields.EthDst, o.Fields.IPSrc, o.Fields.IPDst, o.Fields.TunDst, o.Fields.TunID))
	}
	return out
}

// TestEgressHolderAndReturn: another node's egress traffic is handed to the host only for an egress IP
// held here; replies from outside come back from the holder through the tunnel (or the uplink) only as
// replies of this node's connections, and the guard still refuses every forged cluster source.
func TestEgressHolderAndReturn(t *testing.T) {
	outside := netip.MustParseAddr("198.51.100.7")
	for _, encap := range []Encapsulation{EncapVXLAN, EncapNone} {
		s := sampleNodeState()
		s.Mode = ModeMultitenant
		if encap == EncapNone {
			s.Encapsulation, s.Uplink = EncapNone, true
			s.RemoteNodes[0].OnSegment = true
		}
		s.Egress = sampleEgressState()
		b := offline(t, s)
		peer := s.RemoteNodes[0]
		web := s.Pods[0]
		held, foreign := s.Egress.Held[0], netip.MustParseAddr("192.0.2.40")
		tunnelled := func(tunDst, src, dst netip.Addr) trace.Packet {
			return trace.Packet{InPort: PortVXLAN, TunID: 11, TunSrc: peer.NodeIP, TunDst: tunDst, EthSrc: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 2, 7}),
				EthDst: trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 2, 1}), Proto: "udp", IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: 53}
		}
		fromUplink := func(src, dst netip.Addr) trace.Packet {
			return trace.Packet{InPort: PortUplink, EthSrc: trace.MAC(UplinkMAC(peer.NodeIP)), EthDst: trace.MAC(UplinkMAC(s.NodeIP)),
				Proto: "udp", IPSrc: src, IPDst: dst, SrcPort: 53, DstPort: 40000}
		}
		est := []trace.CtFlags{{"trk", "est", "rpl"}, {"trk", "est", "rpl"}}
		type egressCase struct {
			name  string
			p     trace.Packet
			flags []trace.CtFlags
			out   uint32  // 0: dropped
			at    TableID // where, when dropped
			check func(o trace.Output) string
		}
		cases := []egressCase{
			{"egress traffic for an IP held here", tunnelled(held, netip.MustParseAddr("10.128.2.7"), outside), nil, PortTun0, 0,
				func(o trace.Output) string {
					if o.Fields.EthSrc != EgressMAC(held).String() || o.Fields.EthDst != s.GatewayMAC.String() || o.Fields.IPSrc.String() != "10.128.2.7" {
						return fmt.Sprintf("handed over as %s → %s from %s", o.Fields.EthSrc, o.Fields.EthDst, o.Fields.IPSrc)
					}
					return ""
				}},
			{"egress traffic for an IP held elsewhere", tunnelled(foreign, netip.MustParseAddr("10.128.2.7"), outside), nil, 0, TableEgressOut, nil},
			{"tunnelled to outside the cluster by a node address", tunnelled(s.NodeIP, netip.MustParseAddr("10.128.2.7"), outside), nil, 0, TableEgressOut, nil},
			{"egress traffic for an IP held here, to inside the cluster, routes", tunnelled(held, netip.MustParseAddr("10.128.2.7"), web.IP), nil, web.OFPort, 0, nil},
			{"a reply from outside through the tunnel", tunnelled(s.NodeIP, outside, web.IP), est, web.OFPort, 0, nil},
			{"a new connection from outside through the tunnel", tunnelled(s.NodeIP, outside, web.IP), nil, 0, TableEgressReturn, nil},
			{"a reply claiming a third node's pod", tunnelled(s.NodeIP, netip.MustParseAddr("10.128.4.3"), web.IP), est, 0, TableEgressReturn, nil},
			{"a reply claiming a service address", tunnelled(s.NodeIP, netip.MustParseAddr("172.30.0.53"), web.IP), est, 0, TableEgressReturn, nil},
			{"a reply claiming a third node's address", tunnelled(s.NodeIP, s.RemoteNodes[1].NodeIP, web.IP), est, 0, TableEgressReturn, nil},
		}
		if encap == EncapNone {
			cases = append(cases,
				egressCase{"a reply from outside through the uplink", fromUplink(outside, web.IP), est, web.OFPort, 0, func(o trace.Output) string {
					if o.Fields.EthDst != web.MAC.String() {
						return "not addressed to the pod's MAC: " + o.Fields.EthDst
					}
					return ""
				}},
				egressCase{"a new connection from outside through the uplink", fromUplink(outside, web.IP), nil, 0, TableEgressReturn, nil},
				egressCase{"a reply claiming a third node's pod through the uplink", fromUplink(netip.MustParseAddr("10.128.4.3"), web.IP), est, 0, TableEgressReturn, nil})
		}
		for _, tc := range cases {
			t.Run(string(encap)+"/"+tc.name, func(t *testing.T) {
				path, err := b.Evaluate(tc.p, tc.flags)
				if err != nil {
					t.Fatal(err)
				}
				last, _ := path.Last()
				if tc.out == 0 {
					if !path.Dropped() || last.Table != tc.at {
						t.Fatalf("want a drop in %d: outputs %v, last %+v\n%v", tc.at, path.Outputs, last, path.Key())
					}
					return
				}
				if len(path.Outputs) != 1 || path.Outputs[0].Port != tc.out {
					t.Fatalf("outputs %+v, want port %d\n%v", path.Outputs, tc.out, path.Key())
				}
				if tc.check != nil {
					if msg := tc.check(path.Outputs[0]); msg != "" {
						t.Error(msg)
					}
				}
			})
		}
	}
}

// TestEgressHostPortReply: a connection the host opens to a pod of an egress namespace (a hostPort) is
// committed, so the pod's reply is routed back through the host, not through the egress IP or the
// firewall.
func TestEgressHostPortReply(t *testing.T) {
	s := sampleNodeState()
	s.Mode = ModeMultitenant
	s.Egress = sampleEgressState()
	b := offline(t, s)
	web := s.Pods[0]
	in := trace.Packet{InPort: PortTun0, EthSrc: trace.MAC(s.GatewayMAC), EthDst: trace.MAC(web.MAC), Proto: "tcp",
		IPSrc: netip.MustParseAddr("198.51.100.66"), IPDst: web.IP, SrcPort: 50000, DstPort: 8080}
	path, err := b.Evaluate(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(path.Outputs) != 1 || path.Outputs[0].Port != web.OFPort {
		t.Fatalf("outputs %v\n%v", path.Outputs, path.Key())
	}
	committed := false
	for _, st := range path.Passes[len(path.Passes)-1].Steps {
		if st.Table == TableEgressClassify && strings.Contains(strings.Join(st.Actions, ","), "commit") {
			committed = true
		}
	}
	if !committed {
		t.Errorf("the connection from the host was not committed in 54:\n%v", path.Key())
	}
}

// TestEgressRendersNothingWithoutEgress: a cluster without egress IPs or firewalls has no egress flows
// but the tables' defaults, so the feature costs nothing until used; with them, the count of flows
// each part adds.
func TestEgressRendersNothingWithoutEgress(t *testing.T) {
	s := sampleNodeState()
	owners, err := Render(s)
	if err != nil {
		t.Fatal(err)
	}
	for o, st := range owners {
		for _, f := range st.Flows {
			if (f.Table >= TableEgressClassify && f.Table <= TableEgressOut || f.Table == TableEgressReturn) && f.Priority != 0 {
				t.Errorf("%s renders %s without egress", o, f)
			}
		}
	}
	s.Egress = sampleEgressState()
	owners, err = Render(s)
	if err != nil {
		t.Fatal(err)
	}
	want := map[reconcile.Owner]bool{EgressOwner: true, EgressNamespaceOwner("a"): true, EgressNamespaceOwner("b"): true,
		EgressNamespaceOwner("default"): true, EgressFirewallOwner("a", "fw"): true, EgressFirewallOwner("default", "one"): true}
	for o := range owners {
		if o.Category == reconcile.CategoryEgress || o.Category == reconcile.CategoryEgressFirewall || o == EgressOwner {
			if !want[o] {
				t.Errorf("unexpected owner %s (c has no pod here)", o)
			}
			delete(want, o)
		}
	}
	for o := range want {
		t.Errorf("owner %s missing", o)
	}
	for _, o := range []reconcile.Owner{EgressNamespaceOwner("a"), EgressFirewallOwner("a", "fw")} {
		obj, ok := ObjectOf(o)
		if !ok || obj.Owner() != o {
			t.Errorf("owner %s names %+v %v", o, obj, ok)
		}
	}
}

// TestEgressAfterPolicyLayers: whichever policy layer lets a connection out of the cluster — a
// NetworkPolicy rule, the Admin tier's Accept, the Baseline tier's Accept, or none deciding — it still
// meets the namespace's egress firewall and egress IP (tables 54-57); only a Deny of a tier or a
// NetworkPolicy's isolation drops it before them. Pod web (namespace a, port 3) sends to 198.51.100.66,
// which a's firewall denies, and to 198.51.100.7, which it allows and sends out from a's egress IP.
func TestEgressAfterPolicyLayers(t *testing.T) {
	outside := netip.MustParsePrefix("198.51.100.0/24")
	rule := PolicyRule{Peers: []PolicyPeer{{Net: outside}}}
	web := []PolicyPod{{OFPort: 3}}
	admin := func(tier AdminTier, a AdminAction) []AdminPolicyState {
		return []AdminPolicyState{{Name: "cnp", Tier: tier, Priority: 1, Pods: web, Egress: []AdminRule{{Name: "out", Action: a, PolicyRule: rule}}}}
	}
	allowOut := []PolicyState{{Namespace: "a", Name: "out", Egress: true, Pods: web, EgressRules: []PolicyRule{rule}}}
	isolate := []PolicyState{{Namespace: "a", Name: "deny", Egress: true, Pods: web}}
	gwMAC := trace.MAC(net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 1})
	for _, tc := range []struct {
		name     string
		policies []PolicyState
		admin    []AdminPolicyState
		// dropIn is the table a policy layer drops in (0: the layers let it out, egress decides).
		dropIn TableID
	}{
		{name: "no policy"},
		{name: "NetworkPolicy allows", policies: allowOut},
		{name: "NetworkPolicy isolates", policies: isolate, dropIn: TableEgressPolicy},
		{name: "Admin Accept", admin: admin(AdminTierAdmin, AdminAccept)},
		{name: "Admin Accept over isolation", admin: admin(AdminTierAdmin, AdminAccept), policies: isolate},
		{name: "Admin Deny", admin: admin(AdminTierAdmin, AdminDeny), policies: allowOut, dropIn: TableAdminEgress},
		{name: "Admin Pass, NetworkPolicy allows", admin: admin(AdminTierAdmin, AdminPass), policies: allowOut},
		{name: "Baseline Accept", admin: admin(AdminTierBaseline, AdminAccept)},
		{name: "Baseline Deny", admin: admin(AdminTierBaseline, AdminDeny), dropIn: TableBaselineEgress},
		{name: "Baseline Deny under a NetworkPolicy's allow", admin: admin(AdminTierBaseline, AdminDeny), policies: allowOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sampleNodeState()
			s.Mode, s.Policies, s.AdminPolicies = ModeNetworkPolicy, tc.policies, tc.admin
			s.Pods[0].EgressIsolated = len(tc.policies) > 0 // the agent derives it from the policies that select web
			s.Egress = sampleEgressState()
			b := offline(t, s)
			for _, dst := range []struct {
				addr    string
				denied  bool // by a's egress firewall
				viaEgIP bool
			}{{"198.51.100.66", true, false}, {"198.51.100.7", false, true}} {
				p := trace.Packet{InPort: 3, EthSrc: trace.MAC(s.Pods[0].MAC), EthDst: gwMAC, Proto: "tcp", IPSrc: s.Pods[0].IP,
					IPDst: netip.MustParseAddr(dst.addr), SrcPort: 40000, DstPort: 443}
				path, err := b.Evaluate(p, nil)
				if err != nil {
					t.Fatal(err)
				}
				last, _ := path.Last()
				switch {
				case tc.dropIn != 0:
					if !path.Dropped() || last.Table != tc.dropIn {
						t.Errorf("to %s: want a drop in %d, got outputs %v, last table %d", dst.addr, tc.dropIn, path.Outputs, last.Table)
					}
				case dst.denied:
					if !path.Dropped() || last.Table != TableEgressFirewall {
						t.Errorf("to %s: want the egress firewall's drop (55), got outputs %v, last table %d", dst.addr, path.Outputs, last.Table)
					}
				case dst.viaEgIP:
					if len(path.Outputs) != 1 || path.Outputs[0].Port != PortVXLAN || path.Outputs[0].Fields.TunDst != netip.MustParseAddr("192.0.2.40") {
						t.Errorf("to %s: want VXLAN to a's egress IP 192.0.2.40, got %v", dst.addr, outputsOf(path))
					}
				}
			}
		})
	}
}

// TestEgressRulePriorityRoundTrip: flowctl reads a table-55 drop's rule back from the priority the
// renderer gave it, for every rule an EgressNetworkPolicy may have; the deny-all flow is no rule's.
func TestEgressRulePriorityRoundTrip(t *testing.T) {
	for i := range networkv1.MaxEgressNetworkPolicyRules {
		if got, ok := EgressRuleOf(EgressRulePriority(i)); !ok || got != i {
			t.Errorf("rule %d: priority %d reads back as %d, %v", i, EgressRulePriority(i), got, ok)
		}
	}
	if i, ok := EgressRuleOf(egressDenyAllPriority); ok {
		t.Errorf("the deny-all priority reads as rule %d", i)
	}
}
