package attach

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/ofsdn/ofsdn/agent/networks"
	"github.com/ofsdn/ofsdn/agent/podnet"
	"github.com/ofsdn/ofsdn/cni"
)

// fakeNetworks: red and blue share 10.200.0.0/16 (this node's subnets 10.200.1.0/24), green talks to
// red; namespace "ns" is admitted to red and blue, "other" only to blue. Pods ask by name.
type fakeNetworks struct {
	mu       sync.Mutex
	requests map[string][]networks.Request // by pod name
	talk     bool                          // red and green talk
}

func (f *fakeNetworks) Requests(_ context.Context, namespace, name string) ([]networks.Request, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "asks-for-missing" {
		return nil, fmt.Errorf("%w ns/missing", networks.ErrNoNAD)
	}
	return f.requests[name], nil
}

func (f *fakeNetworks) Placement(network, namespace string) (networks.Placement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pl := map[string]networks.Placement{
		"red":   {Network: "red", VNI: 0xfff001, CIDR: netip.MustParsePrefix("10.200.0.0/16"), Subnet: netip.MustParsePrefix("10.200.1.0/24")},
		"blue":  {Network: "blue", VNI: 0xfff002, CIDR: netip.MustParsePrefix("10.200.0.0/16"), Subnet: netip.MustParsePrefix("10.200.1.0/24")},
		"green": {Network: "green", VNI: 0xfff003, CIDR: netip.MustParsePrefix("10.201.0.0/16"), Subnet: netip.MustParsePrefix("10.201.1.0/24")},
	}
	p, ok := pl[network]
	if !ok {
		return networks.Placement{}, fmt.Errorf("%w: Network %q does not exist", networks.ErrUnavailable, network)
	}
	if network == "red" && namespace != "ns" {
		return networks.Placement{}, fmt.Errorf("%w: Network red does not admit namespace %q", networks.ErrNotAdmitted, namespace)
	}
	p.Gateway = p.Subnet.Addr().Next()
	if f.talk && network == "red" {
		p.Routes = []netip.Prefix{netip.MustParsePrefix("10.201.0.0/16")}
	}
	if f.talk && network == "green" {
		p.Routes = []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}
	}
	return p, nil
}

func mustMAC(s string) []byte {
	m, err := networks.StaticMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func (e *podNetEnv) netAgent(nets *fakeNetworks, warn func(ns, name, reason, msg string)) *Handler {
	return New(Config{Bridge: "br0", HostNetNS: "/var/run/netns/" + e.inst.NetNS, Netdev: true, StateDir: e.stateDir,
		NetworksDir: e.stateDir + "-networks", PendingDeletes: e.pendingDir},
		Deps{Node: newFakeNode(), Flows: fakeFlows{}, DB: e.db, Networks: nets, Warn: warn})
}

// footprint is everything of a sandbox the node holds: OVS ports and host ends by interface, address
// reservations in every store, the view's entries.
func (e *podNetEnv) footprint(p *Handler, containerID string) string {
	e.t.Helper()
	var parts []string
	ports, err := e.db.ListPorts(context.Background(), "br0")
	if err != nil {
		e.t.Fatal(err)
	}
	for _, port := range ports {
		if port.ExternalIDs[ExtSandbox] == containerID {
			parts = append(parts, "port:"+port.ExternalIDs[ExtIfName]+"/"+port.ExternalIDs[ExtNetwork])
		}
	}
	ends, err := podnet.ListHostEnds(p.hostNetNS)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, h := range ends {
		if h.ContainerID == containerID {
			parts = append(parts, "veth:"+h.IfName)
		}
	}
	if s := p.currentStore(); s != nil {
		for _, a := range s.List() {
			if a.ContainerID == containerID {
				parts = append(parts, "ip:"+a.IfName+"="+a.IP.String())
			}
		}
	}
	for network, s := range p.allNetStores() {
		for _, a := range s.List() {
			if a.ContainerID == containerID {
				parts = append(parts, "ip:"+a.IfName+"@"+network+"="+a.IP.String())
			}
		}
	}
	for _, a := range p.node.AllNetAttachments() {
		if a.SandboxID == containerID {
			parts = append(parts, "view:"+a.IfName)
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func (e *podNetEnv) addrs(netns, ifName string) string {
	return strings.Join(strings.Fields(e.ip("-n", netns, "-o", "-4", "addr", "show", "dev", ifName)), " ")
}

// TestNetworkAttachments: one ADD attaches eth0 and every Network the pod asks for (same address on two
// networks, a static address and MAC), all or nothing; a meta-plugin's per-interface ADD and DEL; DEL
// of eth0 takes everything; a restarted agent restores the interfaces; cross-talk routes follow the
// Network live.
func TestNetworkAttachments(t *testing.T) {
	e := newPodNetEnv(t)
	nets := &fakeNetworks{requests: map[string][]networks.Request{
		"multi": {
			{Interface: "net1", NAD: "ns/red", Network: "red"},
			{Interface: "net2", NAD: "ns/blue", Network: "blue", IP: netip.MustParseAddr("10.200.1.77"), MAC: mustMAC("02:00:00:00:00:77")},
		},
		"clash":      {{Interface: "net1", NAD: "ns/red", Network: "red"}, {Interface: "net2", NAD: "ns/blue", Network: "blue", IP: netip.MustParseAddr("10.200.1.77")}},
		"outside":    {{Interface: "net1", NAD: "ns/red", Network: "red", IP: netip.MustParseAddr("10.200.9.9")}},
		"unadmitted": {{Interface: "net1", NAD: "ns/blue", Network: "blue"}, {Interface: "net2", NAD: "ns/red", Network: "red"}},
	}}
	var warnings []string
	p := e.netAgent(nets, func(ns, name, reason, msg string) { warnings = append(warnings, name+": "+msg) })
	ctx := t.Context()

	sb := e.netns("multi")
	res, err := p.Add(ctx, addReq("c-multi", sb, "multi", "u1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Interfaces) != 6 || len(res.IPs) != 3 {
		t.Fatalf("result: %d interfaces, %d addresses; want 6 and 3: %+v", len(res.Interfaces), len(res.IPs), res)
	}
	net1, net2 := e.addrs(sb, "net1"), e.addrs(sb, "net2")
	if !strings.Contains(net1, "10.200.1.2/16") || !strings.Contains(net2, "10.200.1.77/16") {
		t.Fatalf("net1: %s; net2: %s", net1, net2)
	}
	if link := e.ip("-n", sb, "-o", "link", "show", "net2"); !strings.Contains(link, "02:00:00:00:00:77") {
		t.Fatalf("net2's static MAC: %s", link)
	}
	want := "ip:eth0=10.128.0.2 ip:net1@red=10.200.1.2 ip:net2@blue=10.200.1.77 port:eth0/ port:net1/red port:net2/blue veth:eth0 veth:net1 veth:net2 view:net1 view:net2"
	if got := e.footprint(p, "c-multi"); got != want {
		t.Fatalf("footprint\n got %s\nwant %s", got, want)
	}

	// Nothing half-attached: the static address is taken (the second network), a static address outside
	// the node's subnet, a Network that does not admit the namespace, a missing NAD.
	for _, tc := range []struct {
		pod, ns, says string
	}{
		{"clash", "ns", "in use by pod ns/multi"},
		{"outside", "ns", "not in this node's subnet"},
		{"unadmitted", "other", "does not admit namespace"},
		{"asks-for-missing", "ns", "no such NetworkAttachmentDefinition"},
	} {
		t.Run(tc.pod, func(t *testing.T) {
			warnings = nil
			req := addReq("c-"+tc.pod, e.netns(tc.pod), tc.pod, "u-"+tc.pod)
			req.Args["K8S_POD_NAMESPACE"] = tc.ns
			_, err := p.Add(ctx, req)
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("ADD: %v, want an error saying %q", err, tc.says)
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tc.says) {
				t.Errorf("warnings %q", warnings)
			}
			if got := e.footprint(p, "c-"+tc.pod); got != "" {
				t.Fatalf("a refused ADD left %s", got)
			}
		})
	}

	// A meta-plugin's ADD of an interface attached already: the same answer, nothing touched.
	before := e.footprint(p, "c-multi")
	multus := addReq("c-multi", sb, "multi", "u1")
	multus.IfName, multus.Config = "net1", []byte(`{"type":"ofsdn","network":"red"}`)
	again, err := p.Add(ctx, multus)
	if err != nil || len(again.IPs) != 1 || again.IPs[0].Address.IP.String() != "10.200.1.2" {
		t.Fatalf("repeated net1 ADD: %+v %v", again, err)
	}
	// ... and of a new one, with runtimeConfig's static address; then its DEL alone.
	multus.IfName, multus.Config = "net3", []byte(`{"type":"ofsdn","network":"green","runtimeConfig":{"ips":["10.201.1.9/16"]}}`)
	if _, err := p.Add(ctx, multus); err != nil {
		t.Fatal(err)
	}
	if a := e.addrs(sb, "net3"); !strings.Contains(a, "10.201.1.9/16") {
		t.Fatalf("net3: %s", a)
	}
	del := *multus
	del.Command = cni.CmdDel
	if err := p.Del(ctx, &del); err != nil {
		t.Fatal(err)
	}
	if got := e.footprint(p, "c-multi"); got != before {
		t.Fatalf("after net3's ADD and DEL\n got %s\nwant %s", got, before)
	}

	// Cross-talk starts: red's interface gets a route to green through its gateway; stops: it goes.
	nets.mu.Lock()
	nets.talk = true
	nets.mu.Unlock()
	if err := p.SyncRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	if r := e.ip("-n", sb, "route", "show", "10.201.0.0/16"); !strings.Contains(r, "via 10.200.1.1 dev net1") || !strings.Contains(r, "proto 121") {
		t.Fatalf("cross-talk route: %q", r)
	}
	nets.mu.Lock()
	nets.talk = false
	nets.mu.Unlock()
	if err := p.SyncRoutes(ctx); err != nil {
		t.Fatal(err)
	}
	if r := e.ip("-n", sb, "route", "show", "10.201.0.0/16"); strings.TrimSpace(r) != "" {
		t.Fatalf("cross-talk stopped, route stays: %q", r)
	}

	// A restarted agent restores eth0 and both Network interfaces.
	p2 := e.netAgent(nets, nil)
	if err := p2.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.footprint(p2, "c-multi"); got != before {
		t.Fatalf("restored\n got %s\nwant %s", got, before)
	}
	restored := p2.node.NetAttachments("ns/multi", "c-multi")
	if len(restored) != 2 || restored[1].MAC.String() != "02:00:00:00:00:77" || restored[1].Prefix.String() != "10.200.1.77/16" {
		t.Fatalf("restored attachments %+v", restored)
	}

	// DEL of eth0 takes the sandbox's every interface.
	d := addReq("c-multi", sb, "multi", "u1")
	d.Command = cni.CmdDel
	if err := p2.Del(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got := e.footprint(p2, "c-multi"); got != "" {
		t.Fatalf("after DEL: %s", got)
	}
	if err := p2.Del(ctx, d); err != nil {
		t.Fatalf("DEL again: %v", err)
	}
}
