package pipeline

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// allowedByRules is the NetworkPolicy API's ingress semantics for one selected pod, written from the
// API, not from the renderer: a packet is allowed when some rule matches both its port (no ports: every
// port; a port with endPort: the range; port 0: every port of the protocol) and its source (no peers:
// everyone; an ipBlock: inside the CIDR and inside none of its excepts).
func allowedByRules(rules []PolicyRule, proto uint8, src netip.Addr, port uint16) bool {
	for _, r := range rules {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			if p.Protocol == proto && (p.Port == 0 || (port >= p.Port && port <= max(p.EndPort, p.Port))) {
				portOK = true
			}
		}
		peerOK := r.AllPeers
		for _, peer := range r.Peers {
			in := peer.Net.Contains(src)
			for _, e := range peer.Except {
				if e.Contains(src) {
					in = false
				}
			}
			peerOK = peerOK || in
		}
		if portOK && peerOK {
			return true
		}
	}
	return false
}

// TestMergedRulesAllowWhatTheRulesAllow: random ingress policies whose rules often name the same ports
// (so directionConjunctions merges them) are rendered into a bridge and every (source, protocol, port)
// of a small space is evaluated offline (flows/trace, OVS's conjunction semantics) against the model.
func TestMergedRulesAllowWhatTheRulesAllow(t *testing.T) {
	ports := [][]PolicyPort{
		nil,
		{{Protocol: IPProtoTCP, Port: 80}},
		{{Protocol: IPProtoTCP, Port: 80}, {Protocol: IPProtoUDP, Port: 53}},
		{{Protocol: IPProtoUDP, Port: 53}, {Protocol: IPProtoTCP, Port: 80}}, // the same set, another order
		{{Protocol: IPProtoTCP, Port: 79, EndPort: 82}},
		{{Protocol: IPProtoUDP}},
		{{Protocol: 1, Port: 80}}, // a protocol without ports (ICMP): the rule allows no tcp or udp
		{{Protocol: 1, Port: 80}, {Protocol: IPProtoTCP, Port: 80}},
	}
	prefix := func(r *rand.Rand) netip.Prefix {
		if r.IntN(20) == 0 {
			return netip.MustParsePrefix("0.0.0.0/0") // everyone, as no peers is
		}
		bits := 28 + r.IntN(5)
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(16))}), bits).Masked()
	}
	rng := rand.New(rand.NewPCG(7, 11))
	const pod = 3
	for round := range 300 {
		pol := PolicyState{Namespace: "ns", Name: "p", Ingress: true, Pods: []PolicyPod{{OFPort: pod}}}
		for range 1 + rng.IntN(6) {
			r := PolicyRule{Ports: ports[rng.IntN(len(ports))]}
			if rng.IntN(8) == 0 {
				r.AllPeers = true
			} else {
				for range 1 + rng.IntN(3) {
					peer := PolicyPeer{Net: prefix(rng)}
					if rng.IntN(3) == 0 {
						peer.Except = []netip.Prefix{prefix(rng)}
					}
					r.Peers = append(r.Peers, peer)
				}
			}
			pol.IngressRules = append(pol.IngressRules, r)
		}
		st, err := renderPolicy(&pol, atPriority(5000), newIDAllocator())
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, f := range st.Flows {
			k := fmt.Sprint(f.Table, f.Priority, f.Match)
			if seen[k] {
				t.Fatalf("round %d: two flows match %s in table %d at %d:\n%s", round, f.Match, f.Table, f.Priority, flowLines(st.Flows))
			}
			seen[k] = true
		}
		flows := append(st.Flows,
			F(0, 0, M(), LoadReg(RegOutPort, pod), Goto{Table: TableIngressIsolation}),
			F(TableIngressIsolation, isolationPriority, M(append(IP, Reg(RegOutPort, pod))...)),
			F(TableOutput, 0, M(), OutputReg{Src: Whole(RegOutPort)}))
		br := trace.NewBridge(flows, nil)
		for host := range 16 {
			src := netip.AddrFrom4([4]byte{10, 0, 0, byte(host)})
			for _, proto := range []uint8{IPProtoTCP, IPProtoUDP} {
				for _, port := range []uint16{53, 78, 79, 80, 82, 83} {
					p := trace.Packet{InPort: 9, EthSrc: trace.MAC{2, 0, 0, 0, 0, 1}, EthDst: trace.MAC{2, 0, 0, 0, 0, 2},
						Proto: ProtoName(proto), IPSrc: src, IPDst: netip.MustParseAddr("10.1.0.3"), SrcPort: 40000, DstPort: port}
					path, err := br.Evaluate(p, nil)
					if err != nil {
						t.Fatal(err)
					}
					got, want := len(path.Outputs) > 0, allowedByRules(pol.IngressRules, proto, src, port)
					if got != want {
						t.Fatalf("round %d: %s %s:%d allowed %v, the API says %v\nrules: %+v\nflows:\n%s",
							round, ProtoName(proto), src, port, got, want, pol.IngressRules, flowLines(st.Flows))
					}
				}
			}
		}
	}
}

func flowLines(fs []Flow) string {
	var s string
	for _, f := range fs {
		s += fmt.Sprintln(f)
	}
	return s
}

// Rules of one direction that name the same ports share one conjunction whose peers are their union
// (everyone when one of them allows everyone); other ports keep their own; the shared conjunction's
// ID does not depend on the rules' positions, so removing the first rule leaves it alone.
func TestRulesNamingTheSamePortsShareAConjunction(t *testing.T) {
	tcp80 := []PolicyPort{{Protocol: IPProtoTCP, Port: 80}}
	peer := func(s string) []PolicyPeer { return []PolicyPeer{{Net: netip.MustParsePrefix(s)}} }
	p := PolicyState{Namespace: "ns", Name: "merge", Ingress: true, Egress: true, Pods: []PolicyPod{{OFPort: 10}},
		IngressRules: []PolicyRule{
			{Peers: peer("192.0.2.0/24"), Ports: []PolicyPort{{Protocol: IPProtoUDP, Port: 53}}},
			{Peers: peer("198.51.100.0/24"), Ports: tcp80},
			{Peers: peer("198.51.100.7/32"), Ports: tcp80},
			{Peers: peer("203.0.113.0/24"), Ports: tcp80},
		},
		EgressRules: []PolicyRule{{Peers: peer("10.129.0.1/32"), Ports: tcp80}, {AllPeers: true, Ports: tcp80}},
	}
	st, err := renderPolicy(&p, atPriority(5000), newIDAllocator())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"50: ip,in_port=10 & tcp,tp_dst=80",
		"80: ip,reg2=0xa & tcp,tp_dst=80 & ip,nw_src=198.51.100.0/24 & ip,nw_src=198.51.100.7 & ip,nw_src=203.0.113.0/24",
		"80: ip,reg2=0xa & udp,tp_dst=53 & ip,nw_src=192.0.2.0/24",
	}
	if got := conjunctionsOf(st.Flows); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("conjunctions:\n%q\nwant:\n%q", got, want)
	}
	idOf := func(st PolicyState, peerNet string) uint32 {
		out, err := renderPolicy(&st, atPriority(5000), newIDAllocator())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range out.Flows {
			if f.Match.String() == "ip,nw_src="+peerNet {
				return f.Actions[0].(Conjunction).ID
			}
		}
		t.Fatalf("no flow for %s", peerNet)
		return 0
	}
	before := idOf(p, "203.0.113.0/24")
	p.IngressRules = p.IngressRules[1:]
	if after := idOf(p, "203.0.113.0/24"); after != before {
		t.Errorf("removing the first rule moved the tcp/80 conjunction from %d to %d", before, after)
	}
}
