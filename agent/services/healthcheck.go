package services

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
)

// Health check node ports: what kube-proxy serves for a LoadBalancer Service with
// externalTrafficPolicy Local, and what ofsdn, which replaces kube-proxy, must serve too (found by the
// upstream Services tests on real kubelets). A cloud load balancer asks each node's
// spec.healthCheckNodePort for /healthz and sends traffic only to nodes that answer 200, that is,
// nodes with a ready endpoint of the service: 200 or 503, with kube-proxy's body
// {"service":{"namespace":..,"name":..},"localEndpoints":N,"serviceProxyHealthy":true}.

// HealthCheck is one service's health check node port on this node.
type HealthCheck struct {
	Namespace, Name string
	Port            uint16
	LocalEndpoints  int // ready endpoints on this node (terminating ones do not count)
}

// HealthChecks lists the health checks of the services: LoadBalancers with externalTrafficPolicy
// Local and a health check node port, with their ready endpoints on nodeName. Sorted by port.
func HealthChecks(services map[string]*corev1.Service, endpointSlices map[string]*discoveryv1.EndpointSlice, nodeName string) []HealthCheck {
	local := map[string]int{}
	for _, es := range endpointSlices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		for _, e := range es.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			if ready && e.NodeName != nil && *e.NodeName == nodeName {
				local[es.Namespace+"/"+name]++
			}
		}
	}
	var out []HealthCheck
	for key, svc := range services {
		sp := svc.Spec
		if sp.Type != corev1.ServiceTypeLoadBalancer || sp.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
			sp.HealthCheckNodePort <= 0 || sp.HealthCheckNodePort > 65535 {
			continue
		}
		out = append(out, HealthCheck{Namespace: svc.Namespace, Name: svc.Name, Port: uint16(sp.HealthCheckNodePort), LocalEndpoints: local[key]})
	}
	slices.SortFunc(out, func(a, b HealthCheck) int { return cmp.Compare(a.Port, b.Port) })
	return out
}

// HealthCheckServers serves each health check node port on every address of the node.
type HealthCheckServers struct {
	log     klog.Logger
	mu      sync.Mutex
	servers map[uint16]*healthCheckServer
}

type healthCheckServer struct {
	srv   *http.Server
	mu    sync.Mutex
	check HealthCheck
}

func NewHealthCheckServers(log klog.Logger) *HealthCheckServers {
	return &HealthCheckServers{log: log.WithName("healthcheck"), servers: map[uint16]*healthCheckServer{}}
}

// Sync opens the ports of checks that are new, closes those gone, and updates the counts. A port it
// cannot open is reported and tried again at the next sync.
func (h *HealthCheckServers) Sync(checks []HealthCheck) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	want := map[uint16]HealthCheck{}
	for _, c := range checks {
		want[c.Port] = c
	}
	for port, s := range h.servers {
		if _, ok := want[port]; !ok {
			_ = s.srv.Close()
			delete(h.servers, port)
			h.log.V(2).Info("closed health check node port", "port", port)
		}
	}
	var errs []error
	for port, c := range want {
		if s, ok := h.servers[port]; ok {
			s.mu.Lock()
			s.check = c
			s.mu.Unlock()
			continue
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(int(port)))
		if err != nil {
			errs = append(errs, fmt.Errorf("health check node port %d of %s/%s: %w", port, c.Namespace, c.Name, err))
			continue
		}
		s := &healthCheckServer{check: c}
		s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
		h.servers[port] = s
		go func() {
			if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Error(err, "health check node port stopped", "port", port)
			}
		}()
		h.log.V(2).Info("serving health check node port", "port", port, "service", c.Namespace+"/"+c.Name)
	}
	return errors.Join(errs...)
}

// Close closes every port.
func (h *HealthCheckServers) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for port, s := range h.servers {
		_ = s.srv.Close()
		delete(h.servers, port)
	}
}

// ServeHTTP answers as kube-proxy does: 200 with local ready endpoints, 503 without.
func (s *healthCheckServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	c := s.check
	s.mu.Unlock()
	body, _ := json.Marshal(struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}{Service: struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	}{c.Namespace, c.Name}, LocalEndpoints: c.LocalEndpoints, ServiceProxyHealthy: true})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(c.LocalEndpoints))
	if c.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_, _ = w.Write(body)
}
