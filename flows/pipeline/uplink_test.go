package pipeline

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// TestUplinkChoice: which way each peer's IP leaves (table 90's highest flow for its subnet) and what
// the node accepts from the uplink, for every combination of encapsulation, uplink port and segment.
func TestUplinkChoice(t *testing.T) {
	peer := RemoteNode{Name: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23"),
		Pods: []RemotePod{{IP: netip.MustParseAddr("10.128.2.5"), VNID: 20}, {IP: netip.MustParseAddr("10.128.2.6"), VNID: 0},
			{IP: netip.MustParseAddr("10.128.4.9"), VNID: 20}}} // the last is not in n2's subnet: ignored
	for _, tc := range []struct {
		name      string
		mode      Mode
		encap     Encapsulation
		uplink    bool
		onSegment bool
		wantOut   uint32 // port of the IP flow that wins in table 90
		wantIn    int    // table-15 flows of the peer: its host's own address, then its subnet's
	}{
		{"vxlan", ModeMultitenant, EncapVXLAN, false, true, PortVXLAN, 0},
		{"empty encapsulation is vxlan", ModeMultitenant, "", true, true, PortVXLAN, 4},
		{"none, no uplink port here", ModeMultitenant, EncapNone, false, true, PortVXLAN, 0},
		{"none, peer off the segment", ModeMultitenant, EncapNone, true, false, PortVXLAN, 4},
		{"none, peer on the segment", ModeMultitenant, EncapNone, true, true, PortUplink, 4},
		{"none, flat: one flow for the subnet", ModeSubnet, EncapNone, true, true, PortUplink, 2},
		{"none, networkpolicy", ModeNetworkPolicy, EncapNone, true, true, PortUplink, 2},
		// Back to vxlan while the uplink port lingers: still accepted, no longer sent.
		{"vxlan with a lingering uplink port", ModeSubnet, EncapVXLAN, true, true, PortVXLAN, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := peer
			n.OnSegment = tc.onSegment
			s := NodeState{Mode: tc.mode, NodeIP: netip.MustParseAddr("192.0.2.11"), Encapsulation: tc.encap, Uplink: tc.uplink}
			flows := RenderRemoteNode(s, n)
			var best *Flow
			var in []Flow
			for i, f := range flows {
				if f.Table == TableTunnelEgress && strings.Contains(f.Match.String(), "ip,") && (best == nil || f.Priority > best.Priority) {
					best = &flows[i]
				}
				if f.Table == TableUplinkIngress {
					in = append(in, f)
				}
			}
			if best == nil {
				t.Fatal("no IP flow in table 90")
			}
			out, ok := best.Actions[len(best.Actions)-1].(Output)
			if !ok || out.Port != tc.wantOut {
				t.Errorf("IP to %s leaves by %v, want port %d", n.Subnet, best.Actions, tc.wantOut)
			}
			if len(in) != tc.wantIn {
				t.Errorf("%d uplink-ingress flows, want %d:\n%v", len(in), tc.wantIn, in)
			}
			proxied := slices.ContainsFunc(flows, func(f Flow) bool { return f.Table == TableARP && f.Priority == 110 })
			if proxied != (tc.wantOut == PortUplink) {
				t.Errorf("proxy ARP for the peer's subnet: %v, want it exactly when the peer is direct", proxied)
			}
			base := renderPipeline(NodeState{Mode: tc.mode, NodeIP: s.NodeIP, LocalSubnet: netip.MustParsePrefix("10.128.0.0/23"), Uplink: tc.uplink})
			dispatch := slices.ContainsFunc(base, func(f Flow) bool {
				return f.Table == TableClassifier && slices.ContainsFunc(f.Actions, isGoto(TableUplinkIngress))
			})
			if dispatch != tc.uplink {
				t.Errorf("classifier dispatches the uplink port: %v, want %v", dispatch, tc.uplink)
			}
		})
	}
}

func isGoto(t TableID) func(Action) bool {
	return func(a Action) bool { g, ok := a.(Goto); return ok && g.Table == t }
}

// TestUplinkIngressVNIDs: in multitenant mode each known pod of the peer loads its own VNID, the
// peer's gateway and own address (its host) are global, and every flow insists on the peer's uplink MAC.
func TestUplinkIngressVNIDs(t *testing.T) {
	n := RemoteNode{Name: "n2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23"),
		Pods: []RemotePod{{IP: netip.MustParseAddr("10.128.2.5"), VNID: 20}, {IP: netip.MustParseAddr("10.128.2.6"), VNID: 0}}}
	s := NodeState{Mode: ModeMultitenant, NodeIP: netip.MustParseAddr("192.0.2.11"), Encapsulation: EncapNone, Uplink: true}
	want := map[string]string{ // source → the VNID load it must carry ("" for none: 0)
		"10.128.2.1": "", "10.128.2.5": "load:0x14->NXM_NX_REG0[]", "10.128.2.6": "", "192.0.2.12": "",
	}
	got := map[string]string{}
	for _, f := range renderUplinkIngress(s, n) {
		m := f.Match.String()
		if !strings.Contains(m, "dl_src=0e:58:c0:00:02:0c") {
			t.Errorf("flow without the peer's uplink MAC: %s", f)
		}
		src := m[strings.Index(m, "nw_src=")+len("nw_src="):]
		load := ""
		for _, a := range f.Actions {
			if l, ok := a.(Load); ok && l.Dst.Field == RegSrcVNID {
				load = (Flow{Actions: []Action{l}}).String()
				load = load[strings.Index(load, "actions=")+len("actions="):]
			}
		}
		got[src] = load
	}
	if len(got) != len(want) {
		t.Fatalf("sources %v, want %v", got, want)
	}
	for src, w := range want {
		if got[src] != w {
			t.Errorf("from %s: %q, want %q", src, got[src], w)
		}
	}
}

func TestUplinkMAC(t *testing.T) {
	if got := UplinkMAC(netip.MustParseAddr("198.51.100.75")).String(); got != "0e:58:c6:33:64:4b" {
		t.Errorf("UplinkMAC = %s", got)
	}
}
