package agent

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		want: []pipeline.ServiceState{{Namespace: "a", Name: "c", ClusterIP: addr("172.30.0.10"), AffinityTimeout: defaultAffinityTimeout,
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
			got := serviceStates(svcs, sl, "n1", map[string]uint32{"a": 11}, nil)
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
