package ovsdb

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/ovstest"
	"k8s.io/klog/v2"
)

func connect(t *testing.T) (*ovstest.Instance, *Client) {
	t.Helper()
	inst := ovstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, "unix:"+inst.DBSocket(), klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return inst, c
}

func vsctl(t *testing.T, inst *ovstest.Instance, args ...string) string {
	t.Helper()
	out, err := inst.Vsctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

func TestBridgeAndPortsIdempotent(t *testing.T) {
	inst, c := connect(t)
	ctx := context.Background()
	cfg := BridgeConfig{Name: "br0", DatapathType: "netdev"}
	if err := c.EnsureBridge(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ col, want string }{
		{"fail_mode", "secure"}, {"protocols", "[OpenFlow13]"}, {"datapath_type", "netdev"}, {"controller", "[]"},
	} {
		if got := vsctl(t, inst, "get", "Bridge", "br0", tc.col); got != tc.want {
			t.Errorf("br0 %s = %s, want %s", tc.col, got, tc.want)
		}
	}
	tun, err := c.EnsureInternalPort(ctx, "br0", "tun0", 2, 1450)
	if err != nil || tun != 2 {
		t.Fatalf("tun0: ofport %d, %v", tun, err)
	}
	vx, err := c.EnsureVXLANPort(ctx, "br0", "vxlan0", 4789, 1)
	if err != nil || vx != 1 {
		t.Fatalf("vxlan0: ofport %d, %v", vx, err)
	}
	if got := vsctl(t, inst, "get", "Interface", "vxlan0", "options"); got != `{dst_port="4789", key=flow, remote_ip=flow}` {
		t.Errorf("vxlan0 options %s", got)
	}
	// Ensuring everything again changes nothing: not one transaction.
	before := c.Transactions()
	if err := c.EnsureBridge(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureInternalPort(ctx, "br0", "tun0", 2, 1450); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureVXLANPort(ctx, "br0", "vxlan0", 4789, 1); err != nil {
		t.Fatal(err)
	}
	if after := c.Transactions(); after != before {
		t.Errorf("ensuring again sent %d transactions", after-before)
	}
	// A changed VXLAN port number is updated in place.
	if _, err := c.EnsureVXLANPort(ctx, "br0", "vxlan0", 8472, 1); err != nil {
		t.Fatal(err)
	}
	if got := vsctl(t, inst, "get", "Interface", "vxlan0", "options:dst_port"); got != `"8472"` {
		t.Errorf("dst_port not updated: %s", got)
	}
	// Bridge external_ids round trip, merged.
	if err := c.SetBridgeExternalIDs(ctx, "br0", map[string]string{"ofsdn-round": "7"}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetBridgeExternalIDs(ctx, "br0", map[string]string{"ofsdn-pipeline-version": "1"}); err != nil {
		t.Fatal(err)
	}
	ids, err := c.BridgeExternalIDs(ctx, "br0")
	if err != nil || ids["ofsdn-round"] != "7" || ids["ofsdn-pipeline-version"] != "1" {
		t.Fatalf("external_ids %v %v", ids, err)
	}
	n := c.Transactions()
	if err := c.SetBridgeExternalIDs(ctx, "br0", map[string]string{"ofsdn-round": "7"}); err != nil || c.Transactions() != n {
		t.Errorf("setting an unchanged key sent a transaction (%v)", err)
	}
}

func TestSystemPortsAndErrors(t *testing.T) {
	inst, c := connect(t)
	ctx := context.Background()
	if err := c.EnsureBridge(ctx, BridgeConfig{Name: "br0", DatapathType: "netdev"}); err != nil {
		t.Fatal(err)
	}
	// A veth inside the instance's namespace, as a pod's host end would be in the node's.
	if out, err := exec.Command("ip", "-n", inst.NetNS, "link", "add", "vethpod1", "type", "veth", "peer", "name", "vethpod1p").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	_ = exec.Command("ip", "-n", inst.NetNS, "link", "set", "vethpod1", "up").Run()
	ids := map[string]string{"ofsdn/pod-namespace": "ns", "ofsdn/pod-name": "web", "ofsdn/sandbox": "abc", "ofsdn/ip": "10.128.0.5"}
	ofport, err := c.EnsureSystemPort(ctx, "br0", "vethpod1", ids)
	if err != nil || ofport <= 0 {
		t.Fatalf("system port: %d %v", ofport, err)
	}
	ports, err := c.ListPorts(ctx, "br0")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, p := range ports {
		if p.Name == "vethpod1" {
			found = p.OFPort == ofport && p.ExternalIDs["ofsdn/pod-name"] == "web"
		}
	}
	if !found {
		t.Fatalf("ListPorts: %+v", ports)
	}
	if got := vsctl(t, inst, "get", "Port", "vethpod1", "external_ids:ofsdn/sandbox"); got != `abc` && got != `"abc"` {
		t.Errorf("port external_ids: %s", got)
	}
	// An interface that does not exist: Interface.error comes back as the error.
	_, err = c.EnsureSystemPort(ctx, "br0", "nosuchveth", nil)
	if err == nil || !strings.Contains(err.Error(), "nosuchveth") {
		t.Fatalf("missing interface: %v", err)
	}
	for i := 0; i < 2; i++ { // deleting is idempotent
		if err := c.DeletePort(ctx, "br0", "vethpod1"); err != nil {
			t.Fatal(err)
		}
		if err := c.DeletePort(ctx, "br0", "nosuchveth"); err != nil {
			t.Fatal(err)
		}
	}
	if out := vsctl(t, inst, "list-ports", "br0"); out != "" {
		t.Errorf("ports left: %q", out)
	}
	if _, err := c.EnsureInternalPort(ctx, "nobridge", "x", 0, 0); err == nil {
		t.Error("port on a missing bridge accepted")
	}
}

func TestSurvivesVswitchdRestart(t *testing.T) {
	inst, c := connect(t)
	ctx := context.Background()
	if err := c.EnsureBridge(ctx, BridgeConfig{Name: "br0", DatapathType: "netdev"}); err != nil {
		t.Fatal(err)
	}
	// ovs-vswitchd restarts keep the database; the client keeps working across them.
	inst.KillVswitchd()
	if err := inst.StartVswitchd(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.EnsureInternalPort(ctx, "br0", "tun0", 2, 1450); err != nil {
		t.Fatalf("after a vswitchd restart: %v", err)
	}
}

// TestPatchPorts: a patch pair between two bridges of one ovs-vswitchd, each end numbered (br0's as
// requested), idempotent, and removable from both sides; BridgeDatapath tells a bridge's datapath.
func TestPatchPorts(t *testing.T) {
	inst, c := connect(t)
	ctx := context.Background()
	for _, br := range []string{"br0", "br-ul"} {
		if err := c.EnsureBridge(ctx, BridgeConfig{Name: br, DatapathType: "netdev"}); err != nil {
			t.Fatal(err)
		}
	}
	if dp, ok, err := c.BridgeDatapath(ctx, "br-ul"); err != nil || !ok || dp != "netdev" {
		t.Errorf("BridgeDatapath(br-ul) = %q, %v, %v", dp, ok, err)
	}
	if _, ok, err := c.BridgeDatapath(ctx, "eth0"); err != nil || ok {
		t.Errorf("BridgeDatapath of no bridge: ok %v, %v", ok, err)
	}
	ensure := func() {
		t.Helper()
		ours, err := c.EnsurePatchPair(ctx, "br0", "patch-uplink", 65000, "br-ul", "patch-ofsdn-br0")
		if err != nil || ours != 65000 {
			t.Fatalf("br0 end: ofport %d, %v", ours, err)
		}
	}
	ensure()
	if got := vsctl(t, inst, "get", "Interface", "patch-uplink", "options:peer"); got != "patch-ofsdn-br0" {
		t.Errorf("peer %s", got)
	}
	if got := vsctl(t, inst, "get", "Interface", "patch-ofsdn-br0", "ofport"); got == "-1" || got == "[]" {
		t.Errorf("uplink end has no port number: %s", got)
	}
	before := c.Transactions()
	ensure()
	if c.Transactions() != before {
		t.Errorf("ensuring again sent %d transactions", c.Transactions()-before)
	}
	// One end gone (someone deleted it by hand): the pair is made again.
	vsctl(t, inst, "del-port", "br-ul", "patch-ofsdn-br0")
	ensure()
	if got := vsctl(t, inst, "list-ports", "br-ul"); got != "patch-ofsdn-br0" {
		t.Errorf("br-ul ports after repair: %q", got)
	}
	for _, p := range [][2]string{{"br0", "patch-uplink"}, {"br-ul", "patch-ofsdn-br0"}} {
		if err := c.DeletePort(ctx, p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	if got := vsctl(t, inst, "list-ports", "br-ul"); got != "" {
		t.Errorf("br-ul keeps ports %q", got)
	}
}
