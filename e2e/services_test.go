//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/e2e/cluster"
	"github.com/ofsdn/ofsdn/internal/proc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Services without kube-proxy: every check goes through br0's load balancers, the nf_tables forwarding
// of NodePorts and hostPorts, and the conntrack flushes of the agents on the 3-node lab.

const svcNS, svcNSB = "e2e-svc", "e2e-svc-b"

// spreadFrom makes n connections from a namespace with ofsdn-testpod and counts the answering
// endpoints ("ns/pod:port"); failures count under "error: …".
func spreadFrom(ctx context.Context, netns, proto, addr string, n, parallel int) (map[string]int, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, filepath.Join(lc.BinDir, "ofsdn-testpod"), "spread", proto, addr,
		"--count", fmt.Sprint(n), "--parallel", fmt.Sprint(parallel), "--timeout", "2s").Output()
	if err != nil {
		return nil, fmt.Errorf("spread %s %s from %s: %w", proto, addr, netns, err)
	}
	counts := map[string]int{}
	return counts, json.Unmarshal(out, &counts)
}

func errorsIn(counts map[string]int) int {
	n := 0
	for k, v := range counts {
		if strings.HasPrefix(k, "error") {
			n += v
		}
	}
	return n
}

// svcPod is a lab pod carrying the label a service selects.
func svcPod(t *testing.T, ctx context.Context, ns, name, node, selects string, mut func(*corev1.Pod)) *cluster.Pod {
	t.Helper()
	spec := cluster.PodSpec(ns, name, node)
	spec.Labels["svc"] = selects
	if mut != nil {
		mut(spec)
	}
	p, err := lc.RunPod(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), ns, name) })
	return p
}

// hostPortRefusedByKubelet creates a second pod asking for a hostPort the node's first pod holds and
// waits until kubelet fails it at admission.
func hostPortRefusedByKubelet(t *testing.T, ctx context.Context, ns, node string, withHostPort func(*corev1.Pod)) {
	t.Helper()
	spec := cluster.PodSpec(ns, "hp-2", node)
	withHostPort(spec)
	if _, err := lc.Client.CoreV1().Pods(ns).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.DeletePod(context.Background(), ns, "hp-2") })
	var last *corev1.Pod
	proc.Eventually(t, time.Minute, "kubelet fails the pod whose hostPort is taken", func() bool {
		p, err := lc.Client.CoreV1().Pods(ns).Get(ctx, "hp-2", metav1.GetOptions{})
		last = p
		return err == nil && p.Status.Phase == corev1.PodFailed
	})
	if last != nil && !strings.Contains(strings.ToLower(last.Status.Reason+last.Status.Message), "port") {
		t.Errorf("kubelet failed hp-2 for %q (%s), not for its hostPort", last.Status.Reason, last.Status.Message)
	}
}

func createService(t *testing.T, ctx context.Context, ns, name string, spec corev1.ServiceSpec) *corev1.Service {
	t.Helper()
	svc, err := lc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Client.CoreV1().Services(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return svc
}

func tcpPort(name string, port, target int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target)}
}

func clusterIP(svc *corev1.Service, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), uint16(port)).String()
}

// waitEndpoints waits until every node's br0 serves the service with want distinct endpoints, seen
// through connections from netns; it returns how long that took.
func waitEndpoints(t *testing.T, ctx context.Context, netns, proto, addr string, want int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last map[string]int
	for time.Since(start) < timeout {
		counts, err := spreadFrom(ctx, netns, proto, addr, 12*want, 4)
		if err == nil {
			last = counts
			if len(counts) == want && errorsIn(counts) == 0 {
				return time.Since(start)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s %s never had %d endpoints within %s: last %v", proto, addr, want, timeout, last)
	return 0
}

func TestServices(t *testing.T) {
	ctx := ctxT(t, 25*time.Minute)
	for _, ns := range []string{svcNS, svcNSB} {
		if err := lc.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	var web, clients []*cluster.Pod
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range lc.Nodes {
		wg.Add(2)
		go func() {
			defer wg.Done()
			p := svcPod(t, ctx, svcNS, "web-"+n.Name, n.Name, "web", nil)
			mu.Lock()
			web = append(web, p)
			mu.Unlock()
		}()
		go func() {
			defer wg.Done()
			p := svcPod(t, ctx, svcNS, "cl-"+n.Name, n.Name, "client", nil)
			mu.Lock()
			clients = append(clients, p)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	webPorts := []corev1.ServicePort{tcpPort("tcp", 80, cluster.TestPort),
		{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(cluster.TestPort)}}
	websvc := createService(t, ctx, svcNS, "web", corev1.ServiceSpec{Selector: map[string]string{"svc": "web"}, Ports: webPorts})
	// Every client's node must serve all three before the spread is counted: a node whose agent is a
	// little behind would skew it (one CI run: 224/219/157 of 600, waiting on one node only).
	for _, c := range clients {
		took := waitEndpoints(t, ctx, c.NetNS, "tcp", clusterIP(websvc, 80), 3, time.Minute)
		t.Logf("service web: 3 endpoints served from %s %s after creation", c.Key(), took.Round(time.Millisecond))
	}

	forEachEncapsulation(t, ctx, func(t *testing.T) { services(t, ctx, websvc, webPorts, clients) })
}

// services checks what a client sees of services, NodePorts and hostPorts (TestServices runs it in
// each encapsulation).
func services(t *testing.T, ctx context.Context, websvc *corev1.Service, webPorts []corev1.ServicePort, clients []*cluster.Pod) {
	cl := clients[0]
	t.Run("ClusterIP from every node", func(t *testing.T) {
		for _, c := range clients {
			for _, proto := range []string{"tcp", "udp"} {
				port := map[string]int{"tcp": 80, "udp": 53}[proto]
				r, err := c.Probe(ctx, proto, netip.MustParseAddrPort(clusterIP(websvc, port)), 0)
				if err != nil {
					t.Errorf("%s %s → web: %v", proto, c.Key(), err)
					continue
				}
				// The endpoint sees the client pod's own address: nothing is NATed inside the cluster.
				if f := strings.Fields(r); len(f) < 2 || !strings.HasPrefix(f[0], svcNS+"/web-") || !strings.HasPrefix(f[1], c.IP.String()+":") {
					t.Errorf("%s %s → web: reply %q", proto, c.Key(), r)
				}
			}
		}
		for _, n := range lc.Nodes {
			if _, err := lc.ProbeFrom(ctx, n.NetNS, "tcp", netip.MustParseAddrPort(clusterIP(websvc, 80))); err != nil {
				t.Errorf("node %s → web: %v", n.Name, err)
			}
		}
	})

	t.Run("1200 connections spread evenly", func(t *testing.T) {
		const perClient = 400
		total := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				counts, err := spreadFrom(ctx, c.NetNS, "tcp", clusterIP(websvc, 80), perClient, 4)
				if err != nil {
					t.Error(err)
					return
				}
				t.Logf("from %s: %v", c.Key(), counts)
				mu.Lock()
				defer mu.Unlock()
				for k, v := range counts {
					total[k] += v
				}
			}()
		}
		wg.Wait()
		n := perClient * len(clients)
		t.Logf("%d connections to web: %v", n, total)
		if len(total) != 3 {
			t.Fatalf("want 3 endpoints and no errors: %v", total)
		}
		// The model: each connection picks one of 3 endpoints with equal probability, so an endpoint's
		// count is Binomial(n, 1/3). Allow 5 standard deviations (a false alarm about once in 10^5
		// runs even with OVS's 22/21/21-of-64 split): ±82 of 400 for n = 1200.
		mean := float64(n) / 3
		allow := 5 * math.Sqrt(mean*2/3)
		for k, v := range total {
			if math.Abs(float64(v)-mean) > allow {
				t.Errorf("endpoint %s took %d of %d, outside %.0f±%.0f (5σ of a fair three-way split)", k, v, n, mean, allow)
			}
		}
	})

	t.Run("scale up and down", func(t *testing.T) {
		extra := svcPod(t, ctx, svcNS, "web-extra", lc.Nodes[1].Name, "web", nil)
		up := waitEndpoints(t, ctx, cl.NetNS, "tcp", clusterIP(websvc, 80), 4, time.Minute)
		start := time.Now()
		if err := lc.DeletePod(ctx, extra.Namespace, extra.Name); err != nil {
			t.Fatal(err)
		}
		down := waitEndpoints(t, ctx, cl.NetNS, "tcp", clusterIP(websvc, 80), 3, time.Minute) + time.Since(start)
		t.Logf("a 4th endpoint took traffic %s after its pod was created and running; its deletion took effect within %s",
			up.Round(time.Millisecond), down.Round(time.Millisecond))
	})

	t.Run("NodePort and externalTrafficPolicy", func(t *testing.T) {
		np := createService(t, ctx, svcNS, "web-np", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"svc": "web"},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: 30080}}})
		local := createService(t, ctx, svcNS, "web-local", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"svc": "web"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(cluster.TestPort), NodePort: 30081}}})
		ext := lc.Lab.External
		for _, n := range lc.Nodes {
			addr := netip.AddrPortFrom(n.IP, 30080).String()
			waitEndpoints(t, ctx, ext.NetNS, "tcp", addr, 3, time.Minute)
			// From the node itself, to its own address.
			if _, err := lc.ProbeFrom(ctx, n.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30080)); err != nil {
				t.Errorf("node %s → its own NodePort: %v", n.Name, err)
			}
			counts, err := spreadFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30081).String(), 20, 4)
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%s/web-%s:%d", svcNS, n.Name, cluster.TestPort)
			if len(counts) != 1 || counts[want] != 20 {
				t.Errorf("externalTrafficPolicy Local on %s must use only %s: %v", n.Name, want, counts)
			}
			r, err := lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(n.IP, 30081))
			if f := strings.Fields(r); err != nil || len(f) < 2 || !strings.HasPrefix(f[1], ext.IP.String()+":") {
				t.Errorf("externalTrafficPolicy Local on %s keeps the client address %s: reply %q, %v", n.Name, ext.IP, r, err)
			}
		}
		_, _ = np, local
	})

	t.Run("hostPort", func(t *testing.T) {
		node := lc.Nodes[1]
		withHostPort := func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports[0].HostPort = 18080
		}
		hp := svcPod(t, ctx, svcNS, "hp-1", node.Name, "hp", withHostPort)
		ext := lc.Lab.External
		var r string
		var err error
		for i := 0; i < 50; i++ {
			if r, err = lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(node.IP, 18080)); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || !strings.HasPrefix(r, hp.Key()+" ") {
			t.Fatalf("external → %s:18080 (hostPort of %s): %q %v", node.IP, hp.Key(), r, err)
		}
		// The pod sees the client's own address: nothing masquerades a hostPort.
		if f := strings.Fields(r); len(f) < 2 || !strings.HasPrefix(f[1], ext.IP.String()+":") {
			t.Errorf("external → hostPort: the pod saw %q, want the client's address %s", r, ext.IP)
		}
		// Hairpin: the node's own pods reach its address at the hostPort — another pod, and the pod
		// that holds the port. Their source becomes the node's gateway (the host DNATed them back into
		// br0), so the reply returns through the host's un-DNAT.
		for _, from := range []*cluster.Pod{clientOn(clients, node.Name), hp} {
			r, err := from.Probe(ctx, "tcp", netip.AddrPortFrom(node.IP, 18080), 0)
			if err != nil || !strings.HasPrefix(r, hp.Key()+" ") {
				t.Errorf("%s (on %s) → its node's %s:18080: %q %v", from.Key(), node.Name, node.IP, r, err)
			}
		}
		// A second pod asking for the same hostPort is told so; the first keeps it. A real kubelet refuses
		// that pod itself (its admission fails the pod: the node's hostPort is taken), before the network
		// plugin sees it; the stand-in admits it and ofsdn tells the conflict.
		if kubelets {
			hostPortRefusedByKubelet(t, ctx, svcNS, node.Name, withHostPort)
			if r, err := lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(node.IP, 18080)); err != nil || !strings.HasPrefix(r, hp.Key()+" ") {
				t.Errorf("after kubelet refused a second pod, the hostPort must still lead to %s: %q %v", hp.Key(), r, err)
			}
			return
		}
		second := svcPod(t, ctx, svcNS, "hp-2", node.Name, "hp", withHostPort)
		deadline := time.Now().Add(30 * time.Second)
		found := false
		for !found && time.Now().Before(deadline) {
			evs, err := lc.Client.CoreV1().Events(svcNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + second.Name})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs.Items {
				found = found || e.Reason == "HostPortConflict" && e.Type == corev1.EventTypeWarning
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !found {
			t.Errorf("no HostPortConflict Event on %s", second.Key())
		}
		if r, err := lc.ProbeFrom(ctx, ext.NetNS, "tcp", netip.AddrPortFrom(node.IP, 18080)); err != nil || !strings.HasPrefix(r, hp.Key()+" ") {
			t.Errorf("after the conflict the hostPort must still lead to %s: %q %v", hp.Key(), r, err)
		}
	})

	t.Run("session affinity", func(t *testing.T) {
		sticky := createService(t, ctx, svcNS, "sticky", corev1.ServiceSpec{Selector: map[string]string{"svc": "web"}, Ports: webPorts[:1],
			SessionAffinity:       corev1.ServiceAffinityClientIP,
			SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}})
		// Wait for the flows: any answer will do.
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if _, err := cl.Probe(ctx, "tcp", netip.MustParseAddrPort(clusterIP(sticky, 80)), 0); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		// Sticky from each client's first connection on (pipeline.affinityChoice), not only once br0 has
		// learned the client.
		for _, c := range clients {
			counts, err := spreadFrom(ctx, c.NetNS, "tcp", clusterIP(sticky, 80), 30, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(counts) != 1 || errorsIn(counts) > 0 {
				// What the client's node had learned, and the service's endpoint flows, for the record.
				out, _ := exec.CommandContext(ctx, filepath.Join(lc.BinDir, "flowctl"), "dump", "--rundir", nodeOf(c).Dir, "--bridge", "br0",
					"--table", "41").CombinedOutput()
				t.Errorf("ClientIP affinity: %s reached %v; table 41 of %s:\n%s", c.Key(), counts, nodeOf(c).Name, out)
			}
		}
	})

	t.Run("no endpoints rejects", func(t *testing.T) {
		empty := createService(t, ctx, svcNS, "empty", corev1.ServiceSpec{Selector: map[string]string{"svc": "nothing"}, Ports: webPorts[:1]})
		deadline := time.Now().Add(time.Minute)
		var err error
		for time.Now().Before(deadline) {
			if _, err = cl.Probe(ctx, "tcp", netip.MustParseAddrPort(clusterIP(empty, 80)), 0); err != nil && strings.Contains(err.Error(), "refused") {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Errorf("a service without endpoints must refuse at once; last: %v", err)
	})

	t.Run("UDP client after its endpoint is replaced", func(t *testing.T) {
		svcPod(t, ctx, svcNS, "u1", lc.Nodes[1].Name, "udp1", nil)
		udp1 := createService(t, ctx, svcNS, "udp1", corev1.ServiceSpec{Selector: map[string]string{"svc": "udp1"}, Ports: webPorts[1:]})
		waitEndpoints(t, ctx, cl.NetNS, "udp", clusterIP(udp1, 53), 1, time.Minute)
		// One socket, one source port, one conntrack entry, asking 5 times a second.
		waitLine := udpSession(t, ctx, cl.NetNS, clusterIP(udp1, 53), 80*time.Second)
		u1 := fmt.Sprintf("ok %s/u1:%d", svcNS, cluster.TestPort)
		if !waitLine(u1, 10*time.Second) {
			t.Fatal("the UDP session never reached u1")
		}
		svcPod(t, ctx, svcNS, "u2", lc.Nodes[2].Name, "udp1", nil)
		start := time.Now()
		if err := lc.DeletePod(ctx, svcNS, "u1"); err != nil {
			t.Fatal(err)
		}
		if !waitLine(fmt.Sprintf("ok %s/u2:%d", svcNS, cluster.TestPort), 60*time.Second) {
			t.Fatal("the UDP session never moved to u2: its conntrack entry still leads to the deleted u1")
		}
		t.Logf("the UDP session moved to the new endpoint %s after the old one's deletion began", time.Since(start).Round(time.Millisecond))
	})

	t.Run("tenant isolation through services", func(t *testing.T) {
		outsider := svcPod(t, ctx, svcNSB, "cl-b", lc.Nodes[2].Name, "client", nil)
		if r, err := outsider.Probe(ctx, "tcp", netip.MustParseAddrPort(clusterIP(websvc, 80)), 0); err == nil {
			t.Errorf("tenant %s reached tenant %s's endpoints through a service: %q", svcNSB, svcNS, r)
		}
		if _, err := lc.ChangeNetwork(ctx, svcNSB, "join:"+svcNS); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = lc.ChangeNetwork(context.Background(), svcNSB, "isolate") })
		waitEndpoints(t, ctx, outsider.NetNS, "tcp", clusterIP(websvc, 80), 3, time.Minute)
	})

	t.Run("default/kubernetes from pods", func(t *testing.T) {
		k, err := lc.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range clients {
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", c.NetNS, "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}",
				"--max-time", "5", "https://"+clusterIP(k, 443)+"/healthz").Output()
			if code := strings.TrimSpace(string(out)); err != nil || code == "000" {
				t.Errorf("%s → kubernetes service %s: code %q %v", c.Key(), k.Spec.ClusterIP, code, err)
			}
		}
	})
}

// TestService2000Endpoints: a selectorless service whose EndpointSlices list 4 pods × 500 ports. Its
// load balancer needs chained groups (one OpenFlow message holds at most 64 KiB); every endpoint answers.
func TestService2000Endpoints(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	const ns, ports, base = "e2e-svc-big", 500, 20000
	if err := lc.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	var pods []*cluster.Pod
	for i := 0; i < 4; i++ {
		p := svcPod(t, ctx, ns, fmt.Sprintf("big-%d", i), lc.Nodes[i%len(lc.Nodes)].Name, "big", func(p *corev1.Pod) {
			c := &p.Spec.Containers[0]
			c.Ports = c.Ports[:1] // TCP TestPort
			for j := 0; j < ports; j++ {
				c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: int32(base + j), Protocol: corev1.ProtocolTCP})
			}
		})
		pods = append(pods, p)
	}
	svc := createService(t, ctx, ns, "big", corev1.ServiceSpec{Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}}})
	cfg := lc.API.AdminConfig()
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// One slice per port (a slice's ports apply to all its endpoints), each listing the 4 pods.
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{p.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To(p.Node)})
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("big-%d", base+j),
					Labels: map[string]string{discoveryv1.LabelServiceName: "big", discoveryv1.LabelManagedBy: "ofsdn-e2e"}},
					AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
					Ports: []discoveryv1.EndpointPort{{Name: ptr.To(""), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(base + j))}}}
				if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for j := 0; j < ports; j++ {
		work <- j
	}
	close(work)
	wg.Wait()
	t.Cleanup(func() {
		_ = client.DiscoveryV1().EndpointSlices(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=big"})
	})
	if t.Failed() {
		t.FailNow()
	}
	// Repeated connections until every endpoint answered (≈ 2000·ln 2000 connections are expected).
	cl := pods[0]
	seen := map[string]int{}
	start := time.Now()
	conns := 0
	for len(seen) < 4*ports && time.Since(start) < 4*time.Minute {
		counts, err := spreadFrom(ctx, cl.NetNS, "tcp", clusterIP(svc, 80), 2000, 16)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range counts {
			conns += v
			if !strings.HasPrefix(k, "error") {
				seen[k] += v
			}
		}
	}
	t.Logf("2,000 endpoints: %d answered over %d connections in %s", len(seen), conns, time.Since(start).Round(time.Second))
	if len(seen) != 4*ports {
		t.Errorf("%d of %d endpoints answered", len(seen), 4*ports)
	}
}

// nodeOf is the lab node a pod runs on.
func nodeOf(p *cluster.Pod) *cluster.Node {
	for _, n := range lc.Nodes {
		if n.Name == p.Node {
			return n
		}
	}
	return lc.Nodes[0]
}

// clientOn returns the client pod on a node.
func clientOn(clients []*cluster.Pod, node string) *cluster.Pod {
	for _, c := range clients {
		if c.Node == node {
			return c
		}
	}
	return nil
}
