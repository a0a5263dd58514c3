package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Names, annotations and ranges that are part of the API.
const (
	// ClusterNetworkName is the name of the one ClusterNetwork object.
	ClusterNetworkName = "default"

	// ChangeNetworkAnnotation on a NetNamespace asks the controller to change that namespace's VNID:
	// "join:<namespace>" (take that namespace's NETID), "isolate" (a fresh NETID of its own) or "global" (NETID 0).
	// The controller carries the request out and removes the annotation; a malformed request is removed with
	// nothing changed and a Warning Event on the NetNamespace saying why.
	ChangeNetworkAnnotation = "network.ofsdn.io/change-network"

	// GlobalVNID is the VNID of global namespaces: their pods reach, and are reached by, every namespace.
	GlobalVNID uint32 = 0
	// MinVNID is the lowest VNID handed to a namespace; 1-9 are reserved, as in openshift-sdn.
	MinVNID uint32 = 10
	// MaxVNID is the highest VNID of a namespace: VXLAN's VNI is 24 bits, and the top 4,096 VNIs are
	// Networks' (MinNetworkVNI).
	MaxVNID uint32 = MinNetworkVNI - 1

	// DefaultVXLANPort is the IANA VXLAN port.
	DefaultVXLANPort int32 = 4789
)

// PluginMode selects how agents isolate pod traffic. VNIDs are allocated in every mode, so switching modes
// needs no re-allocation; only multitenant mode enforces them.
// +kubebuilder:validation:Enum=subnet;multitenant;networkpolicy
type PluginMode string

const (
	// PluginModeSubnet is a flat pod network: VNIDs exist but carry no isolation.
	PluginModeSubnet PluginMode = "subnet"
	// PluginModeMultitenant isolates namespaces by VNID; VNID 0 is global.
	PluginModeMultitenant PluginMode = "multitenant"
	// PluginModeNetworkPolicy enforces Kubernetes NetworkPolicy instead of VNID isolation.
	PluginModeNetworkPolicy PluginMode = "networkpolicy"
)

// Encapsulation selects how pod traffic crosses between nodes.
// +kubebuilder:validation:Enum=vxlan;none
type Encapsulation string

const (
	// EncapsulationVXLAN tunnels pod traffic to other nodes in VXLAN; the VNI carries the source's VNID.
	EncapsulationVXLAN Encapsulation = "vxlan"
	// EncapsulationNone sends pod traffic to nodes on the same L2 segment unencapsulated, pod addresses
	// untouched, through a patch port from br0 into the OVS bridge that holds the node's address; the
	// destination node derives the source's VNID from its address. Peers it cannot reach that way (not on
	// the segment, or the node's address is not on an OVS bridge) still get VXLAN.
	EncapsulationNone Encapsulation = "none"
)

// CIDR is an IPv4 network in canonical form (no host bits set), e.g. 10.128.0.0/14.
// +kubebuilder:validation:MaxLength=18
// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).masked() == cidr(self)",message="must be an IPv4 CIDR with no host bits set, e.g. 10.128.0.0/14"
type CIDR string

// Condition types on ClusterNetwork's status.
const (
	// ConditionValid is True when the controller accepted the spec and allocates from it. False means the
	// controller refused it (reason InvalidSpec or OrphansSubnets) and keeps the last spec it accepted.
	ConditionValid = "Valid"
	// ConditionSubnetsAvailable is False (reason Exhausted) while some Node has no HostSubnet because the
	// cluster CIDRs are full.
	ConditionSubnetsAvailable = "SubnetsAvailable"
)

// ClusterNetwork describes the pod overlay. There is exactly one, named "default"; the controller creates it
// from its flags when absent and validates every change to it.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Cluster CIDRs",type=string,JSONPath=`.spec.clusterCIDRs`
// +kubebuilder:printcolumn:name="Host Subnet Length",type=integer,JSONPath=`.spec.hostSubnetLength`
// +kubebuilder:printcolumn:name="Service Network",type=string,JSONPath=`.spec.serviceNetwork`
// +kubebuilder:printcolumn:name="Plugin Mode",type=string,JSONPath=`.spec.pluginMode`
// +kubebuilder:printcolumn:name="Encapsulation",type=string,JSONPath=`.spec.encapsulation`
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'default'",message="the ClusterNetwork is a singleton named default"
type ClusterNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterNetworkSpec   `json:"spec"`
	Status ClusterNetworkStatus `json:"status,omitempty"`
}

// ClusterNetworkSpec is the overlay's configuration.
//
// +kubebuilder:validation:XValidation:rule="self.clusterCIDRs.all(c, cidr(c).prefixLength() + self.hostSubnetLength <= 32)",message="hostSubnetLength must fit in every cluster CIDR"
// +kubebuilder:validation:XValidation:rule="self.clusterCIDRs.all(c, !cidr(c).containsIP(cidr(self.serviceNetwork).ip()) && !cidr(self.serviceNetwork).containsIP(cidr(c).ip()))",message="serviceNetwork must not overlap a cluster CIDR"
// +kubebuilder:validation:XValidation:rule="self.clusterCIDRs.all(a, self.clusterCIDRs.all(b, a == b || (!cidr(a).containsIP(cidr(b).ip()) && !cidr(b).containsIP(cidr(a).ip()))))",message="cluster CIDRs must not overlap each other"
type ClusterNetworkSpec struct {
	// ClusterCIDRs are the pod networks that host subnets are carved from, in order of use.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	ClusterCIDRs []CIDR `json:"clusterCIDRs"`

	// HostSubnetLength is the number of host bits of each node's subnet, as in openshift-sdn:
	// 9 gives every node a /23 (510 pods).
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=30
	HostSubnetLength int32 `json:"hostSubnetLength"`

	// ServiceNetwork is the Service ClusterIP range; it must not overlap the cluster CIDRs.
	ServiceNetwork CIDR `json:"serviceNetwork"`

	// PluginMode is subnet, multitenant or networkpolicy.
	// +kubebuilder:default=multitenant
	PluginMode PluginMode `json:"pluginMode"`

	// Encapsulation is vxlan (every node tunnels to every other) or none (nodes on one L2 segment
	// exchange pod traffic unencapsulated, pod addresses untouched; VXLAN remains for peers off the
	// segment). It can change on a running cluster; pods keep running.
	// +kubebuilder:default=vxlan
	// +optional
	Encapsulation Encapsulation `json:"encapsulation,omitempty"`

	// VXLANPort is the UDP port of the overlay.
	// +kubebuilder:default=4789
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	VXLANPort int32 `json:"vxlanPort,omitempty"`

	// MTU is the pod interface MTU: the underlay MTU less VXLAN's 50 bytes.
	// +kubebuilder:default=1450
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=9000
	// +optional
	MTU int32 `json:"mtu,omitempty"`
}

// ClusterNetworkStatus is what the controller reports.
type ClusterNetworkStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Valid and SubnetsAvailable.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// AllocatedSubnets is how many HostSubnets the controller holds.
	// +optional
	AllocatedSubnets int64 `json:"allocatedSubnets,omitempty"`

	// TotalSubnets is how many host subnets the accepted cluster CIDRs hold.
	// +optional
	TotalSubnets int64 `json:"totalSubnets,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// ClusterNetworkList is a list of ClusterNetworks.
type ClusterNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterNetwork `json:"items"`
}

// HostSubnet is a Node's pod subnet; its name is the Node's name. The controller creates it when the Node
// appears and deletes it, freeing the subnet, when the Node goes.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.host`
// +kubebuilder:printcolumn:name="Host IP",type=string,JSONPath=`.hostIP`
// +kubebuilder:printcolumn:name="Subnet",type=string,JSONPath=`.subnet`
// +kubebuilder:validation:XValidation:rule="self.host == self.metadata.name",message="host must equal the HostSubnet's name"
type HostSubnet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Host is the Node's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host"`

	// HostIP is the Node's IPv4 InternalIP: the node's VXLAN tunnel endpoint.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="must be an IPv4 address"
	HostIP string `json:"hostIP"`

	// Subnet is the Node's pod subnet, inside a cluster CIDR. It never changes: deleting the HostSubnet
	// releases it.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="subnet is immutable"
	Subnet CIDR `json:"subnet"`

	// EgressIPs are egress IPs this node may hold (manual placement, egress.go). An egress IP listed on
	// several HostSubnets fails over among those nodes.
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +optional
	EgressIPs []EgressIP `json:"egressIPs,omitempty"`

	// EgressCIDRs are ranges of the node's network from which it may hold any egress IP (automatic
	// placement, egress.go).
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	EgressCIDRs []CIDR `json:"egressCIDRs,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// HostSubnetList is a list of HostSubnets.
type HostSubnetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HostSubnet `json:"items"`
}

// NetNamespace is a Namespace's VNID; its name and netname are the Namespace's name. Namespaces that share
// a NETID reach each other; NETID 0 is global. Change it with the ChangeNetworkAnnotation.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="NetID",type=integer,JSONPath=`.netid`
// +kubebuilder:printcolumn:name="Egress IPs",type=string,JSONPath=`.egressIPs`
// +kubebuilder:validation:XValidation:rule="self.netname == self.metadata.name",message="netname must equal the NetNamespace's name"
type NetNamespace struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// NetName is the Namespace's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	NetName string `json:"netname"`

	// NetID is the namespace's VNID: 0 (global) or 10 to 2^24-4097 (the VNIs above are Networks').
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16773119
	// +kubebuilder:validation:XValidation:rule="self == 0 || self >= 10",message="netid must be 0 (global) or at least 10"
	NetID uint32 `json:"netid"`

	// EgressIPs are the namespace's source addresses for traffic leaving the cluster (egress.go): its
	// pods' traffic to destinations outside the cluster and service networks leaves from the node that
	// holds one of them, with that address.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +optional
	EgressIPs []EgressIP `json:"egressIPs,omitempty"`

	// Status says whether the egress IPs are valid and where each one is held.
	// +optional
	Status NetNamespaceStatus `json:"status,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// NetNamespaceList is a list of NetNamespaces.
type NetNamespaceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NetNamespace `json:"items"`
}
