package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of ofsdn's network objects.
const GroupName = "network.ofsdn.io"

// SchemeGroupVersion is the group and version the generated clientset speaks.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1"}

var (
	// SchemeBuilder registers this package's types; the generated clientset calls AddToScheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds ClusterNetwork, HostSubnet, NetNamespace, Network, NetworkSubnet and EgressNetworkPolicy (and their lists) to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource turns an unqualified resource name into a group-qualified one (used by listers' NotFound errors).
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&ClusterNetwork{}, &ClusterNetworkList{},
		&HostSubnet{}, &HostSubnetList{},
		&NetNamespace{}, &NetNamespaceList{},
		&EgressNetworkPolicy{}, &EgressNetworkPolicyList{},
		&Network{}, &NetworkList{},
		&NetworkSubnet{}, &NetworkSubnetList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
