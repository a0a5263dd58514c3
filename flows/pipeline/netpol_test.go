package pipeline

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/fakeswitch"
)

// TestCIDRMinusCoversExactly checks every address of small prefixes against the definition of an
// ipBlock with excepts: in the CIDR and in no except.
func TestCIDRMinusCoversExactly(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
	}{
		{"10.0.0.0/24", nil},
		{"10.0.0.0/24", []string{"10.0.0.64/26"}},
		{"10.0.0.0/24", []string{"10.0.0.7/32", "10.0.0.128/25", "10.0.0.6/31"}},
		{"10.0.0.0/24", []string{"10.0.0.0/16"}},                                 // except covers all
		{"10.0.0.0/24", []string{"10.0.1.0/24"}},                                 // except outside
		{"10.0.0.0/22", []string{"10.0.1.0/24", "10.0.1.0/25", "10.0.3.255/32"}}, // nested excepts
	} {
		p := netip.MustParsePrefix(tc.cidr)
		var ex []netip.Prefix
		for _, e := range tc.except {
			ex = append(ex, netip.MustParsePrefix(e))
		}
		got := cidrMinus(p, ex)
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			want := true
			for _, e := range ex {
				if e.Contains(a) {
					want = false
				}
			}
			n := 0
			for _, g := range got {
				if g.Contains(a) {
					n++
				}
			}
			if (n > 0) != want || n > 1 {
				t.Fatalf("%s except %v: %s covered %d times, want in=%v (got %v)", tc.cidr, tc.except, a, n, want, got)
			}
		}
		for _, g := range got {
			if !p.Contains(g.Addr()) || g.Bits() < p.Bits() {
				t.Fatalf("%s except %v: %s lies outside", tc.cidr, tc.except, g)
			}
		}
	}
}

// TestPortPrefixesCoverRangesExactly: every port of random ranges is matched by exactly one masked
// prefix, and no port outside is.
func TestPortPrefixesCoverRangesExactly(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ranges := [][2]uint16{{1, 65535}, {80, 80}, {9000, 9010}, {1024, 2047}, {0x7fff, 0x8000}, {65535, 65535}}
	for i := 0; i < 40; i++ {
		a, b := uint16(r.IntN(65535)+1), uint16(r.IntN(65535)+1)
		ranges = append(ranges, [2]uint16{min(a, b), max(a, b)})
	}
	for _, rg := range ranges {
		ps := portPrefixes(rg[0], rg[1])
		if len(ps) > 32 {
			t.Errorf("range %v needs %d prefixes, at most 2×16 expected", rg, len(ps))
		}
		for port := 0; port <= 65535; port++ {
			n := 0
			for _, p := range ps {
				if uint16(port)&p.mask == p.value {
					n++
				}
			}
			in := port >= int(rg[0]) && port <= int(rg[1])
			if (in && n != 1) || (!in && n != 0) {
				t.Fatalf("range %v: port %d matched %d prefixes (%v)", rg, port, n, ps)
			}
		}
	}
}

func addrN(base string, i int) netip.Addr {
	a := netip.MustParseAddr(base).As4()
	a[2] += byte(i >> 8)
	a[3] += byte(i)
	return netip.AddrFrom4(a)
}

// One rule between 200 selected pods and 200 peer pods costs about N+M flows, not N×M.
func TestPolicyFlowsAreNPlusM(t *testing.T) {
	p := PolicyState{Namespace: "ns", Name: "big", Ingress: true}
	rule := PolicyRule{Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 80}}}
	for i := 0; i < 200; i++ {
		p.Pods = append(p.Pods, PolicyPod{OFPort: uint32(10 + i)})
		rule.Peers = append(rule.Peers, PolicyPeer{Net: netip.PrefixFrom(addrN("10.129.0.0", i), 32)})
	}
	p.IngressRules = []PolicyRule{rule}
	st, err := renderPolicy(&p, atPriority(5000), newIDAllocator())
	if err != nil {
		t.Fatal(err)
	}
	if n, limit := len(st.Flows), int(1.1*400); n > limit {
		t.Fatalf("%d flows for 200×200, want ≤ %d", n, limit)
	}
	t.Logf("200 selected pods × 200 peers: %d flows (N×M would be 40,000)", len(st.Flows))
}

// Named ports split a rule by the number the name resolves to: per selected pod for ingress, per peer
// pod for egress; a pod without the name gets no conjunction for it.
func TestNamedPortsResolvePerPod(t *testing.T) {
	http := func(port uint16) []NamedPort { return []NamedPort{{Name: "http", Protocol: IPProtoTCP, Port: port}} }
	p := PolicyState{Namespace: "ns", Name: "named", Ingress: true, Egress: true,
		Pods:         []PolicyPod{{OFPort: 10, NamedPorts: http(8080)}, {OFPort: 11, NamedPorts: http(9090)}, {OFPort: 12}},
		IngressRules: []PolicyRule{{AllPeers: true, Ports: []PolicyPort{{Protocol: IPProtoTCP, Name: "http"}}}},
		EgressRules: []PolicyRule{{Peers: []PolicyPeer{
			{Net: netip.MustParsePrefix("10.129.0.1/32"), NamedPorts: http(8080)},
			{Net: netip.MustParsePrefix("10.129.0.2/32"), NamedPorts: http(7070)},
			{Net: netip.MustParsePrefix("10.129.0.3/32")},
		}, Ports: []PolicyPort{{Protocol: IPProtoTCP, Name: "http"}}}},
	}
	st, err := renderPolicy(&p, atPriority(5000), newIDAllocator())
	if err != nil {
		t.Fatal(err)
	}
	got := conjunctionsOf(st.Flows)
	// Ingress: pod 10 with 8080, pod 11 with 9090, pod 12 nowhere. Egress: peer .1 with 8080, .2 with
	// 7070, .3 nowhere; every selected pod takes part.
	want := []string{
		"50: ip,in_port=10 & ip,in_port=11 & ip,in_port=12 & tcp,tp_dst=7070 & ip,nw_dst=10.129.0.2",
		"50: ip,in_port=10 & ip,in_port=11 & ip,in_port=12 & tcp,tp_dst=8080 & ip,nw_dst=10.129.0.1",
		"80: ip,reg2=0xa & tcp,tp_dst=8080",
		"80: ip,reg2=0xb & tcp,tp_dst=9090",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("conjunctions:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// conjunctionsOf lists each conjunction as "table: match & match ...", clauses in order, sorted.
func conjunctionsOf(flows []Flow) []string {
	type clause struct {
		n       uint8
		matches []string
	}
	conj := map[uint32]map[uint8]*clause{}
	table := map[uint32]TableID{}
	for _, f := range flows {
		for _, a := range f.Actions {
			c, ok := a.(Conjunction)
			if !ok {
				continue
			}
			if conj[c.ID] == nil {
				conj[c.ID] = map[uint8]*clause{}
			}
			cl := conj[c.ID][c.Clause]
			if cl == nil {
				cl = &clause{n: c.Clause}
				conj[c.ID][c.Clause] = cl
			}
			cl.matches = append(cl.matches, f.Match.String())
			table[c.ID] = f.Table
		}
	}
	var out []string
	for id, cls := range conj {
		var parts []string
		for k := uint8(1); k <= 3; k++ {
			if cl := cls[k]; cl != nil {
				parts = append(parts, strings.Join(cl.matches, " & "))
			}
		}
		out = append(out, fmt.Sprintf("%d: %s", table[id], strings.Join(parts, " & ")))
	}
	slices.Sort(out)
	return out
}

// Each policy has a priority of its own: no flow is shared between policies (exact ownership), even
// when two policies select the same pod and peer; a policy's priority survives others coming and going.
func TestPoliciesNeverShareAFlow(t *testing.T) {
	st := sampleNodeState()
	st.Mode = ModeNetworkPolicy
	same := PolicyState{Ingress: true, Pods: []PolicyPod{{OFPort: 3}},
		IngressRules: []PolicyRule{{Peers: []PolicyPeer{{Net: netip.MustParsePrefix("10.128.0.3/32")}}}}}
	var prios []uint16
	for i := 0; i < 50; i++ {
		p := same
		p.Namespace, p.Name = "a", fmt.Sprint("dup-", i)
		st.Policies = append(st.Policies, p)
	}
	owners, err := Render(st)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		fl := owners[NetPolOwner("a", fmt.Sprint("dup-", i))].Flows
		if len(fl) == 0 {
			t.Fatalf("dup-%d rendered nothing", i)
		}
		prios = append(prios, fl[0].Priority)
	}
	// A reconciler refuses two owners of one flow: installing the render proves no sharing.
	if _, err := install(t.Context(), newReconciler(fakeswitch.New(), 1), nil, owners); err != nil {
		t.Fatal(err)
	}
	st.Policies = st.Policies[len(st.Policies)-10:] // 40 policies go
	owners, err = Render(st)
	if err != nil {
		t.Fatal(err)
	}
	for i := 40; i < 50; i++ {
		if got := owners[NetPolOwner("a", fmt.Sprint("dup-", i))].Flows[0].Priority; got != prios[i] {
			t.Errorf("dup-%d moved from priority %d to %d when other policies went", i, prios[i], got)
		}
	}
}

// In other modes policies render nothing, and isolation flows are not rendered.
func TestPoliciesOnlyInNetworkPolicyMode(t *testing.T) {
	for _, mode := range []Mode{ModeSubnet, ModeMultitenant} {
		st := sampleNodeState()
		st.Mode = mode
		st.Pods[0].IngressIsolated = true
		owners, err := Render(st)
		if err != nil {
			t.Fatal(err)
		}
		for o, os := range owners {
			if o.Category == reconcile.CategoryNetPol {
				t.Errorf("%s mode renders %s", mode, o)
			}
			for _, f := range os.Flows {
				if f.Priority == isolationPriority && (f.Table == TableIngressIsolation || f.Table == TableEgressPolicy) {
					t.Errorf("%s mode renders isolation flow %s", mode, f)
				}
			}
		}
	}
}

// The Renderer hands an unchanged pod's flows back as the very same slices (the agent compares
// owners with what is installed; equal slices are a pointer check), and renders a pod again when its
// isolation or the mode changes.
func TestRendererKeepsUnchangedPods(t *testing.T) {
	st := sampleNodeState()
	st.Mode = ModeNetworkPolicy
	var r Renderer
	first, _, err := r.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	o := PodOwner(st.Pods[0].Namespace, st.Pods[0].Name)
	st.Pods = slices.Clone(st.Pods)
	st.Pods[0].MAC = slices.Clone(st.Pods[0].MAC) // equal content in new memory, as each snapshot has
	again, _, _ := r.Render(st)
	if &again[o].Flows[0] != &first[o].Flows[0] {
		t.Error("an unchanged pod was rendered again")
	}
	for _, change := range []func(s *NodeState){
		func(s *NodeState) { s.Pods[0].IngressIsolated = true },
		func(s *NodeState) { s.Pods[0].EgressIsolated = true },
		func(s *NodeState) { s.Mode = ModeSubnet },
		func(s *NodeState) { s.Pods[0].MAC = net.HardwareAddr{0x0a, 0x58, 1, 2, 3, 4} },
	} {
		before, _, _ := r.Render(st)
		change(&st)
		after, _, _ := r.Render(st)
		fresh, err := Render(st)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(after[o].Flows, fresh[o].Flows, func(a, b Flow) bool { return a.String() == b.String() }) || len(after[o].Flows) > 0 && len(before[o].Flows) > 0 && &after[o].Flows[0] == &before[o].Flows[0] {
			t.Errorf("after a change the Renderer gave\n%v\nwant\n%v", after[o].Flows, fresh[o].Flows)
		}
	}
}

// atPriority renders every chunk of a policy at one priority (tests of a policy's flows, whatever its
// band).
func atPriority(p uint16) func(int) (uint16, error) {
	return func(int) (uint16, error) { return p, nil }
}

// A policy with more conjunctions than one priority can carry in a flow (5,000 rules, one CIDR each)
// spreads them over priorities of its own: every conjunction's clauses and its allow flow sit at one
// priority, no flow carries more than maxConjunctionsPerPriority conjunction actions, and the whole
// installs (every flow fits an OpenFlow message). It keeps its priorities while it does not change.
func TestLargePolicySpreadsOverPriorities(t *testing.T) {
	st := sampleNodeState()
	st.Mode = ModeNetworkPolicy
	p := PolicyState{Namespace: "a", Name: "many", Ingress: true, Pods: []PolicyPod{{OFPort: 3}}}
	for i := range 5000 {
		p.IngressRules = append(p.IngressRules, PolicyRule{Peers: []PolicyPeer{{Net: netip.PrefixFrom(addrN("100.64.0.0", i), 32)}},
			Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: uint16(1000 + i)}}}) // a port each: no two rules share a conjunction
	}
	st.Policies = []PolicyState{p}
	var r Renderer
	owners, failed, err := r.Render(st)
	if err != nil || len(failed) > 0 {
		t.Fatal(err, failed)
	}
	flows := owners[NetPolOwner("a", "many")].Flows
	prioOf := map[uint32]map[uint16]bool{} // conj_id → the priorities its flows sit at
	perPrio := map[uint16]map[uint32]bool{}
	note := func(id uint32, prio uint16) {
		if prioOf[id] == nil {
			prioOf[id] = map[uint16]bool{}
		}
		prioOf[id][prio] = true
		if perPrio[prio] == nil {
			perPrio[prio] = map[uint32]bool{}
		}
		perPrio[prio][id] = true
	}
	for _, f := range flows {
		n := 0
		for _, a := range f.Actions {
			if c, ok := a.(Conjunction); ok {
				note(c.ID, f.Priority)
				n++
			}
		}
		if n > maxConjunctionsPerPriority {
			t.Fatalf("a flow carries %d conjunctions: %.200s", n, f)
		}
		if m, ok := f.Match.Get(FieldConjID); ok {
			note(uint32(m.Value), f.Priority)
		}
	}
	if len(prioOf) != 5000 || len(perPrio) != 2 {
		t.Fatalf("%d conjunctions over %d priorities; want 5000 over 2", len(prioOf), len(perPrio))
	}
	for id, ps := range prioOf {
		if len(ps) != 1 {
			t.Fatalf("conjunction %d spans priorities %v", id, ps)
		}
	}
	if _, err := install(t.Context(), newReconciler(fakeswitch.New(), 1), nil, owners); err != nil {
		t.Fatal(err)
	}
	again, _, _ := r.Render(st)
	if &again[NetPolOwner("a", "many")].Flows[0] != &flows[0] {
		t.Error("an unchanged large policy was rendered again")
	}
}

// TestPolicyRerenderReusesUnchangedClauses: re-rendering a policy after one peer left and one came
// builds only the flows those touch — every other flow is the previous render's, slices and all — and
// the result is exactly what a render from scratch gives.
func TestPolicyRerenderReusesUnchangedClauses(t *testing.T) {
	policy := func(peers []int) PolicyState {
		p := PolicyState{Namespace: "ns", Name: "p", Ingress: true, Egress: true}
		for i := range 20 {
			p.Pods = append(p.Pods, PolicyPod{OFPort: uint32(10 + i)})
		}
		var in, out []PolicyPeer
		for _, i := range peers {
			in = append(in, PolicyPeer{Net: netip.PrefixFrom(addrN("10.129.0.0", i), 32)})
			out = append(out, PolicyPeer{Net: netip.PrefixFrom(addrN("10.130.0.0", i), 32)})
		}
		p.IngressRules = []PolicyRule{{Peers: in, Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 80}}},
			{Peers: in[:len(in)/2], Ports: []PolicyPort{{Protocol: IPProtoUDP, Port: 53}}}}
		p.EgressRules = []PolicyRule{{Peers: out, Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 443}}}}
		return p
	}
	var before, after []int
	for i := range 100 {
		before = append(before, i)
		if i != 40 {
			after = append(after, i)
		}
	}
	after = append(after, 200)
	p1, p2 := policy(before), policy(after)
	first, prev, err := renderPolicyReusing(&p1, atPriority(5000), newIDAllocator(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := renderPolicyReusing(&p2, atPriority(5000), newIDAllocator(), prev, nil)
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := renderPolicy(&p2, atPriority(5000), newIDAllocator())
	if err != nil {
		t.Fatal(err)
	}
	if flowLines(again.Flows) != flowLines(scratch.Flows) {
		t.Fatalf("reusing render differs from a render from scratch:\n%s\nvs\n%s", flowLines(again.Flows), flowLines(scratch.Flows))
	}
	old := map[*MatchField]bool{}
	for _, f := range first.Flows {
		if fs := f.Match.Fields(); len(fs) > 0 {
			old[&fs[0]] = true
		}
	}
	// The flows that changed are those whose text the first render does not have (peer 200's clause
	// flows, and peer 50's ingress one, which moved into the UDP rule's half): exactly those are built.
	had := map[string]bool{}
	for _, f := range first.Flows {
		had[f.String()] = true
	}
	built, changed := 0, 0
	for _, f := range again.Flows {
		if fs := f.Match.Fields(); len(fs) > 0 && !old[&fs[0]] {
			built++
		}
		if !had[f.String()] {
			changed++
		}
	}
	if built != changed || changed == 0 {
		t.Errorf("%d of %d flows built again, %d changed: want exactly the changed ones built", built, len(again.Flows), changed)
	}
}

// TestRendererKeysPoliciesByIdentity: a policy handed over again with its very slices is reused without
// hashing it again; one in new slices is keyed afresh, so equal content is still reused and changed
// content (of any of its slices, or of a scalar next to them) renders again, as Render would.
func TestRendererKeysPoliciesByIdentity(t *testing.T) {
	o := NetPolOwner("a", "web-from-b")
	for _, tc := range []struct {
		name   string
		change func(p *PolicyState) // on the state given to the second render (its slices are the first's)
		reused bool
	}{
		{"same slices", func(*PolicyState) {}, true},
		{"equal copies", func(p *PolicyState) {
			p.Pods, p.IngressRules = slices.Clone(p.Pods), slices.Clone(p.IngressRules)
			p.IngressRules[0].Peers = slices.Clone(p.IngressRules[0].Peers)
		}, true},
		{"a peer changed, in new slices", func(p *PolicyState) {
			p.IngressRules = slices.Clone(p.IngressRules)
			p.IngressRules[0].Peers = slices.Clone(p.IngressRules[0].Peers)
			p.IngressRules[0].Peers[1].Net = netip.MustParsePrefix("10.128.2.8/32")
		}, false},
		{"a pod more", func(p *PolicyState) { p.Pods = append(slices.Clip(p.Pods), PolicyPod{OFPort: 9}) }, false},
		{"a rule fewer", func(p *PolicyState) { p.IngressRules = p.IngressRules[:1] }, false},
		{"egress too, same slices", func(p *PolicyState) { p.Egress = true }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sampleNodeState()
			st.Mode = ModeNetworkPolicy
			var r Renderer
			first, _, err := r.Render(st)
			if err != nil {
				t.Fatal(err)
			}
			st.Policies = slices.Clone(st.Policies)
			tc.change(&st.Policies[0])
			again, _, err := r.Render(st)
			if err != nil {
				t.Fatal(err)
			}
			if got := &again[o].Flows[0] == &first[o].Flows[0]; got != tc.reused {
				t.Errorf("reused: %v, want %v", got, tc.reused)
			}
			fresh, err := Render(st)
			if err != nil {
				t.Fatal(err)
			}
			if flowLines(again[o].Flows) != flowLines(fresh[o].Flows) {
				t.Errorf("the Renderer gave\n%s\nwant\n%s", flowLines(again[o].Flows), flowLines(fresh[o].Flows))
			}
		})
	}
}
