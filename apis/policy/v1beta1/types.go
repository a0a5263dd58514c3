// Package v1beta1 is ofsdn's reading of SIG Network's ClusterNetworkPolicy (policy.networking.k8s.io
// v1beta1, sigs.k8s.io/network-policy-api v0.3.0; v1alpha2 has the same schema and is served too): the
// fields the agent and the controller use, with the API's JSON names, filled from the unstructured
// objects a dynamic informer delivers (FromUnstructured).
//
// Why not the module's own types: they are built against k8s.io/apimachinery v0.36, and ofsdn, its
// client-go and the lab's control plane are at v0.34 / v1.34. Importing the module would move every
// k8s.io module of ofsdn to v0.36 (Go's minimal version selection takes the highest), ahead of the
// API server the lab builds. So ofsdn reads the API through the dynamic client, and the upstream
// conformance suite, which needs the module, runs from a module of its own (conformance/cnp).
//
// A field the schema adds in a later version is ignored by this reading; a peer or protocol whose
// every known field is empty is what an unknown field looks like, and the agent fails closed on it as
// the API asks (agent/adminpolicy).
package v1beta1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group; Version the version ofsdn reads and writes.
const (
	Group   = "policy.networking.k8s.io"
	Version = "v1beta1"
	Kind    = "ClusterNetworkPolicy"
)

// Reasons of the Events an agent writes on a ClusterNetworkPolicy for its node (agent/adminpolicy,
// report.go), which the controller reads back to aggregate the nodes' word into the policy's status
// (controller/adminstatus.go): defined here once, so writer and reader cannot drift apart.
const (
	// EventReasonNotEnforced: a Warning naming the node and its problems with the policy.
	EventReasonNotEnforced = "NotEnforced"
	// EventReasonEnforced: a Normal, the node enforces the policy as written (again).
	EventReasonEnforced = "Enforced"
)

// Resource is the ClusterNetworkPolicy resource, for the dynamic client.
var Resource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "clusternetworkpolicies"}

// Tier is spec.tier.
type Tier string

const (
	AdminTier    Tier = "Admin"
	BaselineTier Tier = "Baseline"
)

// Action is a rule's action.
type Action string

const (
	Accept Action = "Accept"
	Deny   Action = "Deny"
	Pass   Action = "Pass"
)

// ClusterNetworkPolicy is a cluster-scoped policy of the Admin or Baseline tier.
type ClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is the policy.
type Spec struct {
	Tier     Tier          `json:"tier"`
	Priority int32         `json:"priority"`
	Subject  Subject       `json:"subject"`
	Ingress  []IngressRule `json:"ingress,omitempty"`
	Egress   []EgressRule  `json:"egress,omitempty"`
}

// Status holds the conditions implementations write.
type Status struct {
	Conditions []metav1.Condition `json:"conditions"`
}

// Subject selects the pods the policy applies to: exactly one field is set.
type Subject struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// NamespacedPod selects pods by namespace and pod labels.
type NamespacedPod struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

// IngressRule acts on traffic to the subject from its peers.
type IngressRule struct {
	Name      string        `json:"name,omitempty"`
	Action    Action        `json:"action"`
	From      []IngressPeer `json:"from"`
	Protocols []Protocol    `json:"protocols,omitempty"`
}

// EgressRule acts on traffic from the subject to its peers.
type EgressRule struct {
	Name      string       `json:"name,omitempty"`
	Action    Action       `json:"action"`
	To        []EgressPeer `json:"to"`
	Protocols []Protocol   `json:"protocols,omitempty"`
}

// IngressPeer is one source: exactly one field is set.
type IngressPeer struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// EgressPeer is one destination: exactly one field is set. Nodes and DomainNames are experimental.
type EgressPeer struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *NamespacedPod        `json:"pods,omitempty"`
	Nodes       *metav1.LabelSelector `json:"nodes,omitempty"`
	Networks    []string              `json:"networks,omitempty"`
	DomainNames []string              `json:"domainNames,omitempty"`
}

// Protocol is one protocol match: exactly one field is set. DestinationNamedPort is experimental.
type Protocol struct {
	TCP                  *ProtocolPort `json:"tcp,omitempty"`
	UDP                  *ProtocolPort `json:"udp,omitempty"`
	SCTP                 *ProtocolPort `json:"sctp,omitempty"`
	DestinationNamedPort string        `json:"destinationNamedPort,omitempty"`
}

// ProtocolPort is a protocol's destination port; nil DestinationPort: every port of the protocol.
type ProtocolPort struct {
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// Port is a number or a range.
type Port struct {
	Number int32      `json:"number,omitempty"`
	Range  *PortRange `json:"range,omitempty"`
}

// PortRange is start..end inclusive.
type PortRange struct {
	Start int32 `json:"start"`
	End   int32 `json:"end"`
}

// FromUnstructured reads a ClusterNetworkPolicy of v1beta1 or v1alpha2 (the same schema).
func FromUnstructured(u *unstructured.Unstructured) (*ClusterNetworkPolicy, error) {
	var p ClusterNetworkPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &p); err != nil {
		return nil, fmt.Errorf("read ClusterNetworkPolicy %s: %w", u.GetName(), err)
	}
	return &p, nil
}

// ToUnstructured writes a policy as the dynamic client sends it.
func ToUnstructured(p *ClusterNetworkPolicy) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		return nil, fmt.Errorf("write ClusterNetworkPolicy %s: %w", p.Name, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(Group + "/" + Version)
	u.SetKind(Kind)
	return u, nil
}
