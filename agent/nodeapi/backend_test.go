package nodeapi

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/debugapi"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/ovsdb"
)

// TestPortInfo: a pod's interface on a Network is named ns/name@net1 with its Network, never ns/name,
// which names the pod's cluster-network interface (flowctl sends a pod's packets from that one).
func TestPortInfo(t *testing.T) {
	pod := func(ifName, network string) ovsdb.PortInfo {
		ids := map[string]string{attach.ExtPodNamespace: "a", attach.ExtPodName: "p", attach.ExtIfName: ifName, attach.ExtIP: "10.200.1.5"}
		if network != "" {
			ids[attach.ExtNetwork] = network
		}
		return ovsdb.PortInfo{Name: "veth-" + ifName, OFPort: 7, ExternalIDs: ids}
	}
	for _, tc := range []struct {
		port                    ovsdb.PortInfo
		pod, iface, network, ip string
	}{
		{pod("eth0", ""), "a/p", "eth0", "", "10.200.1.5"},
		{pod("net1", "red"), "a/p@net1", "net1", "red", "10.200.1.5"},
		{pod("", "red"), "", "", "red", "10.200.1.5"}, // no interface recorded: claims no pod at all
		{ovsdb.PortInfo{Name: "tun0", Type: "internal", OFPort: 2}, "", "", "", "invalid IP"},
	} {
		got := portInfo(tc.port)
		if got.Pod != tc.pod || got.Interface != tc.iface || got.Network != tc.network || got.IP.String() != tc.ip || got.OFPort != tc.port.OFPort {
			t.Errorf("%s: %+v, want pod %q interface %q network %q ip %s", tc.port.Name, got, tc.pod, tc.iface, tc.network, tc.ip)
		}
	}
}

// TestNetworksInfo: the Networks as br0 holds them (cross-talk as the flows apply it) and every
// attachment: the synced ones that have flows carry traffic, the others say why not.
func TestNetworksInfo(t *testing.T) {
	red, green := uint32(0xfff001), uint32(0xfff003)
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	st := pipeline.NodeState{
		Networks: []pipeline.NetworkState{
			{Name: "green", VNI: green, CIDR: netip.MustParsePrefix("10.201.0.0/16"), CrossTalk: []string{"red"}},
			{Name: "red", VNI: red, CIDR: netip.MustParsePrefix("10.200.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.200.1.0/24"),
				Remotes:   []pipeline.NetworkRemote{{Node: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.200.2.0/24")}},
				CrossTalk: []string{"green", "gone"}},
		},
		Attachments: []pipeline.AttachmentState{
			{Namespace: "a", Name: "p", Interface: "net1", Network: "red", VNI: red, IP: netip.MustParseAddr("10.200.1.5"), MAC: mac("0a:58:0a:c8:01:05"), OFPort: 7},
			// Deleted from the view since the sync: its flows are still on br0.
			{Namespace: "a", Name: "old", Interface: "net1", Network: "red", VNI: red, IP: netip.MustParseAddr("10.200.1.9"), MAC: mac("0a:58:0a:c8:01:09"), OFPort: 9},
		},
	}
	view := []NetAttachment{
		{NetAttachment: attach.NetAttachment{Namespace: "a", Name: "p", IfName: "net1", Network: "red", IP: netip.MustParseAddr("10.200.1.5"),
			Prefix: netip.MustParsePrefix("10.200.1.5/16"), MAC: mac("0a:58:0a:c8:01:05"), OFPort: 7}},
		{NetAttachment: attach.NetAttachment{Namespace: "b", Name: "q", IfName: "net1", Network: "red", IP: netip.MustParseAddr("10.200.1.6"),
			MAC: mac("02:00:00:00:00:06"), OFPort: 8}, WhyNot: "Network red does not admit namespace b"},
		{NetAttachment: attach.NetAttachment{Namespace: "c", Name: "r", IfName: "net2", Network: "red", IP: netip.MustParseAddr("10.200.1.7"), OFPort: 10}},
	}
	nets, atts := networksInfo(st, view)
	if len(nets) != 2 || nets[1].Name != "red" || nets[1].Gateway.String() != "10.200.1.1" || fmt.Sprint(nets[1].CrossTalk) != "[green]" ||
		len(nets[1].Remotes) != 1 || nets[1].Remotes[0] != (debugapi.NetworkRemote{Node: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.200.2.0/24")}) ||
		nets[0].Subnet.IsValid() || nets[0].Gateway.IsValid() {
		t.Fatalf("networks %+v", nets)
	}
	want := []struct {
		key      string
		carrying bool
		reason   string
		mac      string
	}{
		{"a/old@net1", true, "", "0a:58:0a:c8:01:09"},
		{"a/p@net1", true, "", "0a:58:0a:c8:01:05"},
		{"b/q@net1", false, "Network red does not admit namespace b", "02:00:00:00:00:06"},
		{"c/r@net2", false, "its flows are not on br0 yet (the flow loop has not synced it)", ""},
	}
	if len(atts) != len(want) {
		t.Fatalf("attachments %+v", atts)
	}
	for i, w := range want {
		a := atts[i]
		if a.Key() != w.key || a.Carrying != w.carrying || a.Reason != w.reason || a.MAC != w.mac {
			t.Errorf("attachment %d: %+v, want %+v", i, a, w)
		}
	}
	if atts[1].VNI != red || atts[1].Prefix.String() != "10.200.1.5/16" || atts[1].OFPort != 7 {
		t.Errorf("a/p@net1: %+v", atts[1])
	}
}
