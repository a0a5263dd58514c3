package pipeline

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
)

func svcNode(svcs ...ServiceState) NodeState {
	return NodeState{
		Mode: ModeMultitenant, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"),
		LocalSubnet:       netip.MustParsePrefix("10.128.0.0/24"),
		ClusterNetworks:   []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
		NodePortAddresses: []netip.Addr{ServiceNodePortIP},
		Services:          svcs,
	}
}

func readyEP(ip string, port uint16, local bool) Endpoint {
	return Endpoint{IP: netip.MustParseAddr(ip), Port: port, Ready: true, Serving: true, Local: local}
}

// renderOne renders a node with one service and returns that service port's flows and groups.
func renderOne(t *testing.T, svc ServiceState) []string {
	t.Helper()
	owners, err := Render(svcNode(svc))
	if err != nil {
		t.Fatal(err)
	}
	st, ok := owners[ServicePortOwner(svc, svc.Ports[0])]
	if !ok {
		t.Fatalf("no owner %s", ServicePortOwner(svc, svc.Ports[0]))
	}
	var out []string
	for _, f := range st.Flows {
		out = append(out, f.String())
	}
	for _, g := range st.Groups {
		out = append(out, g.String())
	}
	return out
}

func TestServiceGolden(t *testing.T) {
	two := []Endpoint{readyEP("10.128.0.12", 8080, true), readyEP("10.129.0.5", 8080, false)}
	for _, tc := range []struct {
		name string
		svc  ServiceState
		want []string
	}{{
		name: "ClusterIP TCP, two endpoints",
		svc: ServiceState{Namespace: "ns", Name: "web", ClusterIP: netip.MustParseAddr("172.30.0.10"),
			Ports: []ServicePort{{Name: "http", Protocol: IPProtoTCP, Port: 80, Endpoints: two}}},
		want: []string{
			"table=42, priority=200,tcp,reg4=0xa80000c,reg5=0x1f90,reg6=0x5dbd5ef3 actions=ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080))",
			"table=42, priority=200,tcp,reg4=0xa810005,reg5=0x1f90,reg6=0x5dbd5ef3 actions=ct(commit,table=45,zone=65520,nat(dst=10.129.0.5:8080))",
			"table=42, priority=100,tcp,reg6=0x5dbd5ef3 actions=group:1572691699",
			"table=40, priority=100,tcp,nw_dst=172.30.0.10,tp_dst=80 actions=load:0x5dbd5ef3->NXM_NX_REG6[],goto_table:42",
			"group_id=1572691699,type=select,bucket=actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42),bucket=actions=load:0xa810005->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
		},
	}, {
		name: "no endpoints: reject through the gateway",
		svc: ServiceState{Namespace: "ns", Name: "none", ClusterIP: netip.MustParseAddr("172.30.0.11"),
			Ports: []ServicePort{{Name: "dns", Protocol: IPProtoUDP, Port: 53}}},
		want: []string{
			"table=40, priority=100,udp,nw_dst=172.30.0.11,tp_dst=53 actions=ct(commit,table=45,zone=65520,nat(dst=10.128.0.1:65400-65499))",
		},
	}, {
		name: "affinity, SCTP, NodePort with externalTrafficPolicy Local, terminating endpoint skipped",
		svc: ServiceState{Namespace: "ns", Name: "sticky", ClusterIP: netip.MustParseAddr("172.30.0.12"), AffinityTimeout: 100000, ExternalLocal: true,
			Ports: []ServicePort{{Name: "s", Protocol: IPProtoSCTP, Port: 9, NodePort: 30009, Endpoints: append(two,
				Endpoint{IP: netip.MustParseAddr("10.128.0.13"), Port: 8080, Serving: true, Terminating: true, Local: true})}}},
		want: []string{
			"table=42, priority=200,sctp,reg4=0xa80000c,reg5=0x1f90,reg6=0x57f1df5f actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080))",
			"table=42, priority=200,sctp,reg4=0xa810005,reg5=0x1f90,reg6=0x57f1df5f actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.129.0.5:8080))",
			"table=42, priority=100,sctp,reg6=0x57f1df5f,nw_src=0.0.0.0/0.0.0.63 actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=42, priority=100,sctp,reg6=0x57f1df5f,nw_src=0.0.0.1/0.0.0.63 actions=load:0xa810005->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"… 62 more address slots, alternating",
			"table=40, priority=100,sctp,nw_dst=172.30.0.12,tp_dst=9 actions=load:0x57f1df5f->NXM_NX_REG6[],resubmit(,41),goto_table:42",
			"table=42, priority=200,sctp,reg4=0xa80000c,reg5=0x1f90,reg6=0x12a6aa8e actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080))",
			"table=42, priority=100,sctp,reg6=0x12a6aa8e,nw_src=0.0.0.0/0.0.0.63 actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=42, priority=100,sctp,reg6=0x12a6aa8e,nw_src=0.0.0.1/0.0.0.63 actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"… 62 more address slots, alternating",
			"table=40, priority=100,sctp,nw_dst=169.254.169.3,tp_dst=30009 actions=load:0x12a6aa8e->NXM_NX_REG6[],resubmit(,41),goto_table:42",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := elideAddressSlots(renderOne(t, tc.svc))
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// elideAddressSlots keeps the first two of each run of sessionAffinity address-slot flows (table 42,
// matching nw_src) and replaces the rest by one line, so a golden stays readable.
func elideAddressSlots(flows []string) []string {
	var out []string
	run := 0
	for i, f := range flows {
		slot := strings.HasPrefix(f, "table=42, priority=100,") && strings.Contains(f, ",nw_src=")
		if slot {
			run++
			if run <= 2 {
				out = append(out, f)
			}
		}
		if run > 2 && (!slot || i == len(flows)-1) {
			out = append(out, fmt.Sprintf("… %d more address slots, alternating", run-2))
		}
		if !slot {
			run = 0
			out = append(out, f)
		}
	}
	return out
}

func TestAffinityChoiceSpreadsAndSticks(t *testing.T) {
	for _, n := range []int{1, 3, 64, 100, 2000} {
		eps := make([]Endpoint, n)
		for i := range eps {
			eps[i] = readyEP(netip.AddrFrom4([4]byte{10, 128, byte(i >> 8), byte(i)}).String(), 80, true)
		}
		flows := affinityChoice(IPProtoTCP, 7, eps)
		slots := affinitySlots(n)
		if len(flows) != slots || slots < n || slots&(slots-1) != 0 {
			t.Fatalf("%d endpoints: %d flows for %d slots", n, len(flows), slots)
		}
		// Every endpoint owns a slot, and no endpoint owns more than one slot more than another.
		per := map[string]int{}
		for _, f := range flows {
			per[strings.Split(strings.SplitAfter(f.String(), "actions=load:")[1], "->")[0]]++
		}
		lo, hi := slots, 0
		for _, c := range per {
			lo, hi = min(lo, c), max(hi, c)
		}
		if len(per) != n || hi-lo > 1 {
			t.Errorf("%d endpoints over %d slots: %d endpoints used, %d..%d slots each", n, slots, len(per), lo, hi)
		}
	}
}

func TestServiceTrafficPolicyLocalWithoutLocalEndpointDrops(t *testing.T) {
	got := renderOne(t, ServiceState{Namespace: "ns", Name: "x", ClusterIP: netip.MustParseAddr("172.30.0.20"), InternalLocal: true,
		Ports: []ServicePort{{Name: "p", Protocol: IPProtoTCP, Port: 80, Endpoints: []Endpoint{readyEP("10.129.0.5", 80, false)}}}})
	if len(got) != 1 || got[0] != "table=40, priority=100,tcp,nw_dst=172.30.0.20,tp_dst=80 actions=drop" {
		t.Errorf("internalTrafficPolicy Local without a local endpoint must drop:\n%s", strings.Join(got, "\n"))
	}
}

// TestServiceChainedGroups: 2,000 endpoints split into groups that each fit one OpenFlow message,
// every endpoint in exactly one, chosen by source-port bits; IDs stable across renders.
func TestServiceChainedGroups(t *testing.T) {
	var eps []Endpoint
	for i := 0; i < 2000; i++ {
		eps = append(eps, Endpoint{IP: netip.AddrFrom4([4]byte{10, 128, byte(i / 250), byte(1 + i%250)}), Port: 80, Ready: true})
	}
	svc := ServiceState{Namespace: "ns", Name: "big", ClusterIP: netip.MustParseAddr("172.30.0.30"),
		Ports: []ServicePort{{Name: "p", Protocol: IPProtoTCP, Port: 80, Endpoints: eps}}}
	owners, err := Render(svcNode(svc))
	if err != nil {
		t.Fatal(err)
	}
	st := owners[ServicePortOwner(svc, svc.Ports[0])]
	if len(st.Groups) != 4 {
		t.Fatalf("want 4 groups of 500, got %d", len(st.Groups))
	}
	seen := map[uint64]int{}
	for _, g := range st.Groups {
		msg, err := EncodeGroupMod(g)
		if err != nil {
			t.Fatal(err)
		}
		if len(msg) > MaxMessageLen {
			t.Errorf("group %d: %d bytes", g.ID, len(msg))
		}
		for _, b := range g.Buckets {
			seen[b.Actions[0].(Load).Value]++
		}
	}
	if len(seen) != 2000 {
		t.Errorf("%d distinct endpoints in the groups, want 2000", len(seen))
	}
	for ip, n := range seen {
		if n != 1 {
			t.Errorf("endpoint %#x in %d groups", ip, n)
		}
	}
	var selectors []string
	for _, f := range st.Flows {
		if f.Table == TableServiceLB && f.Priority == 100 {
			selectors = append(selectors, f.Match.String())
		}
	}
	if len(selectors) != 4 || !strings.Contains(strings.Join(selectors, " "), "tp_src=0x6/0x6") {
		t.Errorf("group selectors: %v", selectors)
	}
	again, _ := Render(svcNode(svc))
	for i, g := range again[ServicePortOwner(svc, svc.Ports[0])].Groups {
		if g.ID != st.Groups[i].ID {
			t.Errorf("group IDs change between renders: %d then %d", st.Groups[i].ID, g.ID)
		}
	}
}

func TestServiceIDCollisionsProbed(t *testing.T) {
	a := newIDAllocator()
	x, err := a.get("svc/a")
	if err != nil {
		t.Fatal(err)
	}
	// Pretend another key already holds svc/b's natural ID.
	y0, _ := newIDAllocator().get("svc/b")
	a.used[y0] = "svc/other"
	y, err := a.get("svc/b")
	if err != nil || y == y0 || y == x {
		t.Errorf("collision not probed away: %d (natural %d), %v", y, y0, err)
	}
	if again, _ := a.get("svc/b"); again != y {
		t.Errorf("the same key must keep its ID: %d then %d", y, again)
	}
}

func TestStaleConntrack(t *testing.T) {
	udp := func(eps ...Endpoint) ServiceState {
		return ServiceState{Namespace: "ns", Name: "dns", ClusterIP: netip.MustParseAddr("172.30.0.53"),
			Ports: []ServicePort{{Name: "dns", Protocol: IPProtoUDP, Port: 53, NodePort: 30053, Endpoints: eps},
				{Name: "dns-tcp", Protocol: IPProtoTCP, Port: 53, Endpoints: eps}}}
	}
	a, b := readyEP("10.128.0.5", 53, true), readyEP("10.128.0.6", 53, true)
	var got []string
	for _, c := range StaleConntrack(svcNode(udp(a, b)), svcNode(udp(b))) {
		got = append(got, c.String())
	}
	want := "udp 169.254.169.3:30053 → 10.128.0.5,udp 172.30.0.53:53 → 10.128.0.5"
	if strings.Join(got, ",") != want {
		t.Errorf("endpoint removed: got %v, want %s", got, want)
	}
	// A service that rejected (no endpoints) gets endpoints: its entries towards the gateway go.
	got = nil
	for _, c := range StaleConntrack(svcNode(udp()), svcNode(udp(a))) {
		got = append(got, c.String())
	}
	if strings.Join(got, ",") != "udp 169.254.169.3:30053 → 10.128.0.1,udp 172.30.0.53:53 → 10.128.0.1" {
		t.Errorf("reject ended: %v", got)
	}
	// An endpoint going terminating while ready ones remain stops taking new flows: flush it too.
	term := b
	term.Ready, term.Terminating = false, true
	if n := len(StaleConntrack(svcNode(udp(a, b)), svcNode(udp(a, term)))); n != 2 {
		t.Errorf("terminating endpoint: %d entries, want 2", n)
	}
	if n := len(StaleConntrack(svcNode(udp(a)), svcNode(udp(a)))); n != 0 {
		t.Errorf("no change, %d entries", n)
	}
}

// TestStaleConntrackHeld: a starting agent compares what conntrack holds with the state: DNATed UDP and
// SCTP entries towards endpoints the state no longer has, or of services it no longer has, go; entries
// the state still DNATs to, TCP, and connections that were never NATed (committed by policy) stay.
func TestStaleConntrackHeld(t *testing.T) {
	a, b := readyEP("10.128.0.5", 53, true), readyEP("10.128.0.6", 53, true)
	st := svcNode(ServiceState{Namespace: "ns", Name: "dns", ClusterIP: netip.MustParseAddr("172.30.0.53"),
		Ports: []ServicePort{{Name: "dns", Protocol: IPProtoUDP, Port: 53, Endpoints: []Endpoint{b}}}})
	ip := netip.MustParseAddr
	held := []ConntrackFlush{
		{Protocol: IPProtoUDP, Dst: ip("172.30.0.53"), DstPort: 53, ReplySrc: a.IP},            // a was removed: stale
		{Protocol: IPProtoUDP, Dst: ip("172.30.0.53"), DstPort: 53, ReplySrc: a.IP},            // the same, twice
		{Protocol: IPProtoUDP, Dst: ip("172.30.0.53"), DstPort: 53, ReplySrc: b.IP},            // still used
		{Protocol: IPProtoUDP, Dst: ip("172.30.0.99"), DstPort: 53, ReplySrc: b.IP},            // service deleted: stale
		{Protocol: IPProtoSCTP, Dst: ip("172.30.0.98"), DstPort: 9, ReplySrc: b.IP},            // stale too
		{Protocol: IPProtoTCP, Dst: ip("172.30.0.99"), DstPort: 80, ReplySrc: b.IP},            // TCP: left alone
		{Protocol: IPProtoUDP, Dst: ip("10.128.2.7"), DstPort: 53, ReplySrc: ip("10.128.2.7")}, // not NATed
	}
	var got []string
	for _, c := range StaleConntrackHeld(st, held) {
		got = append(got, c.String())
	}
	want := "udp 172.30.0.53:53 → 10.128.0.5,sctp 172.30.0.98:9 → 10.128.0.6,udp 172.30.0.99:53 → 10.128.0.6"
	if strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
}

// TestRendererReusesUnchangedServices: a Renderer's output equals Render's, and a service whose inputs
// did not change comes back as the very same slices (so the agent's comparison is cheap).
func TestRendererReusesUnchangedServices(t *testing.T) {
	state := benchServices(50, 5)
	var r Renderer
	first, _, err := r.Render(state)
	if err != nil {
		t.Fatal(err)
	}
	changed := state
	changed.Services = slices.Clone(state.Services)
	svc := changed.Services[7]
	svc.Ports = slices.Clone(svc.Ports)
	svc.Ports[0].Endpoints = slices.Clone(svc.Ports[0].Endpoints)
	svc.Ports[0].Endpoints[2].IP = netip.MustParseAddr("10.131.255.1")
	changed.Services[7] = svc
	got, _, err := r.Render(changed)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(changed)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("a Renderer's second render differs from a fresh Render")
	}
	touched := ServicePortOwner(svc, svc.Ports[0])
	same, rerendered := 0, 0
	for o, st := range got {
		if o.Category != reconcile.CategoryService || len(st.Flows) == 0 {
			continue
		}
		if &st.Flows[0] == &first[o].Flows[0] {
			same++
		} else {
			rerendered++
			if o != touched {
				t.Errorf("%s was rendered again though nothing of it changed", o)
			}
		}
	}
	if rerendered != 1 || same == 0 {
		t.Errorf("%d owners rendered again, %d reused; want exactly the changed one again", rerendered, same)
	}
}
