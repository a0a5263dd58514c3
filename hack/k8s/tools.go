//go:build tools

// Package tools pins the commands hack/build-k8s.sh builds, so that go.mod and go.sum hold every module
// they need. It is never compiled (build tag "tools"); the script builds the commands by import path.
package tools

import (
	// etcd's own main package (etcdmain.Main), in the etcd server module Kubernetes v1.34 is tested with.
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
