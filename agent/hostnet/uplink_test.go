package hostnet

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"k8s.io/klog/v2"
)

type fakeUplinkHost struct {
	uplink    string
	uplinkErr error
	neigh     []nodenet.Neighbor
	mac       net.HardwareAddr
}

func (h *fakeUplinkHost) Uplink(netip.Addr) (string, error) { return h.uplink, h.uplinkErr }
func (h *fakeUplinkHost) PeerNeighbors([]netip.Addr) ([]nodenet.Neighbor, error) {
	return h.neigh, nil
}
func (h *fakeUplinkHost) GatewayMAC() (net.HardwareAddr, error) { return h.mac, nil }

type fakeUplinkOVS struct {
	bridges map[string]string // name → datapath
	ports   map[string]string // port → bridge
	ids     map[string]string // br0's external_ids
	writes  int               // external_ids transactions
	failure error
}

func (o *fakeUplinkOVS) BridgeExternalIDs(context.Context, string) (map[string]string, error) {
	return maps.Clone(o.ids), nil
}

func (o *fakeUplinkOVS) SetBridgeExternalIDs(_ context.Context, _ string, set map[string]string) error {
	if o.ids == nil {
		o.ids = map[string]string{}
	}
	o.writes++
	maps.Copy(o.ids, set)
	return nil
}

func (o *fakeUplinkOVS) BridgeDatapath(_ context.Context, name string) (string, bool, error) {
	dp, ok := o.bridges[name]
	return dp, ok, nil
}

func (o *fakeUplinkOVS) EnsurePatchPair(_ context.Context, aBridge, a string, aOFPort int, bBridge, b string) (int, error) {
	if o.failure != nil {
		return 0, o.failure
	}
	o.ports[a], o.ports[b] = aBridge, bBridge
	return aOFPort, nil
}

func (o *fakeUplinkOVS) DeletePort(_ context.Context, bridge, name string) error {
	if o.ports[name] == bridge {
		delete(o.ports, name)
	}
	return nil
}

// fakeView is the agent's view as the uplink job sees it: the peers it is given, the outcome it records.
type fakeView struct {
	encap      pipeline.Encapsulation
	nodeIP     netip.Addr
	peers      map[netip.Addr][]string
	uplink     string
	onSegment  map[string]bool
	gatewayMAC net.HardwareAddr
}

func (v *fakeView) Peers() (pipeline.Encapsulation, netip.Addr, map[netip.Addr][]string) {
	return v.encap, v.nodeIP, maps.Clone(v.peers)
}

func (v *fakeView) SetUplink(bridge string, onSegment map[string]bool, gatewayMAC net.HardwareAddr) bool {
	if v.uplink == bridge && maps.Equal(v.onSegment, onSegment) && (len(gatewayMAC) == 0 || slices.Equal(v.gatewayMAC, gatewayMAC)) {
		return false
	}
	v.uplink, v.onSegment = bridge, onSegment
	if len(gatewayMAC) > 0 {
		v.gatewayMAC = gatewayMAC
	}
	return true
}

func newUplinkFor(v *fakeView, host UplinkHost, ovs UplinkOVS, changed func(), warn func(reason, msg string)) *Uplink {
	return NewUplink(UplinkConfig{Bridge: "br0", Datapath: "netdev", Logger: klog.Background()},
		UplinkDeps{View: v, Host: host, OVS: ovs, Changed: changed, Warn: warn})
}

func uplinkFixture(t *testing.T) (*fakeView, *fakeUplinkHost, *fakeUplinkOVS, *Uplink, *[]string, *int) {
	t.Helper()
	v := &fakeView{encap: pipeline.EncapVXLAN, nodeIP: netip.MustParseAddr("192.0.2.11"), peers: map[netip.Addr][]string{
		netip.MustParseAddr("192.0.2.12"): {"n2"}, netip.MustParseAddr("198.51.100.13"): {"n3"}}}
	host := &fakeUplinkHost{uplink: "br-ul", mac: net.HardwareAddr{2, 0, 0, 0, 0, 1}, neigh: []nodenet.Neighbor{
		{Peer: netip.MustParseAddr("192.0.2.12"), Link: "br-ul", NextHop: netip.MustParseAddr("192.0.2.12")},
		// n3 is behind a router.
		{Peer: netip.MustParseAddr("198.51.100.13"), Link: "br-ul", NextHop: netip.MustParseAddr("192.0.2.1")},
	}}
	ovs := &fakeUplinkOVS{bridges: map[string]string{"br0": "netdev", "br-ul": "netdev"}, ports: map[string]string{}}
	syncs := 0
	var warned []string
	u := newUplinkFor(v, host, ovs, func() { syncs++ }, func(reason, msg string) { warned = append(warned, reason+": "+msg) })
	return v, host, ovs, u, &warned, &syncs
}

// TestUplink: encapsulation none patches br0 into the bridge holding the node's address and marks
// the peers on its segment; a node without such a bridge falls back to VXLAN once, with an Event; back
// to vxlan, the port lingers, then goes.
func TestUplink(t *testing.T) {
	ctx := context.Background()
	v, host, ovs, u, warned, syncs := uplinkFixture(t)
	now := time.Unix(1000, 0)
	u.now = func() time.Time { return now }

	// vxlan: nothing to do but tun0's MAC.
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "" || len(ovs.ports) != 0 || v.gatewayMAC.String() != "02:00:00:00:00:01" {
		t.Fatalf("vxlan: uplink %q, ports %v, gateway MAC %s", v.uplink, ovs.ports, v.gatewayMAC)
	}

	v.encap = pipeline.EncapNone
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "br-ul" || ovs.ports[uplinkPort] != "br0" || ovs.ports[uplinkPeerPort] != "br-ul" {
		t.Fatalf("none: uplink %q, ports %v", v.uplink, ovs.ports)
	}
	if !v.onSegment["n2"] || v.onSegment["n3"] {
		t.Errorf("on the segment: %v, want n2 only (n3's next hop is a router)", v.onSegment)
	}
	before := *syncs
	if err := u.Ensure(ctx); err != nil || *syncs != before {
		t.Errorf("an unchanged check asked for a sync (%v)", err)
	}

	// Back to vxlan: the port stays DefaultUplinkLinger, then goes.
	v.encap = pipeline.EncapVXLAN
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "br-ul" || len(ovs.ports) != 2 {
		t.Errorf("right after the change back: uplink %q, ports %v; want them kept a while", v.uplink, ovs.ports)
	}
	now = now.Add(DefaultUplinkLinger + time.Second)
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "" || len(ovs.ports) != 0 {
		t.Errorf("after the linger: uplink %q, ports %v", v.uplink, ovs.ports)
	}

	// The node address on a plain interface: VXLAN to everyone, told once.
	host.uplink = "eth0"
	v.encap = pipeline.EncapNone
	for range 2 {
		if err := u.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v.uplink != "" || len(ovs.ports) != 0 {
		t.Errorf("no OVS uplink: uplink %q, ports %v", v.uplink, ovs.ports)
	}
	if len(*warned) != 1 || !strings.Contains((*warned)[0], "EncapsulationFallback") || !strings.Contains((*warned)[0], "eth0") {
		t.Errorf("warnings %q, want one EncapsulationFallback naming eth0", *warned)
	}
	// Another datapath type cannot be patched.
	host.uplink = "br-sys"
	ovs.bridges["br-sys"] = "system"
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "" || len(*warned) != 2 || !strings.Contains((*warned)[1], "datapath") {
		t.Errorf("system-datapath uplink: uplink %q, warnings %q", v.uplink, *warned)
	}
	// The patch pair failing: fallback, the error returned for a retry.
	host.uplink = "br-ul"
	ovs.failure = errors.New("ovsdb down")
	if err := u.Ensure(ctx); err == nil || v.uplink != "" {
		t.Errorf("patch failure: err %v, uplink %q", err, v.uplink)
	}
	ovs.failure = nil
	if err := u.Ensure(ctx); err != nil || v.uplink != "br-ul" {
		t.Errorf("recovered: err %v, uplink %q", err, v.uplink)
	}
}

// TestUplinkSweepsAnEarlierRunsPort: an agent starting in vxlan mode removes the pair a run in none
// mode left.
func TestUplinkSweepsAnEarlierRunsPort(t *testing.T) {
	_, _, ovs, u, _, _ := uplinkFixture(t)
	ovs.ports[uplinkPort], ovs.ports[uplinkPeerPort] = "br0", "br-ul"
	if err := u.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(ovs.ports) != 0 {
		t.Errorf("ports left: %v", ovs.ports)
	}
}

// TestUplinkLingerSurvivesRestart: an agent restarted while the uplink port lingers keeps it until the
// deadline the earlier run left in br0's external_ids (peers still sending unencapsulated would lose
// traffic otherwise); one started in vxlan with no linger under way removes a pair left behind at once,
// and writes nothing to OVSDB.
func TestUplinkLingerSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	v, host, ovs, u, _, _ := uplinkFixture(t)
	now := time.Unix(1000, 0)
	u.now = func() time.Time { return now }
	v.encap = pipeline.EncapNone
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	v.encap = pipeline.EncapVXLAN
	if err := u.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if ovs.ids[lingerKey] == "" {
		t.Fatalf("lingering with no deadline in br0's external_ids: %v", ovs.ids)
	}

	// The agent restarts 10 s into the linger: a new Uplink over the same OVSDB.
	now = now.Add(10 * time.Second)
	restarted := newUplinkFor(v, host, ovs, func() {}, nil)
	restarted.now = u.now
	if err := restarted.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "br-ul" || len(ovs.ports) != 2 {
		t.Fatalf("restarted within the linger: uplink %q, ports %v; want them kept", v.uplink, ovs.ports)
	}
	now = now.Add(DefaultUplinkLinger - 10*time.Second + time.Millisecond)
	if err := restarted.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if v.uplink != "" || len(ovs.ports) != 0 || ovs.ids[lingerKey] != "" {
		t.Fatalf("after the first run's deadline: uplink %q, ports %v, external_ids %v", v.uplink, ovs.ports, ovs.ids)
	}

	// A pair left by a run in none mode, no linger recorded: a vxlan start removes it at once.
	ovs.ports[uplinkPort], ovs.ports[uplinkPeerPort] = "br0", "br-ul"
	writes := ovs.writes
	fresh := newUplinkFor(v, host, ovs, func() {}, nil)
	fresh.now = u.now
	if err := fresh.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if len(ovs.ports) != 0 || ovs.writes != writes {
		t.Errorf("vxlan start over a leftover pair: ports %v, %d external_ids writes; want none of either", ovs.ports, ovs.writes-writes)
	}
}
