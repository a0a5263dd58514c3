// Package services turns Services and EndpointSlices, as the agent's informers keep them (never
// mutated), into the pipeline.ServiceState a node renders: every Service with an IPv4 ClusterIP, with
// the endpoints its EndpointSlices list for each port, the traffic policies, sessionAffinity and
// NodePorts. Watch files the informers' objects in the agent's view, which converts them at each
// snapshot; a Cache converts again only the services whose objects or VNID changed. It also serves
// what kube-proxy serves beside the datapath: LoadBalancer services' health check node ports
// (healthcheck.go).
package services

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// defaultAffinityTimeout is Kubernetes' default sessionAffinity ClientIP timeout (3 hours).
const defaultAffinityTimeout = 10800

// converted is one service's last conversion and the objects it came from. Informer objects are
// replaced, never changed, on update: the same pointers mean the same content.
type converted struct {
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
	vnid   uint32
	st     pipeline.ServiceState
	ok     bool
}

// Cache converts only the services whose Service, EndpointSlices or VNID changed since the
// last snapshot (with 1,000 services, one endpoint change converts one).
type Cache map[string]converted

// States assembles the services the node renders: every Service with an IPv4 ClusterIP, with
// the endpoints its EndpointSlices list for each port. Sorted by namespace/name. cache may be nil.
func States(services map[string]*corev1.Service, endpointSlices map[string]*discoveryv1.EndpointSlice, nodeName string,
	vnids map[string]uint32, cache Cache) []pipeline.ServiceState {
	byService := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range endpointSlices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" || es.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		k := es.Namespace + "/" + name
		byService[k] = append(byService[k], es)
	}
	out := make([]pipeline.ServiceState, 0, len(services))
	for key, svc := range services {
		esl := byService[key]
		slices.SortFunc(esl, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		c, hit := cache[key]
		if !hit || c.svc != svc || c.vnid != vnids[svc.Namespace] || !slices.Equal(c.slices, esl) {
			c = converted{svc: svc, slices: esl, vnid: vnids[svc.Namespace]}
			c.st, c.ok = serviceState(svc, esl, nodeName, vnids)
			if cache != nil {
				cache[key] = c
			}
		}
		if c.ok {
			out = append(out, c.st)
		}
	}
	for key := range cache {
		if _, still := services[key]; !still {
			delete(cache, key)
		}
	}
	slices.SortFunc(out, func(a, b pipeline.ServiceState) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// LabelServiceProxyName names the service proxy that is to serve a Service: kube-proxy, and ofsdn as it
// replaces kube-proxy, leave a Service that carries it alone (found by the upstream Services tests), as
// they do one labelled corev1.IsHeadlessService.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// serviceState converts one Service and its slices; ok is false for what br0 does not serve
// (headless and ExternalName services, IPv6-only ClusterIPs, services for another proxy).
func serviceState(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, nodeName string, vnids map[string]uint32) (pipeline.ServiceState, bool) {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return pipeline.ServiceState{}, false
	}
	if _, other := svc.Labels[LabelServiceProxyName]; other {
		return pipeline.ServiceState{}, false
	}
	if _, headless := svc.Labels[corev1.IsHeadlessService]; headless {
		return pipeline.ServiceState{}, false
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !ip.Is4() {
		return pipeline.ServiceState{}, false
	}
	st := pipeline.ServiceState{Namespace: svc.Namespace, Name: svc.Name, ClusterIP: ip}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		st.AffinityTimeout = defaultAffinityTimeout
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			st.AffinityTimeout = uint32(*c.ClientIP.TimeoutSeconds)
		}
	}
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	st.ExternalLocal = nodePorts && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	st.InternalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	vnid := vnids[svc.Namespace]
	for _, sp := range svc.Spec.Ports {
		proto, ok := k8sobj.ProtocolNumber(sp.Protocol)
		if !ok || sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		p := pipeline.ServicePort{Name: sp.Name, Protocol: proto, Port: uint16(sp.Port)}
		if nodePorts && sp.NodePort > 0 && sp.NodePort <= 65535 {
			p.NodePort = uint16(sp.NodePort)
		}
		for _, es := range endpointSlices {
			port, ok := slicePort(es, sp)
			if !ok {
				continue
			}
			for _, e := range es.Endpoints {
				if len(e.Addresses) == 0 {
					continue
				}
				addr, err := netip.ParseAddr(e.Addresses[0])
				if err != nil || !addr.Is4() {
					continue
				}
				ready := e.Conditions.Ready == nil || *e.Conditions.Ready
				ep := pipeline.Endpoint{IP: addr, Port: port, Ready: ready, VNID: vnid,
					Serving:     e.Conditions.Serving == nil && ready || e.Conditions.Serving != nil && *e.Conditions.Serving,
					Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating}
				if e.NodeName != nil {
					ep.NodeName = *e.NodeName
					ep.Local = ep.NodeName == nodeName
				}
				p.Endpoints = append(p.Endpoints, ep)
			}
		}
		slices.SortFunc(p.Endpoints, func(a, b pipeline.Endpoint) int {
			return cmp.Or(a.IP.Compare(b.IP), cmp.Compare(a.Port, b.Port))
		})
		st.Ports = append(st.Ports, p)
	}
	return st, true
}

// slicePort finds the slice's port for a service port: same name (both may be empty) and protocol (TCP
// where either leaves it unset, as the API defaults it).
func slicePort(es *discoveryv1.EndpointSlice, sp corev1.ServicePort) (uint16, bool) {
	if sp.Protocol == "" {
		sp.Protocol = corev1.ProtocolTCP
	}
	for _, p := range es.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name == sp.Name && proto == sp.Protocol && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 {
			return uint16(*p.Port), true
		}
	}
	return 0, false
}
