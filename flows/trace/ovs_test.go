package trace

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/unixctl"
)

var update = flag.Bool("update", false, "rewrite testdata/ofproto-trace-*.txt from the real OVS traces")

// live traces through a real ovs-vswitchd, as the agent's debug API does. With -update it keeps the
// last raw answer, for the parser's unit tests.
type live struct {
	c      *unixctl.Client
	bridge string
	last   *string
}

func (l live) Trace(ctx context.Context, p Packet, ctNext []CtFlags) (*Path, error) {
	out, err := l.c.Call(ctx, "ofproto/trace", OVSArgs(l.bridge, p, ctNext)...)
	if err != nil {
		return nil, err
	}
	*l.last = out
	return Parse(out)
}

// recorded are the cases whose raw ofproto/trace answers the parser's unit tests read (testdata).
var recorded = map[string]string{
	"multitenant/same tenant? no: a to b":                "tenant-drop",
	"multitenant/service, remote endpoint":               "service-remote",
	"multitenant/hairpin: a pod through its own service": "hairpin",
	"networkpolicy/remote client, policy allows 80":      "policy-allow",
	"networkpolicy/remote client, policy denies 81":      "policy-deny",
	"multitenant/service without endpoints":              "service-reject",
}

func mac(ip netip.Addr) MAC {
	a := ip.As4()
	return MAC{0x0a, 0x58, a[0], a[1], a[2], a[3]}
}

var (
	nodeIP   = netip.MustParseAddr("198.51.100.11")
	peerIP   = netip.MustParseAddr("198.51.100.12")
	subnet   = netip.MustParsePrefix("10.128.0.0/23")
	gw       = pipeline.Gateway(subnet)
	ipA      = netip.MustParseAddr("10.128.0.3")
	ipB      = netip.MustParseAddr("10.128.0.4")
	ipG      = netip.MustParseAddr("10.128.0.5")
	ipRemote = netip.MustParseAddr("10.128.2.5")
	webIP    = netip.MustParseAddr("172.30.0.10")
	emptyIP  = netip.MustParseAddr("172.30.0.11")
	stickyIP = netip.MustParseAddr("172.30.0.12")
	outside  = netip.MustParseAddr("192.0.2.99")
	tun0MAC  = MAC{0x0a, 0x58, 0xff, 0, 0, 1}
)

// testState is one node of every kind of owner: pods in two tenants and the global one, a remote
// node, services with local and remote endpoints, without endpoints and with affinity, NodePorts, and
// (networkpolicy mode) a policy that lets only TCP 80 into pod a.
func testState(mode pipeline.Mode) pipeline.NodeState {
	pod := func(ns, name string, ip netip.Addr, port, vnid uint32) pipeline.PodState {
		return pipeline.PodState{Namespace: ns, Name: name, IP: ip, MAC: net.HardwareAddr(mac(ip)), OFPort: port, VNID: vnid,
			IngressIsolated: name == "a"}
	}
	eps := []pipeline.Endpoint{{IP: ipA, Port: 8080, Ready: true, Local: true}, {IP: ipRemote, Port: 8080, Ready: true, NodeName: "n2"}}
	return pipeline.NodeState{Mode: mode, NodeName: "n1", NodeIP: nodeIP, LocalSubnet: subnet,
		ClusterNetworks:   []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		Pods:              []pipeline.PodState{pod("t1", "a", ipA, 3, 11), pod("t2", "b", ipB, 4, 12), pod("default", "g", ipG, 5, 0)},
		RemoteNodes:       []pipeline.RemoteNode{{Name: "n2", NodeIP: peerIP, Subnet: netip.MustParsePrefix("10.128.2.0/23")}},
		NodePortAddresses: []netip.Addr{pipeline.ServiceNodePortIP},
		Services: []pipeline.ServiceState{
			{Namespace: "t1", Name: "web", ClusterIP: webIP, Ports: []pipeline.ServicePort{
				{Protocol: openflow.IPProtoTCP, Port: 80, NodePort: 30080, Endpoints: eps},
				{Name: "dns", Protocol: openflow.IPProtoUDP, Port: 53, Endpoints: eps}}},
			{Namespace: "t1", Name: "empty", ClusterIP: emptyIP, Ports: []pipeline.ServicePort{{Protocol: openflow.IPProtoTCP, Port: 80}}},
			{Namespace: "t1", Name: "sticky", ClusterIP: stickyIP, AffinityTimeout: 60, Ports: []pipeline.ServicePort{
				{Protocol: openflow.IPProtoTCP, Port: 80, Endpoints: eps}}},
		},
		Policies: []pipeline.PolicyState{{Namespace: "t1", Name: "web-80", Ingress: true, Pods: []pipeline.PolicyPod{{OFPort: 3}},
			IngressRules: []pipeline.PolicyRule{{AllPeers: true, Ports: []pipeline.PolicyPort{{Protocol: openflow.IPProtoTCP, Port: 80}}}}}},
		// Networks: red and blue share addresses (a pod on each has ipNet), green talks to red.
		Networks: []pipeline.NetworkState{
			network("red", vniRed, "10.200.0.0/16", "10.200.1.0/24", "10.200.2.0/24", "green"),
			network("blue", vniBlue, "10.200.0.0/16", "10.200.1.0/24", "10.200.2.0/24"),
			network("green", vniGreen, "10.201.0.0/16", "10.201.3.0/24", "10.201.2.0/24", "red"),
		},
		Attachments: []pipeline.AttachmentState{
			{Namespace: "t1", Name: "a", Interface: "net1", Network: "red", VNI: vniRed, IP: ipNet, MAC: net.HardwareAddr(mac(ipNet)), OFPort: 6},
			{Namespace: "t2", Name: "b", Interface: "net1", Network: "blue", VNI: vniBlue, IP: ipNet, MAC: net.HardwareAddr(mac(ipNet)), OFPort: 7},
			{Namespace: "t1", Name: "a", Interface: "net2", Network: "green", VNI: vniGreen, IP: ipGreen, MAC: net.HardwareAddr(mac(ipGreen)), OFPort: 8},
		},
	}
}

const vniRed, vniBlue, vniGreen = 0xfff001, 0xfff002, 0xfff003

var (
	ipNet       = netip.MustParseAddr("10.200.1.5")
	ipGreen     = netip.MustParseAddr("10.201.3.5")
	ipNetRemote = netip.MustParseAddr("10.200.2.9")
)

// network is a Network with this node's subnet and n2's.
func network(name string, vni uint32, cidr, local, remote string, talks ...string) pipeline.NetworkState {
	return pipeline.NetworkState{Name: name, VNI: vni, CIDR: netip.MustParsePrefix(cidr), LocalSubnet: netip.MustParsePrefix(local),
		Remotes:   []pipeline.NetworkRemote{{Node: "n2", NodeIP: peerIP, Subnet: netip.MustParsePrefix(remote)}},
		CrossTalk: talks}
}

// fromPod is a packet a local pod sends to its gateway's MAC.
func fromPod(port uint32, src, dst netip.Addr, proto string, dport uint16) Packet {
	return Packet{InPort: port, EthSrc: mac(src), EthDst: mac(gw), Proto: proto, IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: dport}
}

// endpointChooser follows the buckets towards want.
func endpointChooser(b *Bridge, want netip.Addr) Chooser {
	v, _ := openflow.IPv4Value(want)
	return func(id uint32) []int {
		g, _ := b.Group(id)
		var out []int
		for i, bk := range g.Buckets {
			for _, a := range bk.Actions {
				if l, ok := a.(openflow.Load); ok && l.Dst.Field == pipeline.RegEndpointIP && l.Value == v {
					out = append(out, i)
				}
			}
		}
		return out
	}
}

// want is a packet's expected fate: the pipeline's intent, written independently of both tracers.
type want struct {
	out     uint32 // output port; 0 = dropped
	dropAt  openflow.TableID
	tunDst  netip.Addr
	tunID   uint64
	ipDst   netip.Addr // as it leaves
	dstPort uint16
	ipSrc   netip.Addr // as it leaves, when it matters
	or      *want      // another right answer (an endpoint chosen by a hash)
}

// TestOfflineAgreesWithOFProtoTrace renders every mode's pipeline onto a real bridge and traces the
// same first packets with ofproto/trace and with the offline evaluator over the bridge's dump: table
// paths, cookies, outputs and tunnel metadata must be the same. The expected fate of each packet is
// the pipeline's intent, written here independently of both.
func TestOfflineAgreesWithOFProtoTrace(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	addPorts(t, b, map[string]uint32{pipeline.PortNameVXLAN: pipeline.PortVXLAN, pipeline.PortNameTun0: pipeline.PortTun0, "pa": 3, "pb": 4, "pg": 5,
		"pa-net1": 6, "pb-net1": 7, "pa-net2": 8})
	l := live{c: unixctl.New(b.Inst.Dir, "ovs-vswitchd"), bridge: "br0", last: new(string)}
	r := reconcile.New(b.Switch, reconcile.Config{Round: 1})

	toRemote := want{out: 1, tunDst: peerIP, tunID: 0, ipDst: ipRemote, dstPort: 8080}
	toSticky := want{out: 3, ipDst: ipA, dstPort: 8080, or: &toRemote}
	remoteIn := func(vnid uint64, dst netip.Addr, dport uint16) Packet {
		return Packet{InPort: pipeline.PortVXLAN, TunID: vnid, TunSrc: peerIP, TunDst: nodeIP, EthSrc: mac(ipRemote), EthDst: mac(dst),
			Proto: "tcp", IPSrc: ipRemote, IPDst: dst, SrcPort: 40000, DstPort: dport}
	}
	nodePort := Packet{InPort: pipeline.PortTun0, EthSrc: tun0MAC, EthDst: MAC(pipeline.ServiceMAC), Proto: "tcp", IPSrc: gw,
		IPDst: pipeline.ServiceNodePortIP, SrcPort: 40000, DstPort: 30080}
	netIn := func(vni uint64, src, dst netip.Addr) Packet {
		return Packet{InPort: pipeline.PortVXLAN, TunID: vni, TunSrc: peerIP, TunDst: nodeIP, EthSrc: mac(src), EthDst: mac(dst),
			Proto: "udp", IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: 5000}
	}
	everyMode := func(w want) map[pipeline.Mode]want {
		return map[pipeline.Mode]want{pipeline.ModeMultitenant: w, pipeline.ModeSubnet: w, pipeline.ModeNetworkPolicy: w}
	}
	onNet := func(port uint32, vni uint32, src, dst netip.Addr, dport uint16) Packet {
		return Packet{InPort: port, EthSrc: mac(src), EthDst: MAC(pipeline.NetworkGatewayMAC(vni)), Proto: "udp", IPSrc: src, IPDst: dst,
			SrcPort: 40000, DstPort: dport}
	}
	cases := []struct {
		name   string
		p      Packet
		follow netip.Addr // endpoint to follow in a select group
		want   map[pipeline.Mode]want
	}{
		// Networks (pipeline/networks.go): the same address on two networks, each its own segment.
		{"network: red pod to a red pod on n2", onNet(6, vniRed, ipNet, ipNetRemote, 5000), netip.Addr{},
			everyMode(want{out: 1, tunDst: peerIP, tunID: vniRed, ipDst: ipNetRemote, dstPort: 5000})},
		{"network: blue pod, same address, to n2", onNet(7, vniBlue, ipNet, ipNetRemote, 5000), netip.Addr{},
			everyMode(want{out: 1, tunDst: peerIP, tunID: vniBlue, ipDst: ipNetRemote, dstPort: 5000})},
		{"network: red in from n2 reaches the red pod only", netIn(vniRed, ipNetRemote, ipNet), netip.Addr{},
			everyMode(want{out: 6, ipDst: ipNet, dstPort: 5000})},
		{"network: blue in from n2 reaches the blue pod only", netIn(vniBlue, ipNetRemote, ipNet), netip.Addr{},
			everyMode(want{out: 7, ipDst: ipNet, dstPort: 5000})},
		{"network: cross-talk red to green", onNet(6, vniRed, ipNet, ipGreen, 5000), netip.Addr{},
			everyMode(want{out: 8, ipDst: ipGreen, dstPort: 5000})},
		{"network: no cross-talk blue to green", onNet(7, vniBlue, ipNet, ipGreen, 5000), netip.Addr{},
			everyMode(want{dropAt: pipeline.TableNetCrossTalk})},
		{"network: green from n2's red subnet", netIn(vniGreen, ipNetRemote, ipGreen), netip.Addr{},
			everyMode(want{out: 8, ipDst: ipGreen, dstPort: 5000})},
		{"network: an unknown network's VNI", netIn(0xfff0ff, ipRemote, ipA), netip.Addr{},
			everyMode(want{dropAt: pipeline.TableTunnelIngress})},
		{"network: to the cluster network", onNet(6, vniRed, ipNet, ipA, 5000), netip.Addr{},
			everyMode(want{dropAt: pipeline.TableNetCrossTalk})},
		{"network: to a node's tunnel port", onNet(6, vniRed, ipNet, peerIP, 4789), netip.Addr{},
			everyMode(want{dropAt: pipeline.TableNetCrossTalk})},
		{"network: spoofed source", onNet(6, vniRed, ipGreen, ipNetRemote, 5000), netip.Addr{},
			everyMode(want{dropAt: pipeline.TablePodIngress})},
		{"same tenant? no: a to b", fromPod(3, ipA, ipB, "tcp", 8080), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {dropAt: pipeline.TableIngressIsolation}, pipeline.ModeSubnet: {out: 4, ipDst: ipB, dstPort: 8080},
			pipeline.ModeNetworkPolicy: {out: 4, ipDst: ipB, dstPort: 8080}}},
		{"global pod reaches a tenant", fromPod(5, ipG, ipB, "udp", 53), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 4, ipDst: ipB, dstPort: 53}, pipeline.ModeSubnet: {out: 4, ipDst: ipB, dstPort: 53},
			pipeline.ModeNetworkPolicy: {out: 4, ipDst: ipB, dstPort: 53}}},
		{"to the remote node", fromPod(3, ipA, ipRemote, "tcp", 8080), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant:   {out: 1, tunDst: peerIP, tunID: 11, ipDst: ipRemote, dstPort: 8080},
			pipeline.ModeSubnet:        {out: 1, tunDst: peerIP, tunID: 11, ipDst: ipRemote, dstPort: 8080},
			pipeline.ModeNetworkPolicy: {out: 1, tunDst: peerIP, tunID: 11, ipDst: ipRemote, dstPort: 8080}}},
		{"spoofed source", fromPod(4, ipA, ipG, "icmp", 0), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {dropAt: pipeline.TablePodIngress}, pipeline.ModeSubnet: {dropAt: pipeline.TablePodIngress},
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TablePodIngress}}},
		{"out of the cluster", fromPod(4, ipB, outside, "tcp", 443), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 2, ipDst: outside, dstPort: 443}, pipeline.ModeSubnet: {out: 2, ipDst: outside, dstPort: 443},
			pipeline.ModeNetworkPolicy: {out: 2, ipDst: outside, dstPort: 443}}},
		{"service, local endpoint", fromPod(5, ipG, webIP, "tcp", 80), ipA, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 3, ipDst: ipA, dstPort: 8080}, pipeline.ModeSubnet: {out: 3, ipDst: ipA, dstPort: 8080},
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableIngressIsolation}}}, // only TCP 80 may reach a; the endpoint port is 8080
		{"service, remote endpoint", fromPod(4, ipB, webIP, "tcp", 80), ipRemote, map[pipeline.Mode]want{
			pipeline.ModeMultitenant:   {out: 1, tunDst: peerIP, tunID: 12, ipDst: ipRemote, dstPort: 8080},
			pipeline.ModeSubnet:        {out: 1, tunDst: peerIP, tunID: 12, ipDst: ipRemote, dstPort: 8080},
			pipeline.ModeNetworkPolicy: {out: 1, tunDst: peerIP, tunID: 12, ipDst: ipRemote, dstPort: 8080}}},
		{"UDP service", fromPod(4, ipB, webIP, "udp", 53), ipRemote, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 1, tunDst: peerIP, tunID: 12, ipDst: ipRemote, dstPort: 8080}}},
		{"service without endpoints", fromPod(4, ipB, emptyIP, "tcp", 80), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 2, ipDst: gw, dstPort: pipeline.RejectPortMin}, pipeline.ModeSubnet: {out: 2, ipDst: gw, dstPort: pipeline.RejectPortMin},
			pipeline.ModeNetworkPolicy: {out: 2, ipDst: gw, dstPort: pipeline.RejectPortMin}}},
		// sessionAffinity: which endpoint a client gets is OVS's jhash of its address (and, for an empty
		// slot, of further bases), so either endpoint is right as long as live and offline agree on it.
		{"sessionAffinity service", fromPod(5, ipG, stickyIP, "tcp", 80), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: toSticky, pipeline.ModeSubnet: toSticky}},
		{"sessionAffinity service, second client", fromPod(4, ipB, stickyIP, "tcp", 80), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeSubnet: toSticky}},
		{"sessionAffinity service, from the host", Packet{InPort: pipeline.PortTun0, EthSrc: tun0MAC, EthDst: mac(gw), Proto: "tcp",
			IPSrc: gw, IPDst: stickyIP, SrcPort: 40000, DstPort: 80}, netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: toSticky, pipeline.ModeSubnet: toSticky, pipeline.ModeNetworkPolicy: toSticky}}, // the node passes any policy,
		{"hairpin: a pod through its own service", fromPod(3, ipA, webIP, "tcp", 80), ipA, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 3, ipDst: ipA, dstPort: 8080, ipSrc: pipeline.ServiceHairpinIP},
			pipeline.ModeSubnet:      {out: 3, ipDst: ipA, dstPort: 8080, ipSrc: pipeline.ServiceHairpinIP},
			// a is isolated and allows only TCP 80: its own service's port 8080 is not allowed either.
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableIngressIsolation}}},
		{"NodePort from outside", nodePort, ipA, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 3, ipDst: ipA, dstPort: 8080}, pipeline.ModeSubnet: {out: 3, ipDst: ipA, dstPort: 8080}}},
		{"remote client, tenant mismatch", remoteIn(12, ipA, 80), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {dropAt: pipeline.TableIngressIsolation}}},
		{"remote client, policy allows 80", remoteIn(0, ipA, 80), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeNetworkPolicy: {out: 3, ipDst: ipA, dstPort: 80}}},
		{"remote client, policy denies 81", remoteIn(0, ipA, 81), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableIngressIsolation}}},
		{"unknown tunnel peer", func() Packet { p := remoteIn(0, ipA, 80); p.TunSrc = outside; return p }(), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {dropAt: pipeline.TableTunnelIngress}}},
		// The tunnel guard (pipeline/guard.go): no pod datagram to a tunnel port outside the pod network;
		// a known peer's tunnel carries only its subnet's and its own addresses.
		{"pod to a node's tunnel port", fromPod(4, ipB, peerIP, "udp", 4789), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {dropAt: pipeline.TableRouting}, pipeline.ModeSubnet: {dropAt: pipeline.TableRouting},
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableRouting}}},
		{"pod to a remote gateway's tunnel port", fromPod(4, ipB, pipeline.Gateway(netip.MustParsePrefix("10.128.2.0/23")), "udp", 4789), netip.Addr{},
			map[pipeline.Mode]want{pipeline.ModeMultitenant: {dropAt: pipeline.TableRouting}, pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableRouting}}},
		{"pod to a node's other port", fromPod(4, ipB, peerIP, "udp", 4790), netip.Addr{}, map[pipeline.Mode]want{
			pipeline.ModeMultitenant: {out: 2, ipDst: peerIP, dstPort: 4790}, pipeline.ModeNetworkPolicy: {out: 2, ipDst: peerIP, dstPort: 4790}}},
		{"tunnel from the peer with a third node's source", func() Packet {
			p := remoteIn(0, ipG, 80)
			p.IPSrc = netip.MustParseAddr("10.128.4.3")
			return p
		}(), netip.Addr{}, map[pipeline.Mode]want{pipeline.ModeMultitenant: {dropAt: pipeline.TableTunnelIngress},
			pipeline.ModeNetworkPolicy: {dropAt: pipeline.TableTunnelIngress}}},
	}
	var applied map[reconcile.Owner]reconcile.OwnerState // the render r holds
	for _, mode := range []pipeline.Mode{pipeline.ModeMultitenant, pipeline.ModeSubnet, pipeline.ModeNetworkPolicy} {
		t.Run(string(mode), func(t *testing.T) {
			owners, err := pipeline.Render(testState(mode))
			if err != nil {
				t.Fatal(err)
			}
			if res, err := r.Apply(ctx, reconcile.Changes(applied, owners)); err != nil || len(res.Failed) > 0 {
				t.Fatal(err, res.Failed)
			}
			applied = owners
			off := offlineBridge(t, b)
			for _, tc := range cases {
				w, ok := tc.want[mode]
				if !ok {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					var choose Chooser
					if tc.follow.IsValid() {
						choose = endpointChooser(off, tc.follow)
					}
					lp, op := traceBoth(t, l, off, tc.p, choose, recorded[string(mode)+"/"+tc.name])
					for name, path := range map[string]*Path{"live": lp, "offline": op} {
						err := w.fate(path)
						for alt := w.or; err != nil && alt != nil; alt = alt.or {
							if alt.fate(path) == nil {
								err = nil
							}
						}
						if err != nil {
							t.Errorf("%s: %v\n%s", name, err, strings.Join(path.Key(), "\n"))
						}
					}
				})
			}
		})
	}
}

// fate says how p differs from what w wants (nil: it does not).
func (w want) fate(p *Path) error {
	if w.out == 0 {
		last, _ := p.Last()
		if !p.Dropped() || last.Table != w.dropAt {
			return fmt.Errorf("want a drop at table %d; outputs %v, last step table %d", w.dropAt, p.Outputs, last.Table)
		}
		return nil
	}
	if len(p.Outputs) != 1 || p.Outputs[0].Port != w.out {
		return fmt.Errorf("outputs %+v, want port %d", p.Outputs, w.out)
	}
	f := p.Outputs[0].Fields
	if f.IPDst != w.ipDst || f.DstPort != w.dstPort {
		return fmt.Errorf("leaves to %s:%d, want %s:%d", f.IPDst, f.DstPort, w.ipDst, w.dstPort)
	}
	if w.tunDst.IsValid() && (f.TunDst != w.tunDst || f.TunID != w.tunID) {
		return fmt.Errorf("tunnel to %s tun_id %#x, want %s tun_id %#x", f.TunDst, f.TunID, w.tunDst, w.tunID)
	}
	if w.ipSrc.IsValid() && f.IPSrc != w.ipSrc {
		return fmt.Errorf("leaves from %s, want %s", f.IPSrc, w.ipSrc)
	}
	return nil
}

// traceBoth traces p live and offline, fails unless both take the same path, and with -update keeps
// the live answer as testdata/ofproto-trace-<record>.txt (and its key) for the parser's tests.
func traceBoth(t *testing.T, l live, off *Bridge, p Packet, choose Chooser, record string) (lp, op *Path) {
	t.Helper()
	ctx := t.Context()
	lp, lflags, err := Run(ctx, l, p, choose)
	if err != nil {
		t.Fatal(err)
	}
	op, oflags, err := Run(ctx, Offline{off}, p, choose)
	if err != nil {
		t.Fatal(err)
	}
	if lk, ok := strings.Join(lp.Key(), "\n"), strings.Join(op.Key(), "\n"); lk != ok {
		t.Fatalf("live and offline paths differ:\nlive (ct %v):\n%s\noffline (ct %v):\n%s", lflags, lk, oflags, ok)
	}
	if record != "" && *update {
		file := filepath.Join("testdata", "ofproto-trace-"+record)
		if err := os.WriteFile(file+".txt", []byte(*l.last), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file+".key", []byte(strings.Join(lp.Key(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return lp, op
}

// addPorts adds internal ports to br0 at the given OpenFlow numbers: a trace's in_port must exist.
func addPorts(t testing.TB, b *ofbridge.Bridge, ports map[string]uint32) {
	t.Helper()
	for name, number := range ports {
		if _, err := b.Inst.Vsctl("add-port", "br0", name, "--", "set", "interface", name, "type=internal",
			fmt.Sprintf("ofport_request=%d", number)); err != nil {
			t.Fatal(err)
		}
	}
}

// install renders st, installs it on b as the agent does (one reconciler, round 1) and reads the bridge
// back as flowctl dump does.
func install(t testing.TB, b *ofbridge.Bridge, st pipeline.NodeState) *Bridge {
	t.Helper()
	owners, err := pipeline.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	r := reconcile.New(b.Switch, reconcile.Config{Round: 1})
	if res, err := r.Apply(context.Background(), reconcile.Changes(nil, owners)); err != nil || len(res.Failed) > 0 {
		t.Fatal(err, res.Failed)
	}
	return offlineBridge(t, b)
}

// offlineBridge reads the bridge's flows and groups as flowctl dump does.
func offlineBridge(t testing.TB, b *ofbridge.Bridge) *Bridge {
	t.Helper()
	ctx := context.Background()
	raw, err := b.Switch.DumpFlows(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rawGroups, err := b.Switch.DumpGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var flows []openflow.Flow
	for _, r := range raw {
		f, err := openflow.DecodeFlowStats(r)
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, f)
	}
	var groups []openflow.GroupEntry
	for _, r := range rawGroups {
		g, err := openflow.DecodeGroupDesc(r)
		if err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g)
	}
	return NewBridge(flows, groups)
}

// TestOfflineAgreesWithOFProtoTraceUplink: encapsulation none. A pod's packet for the peer leaves by
// the uplink port, unencapsulated, between the two nodes' uplink MACs; what the peer sends arrives
// through the uplink port and is accepted by its source address (with the VNID of the pod that has
// it), or dropped. ofproto/trace and the offline evaluator must agree on every step.
func TestOfflineAgreesWithOFProtoTraceUplink(t *testing.T) {
	b := ofbridge.New(t)
	addPorts(t, b, map[string]uint32{pipeline.PortNameVXLAN: pipeline.PortVXLAN, pipeline.PortNameTun0: pipeline.PortTun0, "pa": 3, "pb": 4, "pg": 5,
		"pa-net1": 6, "pb-net1": 7, "pa-net2": 8})
	// The uplink port is a patch port into an uplink bridge that switches NORMAL, as on a node: live,
	// ofproto/trace follows the packet on into that bridge, which is not br0's path.
	b.Inst.AddBridge("br-ul")
	if _, err := b.Inst.Vsctl("add-port", "br-ul", "ul0", "--", "set", "interface", "ul0", "type=internal",
		"--", "add-port", "br0", pipeline.PortNameUplink, "--", "set", "interface", pipeline.PortNameUplink, "type=patch",
		"options:peer=patch-br0", fmt.Sprintf("ofport_request=%d", pipeline.PortUplink),
		"--", "add-port", "br-ul", "patch-br0", "--", "set", "interface", "patch-br0", "type=patch", "options:peer="+pipeline.PortNameUplink); err != nil {
		t.Fatal(err)
	}
	if out, err := b.Inst.Ofctl("add-flow", "br-ul", "actions=NORMAL"); err != nil {
		t.Fatal(err, out)
	}
	l := live{c: unixctl.New(b.Inst.Dir, "ovs-vswitchd"), bridge: "br0", last: new(string)}
	ipRemote2 := netip.MustParseAddr("10.128.2.6") // a pod of the peer in tenant 12
	st := testState(pipeline.ModeMultitenant)
	st.Encapsulation, st.Uplink = pipeline.EncapNone, true
	st.RemoteNodes[0].OnSegment = true
	st.RemoteNodes[0].Pods = []pipeline.RemotePod{{IP: ipRemote, VNID: 11}, {IP: ipRemote2, VNID: 12}}
	off := install(t, b, st)
	ours, peers := MAC(pipeline.UplinkMAC(nodeIP)), MAC(pipeline.UplinkMAC(peerIP))
	fromPeer := func(src, dst netip.Addr, dport uint16) Packet {
		return Packet{InPort: pipeline.PortUplink, EthSrc: peers, EthDst: ours, Proto: "tcp", IPSrc: src, IPDst: dst, SrcPort: 40000, DstPort: dport}
	}
	cases := []struct {
		name string
		p    Packet
		want want
		// ethDst is the destination MAC the packet must leave with ("" when it does not matter).
		ethDst string
		// record names the testdata file that keeps the live answer for the parser's tests (-update).
		record string
	}{
		{"to the peer's pod: out of the uplink port, to the peer's uplink MAC", fromPod(3, ipA, ipRemote, "tcp", 8080),
			want{out: pipeline.PortUplink, ipDst: ipRemote, dstPort: 8080}, peers.String(), "uplink-out"},
		{"from the peer's pod, same tenant: delivered", fromPeer(ipRemote, ipA, 80), want{out: 3, ipDst: ipA, dstPort: 80}, mac(ipA).String(), "uplink-in"},
		{"from the peer's pod, another tenant: isolated", fromPeer(ipRemote2, ipA, 80), want{dropAt: pipeline.TableIngressIsolation}, "", ""},
		{"from an address the peer has no pod at: dropped", fromPeer(netip.MustParseAddr("10.128.2.99"), ipA, 80),
			want{dropAt: pipeline.TableUplinkIngress}, "", ""},
		{"for another node's uplink MAC: dropped", func() Packet { p := fromPeer(ipRemote, ipA, 80); p.EthDst = peers; return p }(),
			want{dropAt: pipeline.TableClassifier}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lp, op := traceBoth(t, l, off, tc.p, nil, tc.record)
			for name, path := range map[string]*Path{"live": lp, "offline": op} {
				if err := tc.want.fate(path); err != nil {
					t.Errorf("%s: %v\n%s", name, err, strings.Join(path.Key(), "\n"))
				} else if tc.ethDst != "" && path.Outputs[0].Fields.EthDst != tc.ethDst {
					t.Errorf("%s: leaves for %s, want %s", name, path.Outputs[0].Fields.EthDst, tc.ethDst)
				}
			}
		})
	}
}
