// Package v1 holds ofsdn's cluster network API, group network.ofsdn.io, version v1:
// ClusterNetwork (the one object named "default" that describes the overlay), HostSubnet (one per Node:
// the pod subnet carved out of the cluster CIDRs, and the egress IPs it may hold), NetNamespace (one per
// Namespace: its VNID and egress IPs) and EgressNetworkPolicy (a namespace's egress firewall; egress.go).
// The controller writes HostSubnets and NetNamespaces; agents and flowctl read them.
//
// +k8s:deepcopy-gen=package
// +groupName=network.ofsdn.io
package v1
