package pipeline

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/stats"
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
			"table=42, priority=200,tcp,reg4=0xa80000c,reg5=0x1f90,reg6=0x5dbd5ef3 actions=ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080),exec(move:NXM_NX_REG3[1]->NXM_NX_CT_MARK[0]))",
			"table=42, priority=200,tcp,reg4=0xa810005,reg5=0x1f90,reg6=0x5dbd5ef3 actions=ct(commit,table=45,zone=65520,nat(dst=10.129.0.5:8080),exec(move:NXM_NX_REG3[1]->NXM_NX_CT_MARK[0]))",
			"table=42, priority=100,tcp,reg6=0x5dbd5ef3 actions=group:1572691699",
			"table=40, priority=100,tcp,nw_dst=172.30.0.10,tp_dst=80 actions=load:0x5dbd5ef3->NXM_NX_REG6[],goto_table:42",
			"group_id=1572691699,type=select,bucket=actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42),bucket=actions=load:0xa810005->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
		},
	}, {
		name: "no endpoints: reject through the gateway",
		svc: ServiceState{Namespace: "ns", Name: "none", ClusterIP: netip.MustParseAddr("172.30.0.11"),
			Ports: []ServicePort{{Name: "dns", Protocol: IPProtoUDP, Port: 53}}},
		want: []string{
			"table=40, priority=100,udp,nw_dst=172.30.0.11,tp_dst=53 actions=controller(max_len=128,meter_id=10),ct(commit,table=45,zone=65520,nat(dst=10.128.0.1:65400-65499))",
		},
	}, {
		name: "affinity, SCTP, NodePort with externalTrafficPolicy Local (but for the node's own connections), terminating endpoint skipped",
		svc: ServiceState{Namespace: "ns", Name: "sticky", ClusterIP: netip.MustParseAddr("172.30.0.12"), AffinityTimeout: 100000, ExternalLocal: true,
			Ports: []ServicePort{{Name: "s", Protocol: IPProtoSCTP, Port: 9, NodePort: 30009, Endpoints: append(two,
				Endpoint{IP: netip.MustParseAddr("10.128.0.13"), Port: 8080, Serving: true, Terminating: true, Local: true})}}},
		want: []string{
			"table=42, priority=200,sctp,reg4=0xa80000c,reg5=0x1f90,reg6=0x57f1df5f actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080),exec(move:NXM_NX_REG3[1]->NXM_NX_CT_MARK[0]))",
			"table=42, priority=200,sctp,reg4=0xa810005,reg5=0x1f90,reg6=0x57f1df5f actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.129.0.5:8080),exec(move:NXM_NX_REG3[1]->NXM_NX_CT_MARK[0]))",
			// Two endpoints, four slots: the client address's hash picks one.
			"table=42, priority=100,sctp,reg6=0x57f1df5f actions=multipath(nw_src,0,modulo_n,65536,0,NXM_NX_REG7[0..15]),resubmit(,43)",
			"table=43, priority=200,reg6=0x57f1df5f,reg7=0/0x3 actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=43, priority=200,reg6=0x57f1df5f,reg7=0x1/0x3 actions=load:0xa810005->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=43, priority=100,reg6=0x57f1df5f actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=40, priority=100,sctp,nw_dst=172.30.0.12,tp_dst=9 actions=load:0x57f1df5f->NXM_NX_REG6[],resubmit(,41),goto_table:42",
			// The node's own connections to the NodePort take any endpoint, masqueraded, as kube-proxy's do.
			"table=40, priority=110,sctp,nw_src=192.0.2.11,nw_dst=169.254.169.3,tp_dst=30009 actions=load:0x57f1df5f->NXM_NX_REG6[],load:0x1->NXM_NX_REG3[1],resubmit(,41),goto_table:42",
			// The NodePort (local endpoints only): one endpoint, no hash; the client's address is kept.
			"table=42, priority=200,sctp,reg4=0xa80000c,reg5=0x1f90,reg6=0x12a6aa8e actions=learn(table=41,idle_timeout=65535,priority=100,delete_learned,cookie=0x900d45639b6,eth_type=0x800,NXM_NX_REG6[],NXM_OF_IP_SRC[],load:NXM_NX_REG4[]->NXM_NX_REG4[],load:NXM_NX_REG5[]->NXM_NX_REG5[]),ct(commit,table=45,zone=65520,nat(dst=10.128.0.12:8080),exec(move:NXM_NX_REG3[1]->NXM_NX_CT_MARK[0]))",
			"table=42, priority=100,sctp,reg6=0x12a6aa8e actions=load:0xa80000c->NXM_NX_REG4[],load:0x1f90->NXM_NX_REG5[],resubmit(,42)",
			"table=40, priority=100,sctp,nw_dst=169.254.169.3,tp_dst=30009 actions=load:0x12a6aa8e->NXM_NX_REG6[],load:0->NXM_NX_REG3[1],resubmit(,41),goto_table:42",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := renderOne(t, tc.svc)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// walkAffinity follows a rendered node's flows (lookup) in tables 42 and 43 the way OVS does for a new client of
// load balancer lb, with hash(basis) standing in for multipath's hash of the client's address, and
// returns the endpoint (reg4:reg5) the client lands on and how many hashes it took.
func walkAffinity(t *testing.T, lookup miniClassifier, lb uint32, hash func(basis uint16) uint16) (string, int) {
	t.Helper()
	regs := map[Field]uint64{RegServiceLB: uint64(lb)}
	hashes := 0
	var run func(table TableID, depth int)
	run = func(table TableID, depth int) {
		if depth > 64 {
			t.Fatal("resubmit depth beyond OVS's 64")
		}
		best := lookup.find(table, regs)
		if best == nil {
			t.Fatalf("table %d: no flow matches %v", table, regs)
		}
		for _, a := range best.Actions {
			switch a := a.(type) {
			case Multipath:
				hashes++
				regs[a.Dst.Field] = regs[a.Dst.Field]&^(uint64(0xffff)<<a.Dst.Start) | uint64(hash(a.Basis))%uint64(a.Links)<<a.Dst.Start
			case Load:
				mask := (uint64(1)<<uint(a.Dst.NBits()) - 1) << a.Dst.Start
				regs[a.Dst.Field] = regs[a.Dst.Field]&^mask | a.Value<<a.Dst.Start
			case Resubmit:
				run(a.Table, depth+1)
			case CT, Learn:
				return // the DNAT flow: the choice is made
			}
		}
	}
	run(TableServiceLB, 0)
	return fmt.Sprintf("%#x:%d", regs[RegEndpointIP], regs[RegEndpointPort]), hashes
}

// miniClassifier finds the highest-priority flow of a table whose register matches hold, as OVS's
// classifier does (one hash table per set of masks); protocol matches are taken as satisfied.
type miniClassifier map[TableID][]*subtable

type subtable struct {
	fields []Field
	masks  []uint64
	flows  map[string]*Flow
}

func matchMask(mf MatchField) uint64 {
	if mf.Masked {
		return mf.Mask
	}
	if b := mf.Field.Bits(); b < 64 {
		return 1<<b - 1
	}
	return ^uint64(0)
}

func newMiniClassifier(flows []Flow) miniClassifier {
	c := miniClassifier{}
	for i := range flows {
		f := &flows[i]
		var fields []Field
		var masks, values []uint64
		for _, mf := range f.Match.Fields() {
			if mf.Field == FieldEthType || mf.Field == FieldIPProto {
				continue
			}
			fields, masks, values = append(fields, mf.Field), append(masks, matchMask(mf)), append(values, mf.Value&matchMask(mf))
		}
		var st *subtable
		for _, x := range c[f.Table] {
			if slices.Equal(x.fields, fields) && slices.Equal(x.masks, masks) {
				st = x
			}
		}
		if st == nil {
			st = &subtable{fields: fields, masks: masks, flows: map[string]*Flow{}}
			c[f.Table] = append(c[f.Table], st)
		}
		k := fmt.Sprint(values)
		if old := st.flows[k]; old == nil || old.Priority < f.Priority {
			st.flows[k] = f
		}
	}
	return c
}

func (c miniClassifier) find(table TableID, regs map[Field]uint64) *Flow {
	var best *Flow
	for _, st := range c[table] {
		values := make([]uint64, len(st.fields))
		for i, f := range st.fields {
			values[i] = regs[f] & st.masks[i]
		}
		if f := st.flows[fmt.Sprint(values)]; f != nil && (best == nil || f.Priority > best.Priority) {
			best = f
		}
	}
	return best
}

func affinityService(eps []Endpoint) ServiceState {
	return ServiceState{Namespace: "ns", Name: "sticky", ClusterIP: netip.MustParseAddr("172.30.0.12"), AffinityTimeout: 600,
		Ports: []ServicePort{{Name: "p", Protocol: IPProtoTCP, Port: 80, Endpoints: eps}}}
}

func endpointsN(n int, salt byte) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = readyEP(netip.AddrFrom4([4]byte{10, 128 + salt, byte(i >> 8), byte(i)}).String(), 8080, true)
	}
	return eps
}

// renderedAffinity renders a node with svc and returns all its flows and the service's load balancer.
func renderedAffinity(t *testing.T, svc ServiceState) ([]Flow, uint32) {
	t.Helper()
	owners, err := Render(svcNode(svc))
	if err != nil {
		t.Fatal(err)
	}
	var flows []Flow
	for _, st := range owners {
		flows = append(flows, st.Flows...)
	}
	for _, f := range owners[ServicePortOwner(svc, svc.Ports[0])].Flows {
		if f.Table == TableServices {
			for _, a := range f.Actions {
				if l, ok := a.(Load); ok && l.Dst == Whole(RegServiceLB) {
					return flows, uint32(l.Value)
				}
			}
		}
	}
	t.Fatal("no load balancer")
	return nil, 0
}

// TestAffinityChoiceIsUniform: walking the rendered flows with an ideal random hash, 30,000 clients
// spread over n endpoints as a uniform choice would (chi-square below its 99.99% quantile, a seeded
// stand-in for the hash, so the test is deterministic), each endpoint reachable, each client taking few
// hashes; the fallback after affinityAttempts empty slots still lands on an endpoint.
func TestAffinityChoiceIsUniform(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 12, 100, 1000} {
		flows, lb := renderedAffinity(t, affinityService(endpointsN(n, 0)))
		lookup := newMiniClassifier(flows)
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		const clients = 30000
		counts := map[string]int{}
		hashes := 0
		for range clients {
			seed := rng.Uint64()
			ep, k := walkAffinity(t, lookup, lb, func(basis uint16) uint16 {
				return uint16(rand.New(rand.NewPCG(seed, uint64(basis))).Uint32())
			})
			counts[ep]++
			hashes += k
		}
		if len(counts) != n {
			t.Errorf("%d endpoints: %d chosen", n, len(counts))
		}
		var all []int
		for _, c := range counts {
			all = append(all, c)
		}
		chi2 := stats.ChiSquare(all)
		// Wilson-Hilferty: the 99.99% quantile of chi-square with n-1 degrees of freedom.
		limit := stats.ChiSquareQuantile(n-1, 3.719)
		t.Logf("%d endpoints, %d slots: chi-square %.1f (99.99%% limit %.1f), %.2f hashes per client", n, affinitySlots(n), chi2, limit, float64(hashes)/clients)
		if n > 1 && chi2 > limit {
			t.Errorf("%d endpoints: chi-square %.1f above %.1f: %v", n, chi2, limit, counts)
		}
		if per := float64(hashes) / clients; n > 1 && per > 3 {
			t.Errorf("%d endpoints: %.2f hashes per client", n, per)
		}
	}
	// A hash that always falls on an empty slot: 32 tries, then the fallback endpoint.
	flows, lb := renderedAffinity(t, affinityService(endpointsN(3, 0)))
	slots := map[uint64]bool{}
	for _, f := range flows {
		if f.Table == TableServiceHash && f.Priority == 200 {
			mf, _ := f.Match.Get(RegAffinityHash)
			slots[mf.Value] = true
		}
	}
	empty := uint16(0)
	for slots[uint64(empty)] {
		empty++
	}
	if ep, k := walkAffinity(t, newMiniClassifier(flows), lb, func(uint16) uint16 { return empty }); k != affinityAttempts+1 || ep == "0:0" {
		t.Errorf("always an empty slot: %d hashes, endpoint %s", k, ep)
	}
}

// TestAffinityLayout: each endpoint owns exactly one slot, no two share one, the slot count keeps
// between 3/8 and 3/4 of them full, the layout depends on the endpoint set only (not its order), and
// one endpoint added or removed moves at most a few others.
func TestAffinityLayout(t *testing.T) {
	for _, n := range []int{2, 3, 4, 10, 96, 97, 1000} {
		eps := endpointsN(n, 0)
		slots := affinitySlots(n)
		if 8*n <= 3*slots || 4*n > 3*slots {
			t.Errorf("%d endpoints in %d slots", n, slots)
		}
		layout := affinityLayout(eps, slots)
		seen := map[int]bool{}
		for _, s := range layout {
			if s < 0 || s >= slots || seen[s] {
				t.Fatalf("%d endpoints: slot %d out of range or shared: %v", n, s, layout)
			}
			seen[s] = true
		}
		shuffled := slices.Clone(eps)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		again := affinityLayout(shuffled, slots)
		for i, e := range shuffled {
			if j := slices.Index(eps, e); again[i] != layout[j] {
				t.Fatalf("%d endpoints: the layout depends on their order", n)
			}
		}
		if affinitySlots(n+1) != slots {
			continue
		}
		more := append(slices.Clone(eps), readyEP("10.131.0.1", 8080, true))
		moved := 0
		for i, s := range affinityLayout(more, slots)[:n] {
			if s != layout[i] {
				moved++
			}
		}
		if moved > 4 {
			t.Errorf("%d endpoints: adding one moved %d others", n, moved)
		}
	}
}

func TestServiceTrafficPolicyLocalWithoutLocalEndpointDrops(t *testing.T) {
	got := renderOne(t, ServiceState{Namespace: "ns", Name: "x", ClusterIP: netip.MustParseAddr("172.30.0.20"), InternalLocal: true,
		Ports: []ServicePort{{Name: "p", Protocol: IPProtoTCP, Port: 80, Endpoints: []Endpoint{readyEP("10.129.0.5", 80, false)}}}})
	if len(got) != 1 || got[0] != "table=40, priority=100,tcp,nw_dst=172.30.0.20,tp_dst=80 actions=controller(max_len=128,meter_id=10)" {
		t.Errorf("internalTrafficPolicy Local without a local endpoint must drop (sampled):\n%s", strings.Join(got, "\n"))
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

// eligible takes what kube-proxy takes: ready endpoints (a ready one that is terminating too, as
// publishNotReadyAddresses makes them, included), else serving terminating ones.
func TestEligibleEndpoints(t *testing.T) {
	ep := func(last byte, ready, serving, terminating bool) Endpoint {
		return Endpoint{IP: netip.AddrFrom4([4]byte{10, 128, 0, last}), Port: 8080, Ready: ready, Serving: serving, Terminating: terminating}
	}
	for _, tc := range []struct {
		name string
		eps  []Endpoint
		want []byte
	}{
		{"ready only, terminating serving ones waiting", []Endpoint{ep(1, true, true, false), ep(2, false, true, true)}, []byte{1}},
		{"no ready one: the serving terminating ones", []Endpoint{ep(2, false, true, true), ep(3, false, false, true), ep(4, false, false, false)}, []byte{2}},
		{"publishNotReadyAddresses: ready while terminating", []Endpoint{ep(5, true, false, true), ep(6, false, true, true)}, []byte{5}},
		{"nothing usable", []Endpoint{ep(3, false, false, true)}, nil},
	} {
		var got []byte
		for _, e := range eligible(tc.eps, false) {
			got = append(got, e.IP.As4()[3])
		}
		if string(got) != string(tc.want) {
			t.Errorf("%s: eligible %v, want %v", tc.name, got, tc.want)
		}
	}
}
