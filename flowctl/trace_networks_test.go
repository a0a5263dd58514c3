package flowctl

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// Networks in the offline two-node world: pods' interfaces on Networks besides their eth0, rendered by
// the pipeline and reported in NodeInfo as the agent reports them (agent/nodeapi/backend.go).

// testNetwork is a Network of the test world.
type testNetwork struct {
	name      string
	vni       uint32
	cidr      string
	subnets   map[string]string // node → its subnet of the Network
	crossTalk []string          // status.crossTalk
	admits    string            // the one namespace its namespaceSelector (team=...) selects
	knownOn   string            // "": every node's agent knows it; else only this node's (the other has not seen it yet)
}

// testAttachment is a pod's interface on a Network.
type testAttachment struct {
	node, ns, name, iface, network string
	ip                             string
	mac                            string // "": 0a:58 and the address, as IPAM gives it
	port                           uint32
}

type testNetworks struct {
	nets []testNetwork
	atts []testAttachment
}

// addTo adds the node's share of the Networks to its state and to its agent's NodeInfo: the Networks
// it knows, and its attachments, those whose Network does not admit their namespace without flows.
func (tn *testNetworks) addTo(node string, st *pipeline.NodeState, info *debugapi.NodeInfo) {
	if tn == nil {
		return
	}
	nodeIPs := map[string]netip.Addr{"n1": n1IP, "n2": n2IP}
	admits := map[string]string{}
	for _, n := range tn.nets {
		if n.knownOn != "" && n.knownOn != node {
			continue
		}
		admits[n.name] = n.admits
		ns := pipeline.NetworkState{Name: n.name, VNI: n.vni, CIDR: netip.MustParsePrefix(n.cidr), CrossTalk: n.crossTalk}
		for _, nd := range slices.Sorted(maps.Keys(n.subnets)) {
			sub := netip.MustParsePrefix(n.subnets[nd])
			if nd == node {
				ns.LocalSubnet = sub
			} else {
				ns.Remotes = append(ns.Remotes, pipeline.NetworkRemote{Node: nd, NodeIP: nodeIPs[nd], Subnet: sub})
			}
		}
		st.Networks = append(st.Networks, ns)
	}
	pipeline.SortNetworks(st.Networks)
	for i := range st.Networks {
		n := &st.Networks[i]
		d := debugapi.Network{Name: n.Name, VNI: n.VNI, CIDR: n.CIDR, Subnet: n.LocalSubnet, Gateway: pipeline.Gateway(n.LocalSubnet)}
		for _, r := range n.Remotes {
			d.Remotes = append(d.Remotes, debugapi.NetworkRemote{Node: r.Node, NodeIP: r.NodeIP, Subnet: r.Subnet})
		}
		for _, p := range st.NetworkPeers(n) {
			d.CrossTalk = append(d.CrossTalk, p.Name)
		}
		info.Networks = append(info.Networks, d)
	}
	for _, a := range tn.atts {
		if a.node != node {
			continue
		}
		ip := netip.MustParseAddr(a.ip)
		mac := podMAC(ip)
		if a.mac != "" {
			mac, _ = net.ParseMAC(a.mac)
		}
		d := debugapi.Attachment{Namespace: a.ns, Name: a.name, Interface: a.iface, Network: a.network, IP: ip, MAC: mac.String(), OFPort: a.port}
		var vni uint32
		for _, n := range st.Networks {
			if n.Name == a.network {
				vni, d.Prefix = n.VNI, netip.PrefixFrom(ip, n.CIDR.Bits())
			}
		}
		switch ns, known := admits[a.network]; {
		case !known:
			d.Reason = fmt.Sprintf("Network %s does not exist here (deleted, or its spec is invalid)", a.network)
		case ns != a.ns:
			d.Reason = fmt.Sprintf("Network %s does not admit namespace %s (its namespaceSelector is team=%s)", a.network, a.ns, ns)
		default:
			d.Carrying, d.VNI = true, vni
			st.Attachments = append(st.Attachments, pipeline.AttachmentState{Namespace: a.ns, Name: a.name, Interface: a.iface, Network: a.network,
				VNI: vni, IP: ip, MAC: mac, OFPort: a.port})
		}
		info.Attachments = append(info.Attachments, d)
		info.Ports = append(info.Ports, debugapi.Port{Name: "veth" + a.name + "-" + a.iface, OFPort: int(a.port), MAC: "0a:58:ee:00:00:02",
			Pod: d.Key(), Interface: a.iface, Network: a.network, IP: ip})
	}
	sort.Slice(info.Attachments, func(i, j int) bool { return info.Attachments[i].Key() < info.Attachments[j].Key() })
}

// networkNodes writes dumps of n1 and n2 (multitenant, VXLAN) with four Networks:
//   - alpha and beta share 10.200.0.0/16 (the same subnets on each node); each has one attachment on
//     each node, and on n2 the two have the same address, 10.200.2.5: blue/p2@net1 on alpha (a static
//     MAC) and blue/q2@net1 on beta. On n1 alpha's blue/p1@net1 (static MAC) is 10.200.1.5, beta's
//     blue/q1@net1 10.200.1.6. Both admit namespace blue only: red/m1@net1 on alpha is attached but
//     carries no traffic.
//   - gamma (10.201.0.0/16) exchanges traffic with alpha; blue/g2@net1 on n2 is on it.
//   - delta (10.202.0.0/16): n1's agent knows it, n2's has not seen it yet; blue/d1@net1 on n1.
//
// Every pod has eth0 on the cluster network too, and red/b (10.128.0.5 on n1) has only eth0.
func networkNodes(t *testing.T) []string {
	dir := t.TempDir()
	both := func(s1, s2 string) map[string]string { return map[string]string{"n1": s1, "n2": s2} }
	nets := &testNetworks{
		nets: []testNetwork{
			{name: "alpha", vni: 0xfff001, cidr: "10.200.0.0/16", subnets: both("10.200.1.0/24", "10.200.2.0/24"), crossTalk: []string{"gamma"}, admits: "blue"},
			{name: "beta", vni: 0xfff002, cidr: "10.200.0.0/16", subnets: both("10.200.1.0/24", "10.200.2.0/24"), admits: "blue"},
			{name: "gamma", vni: 0xfff003, cidr: "10.201.0.0/16", subnets: both("10.201.1.0/24", "10.201.2.0/24"), crossTalk: []string{"alpha"}, admits: "blue"},
			{name: "delta", vni: 0xfff004, cidr: "10.202.0.0/16", subnets: both("10.202.1.0/24", "10.202.2.0/24"), admits: "blue", knownOn: "n1"},
		},
		atts: []testAttachment{
			{"n1", "blue", "p1", "net1", "alpha", "10.200.1.5", "02:00:00:00:a1:01", 11},
			{"n1", "blue", "q1", "net1", "beta", "10.200.1.6", "", 13},
			{"n1", "red", "m1", "net1", "alpha", "10.200.1.9", "", 15},
			{"n1", "blue", "d1", "net1", "delta", "10.202.1.5", "", 17},
			{"n2", "blue", "p2", "net1", "alpha", "10.200.2.5", "02:00:00:00:a1:02", 11},
			{"n2", "blue", "q2", "net1", "beta", "10.200.2.5", "", 13},
			{"n2", "blue", "g2", "net1", "gamma", "10.201.2.5", "", 15},
		},
	}
	ip := netip.MustParseAddr
	n1Pods := []testPod{{"blue", "a", ip("10.128.0.3"), 3}, {"red", "b", ip("10.128.0.5"), 5}, {"blue", "p1", ip("10.128.0.20"), 10},
		{"blue", "q1", ip("10.128.0.21"), 12}, {"red", "m1", ip("10.128.0.22"), 14}, {"blue", "d1", ip("10.128.0.23"), 16}}
	n2Pods := []testPod{{"blue", "c", ip("10.128.2.3"), 3}, {"blue", "p2", ip("10.128.2.20"), 10}, {"blue", "q2", ip("10.128.2.21"), 12},
		{"blue", "g2", ip("10.128.2.22"), 14}}
	mode, encap := pipeline.ModeMultitenant, pipeline.EncapVXLAN
	return []string{
		writeNodeDump(t, dir, "n1", n1IP, n1Net, debugapi.RemoteNode{Name: "n2", NodeIP: n2IP, Subnet: n2Net}, mode, encap, n1Pods, n2Pods, nil, nil, nets),
		writeNodeDump(t, dir, "n2", n2IP, n2Net, debugapi.RemoteNode{Name: "n1", NodeIP: n1IP, Subnet: n1Net}, mode, encap, n2Pods, n1Pods, nil, nil, nets),
	}
}

// TestTraceNetworks: traces from and to pods' interfaces on Networks, with the verdicts the Networks'
// semantics give: a Network is a segment of its own (the same address on another Network is another
// destination, never reached), cross-talk routes between two Networks that allow it, nothing else
// leaves a Network, an attachment whose Network does not admit its namespace carries nothing, and an
// attachment sends from its own MAC and address only.
func TestTraceNetworks(t *testing.T) {
	dumps := networkNodes(t)
	cases := []struct {
		name   string
		o      TraceOptions
		kind   string
		pod    string   // the verdict's pod
		says   []string // the verdict names these
		hops   int
		ethDst string // the packet as it enters the first bridge
	}{
		// alpha's p1 reaches alpha's p2 on n2, not beta's q2 at the same address.
		{"net-cross-node", TraceOptions{Src: "blue/p1@net1", Dst: "blue/p2@net1", Port: 8080}, VerdictDelivered, "blue/p2@net1",
			[]string{"delivered to pod blue/p2@net1 (Network alpha) via node n2"}, 2, "02:00:00:00:a1:02"},
		// An address traced from beta is beta's: 10.200.2.5 is q2, not alpha's p2, nor a cluster pod.
		{"net-same-address", TraceOptions{Src: "blue/q1@net1", Dst: "10.200.2.5", Port: 8080}, VerdictDelivered, "blue/q2@net1",
			[]string{"delivered to pod blue/q2@net1 (Network beta) via node n2"}, 2, "0a:58:0a:c8:02:05"},
		// From beta, alpha's p1 (10.200.1.5, on the same node) is an address beta has no pod at.
		{"net-other-network", TraceOptions{Src: "blue/q1@net1", Dst: "blue/p1@net1", Port: 8080}, VerdictDropped, "",
			[]string{"table 140 net-tunnel", "no pod of Network beta has 10.200.1.5 on node n1"}, 1, "ff:ff:ff:ff:ff:ff"},
		// ... and across nodes: alpha's p2 to beta's q1 dies on n1, where alpha has nobody at 10.200.1.6.
		{"net-other-network-cross-node", TraceOptions{Src: "blue/p2@net1", Dst: "blue/q1@net1", Port: 8080}, VerdictDropped, "",
			[]string{"table 140 net-tunnel", "no pod of Network alpha has 10.200.1.6 on node n1"}, 2, "ff:ff:ff:ff:ff:ff"},
		// Cross-talk: alpha reaches gamma through its gateway, and gamma reaches alpha back.
		{"net-crosstalk", TraceOptions{Src: "blue/p1@net1", Dst: "blue/g2@net1", Port: 8080}, VerdictDelivered, "blue/g2@net1",
			[]string{"delivered to pod blue/g2@net1 (Network gamma) via node n2"}, 2, "0a:59:00:ff:f0:01"},
		{"net-crosstalk-back", TraceOptions{Src: "blue/g2@net1", Dst: "10.200.1.5", Port: 8080}, VerdictDelivered, "blue/p1@net1",
			[]string{"delivered to pod blue/p1@net1 (Network alpha) via node n1"}, 2, "0a:59:00:ff:f0:03"},
		// Nothing leaves a Network but cross-talk: red/b's cluster address is outside alpha and gamma.
		{"net-to-cluster-pod", TraceOptions{Src: "blue/p1@net1", Dst: "10.128.0.5", Port: 8080}, VerdictDropped, "",
			[]string{"table 130 net-crosstalk", "Network alpha does not reach 10.128.0.5: outside its CIDR 10.200.0.0/16 and every Network it exchanges traffic with (crossTalk: gamma)"},
			1, "0a:59:00:ff:f0:01"},
		{"net-to-cluster-pod-no-crosstalk", TraceOptions{Src: "blue/q1@net1", Dst: "red/b", Port: 8080}, VerdictDropped, "",
			[]string{"table 130 net-crosstalk", "Network beta does not reach 10.128.0.5", "(crossTalk: none)"}, 1, "0a:59:00:ff:f0:02"},
		// Attached, but alpha does not admit namespace red: its interface has no flows.
		{"net-not-admitted", TraceOptions{Src: "red/m1@net1", Dst: "blue/p1@net1", Port: 8080}, VerdictDropped, "red/m1@net1",
			[]string{"table 20 pod-ingress", "pod red/m1@net1 carries no traffic: Network alpha does not admit namespace red"}, 1, "02:00:00:00:a1:01"},
		{"net-spoofed", TraceOptions{Src: "blue/p1@net1", Dst: "blue/p2@net1", Port: 8080, SpoofIP: netip.MustParseAddr("10.200.1.6")}, VerdictDropped, "blue/p1@net1",
			[]string{"table 20 pod-ingress", "pod blue/p1@net1 sent it from 02:00:00:00:a1:01 / 10.200.1.6, not its own address on Network alpha (anti-spoofing)"}, 1, "02:00:00:00:a1:02"},
		// n2 has not seen delta: its VNI on the wire names no Network there.
		{"net-unknown-vni", TraceOptions{Src: "blue/d1@net1", Dst: "10.202.2.9", Port: 8080}, VerdictDropped, "",
			[]string{"table 10 tunnel-ingress", "no Network here has VNI 0xfff004"}, 2, "ff:ff:ff:ff:ff:ff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Proto = "tcp"
			res, text := traceOffline(t, dumps, tc.o)
			if res.Verdict.Kind != tc.kind || len(res.Hops) != tc.hops || res.Verdict.Pod != tc.pod {
				t.Errorf("verdict %s (pod %q) after %d hops, want %s (pod %q) after %d:\n%s", res.Verdict.Kind, res.Verdict.Pod, len(res.Hops),
					tc.kind, tc.pod, tc.hops, text)
			}
			for _, s := range tc.says {
				if !strings.Contains(res.Verdict.Text, s) {
					t.Errorf("verdict %q does not say %q", res.Verdict.Text, s)
				}
			}
			if len(res.Hops) > 0 && res.Hops[0].Packet != nil && res.Hops[0].Packet.EthDst.String() != tc.ethDst {
				t.Errorf("the packet leaves the pod for %s, want %s", res.Hops[0].Packet.EthDst, tc.ethDst)
			}
			goldenTrace(t, tc.name, res, text)
		})
	}
}

// TestTraceNetworksSources: the packet from a pod's interface on a Network is built from the agent's
// record of it (port, static MAC, address), and a SRC or DST that names no such interface is an
// error saying which interfaces the pod has.
func TestTraceNetworksSources(t *testing.T) {
	ctx := context.Background()
	w, err := newOfflineWorld(networkNodes(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Trace(ctx, w, TraceOptions{Src: "blue/p1@net1", Dst: "blue/p2@net1", Proto: "icmp"})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Hops[0].Packet
	if p.InPort != 11 || p.EthSrc.String() != "02:00:00:00:a1:01" || p.IPSrc.String() != "10.200.1.5" || p.IPDst.String() != "10.200.2.5" {
		t.Errorf("packet %s", p.OVSFlow())
	}
	if res.From != "pod blue/p1@net1 (10.200.1.5 on Network alpha) on n1" || res.To != "pod blue/p2@net1 (10.200.2.5 on Network alpha) on n2" {
		t.Errorf("from %q to %q", res.From, res.To)
	}
	// The pod's own eth0 is still the cluster network's.
	res, err = Trace(ctx, w, TraceOptions{Src: "blue/p1", Dst: "blue/c", Proto: "tcp", SrcPort: 40000, Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Hops[0].Packet; p.InPort != 10 || p.IPSrc.String() != "10.128.0.20" || res.Verdict.Pod != "blue/c" {
		t.Errorf("eth0: packet %s, verdict %+v", p.OVSFlow(), res.Verdict)
	}
	for _, bad := range []struct{ src, dst, says string }{
		{"blue/p1@net2", "blue/p2@net1", "no interface net2 on a Network (node n1: net1 (Network alpha))"},
		{"blue/a@net1", "blue/p2@net1", "knows no interface of pod blue/a"},
		{"blue/p1@", "blue/p2@net1", "NAMESPACE/NAME@INTERFACE"},
		{"blue/p1@net1", "blue/nope@net1", "blue/nope"},
	} {
		_, err := Trace(ctx, w, TraceOptions{Src: bad.src, Dst: bad.dst, Proto: "tcp", SrcPort: 40000})
		if err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s → %s: error %v, want one saying %q", bad.src, bad.dst, err, bad.says)
		}
	}
	// A node has no way onto a Network.
	res, err = Trace(ctx, w, TraceOptions{Src: "n1", Dst: "blue/p1@net1", Proto: "tcp", SrcPort: 40000})
	if err != nil || res.Verdict.Kind != VerdictHost || !strings.Contains(res.Verdict.Text, "no way onto Network alpha") {
		t.Errorf("node to attachment: %v %+v", err, res)
	}
}

// An agent that records no reason for an attachment without flows (older agents): the verdict still
// says the interface carries nothing, and why it may be.
func TestTraceNetworksNoReason(t *testing.T) {
	w, err := newOfflineWorld(networkNodes(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range w.nodes["n1"].info.Attachments {
		if !a.Carrying {
			w.nodes["n1"].info.Attachments[i].Reason = ""
		}
	}
	res, err := Trace(context.Background(), w, TraceOptions{Src: "red/m1@net1", Dst: "blue/p1@net1", Proto: "tcp", SrcPort: 40000})
	if err != nil {
		t.Fatal(err)
	}
	if want := "pod red/m1@net1 carries no traffic: Network alpha does not admit namespace red (or has no VNI yet)"; !strings.HasSuffix(res.Verdict.Text, want) {
		t.Errorf("verdict %q, want it to end %q", res.Verdict.Text, want)
	}
}

// dump --owner and --category select a Network's flows and an attachment's from a node's dump.
func TestDumpNetworkOwners(t *testing.T) {
	dumps := networkNodes(t)
	w, err := newOfflineWorld(dumps[:1])
	if err != nil {
		t.Fatal(err)
	}
	n := w.nodes["n1"]
	var src fakeSource
	for _, f := range n.flows {
		raw, err := openflow.EncodeFlowStats(f)
		if err != nil {
			t.Fatal(err)
		}
		src.flows = append(src.flows, raw)
	}
	count := func(opts DumpOptions) (owners map[string]int) {
		t.Helper()
		opts.Bridge, opts.Owners = "br0", n.owners
		d, err := ReadDump(context.Background(), src, opts)
		if err != nil {
			t.Fatal(err)
		}
		owners = map[string]int{}
		for _, f := range d.Flows {
			owners[f.Owner]++
		}
		return owners
	}
	for _, tc := range []struct{ owner, want string }{
		{"net/alpha", "map[net/alpha:"},
		{"pod/blue/p1@net1", "map[pod/blue/p1@net1:4]"},
		{"pod/blue/p1", "map[pod/blue/p1:"},
		{"pod/red/m1@net1", "map[]"}, // attached, not admitted: no flows
	} {
		v, m, err := ownerCookie(tc.owner)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(count(DumpOptions{Cookie: v, CookieMask: m})); !strings.HasPrefix(got, tc.want) || strings.Count(got, ":") != strings.Count(tc.want, ":") {
			t.Errorf("--owner %s: flows by owner %s, want %s…", tc.owner, got, tc.want)
		}
	}
	cat, err := reconcile.ParseCategory("net")
	if err != nil {
		t.Fatal(err)
	}
	got := count(DumpOptions{Category: &cat})
	if fmt.Sprint(slices.Sorted(maps.Keys(got))) != "[net/alpha net/beta net/delta net/gamma]" {
		t.Errorf("--category net: flows by owner %v", got)
	}
	if _, _, err := ownerCookie("alpha"); err == nil {
		t.Error("--owner alpha: want an error (owners are category/name)")
	}
}
