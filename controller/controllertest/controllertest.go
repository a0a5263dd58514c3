// Package controllertest runs ofsdn-controller in-process on a kubelab API server, as deployed: with the
// ServiceAccount deploy/controller/rbac.yaml binds (so every test on it also proves that RBAC grants
// enough) and through leader election. The controller's own tests and flowctl's pod-network tests
// stand on it.
package controllertest

import (
	"context"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	networkclient "github.com/ofsdn/ofsdn/client/clientset/versioned"
	networkinformers "github.com/ofsdn/ofsdn/client/informers/externalversions"
	"github.com/ofsdn/ofsdn/controller"
	"github.com/ofsdn/ofsdn/lab/kubelab"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Manifests are the deploy/ manifests a controller needs on the API server first
// (kubelab.StartDeploy(t, opts, controllertest.Manifests...)).
var Manifests = []string{"namespace.yaml", "crds/", "controller/rbac.yaml"}

// Spec is a multitenant ClusterNetwork spec over one cluster CIDR.
func Spec(cidr string, hostBits int32) networkv1.ClusterNetworkSpec {
	return networkv1.ClusterNetworkSpec{ClusterCIDRs: []networkv1.CIDR{networkv1.CIDR(cidr)}, HostSubnetLength: hostBits,
		ServiceNetwork: "172.30.0.0/16", PluginMode: networkv1.PluginModeMultitenant, VXLANPort: 4789, MTU: 1450}
}

// Start runs a controller replica named id (kube-system global besides default) until the returned
// stop is called; t.Cleanup calls it too, and either reports an error Run returned. Leases are short
// (4 s), so a takeover happens within a test's patience.
func Start(t testing.TB, api *kubelab.Cluster, spec networkv1.ClusterNetworkSpec, id string) (stop func()) {
	t.Helper()
	sa := api.ServiceAccountConfig(t, "ofsdn", "ofsdn-controller")
	kube, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	netc, err := networkclient.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	c, err := controller.New(kube, netc, informers.NewSharedInformerFactory(kube, 0), networkinformers.NewSharedInformerFactory(netc, 0),
		controller.Config{Network: spec, GlobalNamespaces: []string{"kube-system"}, Logger: klog.Background().WithValues("replica", id)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- controller.RunLeader(ctx, kube, controller.LeaderConfig{Namespace: "ofsdn", Name: "ofsdn-controller", Identity: id,
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}, c)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("controller %s: %v", id, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
