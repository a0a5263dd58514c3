package agent

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/hostnet"
	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/agent/services"
	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/internal/proc"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func testService(name string, mut func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.10",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}}}
	if mut != nil {
		mut(s)
	}
	return s
}

func testSlice(name, service string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
		Endpoints:   eps}
}

func ep(ip, node string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	if node != "" {
		e.NodeName = ptr.To(node)
	}
	return e
}

func TestServiceStates(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	addr := netip.MustParseAddr
	tests := []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     []pipeline.ServiceState
	}{{
		name:     "two slices merge, sorted, local marked, conditions read",
		services: []*corev1.Service{testService("web", nil)},
		slices: []*discoveryv1.EndpointSlice{
			testSlice("web-1", "web", 8080, ep("10.128.2.5", "n2", yes, yes, no)),
			testSlice("web-2", "web", 8080, ep("10.128.0.5", "n1", nil, nil, nil), ep("10.128.0.6", "n1", no, yes, yes)),
			testSlice("other", "db", 5432, ep("10.128.0.9", "n1", yes, yes, no)),
		},
		want: []pipeline.ServiceState{{Namespace: "a", Name: "web", ClusterIP: addr("172.30.0.10"), Ports: []pipeline.ServicePort{{
			Name: "http", Protocol: openflow.IPProtoTCP, Port: 80, Endpoints: []pipeline.Endpoint{
				{IP: addr("10.128.0.5"), Port: 8080, Ready: true, Serving: true, NodeName: "n1", Local: true, VNID: 11},
				{IP: addr("10.128.0.6"), Port: 8080, Serving: true, Terminating: true, NodeName: "n1", Local: true, VNID: 11},
				{IP: addr("10.128.2.5"), Port: 8080, Ready: true, Serving: true, NodeName: "n2", VNID: 11},
			}}}}},
	}, {
		name: "NodePort with policies and affinity",
		services: []*corev1.Service{testService("np", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		})},
		want: []pipeline.ServiceState{{Namespace: "a", Name: "np", ClusterIP: addr("172.30.0.10"), AffinityTimeout: 60, ExternalLocal: true,
			InternalLocal: true, Ports: []pipeline.ServicePort{{Name: "http", Protocol: openflow.IPProtoTCP, Port: 80, NodePort: 30080}}}},
	}, {
		name: "ClusterIP type ignores a stray nodePort; default affinity timeout; a port name mismatch gets no endpoints",
		services: []*corev1.Service{testService("c", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.Ports[0].Name = "other"
		})},
		slices: []*discoveryv1.EndpointSlice{testSlice("c-1", "c", 8080, ep("10.128.2.5", "n2", yes, yes, no))},
		want: []pipeline.ServiceState{{Namespace: "a", Name: "c", ClusterIP: addr("172.30.0.10"), AffinityTimeout: 10800,
			Ports: []pipeline.ServicePort{{Name: "other", Protocol: openflow.IPProtoTCP, Port: 80}}}},
	}, {
		name: "headless, ExternalName, IPv6 and malformed are skipped",
		services: []*corev1.Service{
			testService("headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
			testService("ext", func(s *corev1.Service) { s.Spec.Type, s.Spec.ClusterIP = corev1.ServiceTypeExternalName, "" }),
			testService("v6", func(s *corev1.Service) { s.Spec.ClusterIP = "fd00::10" }),
			testService("bad", func(s *corev1.Service) { s.Spec.ClusterIP = "not-an-ip" }),
		},
		want: []pipeline.ServiceState{},
	}, {
		name: "services labelled for another proxy or as headless are left alone, as kube-proxy does",
		services: []*corev1.Service{
			testService("other-proxy", func(s *corev1.Service) { s.Labels = map[string]string{services.LabelServiceProxyName: "foo-bar"} }),
			testService("marked-headless", func(s *corev1.Service) { s.Labels = map[string]string{corev1.IsHeadlessService: ""} }),
		},
		slices: []*discoveryv1.EndpointSlice{testSlice("o-1", "other-proxy", 8080, ep("10.128.2.5", "n2", yes, yes, no))},
		want:   []pipeline.ServiceState{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs := map[string]*corev1.Service{}
			for _, s := range tt.services {
				svcs[s.Namespace+"/"+s.Name] = s
			}
			sl := map[string]*discoveryv1.EndpointSlice{}
			for _, s := range tt.slices {
				sl[s.Namespace+"/"+s.Name] = s
			}
			got := services.States(svcs, sl, "n1", map[string]uint32{"a": 11}, nil)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d services %+v, want %d", len(got), got, len(tt.want))
			}
			for i := range got {
				if !reflect.DeepEqual(got[i], tt.want[i]) {
					t.Errorf("service %d:\n got %+v\nwant %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// The Services and EndpointSlices informers, end to end into the snapshot: the conversion follows the
// API's definitions (EndpointConditions: ready nil means ready, serving nil defers to ready, terminating
// nil means not terminating; ports match by name and protocol, TCP when unset; nodePorts only for
// NodePort and LoadBalancer services; sessionAffinity ClientIP defaults to 10800 s).
func TestServiceInformers(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	addr := netip.MustParseAddr
	tcp, udp := openflow.IPProtoTCP, openflow.IPProtoUDP
	slicePorts := func(es *discoveryv1.EndpointSlice, ports ...discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
		es.Ports = ports
		return es
	}
	port := func(name string, proto *corev1.Protocol, p int32) discoveryv1.EndpointPort {
		var n *string
		if name != "" {
			n = ptr.To(name)
		}
		return discoveryv1.EndpointPort{Name: n, Protocol: proto, Port: ptr.To(p)}
	}
	noAddr := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: yes}}
	objects := []runtime.Object{
		clusterNetwork("default", networkv1.PluginModeMultitenant, "10.128.0.0/14"), netNamespace("a", 11),
		// web: one port, endpoints in two slices with every combination of conditions.
		testService("web", nil),
		testSlice("web-1", "web", 8080,
			ep("10.128.0.5", testNode, nil, nil, nil),  // all unset: ready, serving, not terminating
			ep("10.128.0.6", testNode, no, yes, yes),   // terminating but still serving
			ep("10.128.0.7", "n2", no, nil, nil),       // not ready, serving unset: not serving either
			ep("10.128.0.8", "", yes, no, no), noAddr), // no node known; an endpoint without an address is skipped
		testSlice("web-2", "web", 8080, ep("10.128.2.9", "n2", yes, yes, no)),
		// Slices that are not web's: another service's, one without the service label, an IPv6 one.
		testSlice("db-1", "db", 5432, ep("10.128.0.10", testNode, yes, yes, no)),
		func() runtime.Object {
			es := testSlice("stray", "web", 8080, ep("10.128.0.11", testNode, yes, yes, no))
			es.Labels = nil
			return es
		}(),
		func() runtime.Object {
			es := testSlice("web-v6", "web", 8080, ep("fd00::5", testNode, yes, yes, no))
			es.AddressType = discoveryv1.AddressTypeIPv6
			return es
		}(),
		// multi: named ports of two protocols; an unset protocol is TCP on both sides.
		testService("multi", func(s *corev1.Service) {
			s.Spec.ClusterIP = "172.30.0.20"
			s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53}}
		}),
		slicePorts(testSlice("multi-1", "multi", 0, ep("10.128.0.12", testNode, yes, yes, no)),
			port("http", nil, 8080), port("dns", ptr.To(corev1.ProtocolUDP), 5353), port("dns-tcp", ptr.To(corev1.ProtocolUDP), 5354)),
		// np: NodePort with every policy and affinity with its default timeout.
		testService("np", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.Type = "172.30.0.30", corev1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}),
		// lb: a LoadBalancer's nodePorts are served too; an affinity timeout of its own.
		testService("lb", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.Type = "172.30.0.40", corev1.ServiceTypeLoadBalancer
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}),
		// Not served by br0: headless, ExternalName, IPv6-only.
		testService("headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }),
		testService("ext", func(s *corev1.Service) { s.Spec.Type, s.Spec.ClusterIP = corev1.ServiceTypeExternalName, "" }),
		testService("v6", func(s *corev1.Service) { s.Spec.ClusterIP = "fd00::10" }),
	}
	a, api := startAgent(t, objects...)

	web := pipeline.ServiceState{Namespace: "a", Name: "web", ClusterIP: addr("172.30.0.10"), Ports: []pipeline.ServicePort{{
		Name: "http", Protocol: tcp, Port: 80, Endpoints: []pipeline.Endpoint{
			{IP: addr("10.128.0.5"), Port: 8080, Ready: true, Serving: true, NodeName: testNode, Local: true, VNID: 11},
			{IP: addr("10.128.0.6"), Port: 8080, Serving: true, Terminating: true, NodeName: testNode, Local: true, VNID: 11},
			{IP: addr("10.128.0.7"), Port: 8080, NodeName: "n2", VNID: 11},
			{IP: addr("10.128.0.8"), Port: 8080, Ready: true, VNID: 11},
			{IP: addr("10.128.2.9"), Port: 8080, Ready: true, Serving: true, NodeName: "n2", VNID: 11},
		}}}}
	multiEP := func(port uint16) []pipeline.Endpoint {
		return []pipeline.Endpoint{{IP: addr("10.128.0.12"), Port: port, Ready: true, Serving: true, NodeName: testNode, Local: true, VNID: 11}}
	}
	multi := pipeline.ServiceState{Namespace: "a", Name: "multi", ClusterIP: addr("172.30.0.20"), Ports: []pipeline.ServicePort{
		{Name: "http", Protocol: tcp, Port: 80, Endpoints: multiEP(8080)},
		{Name: "dns", Protocol: udp, Port: 53, Endpoints: multiEP(5353)},
		{Name: "dns-tcp", Protocol: tcp, Port: 53}, // the slice's dns-tcp is UDP: no match
	}}
	np := pipeline.ServiceState{Namespace: "a", Name: "np", ClusterIP: addr("172.30.0.30"), AffinityTimeout: 10800, ExternalLocal: true, InternalLocal: true,
		Ports: []pipeline.ServicePort{{Name: "http", Protocol: tcp, Port: 80, NodePort: 30080}}}
	lb := pipeline.ServiceState{Namespace: "a", Name: "lb", ClusterIP: addr("172.30.0.40"), AffinityTimeout: 60,
		Ports: []pipeline.ServicePort{{Name: "http", Protocol: tcp, Port: 80, NodePort: 30080}}}
	check := func(what string, want ...pipeline.ServiceState) {
		t.Helper()
		waitSnapshot(t, a, what, func(st pipeline.NodeState, _ []string) bool { return reflect.DeepEqual(st.Services, want) })
	}
	// Sorted by namespace/name.
	st := a.view.snapshot().state
	if want := []pipeline.ServiceState{lb, multi, np, web}; !reflect.DeepEqual(st.Services, want) {
		for i := range max(len(st.Services), len(want)) {
			var g, w pipeline.ServiceState
			if i < len(st.Services) {
				g = st.Services[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("service %d:\n got %+v\nwant %+v", i, g, w)
			}
		}
	}

	// An endpoint stops being ready; then web-2 goes; then the namespace is isolated to a new VNID.
	esClient := api.kube.DiscoveryV1().EndpointSlices("a")
	upd := testSlice("web-2", "web", 8080, ep("10.128.2.9", "n2", no, no, yes))
	if _, err := esClient.Update(api.ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	web.Ports[0].Endpoints[4] = pipeline.Endpoint{IP: addr("10.128.2.9"), Port: 8080, Terminating: true, NodeName: "n2", VNID: 11}
	check("10.128.2.9 terminating", lb, multi, np, web)
	if err := esClient.Delete(api.ctx, "web-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	web.Ports[0].Endpoints = web.Ports[0].Endpoints[:4]
	check("web-2 gone", lb, multi, np, web)
	if _, err := api.net.NetworkV1().NetNamespaces().Update(api.ctx, netNamespace("a", 15), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*pipeline.ServiceState{&web, &multi} {
		for i := range s.Ports {
			for j := range s.Ports[i].Endpoints {
				s.Ports[i].Endpoints[j].VNID = 15
			}
		}
	}
	check("the endpoints' new VNID", lb, multi, np, web)
	// A Service that goes takes its flows along; one whose type changes loses its nodePorts.
	if err := api.kube.CoreV1().Services("a").Delete(api.ctx, "lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.kube.CoreV1().Services("a").Update(api.ctx, testService("np", func(s *corev1.Service) {
		s.Spec.ClusterIP = "172.30.0.30"
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal // meaningless without nodePorts
	}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	np = pipeline.ServiceState{Namespace: "a", Name: "np", ClusterIP: addr("172.30.0.30"), Ports: []pipeline.ServicePort{{Name: "http", Protocol: tcp, Port: 80}}}
	check("lb gone, np a ClusterIP service", multi, np, web)
}

// The hostPort watch follows this node's pods only (the pod informer holds the whole cluster), skips
// hostNetwork pods (their ports are the node's already) and finished ones, and hands a port to the next
// pod when its holder goes.
func TestHostPortWatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(name, node string, age int, mut func(*corev1.Pod), ports ...corev1.ContainerPort) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute))},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: append(ports, corev1.ContainerPort{ContainerPort: 9999})}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if mut != nil {
			mut(p)
		}
		return p
	}
	hp := func(host, container int32, hostIP string) corev1.ContainerPort {
		return corev1.ContainerPort{Protocol: corev1.ProtocolTCP, HostPort: host, ContainerPort: container, HostIP: hostIP}
	}
	a, api := startAgent(t,
		pod("old", testNode, 0, nil, hp(8080, 80, "")),
		pod("new", testNode, 1, nil, hp(8080, 81, "")),
		pod("pinned", testNode, 2, nil, hp(9091, 91, "192.0.2.1")),
		pod("elsewhere", "n2", 0, nil, hp(7070, 70, "")),
		pod("hostnet", testNode, 0, func(p *corev1.Pod) { p.Spec.HostNetwork = true }, hp(6060, 6060, "")),
		pod("done", testNode, 0, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, hp(5050, 50, "")),
	)
	for i, name := range []string{"old", "new", "pinned", "hostnet", "done"} {
		attachPod(a, "a", name, fmt.Sprintf("10.128.0.%d", 10+i), uint32(10+i))
	}
	a.view.mu.Lock()
	var keys []string
	for k := range a.view.hostPorts {
		keys = append(keys, k)
	}
	a.view.mu.Unlock()
	slices.Sort(keys)
	if want := []string{"a/new", "a/old", "a/pinned"}; !slices.Equal(keys, want) {
		t.Errorf("pods with hostPorts %v, want %v (this node's, running, not hostNetwork)", keys, want)
	}
	got, conflicts := a.view.resolvedHostPorts()
	want := []nodenet.HostPort{
		{Protocol: openflow.IPProtoTCP, HostPort: 8080, PodIP: netip.MustParseAddr("10.128.0.10"), PodPort: 80, Pod: "a/old"},
		{Protocol: openflow.IPProtoTCP, HostIP: netip.MustParseAddr("192.0.2.1"), HostPort: 9091, PodIP: netip.MustParseAddr("10.128.0.12"), PodPort: 91, Pod: "a/pinned"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("host ports:\n got %+v\nwant %+v", got, want)
	}
	if wantC := []hostnet.HostPortConflict{{Pod: "a/new", Holder: "a/old", Port: hp(8080, 81, "")}}; !reflect.DeepEqual(conflicts, wantC) {
		t.Errorf("conflicts %+v, want %+v", conflicts, wantC)
	}

	// The holder goes: the port passes to the next pod. Then that one finishes: nothing is published.
	if err := api.kube.CoreV1().Pods("a").Delete(api.ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait := func(what string, want []nodenet.HostPort) {
		t.Helper()
		var got []nodenet.HostPort
		if err := proc.Until(context.Background(), waitTimeout, func() bool { got, _ = a.view.resolvedHostPorts(); return reflect.DeepEqual(got, want) }); err != nil {
			t.Fatalf("waiting for %s: %v; host ports %+v", what, err, got)
		}
	}
	wait("the port passed to a/new", []nodenet.HostPort{
		{Protocol: openflow.IPProtoTCP, HostPort: 8080, PodIP: netip.MustParseAddr("10.128.0.11"), PodPort: 81, Pod: "a/new"}, want[1]})
	finished := pod("new", testNode, 1, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }, hp(8080, 81, ""))
	if _, err := api.kube.CoreV1().Pods("a").UpdateStatus(api.ctx, finished, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("a/new's port released when it failed", want[1:])
}
