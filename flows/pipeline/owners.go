package pipeline

import (
	"strconv"
	"strings"

	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// The owners of the pipeline's flows: one per object whose state the flows render, named after it, so
// `flowctl dump` says which object every flow belongs to. Owners of API objects are named by the
// object ("pod/ns/name"); the pipeline's own plumbing is category pipeline, which no API object uses.
//
// Object is the one place that builds those names and reads them back: the constructors below build
// an Object's owner, ObjectOf reads an owner back into its Object (the agent writes Events on it,
// flowctl names policies and services from it).
var (
	// PipelineOwner owns the fixed plumbing: dispatch, every table's default, the version note.
	PipelineOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "base"}
)

// Object is the API object whose state an owner's flows render.
type Object struct {
	Kind      ObjectKind
	Namespace string // "" for a cluster-scoped object (a Node)
	Name      string
	// Port is a service owner's port: its name, or number/protocol (53/udp) for an unnamed port.
	Port string
	// Interface is a pod's interface on a Network ("net1"): an attachment's owner. "" for the pod's
	// cluster-network interface.
	Interface string
}

// ObjectKind is the kind of an API object that owns flows.
type ObjectKind string

const (
	KindPod           ObjectKind = "Pod"
	KindNode          ObjectKind = "Node"
	KindService       ObjectKind = "Service"
	KindNetworkPolicy ObjectKind = "NetworkPolicy"
	// KindClusterNetworkPolicy owns one ClusterNetworkPolicy's rules (adminpolicy.go).
	KindClusterNetworkPolicy ObjectKind = "ClusterNetworkPolicy"
	KindNetwork              ObjectKind = "Network"
	// KindNetNamespace owns a namespace's egress classification and egress IPs (egress.go), and
	// KindEgressNetworkPolicy its egress firewall.
	KindNetNamespace        ObjectKind = "NetNamespace"
	KindEgressNetworkPolicy ObjectKind = "EgressNetworkPolicy"
)

// objectKinds is the registry: each kind's owner category, API version, and whether it is namespaced.
var objectKinds = []struct {
	kind       ObjectKind
	category   reconcile.Category
	apiVersion string
	namespaced bool
}{
	{KindPod, reconcile.CategoryPod, "v1", true},
	{KindNode, reconcile.CategoryNode, "v1", false},
	{KindService, reconcile.CategoryService, "v1", true},
	{KindNetworkPolicy, reconcile.CategoryNetPol, "networking.k8s.io/v1", true},
	{KindClusterNetworkPolicy, reconcile.CategoryAdminPolicy, "policy.networking.k8s.io/v1beta1", false},
	{KindNetwork, reconcile.CategoryNetwork, "network.ofsdn.io/v1", false},
	{KindNetNamespace, reconcile.CategoryEgress, "network.ofsdn.io/v1", false},
	{KindEgressNetworkPolicy, reconcile.CategoryEgressFirewall, "network.ofsdn.io/v1", true},
}

// APIVersion is the kind's API group and version, as an ObjectReference names it.
func (k ObjectKind) APIVersion() string {
	for _, e := range objectKinds {
		if e.kind == k {
			return e.apiVersion
		}
	}
	return ""
}

// Owner is the owner of the object's flows: "pod/ns/name", "pod/ns/name@net1" (an attachment),
// "node/name", "svc/ns/name:port", "netpol/ns/name", "net/name".
func (o Object) Owner() reconcile.Owner {
	name := o.Name
	if o.Namespace != "" {
		name = o.Namespace + "/" + name
	}
	if o.Kind == KindService {
		name += ":" + o.Port
	}
	if o.Kind == KindPod && o.Interface != "" {
		name += "@" + o.Interface
	}
	for _, e := range objectKinds {
		if e.kind == o.Kind {
			return reconcile.Owner{Category: e.category, Name: name}
		}
	}
	return reconcile.Owner{Category: reconcile.CategoryNone, Name: name}
}

// ObjectOf reads an owner back into the object it names; false for owners that name no API object
// (the pipeline's plumbing, tenants, tests) and for names no constructor builds.
func ObjectOf(o reconcile.Owner) (Object, bool) {
	for _, e := range objectKinds {
		if e.category != o.Category {
			continue
		}
		obj := Object{Kind: e.kind, Name: o.Name}
		if e.namespaced {
			var ok bool
			if obj.Namespace, obj.Name, ok = strings.Cut(o.Name, "/"); !ok || obj.Namespace == "" {
				return Object{}, false
			}
		}
		if e.kind == KindService {
			var ok bool
			// Service names hold no ':'; the port may hold a '/' (80/TCP).
			if obj.Name, obj.Port, ok = strings.Cut(obj.Name, ":"); !ok || obj.Port == "" {
				return Object{}, false
			}
		}
		if e.kind == KindPod {
			// Pod names hold no '@'; an attachment's owner names its interface after one.
			if name, iface, ok := strings.Cut(obj.Name, "@"); ok {
				if iface == "" {
					return Object{}, false
				}
				obj.Name, obj.Interface = name, iface
			}
		}
		if obj.Name == "" || strings.Contains(obj.Name, "/") {
			return Object{}, false
		}
		return obj, true
	}
	return Object{}, false
}

// Key is the object as flowctl names it: "ns/name" ("ns/name@net1" for an attachment), or the name of
// a cluster-scoped object.
func (o Object) Key() string {
	key := o.Name
	if o.Namespace != "" {
		key = o.Namespace + "/" + o.Name
	}
	if o.Interface != "" {
		key += "@" + o.Interface
	}
	return key
}

// PodOwner owns a local pod's flows.
func PodOwner(namespace, name string) reconcile.Owner {
	return Object{Kind: KindPod, Namespace: namespace, Name: name}.Owner()
}

// NodeOwner owns a remote node's tunnel flows.
func NodeOwner(node string) reconcile.Owner {
	return Object{Kind: KindNode, Name: node}.Owner()
}

// ServiceOwner owns one service port's flows and groups.
func ServiceOwner(namespace, name, port string) reconcile.Owner {
	return Object{Kind: KindService, Namespace: namespace, Name: name, Port: port}.Owner()
}

// TenantOwner owns one VNID's isolation flows (multitenant mode). A VNID is no API object of its own
// (the NetNamespaces that share it are), so its owner is named by the number.
func TenantOwner(vnid uint32) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryTenant, Name: strconv.FormatUint(uint64(vnid), 10)}
}
