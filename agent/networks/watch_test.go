package networks

import (
	"context"
	"errors"
	"testing"

	"github.com/ofsdn/ofsdn/agent/k8sobj"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// indexView is View over one Index, counting updates.
type indexView struct {
	ix      *Index
	updates int
}

func (v *indexView) UpdateNetworks(f func(ix *Index)) { v.updates++; f(v.ix) }

func (v *indexView) Placement(network, namespace string) (Placement, error) {
	return v.ix.Placement(network, namespace, "n1")
}

type countSync struct{ n int }

func (s *countSync) Trigger() { s.n++ }

// TestWatchFilesNetworks: the informers' objects reach the view's Index, every change asks for a sync
// and tells Changed, and a namespace update that keeps its labels does neither.
func TestWatchFilesNetworks(t *testing.T) {
	view, sync, changed := &indexView{ix: NewIndex()}, &countSync{}, 0
	nets, subnets, namespaces := (&Watch{View: view, Sync: sync, Log: klog.Background(), Changed: func() { changed++ }}).Handlers()
	nets.AddFunc(network("red", "10.200.0.0/16", 0xfff001, map[string]string{"net": "red"}))
	subnets.AddFunc(subnet("red", "n1", "192.0.2.11", "10.200.1.0/24"))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"net": "red"}}}
	namespaces.AddFunc(ns)
	if _, err := view.ix.Placement("red", "a", "n1"); err != nil {
		t.Fatalf("placement after the informers' objects: %v", err)
	}
	if sync.n != 3 || changed != 3 {
		t.Errorf("%d syncs, %d changes, want 3 of each", sync.n, changed)
	}
	namespaces.UpdateFunc(ns, ns.DeepCopy())
	if sync.n != 3 || changed != 3 {
		t.Errorf("an update keeping the labels: %d syncs, %d changes", sync.n, changed)
	}
	nets.DeleteFunc(cache.DeletedFinalStateUnknown{Key: "red", Obj: network("red", "10.200.0.0/16", 0xfff001, nil)})
	if _, err := view.ix.Placement("red", "a", "n1"); err == nil {
		t.Error("a deleted Network still places")
	}
}

// TestPodRequestsReadTheAnnotation: from the pod informer when it has the pod, else from the API
// server; a pod the API server does not know asks for nothing; without a NetworkAttachmentDefinition
// client a request fails with ErrNoNAD.
func TestPodRequestsReadTheAnnotation(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = store.Add(&k8sobj.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "cached", Annotations: map[string]string{k8sobj.NetworksAnnotation: "red"}}})
	kube := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "uncached", Annotations: map[string]string{k8sobj.NetworksAnnotation: "blue"}}})
	r := &PodRequests{Placements: &indexView{ix: NewIndex()}, Pods: store, Kube: kube, Log: klog.Background()}
	ctx := context.Background()
	for _, name := range []string{"cached", "uncached"} {
		if _, err := r.Requests(ctx, "a", name); !errors.Is(err, ErrNoNAD) {
			t.Errorf("%s: %v, want ErrNoNAD (its annotation read, no NAD client)", name, err)
		}
	}
	if reqs, err := r.Requests(ctx, "a", "unknown"); err != nil || len(reqs) != 0 {
		t.Errorf("a pod the API does not know: %v, %v", reqs, err)
	}
}
