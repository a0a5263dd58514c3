package pipeline

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ofsdn/ofsdn/internal/ofbridge"

	"github.com/ofsdn/ofsdn/internal/fakeswitch"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files (the pipeline golden only after a PipelineVersion bump)")

const pipelineGolden = "testdata/pipeline.golden"

// TestPipelineGolden guards the pipeline's shape the way openshift-sdn's TestRuleVersion did: everything
// Render produces for a sample node — the base pipeline, pods in two tenants and the global VNID,
// remote nodes, and services (plain with a NodePort, sessionAffinity with its learn flows, UDP split
// over several groups, one without endpoints) with their groups — is pinned in a golden file headed
// by the version it belongs to, for each mode. A change to rendering that keeps the same
// PipelineVersion fails here, because agents would diff an old bridge against flows of a different
// shape instead of rebuilding it.
func TestPipelineGolden(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "version %d\n", PipelineVersion)
	for _, variant := range []struct {
		mode   Mode
		encap  Encapsulation
		egress bool
	}{{ModeMultitenant, EncapVXLAN, false}, {ModeSubnet, EncapVXLAN, false}, {ModeNetworkPolicy, EncapVXLAN, false},
		{ModeMultitenant, EncapNone, false}, {ModeSubnet, EncapNone, false}, {ModeNetworkPolicy, EncapNone, false},
		{ModeMultitenant, EncapVXLAN, true}, {ModeNetworkPolicy, EncapNone, true}} {
		mode := variant.mode
		st := sampleNodeState()
		if variant.egress {
			st.Egress = sampleEgressState()
		}
		st.Mode = mode
		if mode == ModeNetworkPolicy {
			st.Pods[0].IngressIsolated = true
			st.Pods[1].IngressIsolated, st.Pods[1].EgressIsolated = true, true
		}
		if variant.encap == EncapNone {
			// node-2 shares the uplink segment, node-3 does not (VXLAN to it).
			st.Encapsulation, st.Uplink = EncapNone, true
			st.RemoteNodes[0].OnSegment = true
			st.RemoteNodes[0].Pods = []RemotePod{{IP: netip.MustParseAddr("10.128.2.7"), VNID: 11}, {IP: netip.MustParseAddr("10.128.2.9"), VNID: 0}}
		}
		st.AdminPolicies = sampleAdminPolicies()
		owners, err := Render(st)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case variant.egress:
			fmt.Fprintf(&b, "\n# mode %s, encapsulation %s, egress IPs and firewalls\n", mode, variant.encap)
		case variant.encap == EncapNone:
			fmt.Fprintf(&b, "\n# mode %s, encapsulation none\n", mode)
		default:
			fmt.Fprintf(&b, "\n# mode %s\n", mode)
		}
		for _, o := range reconcile.SortedOwnerKeys(owners) {
			fmt.Fprintf(&b, "## %s\n", o)
			rendered := owners[o].Flows
			sort.SliceStable(rendered, func(i, j int) bool {
				if rendered[i].Table != rendered[j].Table {
					return rendered[i].Table < rendered[j].Table
				}
				return rendered[i].Priority > rendered[j].Priority
			})
			for _, f := range rendered {
				b.WriteString(f.String() + "\n")
			}
			groups := owners[o].Groups
			sort.Slice(groups, func(i, j int) bool { return groups[i].ID < groups[j].ID })
			for _, g := range groups {
				// One bucket a line: a diff then shows which bucket changed.
				b.WriteString(strings.ReplaceAll(g.String(), ",bucket=", "\n  bucket=") + "\n")
			}
		}
	}
	got := b.String()
	want, err := os.ReadFile(pipelineGolden)
	if err != nil && !*updateGolden {
		t.Fatalf("%v (run go test ./flows/pipeline -run TestPipelineGolden -update)", err)
	}
	if err := checkGolden(got, string(want), PipelineVersion, *updateGolden); err != nil {
		t.Fatal(err)
	}
	if *updateGolden && got != string(want) {
		if err := os.WriteFile(pipelineGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// checkGolden compares a render with the golden file: equal passes; different under the golden's
// own version fails whatever -update says (the version must be bumped first); different under an
// older version passes only with -update.
func checkGolden(got, want string, version uint32, update bool) error {
	if got == want {
		return nil
	}
	goldenVersion := -1
	if first, _, ok := strings.Cut(want, "\n"); ok {
		if v, err := strconv.Atoi(strings.TrimPrefix(first, "version ")); err == nil {
			goldenVersion = v
		}
	}
	if goldenVersion == int(version) {
		return fmt.Errorf("rendered flows changed but PipelineVersion is still %d: bump it in flows/pipeline/render_base.go, then run with -update; diff:\n%s",
			version, strings.Join(ofbridge.DiffLines(strings.Split(want, "\n"), strings.Split(got, "\n")), "\n"))
	}
	if !update {
		return fmt.Errorf("pipeline golden is for version %d, code is version %d: run with -update", goldenVersion, version)
	}
	return nil
}

func TestCheckGoldenDemandsAVersionBump(t *testing.T) {
	golden := "version 3\n## pod/a/web\ntable=20, priority=100 actions=drop\n"
	changed := "version 3\n## pod/a/web\ntable=20, priority=101 actions=drop\n"
	for _, tc := range []struct {
		name    string
		got     string
		version uint32
		update  bool
		wantErr bool
	}{
		{"unchanged", golden, 3, false, false},
		{"changed without a bump", changed, 3, false, true},
		{"changed without a bump, -update", changed, 3, true, true},
		{"changed with a bump", strings.Replace(changed, "version 3", "version 4", 1), 4, false, true},
		{"changed with a bump, -update", strings.Replace(changed, "version 3", "version 4", 1), 4, true, false},
	} {
		if err := checkGolden(tc.got, golden, tc.version, tc.update); (err != nil) != tc.wantErr {
			t.Errorf("%s: err %v, want error %v", tc.name, err, tc.wantErr)
		}
	}
}

func TestEveryTableHasOneDefault(t *testing.T) {
	defaults := map[TableID]int{}
	for _, f := range RenderBase() {
		if f.Priority == 0 && len(f.Match.Fields()) == 0 {
			defaults[f.Table]++
		}
	}
	for _, tbl := range Tables {
		if defaults[tbl.ID] != 1 {
			t.Errorf("table %d %s has %d default flows, want 1", tbl.ID, tbl.Name, defaults[tbl.ID])
		}
	}
}

// sampleNodeState is a node with pods in two tenants and the global VNID, two remote nodes, and a
// service of every shape the renderer knows.
// sampleAdminPolicies are ClusterNetworkPolicies of both tiers for sampleNodeState's pods: every
// action, named ports, networks, two policies at one priority.
func sampleAdminPolicies() []AdminPolicyState {
	pfx := netip.MustParsePrefix
	return []AdminPolicyState{
		{Name: "tenants-open-dns", Tier: AdminTierAdmin, Priority: 10,
			Pods: []PolicyPod{{OFPort: 5, NamedPorts: []NamedPort{{Name: "dns", Protocol: IPProtoUDP, Port: 5353}}}},
			Ingress: []AdminRule{
				{Name: "dns-from-all", Action: AdminAccept, PolicyRule: PolicyRule{
					Peers: []PolicyPeer{{Net: pfx("10.128.0.2/32")}, {Net: pfx("10.128.0.3/32")}},
					Ports: []PolicyPort{{Protocol: IPProtoUDP, Name: "dns"}, {Protocol: IPProtoTCP, Name: "dns"}}}},
				{Name: "rest-to-netpol", Action: AdminPass, PolicyRule: PolicyRule{AllPeers: true}},
			}},
		{Name: "no-metadata", Tier: AdminTierAdmin, Priority: 10, Pods: []PolicyPod{{OFPort: 3}, {OFPort: 4}},
			Egress: []AdminRule{{Name: "deny-link-local", Action: AdminDeny, PolicyRule: PolicyRule{
				Peers: []PolicyPeer{{Net: pfx("169.254.0.0/16")}}}}}},
		{Name: "default-deny-b", Tier: AdminTierBaseline, Priority: 0, Pods: []PolicyPod{{OFPort: 4}},
			Ingress: []AdminRule{
				{Name: "from-a-web", Action: AdminAccept, PolicyRule: PolicyRule{
					Peers: []PolicyPeer{{Net: pfx("10.128.0.2/32")}},
					Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 5432}, {Protocol: IPProtoTCP, Port: 6000, EndPort: 6003}}}},
				{Name: "", Action: AdminDeny, PolicyRule: PolicyRule{AllPeers: true}},
			}},
	}
}

func sampleNodeState() NodeState {
	mac := func(last byte) net.HardwareAddr { return net.HardwareAddr{0x0a, 0x58, 10, 128, 0, last} }
	ep := func(ip string, port uint16, local bool) Endpoint {
		return Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, Local: local}
	}
	web := []Endpoint{ep("10.128.0.2", 8080, true), ep("10.128.2.7", 8080, false)}
	dns := []Endpoint{ep("10.128.0.4", 5353, true), ep("10.128.2.9", 5353, false), ep("10.128.4.3", 5353, false)}
	return NodeState{
		NodeName:          "node-1",
		NodeIP:            netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:       netip.MustParsePrefix("10.128.0.0/23"),
		ClusterNetworks:   []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		NodePortAddresses: []netip.Addr{ServiceNodePortIP},
		GatewayMAC:        net.HardwareAddr{0x2e, 0x11, 0x22, 0x33, 0x44, 0x55}, // tun0's
		Pods: []PodState{
			{Namespace: "a", Name: "web", IP: netip.MustParseAddr("10.128.0.2"), MAC: mac(2), OFPort: 3, VNID: 11},
			{Namespace: "b", Name: "db", IP: netip.MustParseAddr("10.128.0.3"), MAC: mac(3), OFPort: 4, VNID: 12},
			{Namespace: "default", Name: "dns", IP: netip.MustParseAddr("10.128.0.4"), MAC: mac(4), OFPort: 5, VNID: 0},
		},
		RemoteNodes: []RemoteNode{
			{Name: "node-2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.128.2.0/23")},
			{Name: "node-3", NodeIP: netip.MustParseAddr("192.0.2.13"), Subnet: netip.MustParsePrefix("10.128.4.0/23")},
		},
		Services: []ServiceState{
			{Namespace: "a", Name: "web", ClusterIP: netip.MustParseAddr("172.30.0.10"),
				Ports: []ServicePort{{Name: "http", Protocol: IPProtoTCP, Port: 80, NodePort: 30080, Endpoints: web}}},
			{Namespace: "a", Name: "sticky", ClusterIP: netip.MustParseAddr("172.30.0.11"), AffinityTimeout: 600,
				Ports: []ServicePort{{Name: "http", Protocol: IPProtoTCP, Port: 80, Endpoints: web}}},
			{Namespace: "default", Name: "dns", ClusterIP: netip.MustParseAddr("172.30.0.53"),
				Ports: []ServicePort{{Name: "dns", Protocol: IPProtoUDP, Port: 53, Endpoints: dns}}},
			{Namespace: "b", Name: "empty", ClusterIP: netip.MustParseAddr("172.30.0.12"),
				Ports: []ServicePort{{Protocol: IPProtoSCTP, Port: 9999}}},
		},
		// Rendered in networkpolicy mode only.
		Policies: []PolicyState{
			{Namespace: "a", Name: "web-from-b", Ingress: true,
				Pods: []PolicyPod{{OFPort: 3, NamedPorts: []NamedPort{{Name: "http", Protocol: IPProtoTCP, Port: 8080}}}},
				IngressRules: []PolicyRule{
					{Peers: []PolicyPeer{{Net: netip.MustParsePrefix("10.128.0.3/32")}, {Net: netip.MustParsePrefix("10.128.2.7/32")}},
						Ports: []PolicyPort{{Protocol: IPProtoTCP, Name: "http"}, {Protocol: IPProtoTCP, Port: 9000, EndPort: 9010}}},
					{Peers: []PolicyPeer{{Net: netip.MustParsePrefix("192.0.2.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("192.0.2.128/26")}}}},
				}},
			{Namespace: "b", Name: "db-egress", Egress: true,
				Pods: []PolicyPod{{OFPort: 4}},
				EgressRules: []PolicyRule{
					{AllPeers: true, Ports: []PolicyPort{{Protocol: IPProtoUDP, Port: 53}}},
					{Peers: []PolicyPeer{{Net: netip.MustParsePrefix("10.128.0.2/32"),
						NamedPorts: []NamedPort{{Name: "http", Protocol: IPProtoTCP, Port: 8080}}}},
						Ports: []PolicyPort{{Protocol: IPProtoTCP, Name: "http"}}},
				}},
			{Namespace: "b", Name: "deny-all", Ingress: true, Egress: true, Pods: []PolicyPod{{OFPort: 4}}},
		},
		// Two networks with the same addresses, and a third that talks to the first.
		Networks: []NetworkState{
			{Name: "blue", VNI: 0xfff002, CIDR: netip.MustParsePrefix("10.200.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.200.0.0/24"),
				Remotes: []NetworkRemote{{Node: "node-2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.200.1.0/24")}}},
			{Name: "green", VNI: 0xfff003, CIDR: netip.MustParsePrefix("10.201.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.201.3.0/24"),
				Remotes:   []NetworkRemote{{Node: "node-2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.201.0.0/24")}},
				CrossTalk: []string{"red"}},
			{Name: "red", VNI: 0xfff001, CIDR: netip.MustParsePrefix("10.200.0.0/16"), LocalSubnet: netip.MustParsePrefix("10.200.1.0/24"),
				Remotes: []NetworkRemote{{Node: "node-2", NodeIP: netip.MustParseAddr("192.0.2.12"), Subnet: netip.MustParsePrefix("10.200.0.0/24")},
					{Node: "node-3", NodeIP: netip.MustParseAddr("192.0.2.13"), Subnet: netip.MustParsePrefix("10.200.2.0/24")}},
				CrossTalk: []string{"green", "blue"}}, // blue overlaps: never
		},
		Attachments: []AttachmentState{
			{Namespace: "a", Name: "web", Interface: "net1", Network: "red", VNI: 0xfff001, IP: netip.MustParseAddr("10.200.1.5"),
				MAC: net.HardwareAddr{0x0a, 0x58, 10, 200, 1, 5}, OFPort: 6},
			{Namespace: "a", Name: "web", Interface: "net2", Network: "blue", VNI: 0xfff002, IP: netip.MustParseAddr("10.200.0.5"),
				MAC: net.HardwareAddr{0x0a, 0x58, 10, 200, 0, 5}, OFPort: 7},
			{Namespace: "b", Name: "db", Interface: "net1", Network: "blue", VNI: 0xfff002, IP: netip.MustParseAddr("10.200.0.6"),
				MAC: net.HardwareAddr{0x0a, 0x58, 10, 200, 0, 6}, OFPort: 8},
		},
	}
}

func TestRenderRejectsIncompleteNode(t *testing.T) {
	if _, err := Render(NodeState{NodeName: "n"}); err == nil {
		t.Fatal("a node without subnet must not render")
	}
}

func TestRenderCompiles(t *testing.T) {
	owners, err := Render(sampleNodeState())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := install(context.Background(), newReconciler(fakeswitch.New(), 1), nil, owners); err != nil {
		t.Fatalf("rendered flows do not compile, collide, or are refused: %v", err)
	}
}

// Pipeline-internal owners are in category pipeline, which no API object has: a Node (or a pod, or a
// namespace) named after one of them gets an owner of its own, and its flows never replace the
// node's own.
func TestNoObjectNameCollidesWithPipelineOwners(t *testing.T) {
	st := sampleNodeState()
	for _, name := range []string{"local", "local-subnet", "base", "services"} {
		st.RemoteNodes = append(st.RemoteNodes, RemoteNode{Name: name, NodeIP: netip.AddrFrom4([4]byte{192, 0, 2, byte(20 + len(st.RemoteNodes))}),
			Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 129, byte(len(st.RemoteNodes) * 2), 0}), 23)})
	}
	st.Pods = append(st.Pods, PodState{Namespace: "base", Name: "services", IP: netip.MustParseAddr("10.128.0.9"),
		MAC: net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 9}, OFPort: 9, VNID: 0})
	owners, err := Render(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, internal := range []reconcile.Owner{PipelineOwner, LocalOwner, ServicesOwner} {
		if internal.Category != reconcile.CategoryPipeline {
			t.Errorf("%s is not in category pipeline", internal)
		}
		if len(owners[internal].Flows) == 0 {
			t.Errorf("%s rendered nothing", internal)
		}
	}
	for _, name := range []string{"local", "local-subnet", "base", "services"} {
		if len(owners[NodeOwner(name)].Flows) == 0 {
			t.Errorf("node %q has no flows of its own", name)
		}
	}
	res, err := install(context.Background(), newReconciler(fakeswitch.New(), 1), nil, owners)
	if err != nil {
		t.Fatalf("owners collide: %v (%v)", err, res.Failed)
	}
}
