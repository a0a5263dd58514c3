package pipeline

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// TestLargePolicyOnOVS: a policy of 4,500 rules (more conjunction actions than one flow-mod holds) spreads over two priorities of its own; real TCP shows
// both halves enforce — a rule of the first chunk admits c on port 80 only, a rule of the second admits
// a on every port — and what neither admits is dropped.
func TestLargePolicyOnOVS(t *testing.T) {
	l := newSvcLab(t)
	l.state.Mode = ModeNetworkPolicy
	a := l.addPod(t, "a", 10, 0, []int{80, 81}, nil)
	b := l.addPod(t, "b", 11, 0, []int{80, 81}, nil)
	c := l.addPod(t, "c", 12, 0, []int{80, 81}, nil)
	for _, p := range []pod{a, b, c} {
		if _, err := p.Exec("ethtool", "-K", "eth0", "tx", "off"); err != nil {
			t.Fatal(err)
		}
	}
	const n = 4500
	pol := PolicyState{Namespace: "t", Name: "many", Ingress: true, Pods: []PolicyPod{{OFPort: uint32(b.OFPort)}}}
	for i := range n {
		pol.IngressRules = append(pol.IngressRules, PolicyRule{Peers: []PolicyPeer{{Net: netip.PrefixFrom(addrN("100.64.0.0", i), 32)}},
			Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: uint16(1000 + i)}}}) // a port each: no two rules share a conjunction
	}
	pol.IngressRules[0] = PolicyRule{Peers: []PolicyPeer{{Net: netip.PrefixFrom(c.IP.Addr(), 32)}}, Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 80}}}
	pol.IngressRules[n-1] = PolicyRule{Peers: []PolicyPeer{{Net: netip.PrefixFrom(a.IP.Addr(), 32)}}}
	l.state.Policies = []PolicyState{pol}
	l.state.Pods[1].IngressIsolated = true
	l.apply(t)
	prios := map[uint16]bool{}
	owners, _ := Render(l.state)
	for _, f := range owners[NetPolOwner("t", "many")].Flows {
		prios[f.Priority] = true
	}
	if len(prios) != 2 {
		t.Fatalf("the policy sits at %d priorities, want 2", len(prios))
	}
	for _, e := range []struct {
		from pod
		port int
		want bool
	}{{c, 80, true}, {c, 81, false}, {a, 80, true}, {a, 81, true}} {
		_, err := probe(e.from.Pod, "tcp", fmt.Sprintf("%s:%d", b.IP.Addr(), e.port), 700*time.Millisecond)
		if got := err == nil; got != e.want {
			t.Errorf("%s → b:%d: reachable %v, want %v", e.from.Name, e.port, got, e.want)
		}
	}
}
