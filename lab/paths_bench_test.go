package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/proc"
)

// BenchmarkCrossNodePaths measures single-stream TCP throughput between two "pods" on two lab nodes
// over the four ways a packet can cross the underlay, with hand-written flows and nothing else of
// ofsdn in the way, in one lab and one run:
//
//   - normal: both pods are ports of the nodes' underlay bridges br-ul, which only do NORMAL switching
//     (the baseline: what the userspace datapath costs with no pipeline at all);
//   - vxlan: pods on br0, which encapsulates towards the peer node through vxlan0;
//   - uplink: pods on br0, which rewrites the MACs and sends the frame unencapsulated through a patch
//     port into br-ul (the node's uplink bridge), pod addresses untouched;
//   - host-routes: pods on br0, which hands the packet to the host through tun0; the host routes the
//     peer's pod subnet to the peer's node address (flannel's host-gw) and the peer's host hands it back
//     to its br0 through its tun0.
//
// It is the measurement behind ofsdn's choice for encapsulation "none" (flows/pipeline/uplink.go). The
// figures are MB/s and ratios to normal; the userspace datapath is slow in absolute terms, and the two
// cores are shared, so compare ratios within one run.
func BenchmarkCrossNodePaths(b *testing.B) {
	l := StartT(b, Options{Nodes: 2})
	ctx := context.Background()
	p, err := newPathsLab(ctx, l)
	if err != nil {
		b.Fatal(err)
	}
	const seconds = 4
	results := map[string]float64{}
	for b.Loop() {
		for _, v := range []string{"normal", "vxlan", "uplink", "host-routes"} {
			// A short warm-up first: the userspace datapath drops the first packets to a neighbour
			// it has not resolved yet.
			_, _ = p.measure(ctx, v, 500*time.Millisecond)
			mbps, err := p.measure(ctx, v, seconds*time.Second)
			if err != nil {
				b.Fatalf("%s: %v", v, err)
			}
			results[v] = mbps
		}
	}
	for v, mbps := range results {
		b.ReportMetric(mbps, v+"-MB/s")
		if base := results["normal"]; base > 0 {
			b.ReportMetric(mbps/base, v+"/normal")
		}
	}
}

// pathsLab is the two-node setup of BenchmarkCrossNodePaths.
type pathsLab struct {
	l     *Lab
	nodes []*pathsNode
}

type pathsNode struct {
	n        *Node
	subnet   netip.Prefix // "pod" subnet behind br0
	pod      netip.Addr   // the br0 pod's address
	podNS    string
	plain    netip.Addr // the br-ul pod's underlay address
	plainNS  string
	tun0MAC  string
	uplinkMC string // br0's own MAC on the underlay
}

func macOf(prefix string, ip netip.Addr) string {
	b := ip.As4()
	return fmt.Sprintf("%s:%02x:%02x:%02x:%02x", prefix, b[0], b[1], b[2], b[3])
}

func newPathsLab(ctx context.Context, l *Lab) (*pathsLab, error) {
	p := &pathsLab{l: l}
	for k, n := range l.Nodes {
		pn := &pathsNode{n: n, subnet: netip.MustParsePrefix(fmt.Sprintf("10.128.%d.0/23", 2*(k+1))),
			podNS: l.NetNSName(n.Name + "-pod")}
		pn.pod = pn.subnet.Addr().Next().Next()
		pn.uplinkMC = macOf("0e:58", n.IP)
		gw := pn.subnet.Addr().Next()
		mtu := strconv.Itoa(l.MTU - VXLANOverhead)
		vs := [][]string{
			{"add-br", "br0", "--", "set", "Bridge", "br0", "datapath_type=netdev", "fail_mode=secure", "protocols=OpenFlow13"},
			{"add-port", "br0", "vxlan0", "--", "set", "Interface", "vxlan0", "type=vxlan", "ofport_request=1",
				"options:remote_ip=flow", "options:key=flow", "options:dst_port=4789"},
			{"add-port", "br0", "tun0", "--", "set", "Interface", "tun0", "type=internal", "ofport_request=2", "mtu_request=" + mtu},
			{"add-port", "br0", "patch-ul", "--", "set", "Interface", "patch-ul", "type=patch", "options:peer=patch-br0", "ofport_request=3",
				"--", "add-port", UnderlayBridge, "patch-br0", "--", "set", "Interface", "patch-br0", "type=patch", "options:peer=patch-ul"},
		}
		for _, args := range vs {
			if _, err := n.Vsctl(ctx, args...); err != nil {
				return nil, err
			}
		}
		if err := p.podOn(ctx, n, pn.podNS, "br0", "10", netip.PrefixFrom(pn.pod, 14), l.MTU-VXLANOverhead); err != nil {
			return nil, err
		}
		plain, err := l.AttachToUplink(ctx, n, n.Name+"-plain", 100+k)
		if err != nil {
			return nil, err
		}
		pn.plainNS, pn.plain = plain.NetNS, plain.IP
		if err := proc.Until(ctx, 10*time.Second, func() bool { _, err := n.Exec(ctx, "ip", "link", "show", "tun0"); return err == nil }); err != nil {
			return nil, fmt.Errorf("%s: tun0: %w", n.Name, err)
		}
		out, err := n.Exec(ctx, "cat", "/sys/class/net/tun0/address")
		if err != nil {
			return nil, err
		}
		pn.tun0MAC = strings.TrimSpace(out)
		if err := runAll(ctx, [][]string{
			{"ip", "-n", n.NetNS, "addr", "add", netip.PrefixFrom(gw, 23).String(), "dev", "tun0"},
			{"ip", "-n", n.NetNS, "link", "set", "tun0", "up"},
			{"ip", "netns", "exec", n.NetNS, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
			// The host hands the pod's packets back into br0 without ARP (no ARP flows here).
			{"ip", "-n", n.NetNS, "neigh", "replace", pn.pod.String(), "lladdr", macOf("0a:58", pn.pod), "dev", "tun0", "nud", "permanent"},
		}); err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, pn)
	}
	for k, pn := range p.nodes {
		peer := p.nodes[1-k]
		if err := runAll(ctx, [][]string{
			{"ip", "-n", pn.n.NetNS, "route", "replace", peer.subnet.String(), "via", peer.n.IP.String(), "dev", UnderlayBridge},
			{"ip", "-n", pn.podNS, "neigh", "replace", peer.pod.String(), "lladdr", macOf("0a:58", peer.pod), "dev", "eth0", "nud", "permanent"},
		}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// podOn makes a namespace with eth0 (TX checksum offload off, as LAB.md says) whose peer is port ofport
// of bridge.
func (p *pathsLab) podOn(ctx context.Context, n *Node, ns, bridge, ofport string, addr netip.Prefix, mtu int) error {
	host := "v" + strings.TrimPrefix(ns, p.l.Prefix+"-")
	if len(host) > 15 {
		host = host[:15]
	}
	m := strconv.Itoa(mtu)
	if err := runAll(ctx, [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", n.NetNS, "link", "add", host, "mtu", m, "type", "veth", "peer", "name", "eth0", "mtu", m, "netns", ns},
		{"ip", "-n", ns, "link", "set", "eth0", "address", macOf("0a:58", addr.Addr())},
		{"ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off"},
		{"ip", "-n", ns, "addr", "add", addr.String(), "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", n.NetNS, "link", "set", host, "up"},
	}); err != nil {
		return err
	}
	_, err := n.Vsctl(ctx, "add-port", bridge, host, "--", "set", "Interface", host, "ofport_request="+ofport)
	return err
}

// flows installs a variant's flows on both nodes' br0.
func (p *pathsLab) flows(ctx context.Context, variant string) error {
	for k, pn := range p.nodes {
		peer := p.nodes[1-k]
		var fl []string
		switch variant {
		case "vxlan":
			fl = []string{
				fmt.Sprintf("in_port=10,ip,nw_dst=%s actions=set_field:%s->tun_dst,output:1", peer.subnet, peer.n.IP),
				"in_port=1,ip actions=output:10",
			}
		case "uplink":
			fl = []string{
				fmt.Sprintf("in_port=10,ip,nw_dst=%s actions=set_field:%s->eth_src,set_field:%s->eth_dst,output:3", peer.subnet, pn.uplinkMC, peer.uplinkMC),
				fmt.Sprintf("in_port=3,ip,dl_dst=%s actions=set_field:%s->eth_dst,output:10", pn.uplinkMC, macOf("0a:58", pn.pod)),
			}
		case "host-routes":
			fl = []string{
				fmt.Sprintf("in_port=10,ip,nw_dst=%s actions=set_field:%s->eth_dst,output:2", peer.subnet, pn.tun0MAC),
				fmt.Sprintf("in_port=2,ip,nw_dst=%s actions=set_field:%s->eth_dst,output:10", pn.pod, macOf("0a:58", pn.pod)),
			}
		}
		if _, err := pn.n.Ofctl(ctx, "del-flows", "br0"); err != nil {
			return err
		}
		for _, f := range fl {
			if _, err := pn.n.Ofctl(ctx, "add-flow", "br0", f); err != nil {
				return err
			}
		}
	}
	return nil
}

// measure runs one TCP stream from node 1's pod to node 2's for d and returns MB/s received.
func (p *pathsLab) measure(ctx context.Context, variant string, d time.Duration) (float64, error) {
	if err := p.flows(ctx, variant); err != nil {
		return 0, err
	}
	src, dst := p.nodes[0], p.nodes[1]
	srcNS, dstNS, dstIP := src.podNS, dst.podNS, dst.pod
	if variant == "normal" {
		srcNS, dstNS, dstIP = src.plainNS, dst.plainNS, dst.plain
	}
	return TCPThroughput(ctx, srcNS, dstNS, dstIP, 5201, d)
}
