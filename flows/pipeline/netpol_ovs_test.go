package pipeline

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// TestPoliciesOnOVS renders NetworkPolicies onto a real bridge and sends real TCP and UDP: what a rule
// allows connects, what no rule allows does not, replies of allowed connections pass whatever the
// other side's isolation, and a policy change cuts an established connection it no longer allows while
// one it still allows keeps going. Expectations are written from the API's rules for each case.
func TestPoliciesOnOVS(t *testing.T) {
	l := newSvcLab(t)
	l.state.Mode = ModeNetworkPolicy
	a := l.addPod(t, "a", 10, 0, []int{80, 81}, []int{53})
	b := l.addPod(t, "b", 11, 0, []int{80, 81}, []int{53})
	c := l.addPod(t, "c", 12, 0, []int{80, 81}, []int{53})
	pods := map[string]pod{"a": a, "b": b, "c": c}
	for _, p := range pods {
		if _, err := p.Exec("ethtool", "-K", "eth0", "tx", "off"); err != nil {
			t.Fatal(err)
		}
	}
	host := func(p pod) netip.Prefix { return netip.PrefixFrom(p.IP.Addr(), 32) }
	setIsolation := func(ingress, egress map[string]bool) {
		for i := range l.state.Pods {
			name := l.state.Pods[i].Name
			l.state.Pods[i].IngressIsolated, l.state.Pods[i].EgressIsolated = ingress[name], egress[name]
		}
	}
	reach := func(from, to pod, network string, port int) bool {
		_, err := probe(from.Pod, network, fmt.Sprintf("%s:%d", to.IP.Addr(), port), 700*time.Millisecond)
		return err == nil
	}
	type edge struct {
		from, to, network string
		port              int
		want              bool
	}
	check := func(t *testing.T, edges []edge) {
		t.Helper()
		for _, e := range edges {
			if got := reach(pods[e.from], pods[e.to], e.network, e.port); got != e.want {
				t.Errorf("%s → %s %s/%d: reachable %v, want %v", e.from, e.to, e.network, e.port, got, e.want)
			}
		}
	}

	// b admits only a, on tcp/80; c may send only to b (any port) and udp/53 anywhere.
	l.state.Policies = []PolicyState{
		{Namespace: "t", Name: "b-from-a", Ingress: true, Pods: []PolicyPod{{OFPort: uint32(b.OFPort)}},
			IngressRules: []PolicyRule{{Peers: []PolicyPeer{{Net: host(a)}}, Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 80}}}}},
		{Namespace: "t", Name: "c-egress", Egress: true, Pods: []PolicyPod{{OFPort: uint32(c.OFPort)}},
			EgressRules: []PolicyRule{
				{Peers: []PolicyPeer{{Net: host(b)}}},
				{AllPeers: true, Ports: []PolicyPort{{Protocol: IPProtoUDP, Port: 53}}},
			}},
	}
	setIsolation(map[string]bool{"b": true}, map[string]bool{"c": true})
	l.apply(t)
	check(t, []edge{
		{"a", "b", "tcp", 80, true}, {"a", "b", "tcp", 81, false}, {"a", "b", "udp", 53, false},
		{"c", "b", "tcp", 80, false}, // c's egress allows b, but b's ingress does not allow c
		{"c", "a", "tcp", 80, false}, {"c", "a", "udp", 53, true}, {"c", "b", "udp", 53, false},
		{"b", "a", "tcp", 81, true}, // b's ingress isolation does not stop b's own connections or their replies
		{"a", "c", "tcp", 80, true}, // c's egress isolation lets replies out
	})

	// An ipBlock with an except, and an endPort range: a admits 10.128.0.0/24 except c's /30.
	l.state.Policies = append(l.state.Policies, PolicyState{Namespace: "t", Name: "a-block", Ingress: true,
		Pods: []PolicyPod{{OFPort: uint32(a.OFPort)}},
		IngressRules: []PolicyRule{{Peers: []PolicyPeer{{Net: netip.MustParsePrefix("10.128.0.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("10.128.0.12/30")}}},
			Ports: []PolicyPort{{Protocol: IPProtoTCP, Port: 79, EndPort: 80}}}}})
	setIsolation(map[string]bool{"a": true, "b": true}, map[string]bool{"c": true})
	l.apply(t)
	check(t, []edge{{"b", "a", "tcp", 80, true}, {"b", "a", "tcp", 81, false}, {"c", "a", "udp", 53, false}})

	// A long-lived a → b:82 connection (an echo server), then the policy changes: while it still allows
	// the connection, it keeps going; once it no longer does, the connection's next packet is dropped.
	echoIn(t, b, 82)
	l.state.Policies[0].IngressRules[0].Ports = append(l.state.Policies[0].IngressRules[0].Ports, PolicyPort{Protocol: IPProtoTCP, Port: 82})
	l.apply(t)
	var conn net.Conn
	if err := a.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", fmt.Sprintf("%s:82", b.IP.Addr()), time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	if !echoes(conn, rd) {
		t.Fatal("no echo on a fresh allowed connection")
	}
	l.state.Policies[0].IngressRules[0].Ports = append(l.state.Policies[0].IngressRules[0].Ports, PolicyPort{Protocol: IPProtoTCP, Port: 81})
	l.apply(t)
	if !echoes(conn, rd) {
		t.Fatal("an established connection the changed policy still allows was cut")
	}
	l.state.Policies[0].IngressRules[0].Peers = []PolicyPeer{{Net: host(c)}}
	l.apply(t)
	if echoes(conn, rd) {
		t.Fatal("an established connection the changed policy no longer allows kept going")
	}
	check(t, []edge{{"a", "b", "tcp", 80, false}})
}

// echoIn serves a line echo on port inside a pod until the test ends.
func echoIn(t *testing.T, p pod, port int) {
	t.Helper()
	var ln net.Listener
	if err := p.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				rd := bufio.NewReader(c)
				for {
					line, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// echoes reports whether a line sent on an echo connection comes back within a short deadline.
func echoes(c net.Conn, rd *bufio.Reader) bool {
	_ = c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return false
	}
	line, err := rd.ReadString('\n')
	return err == nil && strings.TrimSpace(line) == "ping"
}
