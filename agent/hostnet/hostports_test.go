package hostnet

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/nodenet"
	"github.com/ofsdn/ofsdn/flows/openflow"
	corev1 "k8s.io/api/core/v1"
)

// TestResolveHostPorts: the oldest pod holds a port, a later one asking for it on an overlapping host
// IP is a conflict, another protocol or host IP is not, and a pod not attached yet waits.
func TestResolveHostPorts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := map[string]netip.Addr{
		"a/old": netip.MustParseAddr("10.128.0.5"),
		"a/new": netip.MustParseAddr("10.128.0.6"),
		"a/ip":  netip.MustParseAddr("10.128.0.7"),
	}
	podIP := func(key string) (netip.Addr, bool) {
		ip, ok := pods[key]
		return ip, ok
	}
	tcp := func(host int32, container int32, hostIP string) corev1.ContainerPort {
		return corev1.ContainerPort{Protocol: corev1.ProtocolTCP, HostPort: host, ContainerPort: container, HostIP: hostIP}
	}
	hp := map[string]HostPortPod{
		"a/new":     {Created: t0.Add(time.Minute), Ports: []corev1.ContainerPort{tcp(8080, 80, ""), {Protocol: corev1.ProtocolUDP, HostPort: 8080, ContainerPort: 53}}},
		"a/old":     {Created: t0, Ports: []corev1.ContainerPort{tcp(8080, 80, "")}},
		"a/ip":      {Created: t0.Add(2 * time.Minute), Ports: []corev1.ContainerPort{tcp(9090, 90, "192.0.2.11"), tcp(8080, 80, "192.0.2.11")}},
		"a/waiting": {Created: t0, Ports: []corev1.ContainerPort{tcp(7070, 70, "")}}, // no IP yet
	}
	got, conflicts := ResolveHostPorts(podIP, hp)
	want := []nodenet.HostPort{
		{Protocol: openflow.IPProtoTCP, HostPort: 8080, PodIP: pods["a/old"], PodPort: 80, Pod: "a/old"},
		{Protocol: openflow.IPProtoUDP, HostPort: 8080, PodIP: pods["a/new"], PodPort: 53, Pod: "a/new"},
		{Protocol: openflow.IPProtoTCP, HostIP: netip.MustParseAddr("192.0.2.11"), HostPort: 9090, PodIP: pods["a/ip"], PodPort: 90, Pod: "a/ip"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("host ports:\n got %+v\nwant %+v", got, want)
	}
	wantConflicts := []HostPortConflict{
		{Pod: "a/new", Holder: "a/old", Port: tcp(8080, 80, "")},
		{Pod: "a/ip", Holder: "a/old", Port: tcp(8080, 80, "192.0.2.11")},
	}
	if !reflect.DeepEqual(conflicts, wantConflicts) {
		t.Errorf("conflicts:\n got %+v\nwant %+v", conflicts, wantConflicts)
	}
}
