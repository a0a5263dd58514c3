// Package debugapi is the node agent's read-only debug API, what flowctl asks a node: the node's view
// (its pods with their OpenFlow ports and MACs from OVSDB, tenants, services, remote nodes, Networks and
// the pods' interfaces on them), the flows
// and groups the agent wants on br0 by owner, a drift report (what differs between those and br0),
// the bridge's flows and groups, ofproto/trace runs on the node's ovs-vswitchd, and the node's
// sampled drops as an NDJSON stream (drops.go).
//
// Nothing in it changes anything. The agent serves it over HTTP on a root-only unix socket on the node
// (<ovs-rundir>/<bridge>.ofsdn.sock) and, for flowctl elsewhere, over TLS on a TCP port of the node that
// flowctl reaches through the API server's node proxy (/api/v1/nodes/https:<node>:<port>/proxy/...),
// answering only tokens the API server vouches for and authorizes (agent/nodeauth; auth.go is the
// caller's side). Traces run one at a time per node and bodies are bounded, so the API cannot load
// ovs-vswitchd.
package debugapi

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/ofsdn/ofsdn/flows/trace"
)

// Prefix is where every endpoint lives.
const Prefix = "/debug/ofsdn/v1/"

// DefaultSocket is where the agent serves the debug API on the node, and where flowctl looks for it:
// beside the bridge's OpenFlow management socket and owner index in ovs-vswitchd's run directory, so
// flowctl --rundir finds all three. Here, not in agent/nodeapi, so flowctl need not import the agent.
func DefaultSocket(ovsRunDir, bridge string) string {
	return filepath.Join(ovsRunDir, bridge+".ofsdn.sock")
}

// Endpoints (GET unless said otherwise).
const (
	PathNode    = Prefix + "node"    // NodeInfo
	PathDesired = Prefix + "desired" // Desired
	PathDiff    = Prefix + "diff"    // Diff
	PathDump    = Prefix + "dump"    // Dump
	PathTrace   = Prefix + "trace"   // POST TraceRequest → TraceResponse
	// PathDrops (drops.go) streams Drop records as NDJSON.
)

// NodeInfo is a node as its agent sees it: what its flows are rendered from, plus its bridge's ports
// as OVSDB lists them.
type NodeInfo struct {
	Name            string         `json:"name"`
	Bridge          string         `json:"bridge"`
	NodeIP          netip.Addr     `json:"nodeIP"`
	Subnet          netip.Prefix   `json:"subnet"`
	Gateway         netip.Addr     `json:"gateway"`
	Mode            string         `json:"mode"`
	ClusterNetworks []netip.Prefix `json:"clusterNetworks"`
	ServiceNetwork  netip.Prefix   `json:"serviceNetwork,omitzero"`
	Round           uint16         `json:"round"`
	PipelineVersion uint32         `json:"pipelineVersion"`
	// Ports are the bridge's ports from OVSDB (tun0, vxlan0, the pods' veths).
	Ports []Port `json:"ports"`
	// Pods are the local pods the agent renders, with their tenant.
	Pods        []Pod             `json:"pods"`
	RemoteNodes []RemoteNode      `json:"remoteNodes"`
	VNIDs       map[string]uint32 `json:"vnids"` // namespace → VNID (NetNamespaces)
	Services    []Service         `json:"services"`
	// NodePortAddress is where the host forwards NodePorts into br0 (nf_tables DNAT).
	NodePortAddress netip.Addr `json:"nodePortAddress"`
	// Owners are the owner keys the agent has flows for: they name cookies (reconcile.OwnerIndex).
	Owners []string `json:"owners"`
	// Networks are the Networks (network.ofsdn.io) the node renders: those with a VNI.
	Networks []Network `json:"networks,omitempty"`
	// Attachments are the local pods' interfaces on Networks: those that carry traffic (their flows are
	// on br0) and those that carry none, with the reason (an attached pod whose namespace the Network
	// does not admit keeps its interface and address, and gets no flows).
	Attachments []Attachment `json:"attachments,omitempty"`
	// Egress is what the node renders of egress IPs and firewalls (nil: none in the cluster).
	Egress *Egress `json:"egress,omitempty"`
}

// Egress is a node's egress IPs and firewalls (flows/pipeline/egress.go).
type Egress struct {
	// Held are the egress IPs this node holds now.
	Held       []netip.Addr      `json:"held,omitempty"`
	Namespaces []EgressNamespace `json:"namespaces,omitempty"`
}

// EgressNamespace is one namespace's egress IPs and firewall.
type EgressNamespace struct {
	Name       string       `json:"name"`
	IPs        []netip.Addr `json:"ips,omitempty"`
	NoUsableIP bool         `json:"noUsableIP,omitempty"`
	// Policy names its EgressNetworkPolicy ("" none); DenyAll: it cannot be enforced as written.
	Policy  string       `json:"policy,omitempty"`
	DenyAll bool         `json:"denyAll,omitempty"`
	Rules   []EgressRule `json:"rules,omitempty"`
}

// EgressRule is one firewall rule: a CIDR, or a DNS name and what it resolved to.
type EgressRule struct {
	Allow     bool           `json:"allow"`
	DNSName   string         `json:"dnsName,omitempty"`
	Addresses []netip.Prefix `json:"addresses"`
}

// String names the rule as the API writes it.
func (r EgressRule) String() string {
	verb := "Deny"
	if r.Allow {
		verb = "Allow"
	}
	if r.DNSName != "" {
		return fmt.Sprintf("%s %s (resolved to %v)", verb, r.DNSName, r.Addresses)
	}
	if len(r.Addresses) == 1 {
		return verb + " " + r.Addresses[0].String()
	}
	return fmt.Sprintf("%s %v", verb, r.Addresses)
}

// Port is one port of the bridge.
type Port struct {
	Name   string `json:"name"`
	Type   string `json:"type,omitempty"`
	OFPort int    `json:"ofport"`
	MAC    string `json:"mac,omitempty"`
	// Pod is the pod interface it attaches: namespace/name for the pod's cluster-network interface,
	// namespace/name@net1 for its interface on a Network (then Network names that Network).
	Pod       string     `json:"pod,omitempty"`
	Interface string     `json:"interface,omitempty"` // the interface's name in the pod: eth0, net1, ...
	Network   string     `json:"network,omitempty"`
	IP        netip.Addr `json:"ip,omitzero"` // the interface's address
	Error     string     `json:"error,omitempty"`
}

// Pod is a local pod as the agent renders it.
type Pod struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	IP        netip.Addr `json:"ip"`
	MAC       string     `json:"mac"`
	OFPort    uint32     `json:"ofport"`
	VNID      uint32     `json:"vnid"`
	// IngressPolicies and EgressPolicies are the NetworkPolicies ("namespace/name") that isolate the
	// pod in each direction (networkpolicy mode): what its default deny is owed to.
	IngressPolicies []string `json:"ingressPolicies,omitempty"`
	EgressPolicies  []string `json:"egressPolicies,omitempty"`
}

// RemoteNode is another node this one tunnels to.
type RemoteNode struct {
	Name   string       `json:"name"`
	NodeIP netip.Addr   `json:"nodeIP"`
	Subnet netip.Prefix `json:"subnet"`
}

// Network is a Network as this node renders it.
type Network struct {
	Name string       `json:"name"`
	VNI  uint32       `json:"vni"`
	CIDR netip.Prefix `json:"cidr"`
	// Subnet is this node's subnet of the Network (none until the controller gave one) and Gateway
	// its first address, the pods' gateway towards cross-talk peers.
	Subnet  netip.Prefix    `json:"subnet,omitzero"`
	Gateway netip.Addr      `json:"gateway,omitzero"`
	Remotes []NetworkRemote `json:"remotes,omitempty"`
	// CrossTalk are the Networks it exchanges traffic with here: its status.crossTalk as the flows
	// apply it (pipeline.NetworkPeers).
	CrossTalk []string `json:"crossTalk,omitempty"`
}

// NetworkRemote is another node's subnet of a Network.
type NetworkRemote struct {
	Node   string       `json:"node"`
	NodeIP netip.Addr   `json:"nodeIP"`
	Subnet netip.Prefix `json:"subnet"`
}

// Attachment is a local pod's interface on a Network.
type Attachment struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	Interface string       `json:"interface"`
	Network   string       `json:"network"`
	IP        netip.Addr   `json:"ip"`
	Prefix    netip.Prefix `json:"prefix,omitzero"` // the address with the Network's prefix length, as the pod has it
	MAC       string       `json:"mac"`
	OFPort    uint32       `json:"ofport"`
	VNI       uint32       `json:"vni,omitempty"` // its Network's, when it carries traffic
	// Carrying says whether its flows are on br0; Reason says why not.
	Carrying bool   `json:"carrying"`
	Reason   string `json:"reason,omitempty"`
}

// Key is the attachment as flowctl names it: namespace/name@interface.
func (a Attachment) Key() string { return a.Namespace + "/" + a.Name + "@" + a.Interface }

// Service is a service the node load-balances.
type Service struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	ClusterIP netip.Addr    `json:"clusterIP"`
	Ports     []ServicePort `json:"ports"`
	Affinity  bool          `json:"affinity,omitempty"`
	// ExternalLocal: externalTrafficPolicy Local (NodePorts keep the client's address, local
	// endpoints only); otherwise the host masquerades NodePort traffic to the gateway address.
	ExternalLocal bool `json:"externalLocal,omitempty"`
	InternalLocal bool `json:"internalLocal,omitempty"`
}

// ServicePort is one port of a service and its endpoints.
type ServicePort struct {
	Name      string     `json:"name,omitempty"`
	Protocol  string     `json:"protocol"`
	Port      uint16     `json:"port"`
	NodePort  uint16     `json:"nodePort,omitempty"`
	Owner     string     `json:"owner"` // svc/ns/name:port, the owner of its flows
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one endpoint of a service port.
type Endpoint struct {
	IP    netip.Addr `json:"ip"`
	Port  uint16     `json:"port"`
	Ready bool       `json:"ready"`
	Node  string     `json:"node,omitempty"`
}

// Entry is one flow or group: as ovs-ofctl prints it, and its wire encoding (an ofp_flow_stats or
// ofp_group_desc entry) for a lossless copy.
type Entry struct {
	Text string `json:"text"`
	Raw  []byte `json:"raw"`
}

// Desired is every owner's desired flows and groups.
type Desired struct {
	Node   string         `json:"node"`
	Round  uint16         `json:"round"`
	Owners []OwnerDesired `json:"owners"`
}

// OwnerDesired is one owner's share of the desired state.
type OwnerDesired struct {
	Owner  string  `json:"owner"`
	Cookie string  `json:"cookie"`
	Flows  []Entry `json:"flows"`
	Groups []Entry `json:"groups,omitempty"`
}

// Diff is the difference between the desired state and the bridge: what a resync would repair.
type Diff struct {
	Node            string      `json:"node"`
	Bridge          string      `json:"bridge"`
	Round           uint16      `json:"round"`
	DesiredFlows    int         `json:"desiredFlows"`
	DesiredGroups   int         `json:"desiredGroups"`
	InstalledFlows  int         `json:"installedFlows"`
	InstalledGroups int         `json:"installedGroups"`
	Entries         []DiffEntry `json:"entries"`
}

// DiffEntry is one flow or group that differs.
type DiffEntry struct {
	Owner     string `json:"owner"`
	Kind      string `json:"kind"`  // flow or group
	State     string `json:"state"` // missing, unexpected or different
	Desired   string `json:"desired,omitempty"`
	Installed string `json:"installed,omitempty"`
	Why       string `json:"why,omitempty"`
}

// Dump is the bridge's flows and groups as the switch returns them, plus the owner index that names
// cookies.
type Dump struct {
	Node   string   `json:"node"`
	Bridge string   `json:"bridge"`
	Flows  [][]byte `json:"flows"`  // ofp_flow_stats entries
	Groups [][]byte `json:"groups"` // ofp_group_desc entries
	Owners []string `json:"owners"` // every owner key the agent knows (reconcile.OwnerIndex)
}

// TraceRequest asks the node's ovs-vswitchd to trace a packet through its bridge.
type TraceRequest struct {
	Packet trace.Packet `json:"packet"`
	// CtNext are the ct_state flags each successive conntrack recirculation resumes with (--ct-next).
	CtNext []trace.CtFlags `json:"ctNext,omitempty"`
}

// TraceResponse is ofproto/trace's answer.
type TraceResponse struct {
	Node   string   `json:"node"`
	Args   []string `json:"args"`   // the unixctl parameters sent
	Output string   `json:"output"` // ofproto/trace's text
}
