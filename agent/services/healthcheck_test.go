package services

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

func TestHealthChecksOf(t *testing.T) {
	svc := func(name string, typ corev1.ServiceType, etp corev1.ServiceExternalTrafficPolicy, hc int32) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: corev1.ServiceSpec{Type: typ, ExternalTrafficPolicy: etp, HealthCheckNodePort: hc}}
	}
	ep := func(node string, ready, terminating bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.128.0.9"}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Terminating: ptr.To(terminating)}}
	}
	slice := func(service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: service + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: service}}, AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps}
	}
	services := map[string]*corev1.Service{
		"ns/local":   svc("local", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, 30100),
		"ns/drain":   svc("drain", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, 30101),
		"ns/cluster": svc("cluster", corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyCluster, 0),
		"ns/np":      svc("np", corev1.ServiceTypeNodePort, corev1.ServiceExternalTrafficPolicyLocal, 0),
	}
	slices := map[string]*discoveryv1.EndpointSlice{
		"ns/local-x": slice("local", ep("n1", true, false), ep("n1", true, false), ep("n2", true, false)),
		// Only a terminating endpoint here: not ready, so the node fails the check.
		"ns/drain-x":   slice("drain", ep("n1", false, true)),
		"ns/cluster-x": slice("cluster", ep("n1", true, false)),
	}
	got := HealthChecks(services, slices, "n1")
	want := []HealthCheck{{"ns", "local", 30100, 2}, {"ns", "drain", 30101, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("HealthChecks = %v, want %v", got, want)
	}
}

// The server answers as kube-proxy's does, follows the count, and lets the port go when the service
// goes.
func TestHealthCheckServers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	h := NewHealthCheckServers(klog.Background())
	t.Cleanup(h.Close)
	get := func() (int, map[string]any, error) {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var body map[string]any
		err = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body, err
	}
	for _, tc := range []struct {
		local int
		code  int
	}{{0, http.StatusServiceUnavailable}, {3, http.StatusOK}} {
		if err := h.Sync([]HealthCheck{{"ns", "web", port, tc.local}}); err != nil {
			t.Fatal(err)
		}
		code, body, err := get()
		if err != nil || code != tc.code || body["localEndpoints"] != float64(tc.local) ||
			body["service"].(map[string]any)["name"] != "web" || body["serviceProxyHealthy"] != true {
			t.Errorf("%d local endpoints: %d %v %v, want %d", tc.local, code, body, err, tc.code)
		}
	}
	if err := h.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(); err == nil {
		t.Error("the port still answers after its service went")
	}
}
