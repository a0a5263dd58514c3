// Package hostnet is the agent's host-side jobs beyond nodenet's plumbing: encapsulation none's
// uplink port (uplink.go), ovs-vswitchd's tunnel neighbours checked against the kernel's on the
// userspace datapath (neighbors.go), the datapath flow cache purged after policy changes there
// (purge.go), and the local pods' hostPorts — filed by the pod informer's watcher, resolved oldest pod
// first into nodenet's forwards, conflicts told once as Events (hostports.go). Each knows the agent's
// view through a small interface of its own (UplinkView, HostPortView).
package hostnet
