package nodesim

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestAgnhostPorts: the ports the upstream suites' agnhost commands serve, as agnhost's flags say.
func TestAgnhostPorts(t *testing.T) {
	tests := []struct {
		name           string
		c              corev1.Container
		tcp, udp, sctp []string
	}{
		{"serve-hostname tcp", corev1.Container{Command: []string{"/bin/bash", "-c", "/agnhost serve-hostname --tcp --http=false --port 8080"}},
			[]string{"8080"}, nil, nil},
		{"serve-hostname udp", corev1.Container{Command: []string{"/bin/bash", "-c", "/agnhost serve-hostname --udp --http=false --port=53"}},
			nil, []string{"53"}, nil},
		{"porter", corev1.Container{Command: []string{"/bin/bash", "-c", "/agnhost porter"},
			Env: []corev1.EnvVar{{Name: "SERVE_SCTP_PORT_9003", Value: "foo"}, {Name: "SERVE_PORT_81", Value: "bar"}}},
			[]string{"81"}, nil, []string{"9003"}},
		{"no agnhost", corev1.Container{Command: []string{"sleep", "--port", "80"}}, nil, nil, nil},
	}
	for _, tt := range tests {
		tcp, udp, sctp := agnhostPorts(tt.c)
		if !slices.Equal(tcp, tt.tcp) || !slices.Equal(udp, tt.udp) || !slices.Equal(sctp, tt.sctp) {
			t.Errorf("%s: tcp %v udp %v sctp %v, want %v %v %v", tt.name, tcp, udp, sctp, tt.tcp, tt.udp, tt.sctp)
		}
	}
}
