package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Egress IPs and the egress firewall, in openshift-sdn's shapes:
//
//   - NetNamespace.egressIPs are a namespace's source addresses for traffic that leaves the cluster: its
//     pods' traffic to any destination outside the cluster and service networks (and the nodes' own
//     addresses) is sent to the node that holds one of them, which SNATs it to that address.
//   - A node may hold an egress IP that its HostSubnet lists in egressIPs (manual placement) or that lies
//     in one of its egressCIDRs (automatic placement). The agents choose among the live nodes that may hold
//     an IP and move it in hundreds of milliseconds when its holder dies, without the API server; the
//     controller validates, makes the API-level placement (status.egressIPs[].assignedNode) and reports
//     problems, and the holder's agent records status.egressIPs[].node once it holds the address.
//   - EgressNetworkPolicy (one per namespace) is an ordered list of Allow and Deny rules to CIDRs or DNS
//     names; the first rule that matches a destination outside the cluster decides, and a destination no
//     rule matches is allowed. It is enforced on the node where the pod runs.

// EgressIP is an IPv4 address that traffic leaving the cluster can take as its source.
// +kubebuilder:validation:MaxLength=15
// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4 && ip.isCanonical(self)",message="must be an IPv4 address in dotted-decimal form"
type EgressIP string

// Condition types and reasons of a NetNamespace's status (the controller writes them).
const (
	// ConditionEgressIPsValid is False when an egress IP cannot be used at all: another namespace claims it
	// too (ReasonEgressIPConflict: neither namespace gets it), it lies inside the cluster network, the service
	// network or is a node's address (ReasonEgressIPInsideCluster), or no HostSubnet offers it
	// (ReasonEgressIPNoEligibleNode). The namespace's external traffic that would use it is dropped.
	ConditionEgressIPsValid = "EgressIPsValid"
	// ConditionEgressIPsAssigned is False (ReasonEgressIPNoReadyNode) while some valid egress IP has no
	// Ready node that may hold it: the namespace's traffic for it is dropped until one is.
	ConditionEgressIPsAssigned = "EgressIPsAssigned"

	ReasonEgressIPConflict       = "Conflict"
	ReasonEgressIPInsideCluster  = "InsideCluster"
	ReasonEgressIPNoEligibleNode = "NoEligibleNode"
	ReasonEgressIPNoReadyNode    = "NoReadyNode"
)

// NetNamespaceStatus is what the controller and the agents report about a namespace's egress IPs.
type NetNamespaceStatus struct {
	// Conditions: EgressIPsValid and EgressIPsAssigned (only while the namespace has egress IPs).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// EgressIPs says where each egress IP is placed and held.
	// +listType=map
	// +listMapKey=ip
	// +kubebuilder:validation:MaxItems=16
	// +optional
	EgressIPs []EgressIPStatus `json:"egressIPs,omitempty"`
}

// EgressIPStatus is one egress IP's placement.
type EgressIPStatus struct {
	// IP is the egress IP.
	IP EgressIP `json:"ip"`

	// AssignedNode is the controller's placement: the node that should hold the IP (empty when no
	// Ready node may).
	// +optional
	AssignedNode string `json:"assignedNode,omitempty"`

	// Node is the node that holds the IP now, written by that node's agent after it claimed the address
	// (it may differ from AssignedNode for a moment after a failover, which the agents make without
	// waiting for the controller).
	// +optional
	Node string `json:"node,omitempty"`
}

// EgressNetworkPolicyRuleType says what a rule does with the traffic it matches.
// +kubebuilder:validation:Enum=Allow;Deny
type EgressNetworkPolicyRuleType string

const (
	EgressNetworkPolicyRuleAllow EgressNetworkPolicyRuleType = "Allow"
	EgressNetworkPolicyRuleDeny  EgressNetworkPolicyRuleType = "Deny"
)

// MaxEgressNetworkPolicyRules is the most rules one EgressNetworkPolicy may have (openshift-sdn's limit).
const MaxEgressNetworkPolicyRules = 50

// Condition reasons of an EgressNetworkPolicy's Valid condition.
const (
	// ReasonEgressPolicyConflict: the namespace has more than one EgressNetworkPolicy. None of them is
	// enforced and the namespace's traffic leaving the cluster is dropped (openshift-sdn's behaviour),
	// until one is left.
	ReasonEgressPolicyConflict = "MultiplePolicies"
	// ReasonEgressPolicyInvalid: a rule cannot be parsed (the CRD's validation normally refuses it). The
	// namespace's traffic leaving the cluster is dropped until it is fixed.
	ReasonEgressPolicyInvalid = "InvalidRule"
	// ReasonEgressPolicyAccepted: the policy is enforced.
	ReasonEgressPolicyAccepted = "Accepted"
)

// EgressNetworkPolicy restricts where a namespace's pods may connect outside the cluster: its rules are
// tried in order and the first one whose destination matches decides; what no rule matches is allowed.
// Destinations inside the cluster (pods, services, the nodes' addresses) are never restricted by it: the
// cluster's DNS and API server stay reachable through their Services under a deny-all. One per namespace.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].reason`
type EgressNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec EgressNetworkPolicySpec `json:"spec"`

	// +optional
	Status EgressNetworkPolicyStatus `json:"status,omitempty"`
}

// EgressNetworkPolicySpec is the ordered list of rules.
type EgressNetworkPolicySpec struct {
	// Egress are the rules, in the order they are tried.
	// +kubebuilder:validation:MaxItems=50
	// +listType=atomic
	Egress []EgressNetworkPolicyRule `json:"egress"`
}

// EgressNetworkPolicyRule allows or denies traffic to one destination.
type EgressNetworkPolicyRule struct {
	// Type is Allow or Deny.
	Type EgressNetworkPolicyRuleType `json:"type"`
	// To is the destination.
	To EgressNetworkPolicyPeer `json:"to"`
}

// EgressNetworkPolicyPeer is a destination: exactly one of a CIDR and a DNS name.
// +kubebuilder:validation:XValidation:rule="has(self.cidrSelector) != has(self.dnsName)",message="exactly one of cidrSelector and dnsName"
type EgressNetworkPolicyPeer struct {
	// CIDRSelector is an IPv4 network (host bits are ignored), e.g. 0.0.0.0/0 for everything.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="must be an IPv4 CIDR, e.g. 192.0.2.0/24"
	// +optional
	CIDRSelector string `json:"cidrSelector,omitempty"`
	// DNSName is a host name; the agents resolve it and re-resolve it when its records' TTL runs out, and
	// the rule matches the addresses it resolved to.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.?$`
	// +kubebuilder:validation:XValidation:rule="!isIP(self)",message="an address is a cidrSelector, not a dnsName"
	// +optional
	DNSName string `json:"dnsName,omitempty"`
}

// EgressNetworkPolicyStatus says whether the policy is enforced.
type EgressNetworkPolicyStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Valid (reasons Accepted, MultiplePolicies, InvalidRule).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true

// EgressNetworkPolicyList is a list of EgressNetworkPolicies.
type EgressNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EgressNetworkPolicy `json:"items"`
}
