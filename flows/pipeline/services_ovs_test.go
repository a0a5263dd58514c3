package pipeline

// Services on a real bridge: pods in network namespaces, real TCP and UDP through the flows Render
// produces, installed by the reconcile.Reconciler over an OpenFlow session. Port 2 (tun0) is a namespace standing
// in for the host, holding the gateway address, so rejects are answered by a real kernel.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/reconcile"

	"github.com/ofsdn/ofsdn/e2e/testpod"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/internal/ovstest"
)

// svcLab is one bridge with a host stand-in on tun0, pods, and the node state rendered onto it.
type svcLab struct {
	b     *ofbridge.Bridge
	r     *reconcile.Reconciler
	state NodeState
	host  *ovstest.Pod
	pods  map[string]pod
	// applied is the render r last installed.
	applied map[reconcile.Owner]reconcile.OwnerState
}

var (
	labSubnet = netip.MustParsePrefix("10.128.0.0/24")
	labGW     = netip.MustParseAddr("10.128.0.1")
)

func newSvcLab(t *testing.T) *svcLab {
	b := ofbridge.New(t)
	host := b.Inst.AddPod("br0", "host", netip.PrefixFrom(labGW, 24), net.HardwareAddr{0x0a, 0x58, 10, 128, 0, 1}, int(PortTun0))
	// The agent's host side: services and the hairpin/NodePort addresses are routed into br0 via tun0.
	for _, args := range [][]string{
		{"ip", "route", "add", ServiceHairpinIP.String() + "/32", "dev", "eth0"},
		{"ip", "route", "add", ServiceNodePortIP.String() + "/32", "dev", "eth0"},
		{"ip", "route", "add", "172.30.0.0/16", "via", ServiceHairpinIP.String(), "dev", "eth0", "onlink"},
	} {
		if _, err := host.Exec(args[0], args[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	l := &svcLab{b: b, host: host, pods: map[string]pod{}, r: newReconciler(b.Switch, 1),
		state: NodeState{
			Mode: ModeMultitenant, NodeName: "n1", NodeIP: netip.MustParseAddr("192.0.2.11"), LocalSubnet: labSubnet,
			ClusterNetworks:   []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14")},
			NodePortAddresses: []netip.Addr{ServiceNodePortIP},
		}}
	return l
}

// addPod adds a pod with a default route via the gateway, serving TCP and UDP on the given ports in
// this process (replies "name clientaddr").
func (l *svcLab) addPod(t *testing.T, name string, host byte, vnid uint32, tcp, udp []int) pod {
	t.Helper()
	p := addPod(l.b, name, host, vnid)
	if _, err := p.Exec("ip", "route", "add", "default", "via", labGW.String()); err != nil {
		t.Fatal(err)
	}
	l.pods[name] = p
	l.state.Pods = append(l.state.Pods, PodState{Namespace: "t", Name: name, IP: p.IP.Addr(), MAC: p.MAC, OFPort: uint32(p.OFPort), VNID: vnid})
	if len(tcp)+len(udp) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		started := make(chan error, 1)
		go func() {
			_ = p.Do(func() error {
				return serveStarted(ctx, name, tcp, udp, started)
			})
		}()
		if err := <-started; err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// serveStarted is testpod.Serve that reports once its sockets are open.
func serveStarted(ctx context.Context, name string, tcp, udp []int, started chan<- error) error {
	var lns []net.Listener
	var pcs []net.PacketConn
	for _, port := range tcp {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			started <- err
			return err
		}
		lns = append(lns, ln)
	}
	for _, port := range udp {
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		if err != nil {
			started <- err
			return err
		}
		pcs = append(pcs, pc)
	}
	started <- nil
	for _, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
					_, _ = bufio.NewReader(c).ReadString('\n')
				}()
			}
		}()
	}
	for _, pc := range pcs {
		go func() {
			buf := make([]byte, 2048)
			for {
				_, addr, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, addr)), addr)
			}
		}()
	}
	<-ctx.Done()
	for _, ln := range lns {
		ln.Close()
	}
	for _, pc := range pcs {
		pc.Close()
	}
	return nil
}

// apply renders the state and syncs it through the reconcile.Reconciler, as the agent does.
func (l *svcLab) apply(t *testing.T) reconcile.SyncStats {
	t.Helper()
	owners, err := Render(l.state)
	if err != nil {
		t.Fatal(err)
	}
	res, err := install(context.Background(), l.r, l.applied, owners)
	if err != nil {
		t.Fatal(err)
	}
	l.applied = owners
	l.settle(t)
	return res.Stats
}

// settle waits for ovs-vswitchd to carry flow-table changes into its datapath flow cache (the bundle
// is in the tables when SyncAll returns; cached datapath flows follow on the next revalidation).
func (l *svcLab) settle(t *testing.T) {
	t.Helper()
	if _, err := l.b.Inst.Output("ovs-appctl", "revalidator/wait"); err != nil {
		t.Fatal(err)
	}
}

func ep(p pod, port uint16, local bool) Endpoint {
	return Endpoint{IP: p.IP.Addr(), Port: port, Ready: true, Serving: true, NodeName: "n1", Local: local, VNID: p.vnid}
}

// probe opens one connection from a namespace and returns the reply line's name and seen address.
func probe(from *ovstest.Pod, network, addr string, timeout time.Duration) (testpod.Reply, error) {
	var rep testpod.Reply
	err := from.Do(func() error {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if network == "udp" {
			if _, err := c.Write([]byte("probe\n")); err != nil {
				return err
			}
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		name, seen, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
		rep = testpod.Reply{Name: name, Seen: seen}
		return nil
	})
	return rep, err
}

// spread makes n connections and counts replies per endpoint name.
func spread(t *testing.T, from *ovstest.Pod, network, addr string, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		rep, err := probe(from, network, addr, 2*time.Second)
		if err != nil {
			t.Fatalf("%s %s, connection %d: %v", network, addr, i, err)
		}
		counts[rep.Name]++
	}
	return counts
}

func TestServicesOnOVS(t *testing.T) {
	l := newSvcLab(t)
	ports := []int{8080}
	cl := l.addPod(t, "cl", 10, 5, nil, nil)
	e1 := l.addPod(t, "e1", 11, 5, ports, ports)
	e2 := l.addPod(t, "e2", 12, 5, ports, ports)
	e3 := l.addPod(t, "e3", 13, 5, ports, ports)
	other := l.addPod(t, "other", 20, 6, ports, ports)
	glob := l.addPod(t, "glob", 21, GlobalVNID, nil, nil)
	three := []Endpoint{ep(e1, 8080, true), ep(e2, 8080, true), ep(e3, 8080, true)}
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
		svc("web", "172.30.0.10", three, func(s *ServiceState) { s.Ports[0].NodePort = 30080 }),
		svc("sticky", "172.30.0.11", three, func(s *ServiceState) { s.AffinityTimeout = 60 }),
		svc("empty", "172.30.0.12", nil, nil),
		svc("self", "172.30.0.13", []Endpoint{ep(e1, 8080, true)}, nil),
		svc("tenantb", "172.30.0.14", []Endpoint{ep(other, 8080, true)}, nil),
		svc("local", "172.30.0.15", []Endpoint{ep(e1, 8080, true), ep(e2, 8080, false)}, func(s *ServiceState) {
			s.ExternalLocal, s.InternalLocal = true, true
			s.Ports[0].NodePort = 30081
		}),
	}
	// In service "local", e2 counts as on another node: the same pods, so the policy alone decides.
	st := l.apply(t)
	t.Logf("installed: %s", st)
	// What ovs-ofctl shows is what we print: the service flows' String() is ovs-ofctl's syntax.
	var want []string
	for _, f := range l.r.DesiredFlows() {
		want = append(want, f.String())
	}
	sort.Strings(want)
	if d := ofbridge.DiffLines(want, ofbridge.WithoutCookies(l.b.OfctlFlows(t))); len(d) != 0 {
		t.Errorf("ovs-ofctl and our printer disagree:\n%s", strings.Join(d, "\n"))
	}
	if _, err := probe(cl.Pod, "tcp", e1.IP.Addr().String()+":8080", 2*time.Second); err != nil {
		t.Fatalf("pod to pod before any service: %v", err)
	}

	t.Run("ClusterIP TCP spread", func(t *testing.T) {
		counts := spread(t, cl.Pod, "tcp", "172.30.0.10:80", 600)
		t.Logf("600 TCP connections to 172.30.0.10:80: %v", counts)
		for _, e := range []string{"e1", "e2", "e3"} {
			if counts[e] == 0 {
				t.Errorf("endpoint %s never chosen: %v", e, counts)
			}
		}
		rep, err := probe(cl.Pod, "tcp", "172.30.0.10:80", 2*time.Second)
		if err != nil || !strings.HasPrefix(rep.Seen, cl.IP.Addr().String()+":") {
			t.Errorf("the endpoint must see the client's own address: %+v %v", rep, err)
		}
	})
	t.Run("ClusterIP UDP", func(t *testing.T) {
		// A connected UDP socket accepts only replies from 172.30.0.10:53: an answer proves the un-DNAT.
		counts := spread(t, cl.Pod, "udp", "172.30.0.10:53", 60)
		t.Logf("60 UDP flows to 172.30.0.10:53: %v", counts)
		if len(counts) < 2 {
			t.Errorf("UDP flows all went to one endpoint: %v", counts)
			out, _ := l.b.Inst.Output("ovs-appctl", "dpctl/dump-conntrack")
			t.Log(out)
			out, _ = l.b.Inst.Output("ovs-appctl", "dpctl/dump-flows")
			t.Log(out)
		}
	})
	t.Run("affinity", func(t *testing.T) {
		// Sticky from the first connection on: the ones right after it, before OVS has revalidated the
		// datapath flows cached without the learned flow, find it again after the select group.
		counts := spread(t, cl.Pod, "tcp", "172.30.0.11:80", 40)
		if len(counts) != 1 {
			t.Errorf("ClientIP affinity: one client reached %v", counts)
		}
		// Another client is free to land elsewhere, and sticks too.
		counts = spread(t, glob.Pod, "tcp", "172.30.0.11:80", 20)
		if len(counts) != 1 {
			t.Errorf("ClientIP affinity, second client: %v", counts)
		}
		out, err := l.b.Inst.Ofctl("dump-flows", "br0", fmt.Sprintf("table=%d", TableServiceAffinity))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(out, "idle_timeout=60"); n != 2 {
			t.Errorf("want 2 learned affinity flows, got %d:\n%s", n, out)
		}
		// The reconciler leaves the switch's learned flows alone.
		if res, err := l.r.Resync(context.Background()); err != nil || res.Stats.FlowDeletes != 0 {
			t.Errorf("resync touched learned flows: %s %v", res.Stats, err)
		}
	})
	t.Run("no endpoints rejects", func(t *testing.T) {
		for _, network := range []string{"tcp", "udp"} {
			start := time.Now()
			_, err := probe(cl.Pod, network, "172.30.0.12:"+map[string]string{"tcp": "80", "udp": "53"}[network], 3*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s to a service without endpoints: want connection refused, got %v", network, err)
			}
			t.Logf("%s refused after %v", network, time.Since(start))
		}
	})
	t.Run("hairpin", func(t *testing.T) {
		rep, err := probe(e1.Pod, "tcp", "172.30.0.13:80", 2*time.Second)
		if err != nil || rep.Name != "e1" || !strings.HasPrefix(rep.Seen, ServiceHairpinIP.String()+":") {
			t.Errorf("e1 through its own service: %+v %v", rep, err)
		}
		rep, err = probe(e1.Pod, "udp", "172.30.0.13:53", 2*time.Second)
		if err != nil || rep.Name != "e1" {
			t.Errorf("e1 through its own service over UDP: %+v %v", rep, err)
		}
	})
	t.Run("isolation", func(t *testing.T) {
		if _, err := probe(cl.Pod, "tcp", "172.30.0.14:80", time.Second); err == nil {
			t.Error("tenant 5 reached tenant 6's endpoints through a service")
		}
		if _, err := probe(other.Pod, "tcp", "172.30.0.10:80", time.Second); err == nil {
			t.Error("tenant 6 reached tenant 5's endpoints through a service")
		}
		if rep, err := probe(glob.Pod, "tcp", "172.30.0.14:80", 2*time.Second); err != nil || rep.Name != "other" {
			t.Errorf("the global VNID must reach every tenant's service: %+v %v", rep, err)
		}
		// Join: the endpoint's tenant becomes 5; now the service works.
		for i := range l.state.Pods {
			if l.state.Pods[i].Name == "other" {
				l.state.Pods[i].VNID = 5
			}
		}
		l.apply(t)
		if rep, err := probe(cl.Pod, "tcp", "172.30.0.14:80", 2*time.Second); err != nil || rep.Name != "other" {
			t.Errorf("after join: %+v %v", rep, err)
			out, err := l.b.Inst.Output("ovs-appctl", "dpctl/dump-conntrack")
			t.Log(out, err)
			out, err = l.b.Inst.Output("ovs-appctl", "dpctl/dump-flows")
			t.Log(out, err)
			out, err = other.Exec("ss", "-tan")
			t.Log(out, err)
			out, err = other.Exec("ip", "neigh")
			t.Log(out, err)
			out, err = other.Exec("nstat", "-a")
			t.Log(out, err)
			out, err = l.b.Inst.Output("ovs-appctl", "ofproto/trace", "br0", "in_port=30,tcp,dl_src=0a:58:0a:80:00:14,dl_dst=0a:58:0a:80:00:0a,nw_src=10.128.0.20,nw_dst=10.128.0.10,tp_src=8080,tp_dst=42000,tcp_flags=+syn+ack")
			t.Log(out, err)
		}
	})
	t.Run("host", func(t *testing.T) {
		counts := spread(t, l.host, "tcp", "172.30.0.10:80", 30)
		t.Logf("host to ClusterIP: %v", counts)
		if _, err := probe(l.host, "tcp", "172.30.0.12:80", 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("host to a service without endpoints: %v", err)
		}
	})
	t.Run("NodePort", func(t *testing.T) {
		np := ServiceNodePortIP.String()
		counts := spread(t, l.host, "tcp", np+":30080", 30)
		t.Logf("NodePort 30080: %v", counts)
		if len(counts) < 2 {
			t.Errorf("NodePort with externalTrafficPolicy Cluster used one endpoint: %v", counts)
		}
		counts = spread(t, l.host, "tcp", np+":30081", 20)
		if len(counts) != 1 || counts["e1"] != 20 {
			t.Errorf("externalTrafficPolicy Local must use only the local endpoint: %v", counts)
		}
		rep, err := probe(l.host, "tcp", np+":30081", 2*time.Second)
		if err != nil || !strings.HasPrefix(rep.Seen, labGW.String()+":") {
			t.Errorf("externalTrafficPolicy Local keeps the client address: %+v %v", rep, err)
		}
		counts = spread(t, cl.Pod, "tcp", "172.30.0.15:80", 20)
		if len(counts) != 1 || counts["e1"] != 20 {
			t.Errorf("internalTrafficPolicy Local must use only the local endpoint: %v", counts)
		}
	})
	t.Run("UDP endpoint removed", func(t *testing.T) {
		// One UDP "connection" (a connected socket, a fixed source port) to web's dns port. Its
		// endpoint leaves the service: conntrack still DNATs to it until the agent flushes the entry.
		var c net.Conn
		if err := cl.Pod.Do(func() (err error) { c, err = net.Dial("udp", "172.30.0.10:53"); return err }); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ask := func() string {
			t.Helper()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("probe\n")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 256)
			n, err := c.Read(buf)
			if err != nil {
				return "no answer: " + err.Error()
			}
			name, _, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
			return name
		}
		first := ask()
		before := l.state
		before.Services = slices.Clone(l.state.Services)
		web := &l.state.Services[0]
		web.Ports = slices.Clone(web.Ports)
		web.Ports[1].Endpoints = slices.DeleteFunc(slices.Clone(web.Ports[1].Endpoints), func(e Endpoint) bool {
			return e.IP == l.pods[first].IP.Addr()
		})
		l.apply(t)
		if again := ask(); again != first {
			t.Fatalf("without a flush the entry should still lead to %s, got %s", first, again)
		}
		stale := StaleConntrack(before, l.state)
		var msgs [][]byte
		for _, f := range stale {
			msgs = append(msgs, EncodeConntrackFlush(ZoneService, f))
		}
		if len(stale) == 0 {
			t.Fatal("StaleConntrack found nothing to flush")
		}
		if err := l.b.Sess.Send(context.Background(), msgs); err != nil {
			t.Fatalf("flush %v: %v", stale, err)
		}
		if after := ask(); after == first || strings.HasPrefix(after, "no answer") {
			t.Errorf("after flushing %v the client still reached %q (first %s)", stale, after, first)
		}
		l.state = before
		l.apply(t)
	})
	t.Run("terminating", func(t *testing.T) {
		// e2 and e3 terminate: new connections go to e1 only. Then all three terminate but still
		// serve: they take connections again, as nothing ready is left.
		web := &l.state.Services[0]
		eps := web.Ports[0].Endpoints
		for i := 1; i < 3; i++ {
			eps[i].Ready, eps[i].Terminating = false, true
		}
		st := l.apply(t)
		t.Logf("two endpoints terminating: %s", st)
		if counts := spread(t, cl.Pod, "tcp", "172.30.0.10:80", 30); len(counts) != 1 || counts["e1"] != 30 {
			t.Errorf("terminating endpoints took new connections: %v", counts)
		}
		eps[0].Ready, eps[0].Terminating = false, true
		l.apply(t)
		if counts := spread(t, cl.Pod, "tcp", "172.30.0.10:80", 60); len(counts) < 2 {
			t.Errorf("serving terminating endpoints must be used when none is ready: %v", counts)
		}
	})
}

// TestServiceManyEndpointsOnOVS: 2,000 endpoints (four pods with 500 TCP ports each) install as
// chained groups and every one of them answers.
func TestServiceManyEndpointsOnOVS(t *testing.T) {
	l := newSvcLab(t)
	cl := l.addPod(t, "cl", 10, 5, nil, nil)
	// One client reaches a bucket only through the source ports it has (Linux connects from even ports,
	// and each group sees a quarter of them): give it the whole port range, so no hash slot is starved.
	if _, err := cl.Exec("sysctl", "-w", "net.ipv4.ip_local_port_range=1024 65535"); err != nil {
		t.Fatal(err)
	}
	const perPod, base = 500, 20000
	var eps []Endpoint
	var udp []int
	for i := 0; i < perPod; i++ {
		udp = append(udp, base+i)
	}
	for k := 0; k < 4; k++ {
		p := l.addPod(t, fmt.Sprintf("e%d", k), byte(11+k), 5, nil, nil)
		// Each socket answers with its own port, so the reply names the endpoint.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		started := make(chan error, 1)
		go func() { _ = p.Do(func() error { return servePorts(ctx, p.IP.Addr().String(), udp, started) }) }()
		if err := <-started; err != nil {
			t.Fatal(err)
		}
		for _, port := range udp {
			eps = append(eps, ep(p, uint16(port), true))
		}
	}
	l.state.Services = []ServiceState{{Namespace: "t", Name: "big", ClusterIP: netip.MustParseAddr("172.30.1.1"),
		Ports: []ServicePort{{Name: "t", Protocol: IPProtoTCP, Port: 9000, Endpoints: eps}}}}
	st := l.apply(t)
	t.Logf("2,000 endpoints installed: %s", st)
	if st.GroupAdds < 4 {
		t.Fatalf("2,000 endpoints need chained groups, got %d groups", st.GroupAdds)
	}
	// Many connections, 32 at a time, until every endpoint has answered.
	seen := map[string]bool{}
	var mu sync.Mutex
	start, sent := time.Now(), 0
	for len(seen) < len(eps) && sent < 80000 {
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					rep, err := probe(cl.Pod, "tcp", "172.30.1.1:9000", 2*time.Second)
					if err != nil {
						continue
					}
					mu.Lock()
					seen[rep.Name] = true
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		sent += 32 * 50
	}
	t.Logf("%d of %d endpoints answered after %d connections in %v", len(seen), len(eps), sent, time.Since(start).Round(time.Millisecond))
	if len(seen) != len(eps) {
		var missing []string
		for _, e := range eps {
			if k := fmt.Sprintf("%s:%d", e.IP, e.Port); !seen[k] {
				missing = append(missing, k)
			}
		}
		sort.Strings(missing)
		t.Fatalf("%d endpoints never answered, e.g. %v", len(missing), missing[:min(10, len(missing))])
	}
}

// servePorts answers TCP on every port with "ip:port" of the listener that accepted.
func servePorts(ctx context.Context, ip string, ports []int, started chan<- error) error {
	var lns []net.Listener
	for _, port := range ports {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			started <- err
			return err
		}
		lns = append(lns, ln)
	}
	started <- nil
	for i, ln := range lns {
		name := fmt.Sprintf("%s:%d", ip, ports[i])
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
				c.Close()
			}
		}()
	}
	<-ctx.Done()
	for _, ln := range lns {
		ln.Close()
	}
	return nil
}
