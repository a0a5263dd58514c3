package pipeline

// The client's address on a real bridge: sessionAffinity chooses by a hash of it, NodePorts and host
// clients choose by it before they are masqueraded, externalTrafficPolicy Local keeps it. The host
// stand-in on tun0 holds many extra addresses, each one a distinct client.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"

	"github.com/ofsdn/ofsdn/e2e/testpod"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/internal/stats"
	"github.com/vishvananda/netlink"
)

// addAddresses puts each address on the namespace's eth0 as a /32.
func addAddresses(t *testing.T, p *ovstest.Pod, addrs []netip.Addr) {
	t.Helper()
	err := p.Do(func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return fmt.Errorf("add %s: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// probeSrc is testpod.ProbeFrom run inside the namespace: UDP resends until an answer or the
// timeout (a datagram lost while OVS handles a burst of new flows is not a wrong answer).
func probeSrc(from *ovstest.Pod, network string, src netip.Addr, addr string, timeout time.Duration) (testpod.Reply, error) {
	var rep testpod.Reply
	err := from.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var err error
		rep, err = testpod.ProbeFrom(ctx, network, src, addr)
		return err
	})
	return rep, err
}

// seenPort is the source port the server saw.
func seenPort(t *testing.T, rep testpod.Reply) (netip.Addr, uint16) {
	t.Helper()
	ap, err := netip.ParseAddrPort(rep.Seen)
	if err != nil {
		t.Fatalf("reply %+v: %v", rep, err)
	}
	return ap.Addr(), ap.Port()
}

func masqueraded(port uint16) bool { return port >= MasqueradePortMin && port <= MasqueradePortMax }

func TestServiceClientAddressOnOVS(t *testing.T) {
	l := newSvcLab(t)
	ports := []int{8080}
	var eps []Endpoint
	for i := range 4 {
		eps = append(eps, ep(l.addPod(t, fmt.Sprintf("e%d", i+1), byte(11+i), 5, ports, ports), 8080, true))
	}
	// 256 clients on the host whose addresses agree in every bit but the third byte: the low bits of
	// the address (the previous scheme) would send all of them to one endpoint.
	var clients []netip.Addr
	for k := range 256 {
		clients = append(clients, netip.AddrFrom4([4]byte{100, 64, byte(k), 8}))
	}
	// 256 more, new when the endpoints change.
	var later []netip.Addr
	for k := range 256 {
		later = append(later, netip.AddrFrom4([4]byte{100, 65, byte(k), 8}))
	}
	hostEP := netip.MustParseAddr("198.51.100.7")
	addAddresses(t, l.host, append(append(clients, later...), hostEP))
	hostServes := make(chan error, 1)
	go func() {
		_ = l.host.Do(func() error { return serveStarted(t.Context(), "host", []int{9000}, nil, hostServes) })
	}()
	if err := <-hostServes; err != nil {
		t.Fatal(err)
	}
	svc := func(name, vip string, eps []Endpoint, mod func(*ServiceState)) ServiceState {
		s := ServiceState{Namespace: "t", Name: name, ClusterIP: netip.MustParseAddr(vip), Ports: []ServicePort{
			{Name: "http", Protocol: IPProtoTCP, Port: 80, Endpoints: eps},
			{Name: "dns", Protocol: IPProtoUDP, Port: 53, Endpoints: eps},
		}}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	l.state.Services = []ServiceState{
		svc("sticky", "172.30.0.20", eps, func(s *ServiceState) { s.AffinityTimeout = 600; s.Ports[0].NodePort = 30090 }),
		svc("keep", "172.30.0.21", eps[:1], func(s *ServiceState) { s.ExternalLocal = true; s.Ports[0].NodePort = 30091 }),
		svc("hostep", "172.30.0.22", []Endpoint{{IP: hostEP, Port: 9000, Ready: true}}, nil),
		svc("empty", "172.30.0.23", nil, nil),
	}
	l.apply(t)

	// Each client's endpoint over TCP and UDP, its first connection each.
	first := map[string]map[netip.Addr]string{}
	t.Run("affinity spreads clients by a hash of their whole address", func(t *testing.T) {
		for _, network := range []string{"tcp", "udp"} {
			port := map[string]string{"tcp": "80", "udp": "53"}[network]
			first[network] = map[netip.Addr]string{}
			counts := map[string]int{}
			for _, c := range clients {
				rep, err := probeSrc(l.host, network, c, "172.30.0.20:"+port, 2*time.Second)
				if err != nil {
					t.Fatalf("%s from %s: %v", network, c, err)
				}
				first[network][c] = rep.Name
				counts[rep.Name]++
			}
			line, err := stats.Spread(counts, len(eps), 1e-4)
			t.Logf("%s, 256 clients x.x.k.8: %s", network, line)
			if err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("each client sticks from its first connection, connections racing", func(t *testing.T) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, c := range clients[:32] {
			for _, network := range []string{"tcp", "udp"} {
				for range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rep, err := probeSrc(l.host, network, c, "172.30.0.20:"+map[string]string{"tcp": "80", "udp": "53"}[network], 5*time.Second)
						mu.Lock()
						defer mu.Unlock()
						if err != nil || rep.Name != first[network][c] {
							t.Errorf("%s from %s: %q, %v; its first connection went to %s", network, c, rep.Name, err, first[network][c])
						}
					}()
				}
			}
		}
		wg.Wait()
	})
	t.Run("learned flows are keyed on the client's own address", func(t *testing.T) {
		out, err := l.b.Inst.Ofctl("dump-flows", "br0", fmt.Sprintf("table=%d", TableServiceAffinity))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out, "nw_src=100.64."); n != 2*len(clients) {
			t.Errorf("want %d learned flows keyed on the clients' addresses, got %d:\n%.2000s", 2*len(clients), n, out)
		}
	})
	t.Run("NodePort chooses by the client's address and masquerades after", func(t *testing.T) {
		np := ServiceNodePortIP.String()
		for _, c := range clients[:16] {
			rep, err := probeSrc(l.host, "tcp", c, np+":30090", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			// The same load balancer as the ClusterIP, and the same learned choice.
			if rep.Name != first["tcp"][c] {
				t.Errorf("NodePort from %s reached %s, its ClusterIP choice was %s", c, rep.Name, first["tcp"][c])
			}
			if a, p := seenPort(t, rep); a != labGW || !masqueraded(p) {
				t.Errorf("externalTrafficPolicy Cluster from %s: the endpoint saw %s, want the gateway at a masquerade port", c, rep.Seen)
			}
			// externalTrafficPolicy Local keeps the client's address.
			rep, err = probeSrc(l.host, "tcp", c, np+":30091", 2*time.Second)
			if a, _ := seenPort(t, rep); err != nil || a != c {
				t.Errorf("externalTrafficPolicy Local from %s: the endpoint saw %s, %v", c, rep.Seen, err)
			}
		}
	})
	t.Run("host clients: masqueraded when outside the cluster networks", func(t *testing.T) {
		rep, err := probeSrc(l.host, "udp", clients[0], "172.30.0.20:53", 2*time.Second)
		if a, p := seenPort(t, rep); err != nil || a != labGW || !masqueraded(p) {
			t.Errorf("from %s: the endpoint saw %s, %v", clients[0], rep.Seen, err)
		}
		rep, err = probe(l.host, "tcp", "172.30.0.21:80", 2*time.Second)
		if a, p := seenPort(t, rep); err != nil || a != labGW || masqueraded(p) {
			t.Errorf("from the gateway address: the endpoint saw %s (kept as it is), %v", rep.Seen, err)
		}
	})
	t.Run("host endpoint behind a service: masquerade, then hairpin", func(t *testing.T) {
		for _, src := range []netip.Addr{clients[3], labGW} {
			rep, err := probeSrc(l.host, "tcp", src, "172.30.0.22:80", 2*time.Second)
			if a, _ := seenPort(t, rep); err != nil || rep.Name != "host" || a != ServiceHairpinIP {
				t.Errorf("from %s: %+v, %v", src, rep, err)
			}
		}
	})
	t.Run("reject from a host client outside the cluster networks", func(t *testing.T) {
		for _, network := range []string{"tcp", "udp"} {
			_, err := probeSrc(l.host, network, clients[4], "172.30.0.23:"+map[string]string{"tcp": "80", "udp": "53"}[network], 2*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: want connection refused, got %v", network, err)
			}
		}
	})
	t.Run("an endpoint added: clients stay, the change is a few flow-mods", func(t *testing.T) {
		e5 := ep(l.addPod(t, "e5", 15, 5, ports, ports), 8080, true)
		for i := range l.state.Services[0].Ports {
			p := &l.state.Services[0].Ports[i]
			p.Endpoints = append(append([]Endpoint(nil), p.Endpoints...), e5)
		}
		st := l.apply(t)
		t.Logf("e5 joins sticky (TCP and UDP ports; e5's own pod flows too): %s", st)
		for _, c := range clients[:64] {
			for _, network := range []string{"tcp", "udp"} {
				rep, err := probeSrc(l.host, network, c, "172.30.0.20:"+map[string]string{"tcp": "80", "udp": "53"}[network], 2*time.Second)
				if err != nil || rep.Name != first[network][c] {
					t.Errorf("%s from %s after e5 joined: %q, %v; before %s", network, c, rep.Name, err, first[network][c])
				}
			}
		}
		// New clients spread over all five.
		counts := map[string]int{}
		for _, c := range later {
			rep, err := probeSrc(l.host, "udp", c, "172.30.0.20:53", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			counts[rep.Name]++
		}
		line, err := stats.Spread(counts, 5, 1e-4)
		t.Logf("udp, 256 new clients after e5 joined: %s", line)
		if err != nil {
			t.Error(err)
		}
	})
}

// TestServiceHairpinInNetworkPolicyModeOnOVS: in networkpolicy mode an allowed packet is committed to
// conntrack on its way to delivery, which hides the ct_state the hairpin check used to read: a pod
// reaching itself through its service, and the host reaching a host endpoint from outside the cluster
// networks (masquerade, then hairpin), must still be SNATed and answered.
func TestServiceHairpinInNetworkPolicyModeOnOVS(t *testing.T) {
	l := newSvcLab(t)
	l.state.Mode = ModeNetworkPolicy
	e1 := l.addPod(t, "e1", 11, 0, []int{8080}, []int{8080})
	hostEP, client := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("100.64.0.8")
	addAddresses(t, l.host, []netip.Addr{hostEP, client})
	hostServes := make(chan error, 1)
	go func() {
		_ = l.host.Do(func() error { return serveStarted(t.Context(), "host", []int{9000}, nil, hostServes) })
	}()
	if err := <-hostServes; err != nil {
		t.Fatal(err)
	}
	l.state.Services = []ServiceState{
		{Namespace: "t", Name: "self", ClusterIP: netip.MustParseAddr("172.30.0.13"), Ports: []ServicePort{
			{Name: "http", Protocol: IPProtoTCP, Port: 80, Endpoints: []Endpoint{ep(e1, 8080, true)}},
			{Name: "dns", Protocol: IPProtoUDP, Port: 53, Endpoints: []Endpoint{ep(e1, 8080, true)}}}},
		{Namespace: "t", Name: "hostep", ClusterIP: netip.MustParseAddr("172.30.0.22"), Ports: []ServicePort{
			{Name: "http", Protocol: IPProtoTCP, Port: 80, Endpoints: []Endpoint{{IP: hostEP, Port: 9000, Ready: true}}}}},
	}
	l.apply(t)
	for _, network := range []string{"tcp", "udp"} {
		rep, err := probe(e1.Pod, network, "172.30.0.13:"+map[string]string{"tcp": "80", "udp": "53"}[network], 2*time.Second)
		if err != nil || rep.Name != "e1" || !strings.HasPrefix(rep.Seen, ServiceHairpinIP.String()+":") {
			t.Errorf("%s: e1 through its own service: %+v %v", network, rep, err)
		}
	}
	rep, err := probeSrc(l.host, "tcp", client, "172.30.0.22:80", 2*time.Second)
	if err != nil || rep.Name != "host" || !strings.HasPrefix(rep.Seen, ServiceHairpinIP.String()+":") {
		t.Errorf("host endpoint from %s: %+v %v", client, rep, err)
	}
}
