package pipeline

import (
	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// The pipeline's ports, described the way Tables describes its tables: br0's own ports have fixed
// numbers (requested through OVSDB's ofport_request) and names, and each has a role that says where a
// packet it carries comes from or goes to; every other port is a pod's. The classifier (table 0)
// dispatches by the ingress port's role, and flowctl trace follows a packet by the role of the port it
// leaves by: on to the peer node (tunnel, uplink), to the host (host), or to the pod (pod).

// Names of br0's own ports (their numbers: PortVXLAN, PortTun0, PortUplink).
const (
	PortNameVXLAN  = "vxlan0"
	PortNameTun0   = "tun0"
	PortNameUplink = "patch-uplink"
)

// PortRole is what a port of br0 connects it to.
type PortRole string

const (
	// RoleTunnel: other nodes, encapsulated (VXLAN; tun_id carries the source VNID).
	RoleTunnel PortRole = "tunnel"
	// RoleHost: the node's own network stack (its gateway address, NodePorts, host-network pods).
	RoleHost PortRole = "host"
	// RoleUplink: other nodes' br0 unencapsulated, through the uplink bridge (encapsulation none).
	RoleUplink PortRole = "uplink"
	// RolePod: one pod's veth; any port not in Ports.
	RolePod PortRole = "pod"
)

// PortRoles lists every role, in the order of Ports, pods last.
func PortRoles() []PortRole {
	out := make([]PortRole, 0, len(Ports)+1)
	for _, p := range Ports {
		out = append(out, p.Role)
	}
	return append(out, RolePod)
}

// BridgePort documents one of br0's own ports.
type BridgePort struct {
	Number uint32
	Name   string
	Role   PortRole
	// Ingress is the table the classifier sends what the port carries in to.
	Ingress TableID
	Purpose string
}

// Ports is the registry of br0's own ports. Numbers and names never change once shipped: OVSDB holds
// them and flows match them. A pod's port is any other (Ingress TablePodIngress).
var Ports = []BridgePort{
	{PortVXLAN, PortNameVXLAN, RoleTunnel, TableTunnelIngress, "VXLAN to and from every other node (tun_id = VNID)"},
	{PortTun0, PortNameTun0, RoleHost, TableHostIngress, "the host's internal port: gateway address, NodePorts, host-network pods"},
	{PortUplink, PortNameUplink, RoleUplink, TableUplinkIngress, "patch port into the uplink bridge: peers on the segment, unencapsulated (encapsulation none)"},
}

// LookupPort returns the registry entry of a port number; false for a pod's port.
func LookupPort(number uint32) (BridgePort, bool) {
	for _, p := range Ports {
		if p.Number == number {
			return p, true
		}
	}
	return BridgePort{}, false
}

// PortNamed returns the registry entry of a port name; false for a pod's port.
func PortNamed(name string) (BridgePort, bool) {
	for _, p := range Ports {
		if p.Name == name {
			return p, true
		}
	}
	return BridgePort{}, false
}

// PortOfRole returns the port that has a role (RolePod has none: pods' ports have no fixed number).
func PortOfRole(role PortRole) (BridgePort, bool) {
	for _, p := range Ports {
		if p.Role == role {
			return p, true
		}
	}
	return BridgePort{}, false
}
