package flowctl

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/flows/trace"
)

// A two-node cluster rendered in pure Go, saved as the JSON dumps flowctl dump writes: flowctl trace
// --dump answers from them with the offline evaluator (the same evaluator real-OVS tests hold to
// ofproto/trace: flows/trace). The verdicts expected here are the pipeline's intent; the golden files
// pin the output format.

var (
	n1IP, n2IP     = netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("198.51.100.12")
	n1Net, n2Net   = netip.MustParsePrefix("10.128.0.0/23"), netip.MustParsePrefix("10.128.2.0/23")
	clusterNet     = netip.MustParsePrefix("10.128.0.0/14")
	serviceNet     = netip.MustParsePrefix("172.30.0.0/16")
	traceVNIDs     = map[string]uint32{"blue": 12, "red": 14, "default": 0}
	testRound      = uint16(7)
	webClusterIP   = netip.MustParseAddr("172.30.0.10")
	emptyClusterIP = netip.MustParseAddr("172.30.0.11")
)

type testPod struct {
	ns, name string
	ip       netip.Addr
	port     uint32
}

func podMAC(ip netip.Addr) net.HardwareAddr { return net.HardwareAddr(macOfIP(ip)) }

// vnidOf is a test pod's VNID in a mode.
func vnidOf(p testPod, mode pipeline.Mode) uint32 {
	if mode != pipeline.ModeMultitenant {
		return 0
	}
	return traceVNIDs[p.ns]
}

// writeNodeDump renders one node and writes its dump file. With encapsulation none the node has an
// uplink port and its peer is on the segment (peerPods are the peer's pods, as uplink-ingress needs).
func writeNodeDump(t *testing.T, dir, name string, nodeIP netip.Addr, subnet netip.Prefix, peer debugapi.RemoteNode, mode pipeline.Mode,
	encap pipeline.Encapsulation, pods, peerPods []testPod, services []pipeline.ServiceState, policies []pipeline.PolicyState, nets *testNetworks,
	admin ...pipeline.AdminPolicyState) string {
	t.Helper()
	return writeNodeDumpEgress(t, dir, name, nodeIP, subnet, peer, mode, encap, pods, peerPods, services, policies, nets, pipeline.EgressState{}, admin...)
}

// writeNodeDumpEgress is writeNodeDump with egress IPs and firewalls.
func writeNodeDumpEgress(t *testing.T, dir, name string, nodeIP netip.Addr, subnet netip.Prefix, peer debugapi.RemoteNode, mode pipeline.Mode,
	encap pipeline.Encapsulation, pods, peerPods []testPod, services []pipeline.ServiceState, policies []pipeline.PolicyState, nets *testNetworks,
	egress pipeline.EgressState, admin ...pipeline.AdminPolicyState) string {
	t.Helper()
	remote := pipeline.RemoteNode{Name: peer.Name, NodeIP: peer.NodeIP, Subnet: peer.Subnet, OnSegment: encap == pipeline.EncapNone}
	for _, p := range peerPods {
		remote.Pods = append(remote.Pods, pipeline.RemotePod{IP: p.ip, VNID: vnidOf(p, mode)})
	}
	st := pipeline.NodeState{Mode: mode, NodeName: name, NodeIP: nodeIP, LocalSubnet: subnet, ClusterNetworks: []netip.Prefix{clusterNet},
		Encapsulation: encap, Uplink: encap == pipeline.EncapNone, RemoteNodes: []pipeline.RemoteNode{remote},
		NodePortAddresses: []netip.Addr{pipeline.ServiceNodePortIP}, Services: services, Policies: policies, Egress: egress, AdminPolicies: admin}
	info := &debugapi.NodeInfo{Name: name, Bridge: "br0", NodeIP: nodeIP, Subnet: subnet, Gateway: pipeline.Gateway(subnet), Mode: string(mode),
		ClusterNetworks: []netip.Prefix{clusterNet}, ServiceNetwork: serviceNet, Round: testRound, PipelineVersion: pipeline.PipelineVersion,
		RemoteNodes: []debugapi.RemoteNode{peer}, VNIDs: traceVNIDs, NodePortAddress: pipeline.ServiceNodePortIP,
		Ports: []debugapi.Port{{Name: "tun0", Type: "internal", OFPort: 2, MAC: "0a:58:ff:00:00:02"}, {Name: "vxlan0", Type: "vxlan", OFPort: 1}}}
	if len(egress.Namespaces) > 0 {
		st.GatewayMAC = net.HardwareAddr{0x0a, 0x58, 0xff, 0, 0, 2} // tun0's (the holder hands egress traffic to it)
		info.Egress = &debugapi.Egress{Held: egress.Held}
		for _, ns := range egress.Namespaces {
			en := debugapi.EgressNamespace{Name: ns.Name, IPs: ns.IPs, NoUsableIP: ns.NoUsableIP}
			if fw := ns.Firewall; fw != nil {
				en.Policy, en.DenyAll = fw.Policy, fw.DenyAll
				for _, r := range fw.Rules {
					en.Rules = append(en.Rules, debugapi.EgressRule{Allow: r.Allow, DNSName: r.DNSName, Addresses: r.Dsts})
				}
			}
			info.Egress.Namespaces = append(info.Egress.Namespaces, en)
		}
	}
	if encap == pipeline.EncapNone {
		info.Ports = append(info.Ports, debugapi.Port{Name: pipeline.PortNameUplink, Type: "patch", OFPort: int(pipeline.PortUplink)})
	}
	for _, p := range pods {
		vnid := vnidOf(p, mode)
		isolated := false
		for _, pol := range policies {
			for _, pp := range pol.Pods {
				isolated = isolated || pp.OFPort == p.port
			}
		}
		st.Pods = append(st.Pods, pipeline.PodState{Namespace: p.ns, Name: p.name, IP: p.ip, MAC: podMAC(p.ip), OFPort: p.port, VNID: vnid, IngressIsolated: isolated})
		info.Pods = append(info.Pods, debugapi.Pod{Namespace: p.ns, Name: p.name, IP: p.ip, MAC: podMAC(p.ip).String(), OFPort: p.port, VNID: vnid,
			IngressPolicies: pipeline.IsolatingPolicies(policies, p.port, true), EgressPolicies: pipeline.IsolatingPolicies(policies, p.port, false)})
		info.Ports = append(info.Ports, debugapi.Port{Name: "veth" + p.name, OFPort: int(p.port), MAC: "0a:58:ee:00:00:01", Pod: p.ns + "/" + p.name, IP: p.ip})
	}
	for _, s := range services {
		svc := debugapi.Service{Namespace: s.Namespace, Name: s.Name, ClusterIP: s.ClusterIP}
		for _, p := range s.Ports {
			sp := debugapi.ServicePort{Name: p.Name, Protocol: openflow.ProtoName(p.Protocol), Port: p.Port, NodePort: p.NodePort,
				Owner: pipeline.ServicePortOwner(s, p).String()}
			for _, e := range p.Endpoints {
				sp.Endpoints = append(sp.Endpoints, debugapi.Endpoint{IP: e.IP, Port: e.Port, Ready: e.Ready, Node: e.NodeName})
			}
			svc.Ports = append(svc.Ports, sp)
		}
		info.Services = append(info.Services, svc)
	}
	nets.addTo(name, &st, info)
	owners, err := pipeline.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	d := Dump{Bridge: "br0", Node: info}
	for _, o := range reconcile.SortedOwnerKeys(owners) {
		d.Owners = append(d.Owners, o.String())
		info.Owners = append(info.Owners, o.String())
		for _, f := range owners[o].Flows {
			f.Cookie = uint64(reconcile.MakeCookie(testRound, o))
			raw, err := openflow.EncodeFlowStats(f)
			if err != nil {
				t.Fatal(err)
			}
			d.Flows = append(d.Flows, DumpedFlow{Table: f.Table, Priority: f.Priority, Flow: f.String(), Raw: raw})
		}
		for _, g := range owners[o].Groups {
			raw, err := openflow.EncodeGroupDesc(g)
			if err != nil {
				t.Fatal(err)
			}
			d.Groups, d.RawGroups = append(d.Groups, g.String()), append(d.RawGroups, raw)
		}
	}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// twoNodes writes dumps of n1 and n2 in a mode and an encapsulation: blue/a, blue/a2, red/b, default/g
// on n1; blue/c on n2; service blue/web (endpoints a and c, NodePort 30080) and blue/empty (none); in
// networkpolicy mode, policy blue/web-80 lets only TCP 80 into a.
func twoNodes(t *testing.T, mode pipeline.Mode, encap pipeline.Encapsulation) []string {
	dir := t.TempDir()
	a, a2, b, g := netip.MustParseAddr("10.128.0.3"), netip.MustParseAddr("10.128.0.4"), netip.MustParseAddr("10.128.0.5"), netip.MustParseAddr("10.128.0.6")
	c := netip.MustParseAddr("10.128.2.3")
	eps := []pipeline.Endpoint{{IP: a, Port: 8080, Ready: true, Local: true, NodeName: "n1"}, {IP: c, Port: 8080, Ready: true, NodeName: "n2"}}
	services := func(local string) []pipeline.ServiceState {
		e := append([]pipeline.Endpoint(nil), eps...)
		for i := range e {
			e[i].Local = e[i].NodeName == local
		}
		return []pipeline.ServiceState{
			{Namespace: "blue", Name: "web", ClusterIP: webClusterIP, Ports: []pipeline.ServicePort{{Name: "http", Protocol: openflow.IPProtoTCP, Port: 80, NodePort: 30080, Endpoints: e}}},
			{Namespace: "blue", Name: "empty", ClusterIP: emptyClusterIP, Ports: []pipeline.ServicePort{{Protocol: openflow.IPProtoTCP, Port: 80}}},
		}
	}
	var pol1, pol2 []pipeline.PolicyState
	if mode == pipeline.ModeNetworkPolicy {
		pol1 = []pipeline.PolicyState{{Namespace: "blue", Name: "web-80", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 3}},
			IngressRules: []pipeline.PolicyRule{{AllPeers: true, Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Port: 80}}}}}}
	}
	n1Pods := []testPod{{"blue", "a", a, 3}, {"blue", "a2", a2, 4}, {"red", "b", b, 5}, {"default", "g", g, 6}}
	n2Pods := []testPod{{"blue", "c", c, 3}}
	return []string{
		writeNodeDump(t, dir, "n1", n1IP, n1Net, debugapi.RemoteNode{Name: "n2", NodeIP: n2IP, Subnet: n2Net}, mode, encap,
			n1Pods, n2Pods, services("n1"), pol1, nil),
		writeNodeDump(t, dir, "n2", n2IP, n2Net, debugapi.RemoteNode{Name: "n1", NodeIP: n1IP, Subnet: n1Net}, mode, encap,
			n2Pods, n1Pods, services("n2"), pol2, nil),
	}
}

// TestTraceOffline: every question of the list, answered from dumps, with the verdict the
// pipeline intends; text and JSON outputs are golden.
func TestTraceOffline(t *testing.T) {
	multi, np := twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapVXLAN), twoNodes(t, pipeline.ModeNetworkPolicy, pipeline.EncapVXLAN)
	// Encapsulation none: across nodes the packet leaves by the uplink port and is followed to the peer.
	multiNone, npNone := twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapNone), twoNodes(t, pipeline.ModeNetworkPolicy, pipeline.EncapNone)
	cases := []struct {
		name  string
		dumps []string
		o     TraceOptions
		kind  string
		says  []string // the verdict names these
		hops  int
	}{
		{"same-node", multi, TraceOptions{Src: "blue/a", Dst: "blue/a2", Port: 8080}, VerdictDelivered, []string{"blue/a2", "node n1"}, 1},
		{"cross-node", multi, TraceOptions{Src: "blue/a", Dst: "blue/c", Port: 8080}, VerdictDelivered, []string{"blue/c", "node n2"}, 2},
		{"tenant-deny", multi, TraceOptions{Src: "blue/a", Dst: "red/b", Port: 8080}, VerdictDropped,
			[]string{"table 80 ingress-isolation", "tenant VNID 12 (blue) may not reach VNID 14 (red)"}, 1},
		{"global", multi, TraceOptions{Src: "default/g", Dst: "red/b", Port: 8080}, VerdictDelivered, []string{"red/b"}, 1},
		{"spoofed", multi, TraceOptions{Src: "blue/a", Dst: "blue/a2", Port: 8080, SpoofIP: netip.MustParseAddr("10.128.0.5")}, VerdictDropped,
			[]string{"table 20 pod-ingress", "anti-spoofing"}, 1},
		{"service-local-endpoint", multi, TraceOptions{Src: "red/b", Dst: "svc/blue/web", Endpoint: "10.128.0.3"}, VerdictDropped,
			[]string{"tenant VNID 14 (red) may not reach VNID 12 (blue)"}, 1},
		{"service-remote-endpoint", multi, TraceOptions{Src: "blue/a2", Dst: "svc/blue/web", Endpoint: "10.128.2.3:8080"}, VerdictDelivered,
			[]string{"blue/c via node n2"}, 2},
		{"service-no-endpoints", multi, TraceOptions{Src: "blue/a", Dst: "svc/blue/empty"}, VerdictRejected, []string{"service blue/empty has no ready endpoint"}, 1},
		{"nodeport-from-outside", multi, TraceOptions{Src: "192.0.2.7", Dst: "n1", Port: 30080, Endpoint: "10.128.2.3"}, VerdictDelivered,
			[]string{"blue/c via node n2"}, 3},
		{"to-outside", multi, TraceOptions{Src: "blue/a", Dst: "192.0.2.7", Port: 443}, VerdictLeftCluster,
			[]string{"SNATs it from 10.128.0.3 to 198.51.100.11"}, 1},
		{"tunnel-guard", multi, TraceOptions{Src: "blue/a", Dst: "198.51.100.12", Proto: "udp", Port: 4789}, VerdictDropped,
			[]string{"table 60 routing by the tunnel guard", "udp/4789 of 198.51.100.12"}, 1},
		{"policy-allow", np, TraceOptions{Src: "blue/c", Dst: "blue/a", Port: 80}, VerdictDelivered,
			[]string{"blue/a via node n1", "allowed by NetworkPolicy blue/web-80"}, 2},
		{"policy-deny", np, TraceOptions{Src: "blue/c", Dst: "blue/a", Port: 81}, VerdictDropped,
			[]string{"table 80 ingress-isolation by the NetworkPolicy isolation of pod blue/a: isolated by NetworkPolicy blue/web-80 (no rule allows tcp/81)"}, 2},
		{"cross-node-none", multiNone, TraceOptions{Src: "blue/a", Dst: "blue/c", Port: 8080}, VerdictDelivered, []string{"blue/c", "node n2"}, 2},
		{"tenant-deny-cross-node-none", multiNone, TraceOptions{Src: "red/b", Dst: "blue/c", Port: 8080}, VerdictDropped,
			[]string{"table 80 ingress-isolation", "tenant VNID 14 (red) may not reach VNID 12 (blue)"}, 2},
		{"service-remote-endpoint-none", multiNone, TraceOptions{Src: "blue/a2", Dst: "svc/blue/web", Endpoint: "10.128.2.3:8080"}, VerdictDelivered,
			[]string{"blue/c via node n2"}, 2},
		{"nodeport-from-outside-none", multiNone, TraceOptions{Src: "192.0.2.7", Dst: "n1", Port: 30080, Endpoint: "10.128.2.3"}, VerdictDelivered,
			[]string{"blue/c via node n2"}, 3},
		{"policy-allow-none", npNone, TraceOptions{Src: "blue/c", Dst: "blue/a", Port: 80}, VerdictDelivered,
			[]string{"blue/a via node n1", "allowed by NetworkPolicy blue/web-80"}, 2},
		{"policy-deny-none", npNone, TraceOptions{Src: "blue/c", Dst: "blue/a", Port: 81}, VerdictDropped,
			[]string{"table 80 ingress-isolation by the NetworkPolicy isolation of pod blue/a: isolated by NetworkPolicy blue/web-80 (no rule allows tcp/81)"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, text := traceOffline(t, tc.dumps, tc.o)
			if res.Verdict.Kind != tc.kind || len(res.Hops) != tc.hops {
				t.Errorf("verdict %s after %d hops, want %s after %d:\n%s", res.Verdict.Kind, len(res.Hops), tc.kind, tc.hops, text)
			}
			for _, s := range tc.says {
				if !strings.Contains(res.Verdict.Text, s) {
					t.Errorf("verdict %q does not say %q", res.Verdict.Text, s)
				}
			}
			goldenTrace(t, tc.name, res, text)
		})
	}
}

// TestTraceOfflineServiceEndpoints: a service trace names every endpoint of the group and the one
// followed; --endpoint follows another; an endpoint the group does not have is an error naming them.
func TestTraceOfflineServiceEndpoints(t *testing.T) {
	ctx := context.Background()
	w, err := newOfflineWorld(twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapVXLAN))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Trace(ctx, w, TraceOptions{Src: "blue/a2", Dst: "svc/blue/web", Proto: "tcp", SrcPort: 40000})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Service
	if s == nil || s.Chosen != "10.128.0.3:8080" || s.Bucket == nil || *s.Bucket != 0 || len(s.Endpoints) != 2 ||
		s.Endpoints[0] != "10.128.0.3:8080 (1/2 buckets)" || s.Owner != "svc/blue/web:http" {
		t.Fatalf("service %+v", s)
	}
	if res.Verdict.Pod != "blue/a" {
		t.Errorf("default endpoint: verdict %+v", res.Verdict)
	}
	_, err = Trace(ctx, w, TraceOptions{Src: "blue/a2", Dst: "svc/blue/web", Proto: "tcp", SrcPort: 40000, Endpoint: "10.128.9.9"})
	if err == nil || !strings.Contains(err.Error(), "10.128.0.3:8080") {
		t.Errorf("unknown endpoint: %v", err)
	}
	for _, bad := range []TraceOptions{
		{Src: "svc/blue/web", Dst: "blue/a"}, {Src: "blue/nope", Dst: "blue/a"}, {Src: "blue/a", Dst: "svc/blue/nope"},
		{Src: "blue/a", Dst: "svc/blue/web", Port: 99}, {Src: "192.0.2.7", Dst: "blue/a"}, {Src: "192.0.2.7", Dst: "n1", Port: 31999},
		{Src: "n3", Dst: "blue/a"}, {Src: "blue/a", Dst: "blue/c", Proto: "gre"},
	} {
		if bad.Proto == "" {
			bad.Proto = "tcp"
		}
		bad.SrcPort = 40000
		if res, err := Trace(ctx, w, bad); err == nil {
			t.Errorf("%+v: traced (%s), want an error", bad, res.Verdict.Text)
		}
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

// traceOffline traces o over the dumps, tcp from port 40000 unless o names another protocol, and
// returns the result with its text.
func traceOffline(t *testing.T, dumps []string, o TraceOptions) (*TraceResult, string) {
	t.Helper()
	w, err := newOfflineWorld(dumps)
	if err != nil {
		t.Fatal(err)
	}
	if o.Proto == "" {
		o.Proto = "tcp"
	}
	o.SrcPort = 40000
	res, err := Trace(context.Background(), w, o)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	return res, text.String()
}

// goldenTrace compares a trace's text and JSON with testdata/trace-<name>.golden and .json.golden.
func goldenTrace(t *testing.T, name string, res *TraceResult, text string) {
	t.Helper()
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "trace-"+name+".golden", []byte(text))
	golden(t, "trace-"+name+".json.golden", append(js, '\n'))
}

// Every role a port of br0 can have (the pipeline's registry) has a trace outcome, and a trace that
// leaves a bridge by a port of that role ends as that role means: a role added to the registry
// without an outcome, or one whose packets are no longer followed, fails here.
func TestEveryPortRoleHasATraceOutcome(t *testing.T) {
	ctx := context.Background()
	vxlan, none := twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapVXLAN), twoNodes(t, pipeline.ModeMultitenant, pipeline.EncapNone)
	cases := map[pipeline.PortRole]struct {
		dumps []string
		o     TraceOptions
		// ends is how the trace must end: the verdict kind, the hops, and what the first hop left by.
		kind   string
		hops   int
		leaves string
	}{
		pipeline.RoleTunnel: {vxlan, TraceOptions{Src: "blue/a", Dst: "blue/c"}, VerdictDelivered, 2, "leaves by vxlan0 to node n2"},
		pipeline.RoleUplink: {none, TraceOptions{Src: "blue/a", Dst: "blue/c"}, VerdictDelivered, 2, "leaves by patch-uplink to node n2"},
		pipeline.RoleHost:   {vxlan, TraceOptions{Src: "blue/a", Dst: "192.0.2.7"}, VerdictLeftCluster, 1, "leaves by tun0 to the host of node n1"},
		pipeline.RolePod:    {vxlan, TraceOptions{Src: "blue/a", Dst: "blue/a2"}, VerdictDelivered, 1, "leaves by port 4 (vetha2, pod blue/a2)"},
	}
	for _, role := range pipeline.PortRoles() {
		t.Run(string(role), func(t *testing.T) {
			if exits[role] == nil {
				t.Fatalf("flowctl trace has no outcome for ports of role %q", role)
			}
			tc, ok := cases[role]
			if !ok {
				t.Fatalf("no trace here leaves by a port of role %q: add one", role)
			}
			w, err := newOfflineWorld(tc.dumps)
			if err != nil {
				t.Fatal(err)
			}
			tc.o.Proto, tc.o.SrcPort, tc.o.Port = "tcp", 40000, 8080
			res, err := Trace(ctx, w, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict.Kind != tc.kind || len(res.Hops) != tc.hops || !strings.HasPrefix(res.Hops[0].Leaves, tc.leaves) {
				var text bytes.Buffer
				_ = res.WriteText(&text)
				t.Errorf("verdict %s after %d hops, first leaving %q; want %s after %d, leaving %q…\n%s",
					res.Verdict.Kind, len(res.Hops), res.Hops[0].Leaves, tc.kind, tc.hops, tc.leaves, text.String())
			}
		})
	}
}

// egressNodes writes dumps of n1 and n2 with egress: blue leaves from 198.51.100.40, held by n2; red has
// an EgressNetworkPolicy (deny 192.0.2.66, allow 192.0.2.0/24, deny the rest); default has an egress
// IP no node holds (198.51.100.41).
func egressNodes(t *testing.T, mode pipeline.Mode, encap pipeline.Encapsulation) []string {
	dir := t.TempDir()
	a, b, g := netip.MustParseAddr("10.128.0.3"), netip.MustParseAddr("10.128.0.5"), netip.MustParseAddr("10.128.0.6")
	c := netip.MustParseAddr("10.128.2.3")
	pfx := netip.MustParsePrefix
	egress := func(held ...netip.Addr) pipeline.EgressState {
		return pipeline.EgressState{ServiceNetwork: serviceNet, Held: held, Namespaces: []pipeline.EgressNamespace{
			{Name: "blue", IPs: []netip.Addr{netip.MustParseAddr("198.51.100.40")}},
			{Name: "default", IPs: []netip.Addr{netip.MustParseAddr("198.51.100.41")}},
			{Name: "red", Firewall: &pipeline.EgressFirewall{Policy: "fw", Rules: []pipeline.EgressRule{
				{Dsts: []netip.Prefix{pfx("192.0.2.66/32")}}, {Allow: true, Dsts: []netip.Prefix{pfx("192.0.2.0/24")}}, {Dsts: []netip.Prefix{pfx("0.0.0.0/0")}}}}},
		}}
	}
	n1Pods := []testPod{{"blue", "a", a, 3}, {"red", "b", b, 5}, {"default", "g", g, 6}}
	n2Pods := []testPod{{"blue", "c", c, 3}}
	return []string{
		writeNodeDumpEgress(t, dir, "n1", n1IP, n1Net, debugapi.RemoteNode{Name: "n2", NodeIP: n2IP, Subnet: n2Net}, mode, encap,
			n1Pods, n2Pods, nil, nil, nil, egress()),
		writeNodeDumpEgress(t, dir, "n2", n2IP, n2Net, debugapi.RemoteNode{Name: "n1", NodeIP: n1IP, Subnet: n1Net}, mode, encap,
			n2Pods, n1Pods, nil, nil, nil, egress(netip.MustParseAddr("198.51.100.40"))),
	}
}

// TestTraceOfflineEgress: a trace to an outside address names the egress IP and the node it leaves
// from, or the EgressNetworkPolicy rule that drops it, in both encapsulations.
func TestTraceOfflineEgress(t *testing.T) {
	for _, encap := range []pipeline.Encapsulation{pipeline.EncapVXLAN, pipeline.EncapNone} {
		dumps := egressNodes(t, pipeline.ModeMultitenant, encap)
		cases := []struct {
			name     string
			o        TraceOptions
			kind     string
			says     []string
			hops     int
			egressIP string
			firewall string
		}{
			{"egress-ip", TraceOptions{Src: "blue/a", Dst: "192.0.2.7", Port: 443}, VerdictLeftCluster,
				[]string{"from node n2", "with egress IP 198.51.100.40 (namespace blue)", "SNATs it from 10.128.0.3 to 198.51.100.40"}, 2, "198.51.100.40", ""},
			{"egress-ip-held-here", TraceOptions{Src: "blue/c", Dst: "192.0.2.7", Port: 443}, VerdictLeftCluster,
				[]string{"from node n2", "with egress IP 198.51.100.40", "from 10.128.2.3 to 198.51.100.40"}, 1, "198.51.100.40", ""},
			{"egress-ip-unheld", TraceOptions{Src: "default/g", Dst: "192.0.2.7", Port: 443}, VerdictDropped,
				[]string{"egress IP 198.51.100.41 (namespace default), which no node holds now"}, 1, "198.51.100.41", ""},
			{"egress-ip-inside", TraceOptions{Src: "blue/a", Dst: "blue/c", Port: 8080}, VerdictDelivered, []string{"blue/c"}, 2, "", ""},
			{"egress-firewall-first-rule", TraceOptions{Src: "red/b", Dst: "192.0.2.66", Port: 443}, VerdictDropped,
				[]string{"table 55 egress-firewall by EgressNetworkPolicy red/fw: rule 0 (Deny 192.0.2.66/32)"}, 1, "", "red/fw rule 0"},
			{"egress-firewall-allowed", TraceOptions{Src: "red/b", Dst: "192.0.2.7", Port: 443}, VerdictLeftCluster,
				[]string{"SNATs it from 10.128.0.5 to 198.51.100.11"}, 1, "", ""},
			{"egress-firewall-last-rule", TraceOptions{Src: "red/b", Dst: "198.18.0.1", Port: 443}, VerdictDropped,
				[]string{"rule 2 (Deny 0.0.0.0/0)"}, 1, "", "red/fw rule 2"},
		}
		for _, tc := range cases {
			t.Run(string(encap)+"/"+tc.name, func(t *testing.T) {
				tc.o.Proto = "tcp"
				res, text := traceOffline(t, dumps, tc.o)
				if res.Verdict.Kind != tc.kind || len(res.Hops) != tc.hops || res.Verdict.EgressIP != tc.egressIP || res.Verdict.Firewall != tc.firewall {
					t.Errorf("verdict %s (egress IP %q, firewall %q) after %d hops, want %s (%q, %q) after %d:\n%s", res.Verdict.Kind, res.Verdict.EgressIP,
						res.Verdict.Firewall, len(res.Hops), tc.kind, tc.egressIP, tc.firewall, tc.hops, text)
				}
				for _, s := range tc.says {
					if !strings.Contains(res.Verdict.Text, s) {
						t.Errorf("verdict %q does not say %q", res.Verdict.Text, s)
					}
				}
				if encap == pipeline.EncapVXLAN && tc.name == "egress-ip" {
					golden(t, "trace-egress-ip.golden", []byte(text))
				}
			})
		}
	}
}

// TestTraceShowsSampledDrops: a trace step through a sampled drop flow reads as flowctl dump shows it,
// "drop (sampled: CAUSE, meter M)", not as a packet sent to the controller, in text and in JSON's
// sampled; a live trace's step (ovs-vswitchd's match text) finds its flow by table, priority and
// cookie; any other flow's actions are shown as they are.
func TestTraceShowsSampledDrops(t *testing.T) {
	cookie := uint64(reconcile.MakeCookie(3, pipeline.PipelineOwner))
	sample := func(meter uint32) openflow.Action {
		return openflow.Controller{MaxLen: pipeline.DropSampleLen, MeterID: meter}
	}
	spoofMiss := openflow.F(pipeline.TablePodIngress, 0, openflow.M(), sample(4))
	spoofMiss.Cookie = cookie
	otherMeter := openflow.F(pipeline.TablePodIngress, 1, openflow.M(openflow.IPv6...), sample(9))
	otherMeter.Cookie = cookie
	n := &traceNode{owners: ownerIndex([]string{pipeline.PipelineOwner.String()}), flows: []openflow.Flow{spoofMiss, otherMeter}}
	step := func(f openflow.Flow, match string) trace.Step {
		s := trace.Step{Table: f.Table, Priority: f.Priority, Match: match, Cookie: f.Cookie, Bucket: -1}
		for _, a := range f.Actions {
			s.Actions = append(s.Actions, a.String())
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		step    trace.Step
		sampled string
		text    string // the step's actions in flowctl trace's text
	}{
		{"offline", step(spoofMiss, spoofMiss.Match.String()), "anti-spoofing", "owner pipeline/base: drop (sampled: anti-spoofing, meter 4)\n"},
		{"live match text", step(spoofMiss, "recirc_id=0"), "anti-spoofing", "owner pipeline/base: drop (sampled: anti-spoofing, meter 4)\n"},
		{"not its cause's meter", step(otherMeter, otherMeter.Match.String()), "", "owner pipeline/base: controller(max_len=128,meter_id=9)\n"},
		{"a flow the node does not have", trace.Step{Table: pipeline.TablePodIngress, Priority: 7, Cookie: cookie, Bucket: -1,
			Actions: []string{"controller(max_len=128,meter_id=4)"}}, "", "owner pipeline/base: controller(max_len=128,meter_id=4)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := describeSteps(n, &trace.Path{Passes: []trace.Pass{{Steps: []trace.Step{tc.step}}}})
			if len(steps) != 1 || steps[0].Sampled != tc.sampled {
				t.Fatalf("steps %+v, want one sampled %q", steps, tc.sampled)
			}
			var buf bytes.Buffer
			res := &TraceResult{Hops: []Hop{{Node: "n1", Steps: steps}}, Verdict: Verdict{Kind: VerdictDropped, Text: "dropped"}}
			if err := res.WriteText(&buf); err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(strings.SplitAfter(buf.String(), "\n")[4], tc.text) {
				t.Errorf("text, want a step ending %q:\n%s", tc.text, buf.String())
			}
		})
	}
}
