package pipeline

import (
	"strconv"

	"github.com/ofsdn/ofsdn/flows/reconcile"
)

// The owners of the pipeline's flows: one per object whose state the flows render, named after it, so
// `flowctl dump` says which object every flow belongs to. Owners of API objects are named by the
// object ("pod/ns/name"); the pipeline's own plumbing is category pipeline, which no API object uses.
var (
	// PipelineOwner owns the fixed plumbing: dispatch, every table's default, the version note.
	PipelineOwner = reconcile.Owner{Category: reconcile.CategoryPipeline, Name: "base"}
)

// PodOwner owns a local pod's flows.
func PodOwner(namespace, name string) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryPod, Name: namespace + "/" + name}
}

// NodeOwner owns a remote node's tunnel flows.
func NodeOwner(node string) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryNode, Name: node}
}

// TenantOwner owns one VNID's isolation flows (multitenant mode).
func TenantOwner(vnid uint32) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryTenant, Name: strconv.FormatUint(uint64(vnid), 10)}
}

// ServiceOwner owns one service port's flows and groups.
func ServiceOwner(namespace, name, port string) reconcile.Owner {
	return reconcile.Owner{Category: reconcile.CategoryService, Name: namespace + "/" + name + ":" + port}
}
