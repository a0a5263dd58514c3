package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Networks: pod networks besides the cluster network. A pod always has its cluster-network interface
// (eth0); it gets one on a Network when its namespace is admitted by the Network's namespaceSelector and
// it asks for it the ecosystem's way (a NetworkAttachmentDefinition in its namespace whose CNI config
// names the Network, and the pod's k8s.v1.cni.cncf.io/networks annotation). Each Network is a segment of
// its own across the nodes: its own VNI on the wire, addresses that may overlap other Networks' and the
// cluster network's, its own conntrack zone in br0. Two Networks whose addresses do not overlap may
// exchange traffic when either lists the other in crossTalk.

const (
	// MinNetworkVNI..MaxNetworkVNI is the VNI range of Networks: above every tenant's VNID (MaxVNID), so a
	// Network's traffic can never be taken for a tenant's. 4,096 Networks.
	MinNetworkVNI uint32 = 0xfff000
	MaxNetworkVNI uint32 = 0xffffff

	// NetworkInUseFinalizer keeps a deleted Network until no pod is attached to it on any node: its
	// flows and addresses go only with its last attachment.
	NetworkInUseFinalizer = "network.ofsdn.io/in-use"

	// NADNetworkKey is the key of a NetworkAttachmentDefinition's CNI config that names the Network:
	// {"cniVersion": "1.0.0", "type": "ofsdn", "network": "blue"}.
	NADNetworkKey = "network"
)

// Condition types and reasons on a Network's status (besides ConditionValid and
// ConditionSubnetsAvailable, as on the ClusterNetwork).
const (
	// ConditionCrossTalk is False (reason Overlapping, Ambiguous or UnknownNetwork) when a network
	// crossTalk names cannot exchange traffic with this one; the others still do.
	ConditionCrossTalk = "CrossTalk"
	// ConditionInUse is True while pods are attached; a deleted Network waits for it to go False.
	ConditionInUse = "InUse"
)

// Network is a pod network besides the cluster network (see above). Cluster-scoped: the administrator
// decides which namespaces attach to it and which networks it exchanges traffic with.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=onet
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="Host Subnet Length",type=integer,JSONPath=`.spec.hostSubnetLength`
// +kubebuilder:printcolumn:name="VNI",type=integer,JSONPath=`.status.vni`
// +kubebuilder:printcolumn:name="Cross Talk",type=string,JSONPath=`.status.crossTalk`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.attachments`
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="a Network's name is a DNS label (no dots): its NetworkSubnets are named <network>.<node>"
type Network struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NetworkSpec   `json:"spec"`
	Status NetworkStatus `json:"status,omitempty"`
}

// NetworkSpec is what the administrator asks of a Network.
//
// +kubebuilder:validation:XValidation:rule="cidr(self.cidr).prefixLength() + self.hostSubnetLength <= 32",message="hostSubnetLength must fit in the cidr"
type NetworkSpec struct {
	// CIDR is the Network's address range, which node subnets are carved from. It may overlap other
	// Networks' and the cluster network's; it never changes.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="cidr is immutable"
	CIDR CIDR `json:"cidr"`

	// HostSubnetLength is the number of host bits of each node's subnet of this Network (8: a /24 per
	// node in a /16).
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=30
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="hostSubnetLength is immutable"
	HostSubnetLength int32 `json:"hostSubnetLength"`

	// VNI is the Network's VXLAN network identifier on the wire, from MinNetworkVNI-MaxNetworkVNI; the
	// controller picks one when it is not given.
	// +kubebuilder:validation:Minimum=16773120
	// +kubebuilder:validation:Maximum=16777215
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vni is immutable: the pods' traffic carries it"
	// +optional
	VNI uint32 `json:"vni,omitempty"`

	// MTU of the Network's pod interfaces; the cluster network's when not given.
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=9000
	// +optional
	MTU int32 `json:"mtu,omitempty"`

	// NamespaceSelector selects the namespaces whose pods may attach. An empty selector selects every
	// namespace; a change applies to running pods at once (a pod of a namespace no longer selected
	// keeps its interface but carries no traffic on it).
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`

	// CrossTalk names the Networks this one exchanges traffic with (routed in br0; either side naming
	// the other is enough). Only Networks whose CIDRs do not overlap this one's can: others are
	// reported in the CrossTalk condition and carry nothing.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +optional
	CrossTalk []string `json:"crossTalk,omitempty"`
}

// NetworkStatus is what the controller reports of a Network.
type NetworkStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// VNI is the VNI in use: spec.vni, or the one the controller picked.
	// +optional
	VNI uint32 `json:"vni,omitempty"`

	// CrossTalk lists the Networks this one exchanges traffic with, from both sides' crossTalk.
	// +listType=set
	// +optional
	CrossTalk []string `json:"crossTalk,omitempty"`

	// Attachments is how many pods are attached, over all nodes (their NetworkSubnets say per node).
	// +optional
	Attachments int64 `json:"attachments,omitempty"`

	// Conditions: Valid, SubnetsAvailable, CrossTalk, InUse.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetworkList is a list of Networks.
type NetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Network `json:"items"`
}

// NetworkSubnet is one node's subnet of one Network, named <network>.<node>: the controller creates it
// for every node once the Network is valid, and deletes it with the node or the Network. The node's
// agent reports in its status how many pods it has attached there.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.network`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.node`
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.subnet`
// +kubebuilder:printcolumn:name="Pods",type=integer,JSONPath=`.status.attachments`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.network + '.' + self.node",message="the name must be <network>.<node>"
type NetworkSubnet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Network is the Network's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Network string `json:"network"`

	// Node is the Node's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// HostIP is the Node's VXLAN endpoint (its HostSubnet's hostIP).
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="must be an IPv4 address"
	HostIP string `json:"hostIP"`

	// Subnet is the node's subnet of the Network; its first address is the node's gateway on it.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="subnet is immutable"
	Subnet CIDR `json:"subnet"`

	// +optional
	Status NetworkSubnetStatus `json:"status,omitempty"`
}

// NetworkSubnetStatus is what the node's agent reports.
type NetworkSubnetStatus struct {
	// Attachments is how many pods the node has attached to the Network.
	// +optional
	Attachments int64 `json:"attachments,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetworkSubnetList is a list of NetworkSubnets.
type NetworkSubnetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetworkSubnet `json:"items"`
}

// NetworkSubnetName is the name of a Network's NetworkSubnet on a node.
func NetworkSubnetName(network, node string) string { return network + "." + node }
