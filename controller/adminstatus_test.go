package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	cnp "github.com/ofsdn/ofsdn/apis/policy/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
)

func adminEvent(node, reason, msg string, at time.Time) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: node + reason + at.String(), Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: cnp.Kind, APIVersion: cnp.Group + "/" + cnp.Version, Name: "p"},
		Reason:         reason, Message: msg, Source: corev1.EventSource{Component: "ofsdn-agent", Host: node}, LastTimestamp: metav1.NewTime(at)}
}

// TestAggregateAdminCondition: the condition is each live node's latest report, grouped by problem.
func TestAggregateAdminCondition(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	p := &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 3, CreationTimestamp: metav1.NewTime(t0)}}
	live := func(n string) bool { return n != "gone" }
	dn := "node %s: DomainNamesUnsupported: spec.egress[0].to[0].domainNames: not implemented"
	tests := []struct {
		name   string
		events []*corev1.Event
		status metav1.ConditionStatus
		says   []string
	}{
		{"no reports: enforced", nil, metav1.ConditionTrue, []string{"every node"}},
		{"two nodes with one problem, grouped", []*corev1.Event{
			adminEvent("n1", "NotEnforced", strings.ReplaceAll(dn, "%s", "n1"), t0.Add(time.Minute)),
			adminEvent("n2", "NotEnforced", strings.ReplaceAll(dn, "%s", "n2"), t0.Add(time.Minute)),
		}, metav1.ConditionFalse, []string{"on n1, n2: DomainNamesUnsupported"}},
		{"a node's latest report wins", []*corev1.Event{
			adminEvent("n1", "NotEnforced", "node n1: RenderFailed: its flows are not installed", t0.Add(time.Minute)),
			adminEvent("n1", "Enforced", "node n1 enforces it as written", t0.Add(2*time.Minute)),
			adminEvent("n2", "Enforced", "node n2 enforces it as written", t0.Add(time.Minute)),
			adminEvent("n2", "NotEnforced", "node n2: RenderFailed: its flows are not installed", t0.Add(3*time.Minute)),
		}, metav1.ConditionFalse, []string{"on n2: RenderFailed"}},
		{"nodes that are gone and reports older than the policy are ignored", []*corev1.Event{
			adminEvent("gone", "NotEnforced", "node gone: RenderFailed: x", t0.Add(time.Minute)),
			adminEvent("n1", "NotEnforced", "node n1: RenderFailed: x", t0.Add(-time.Minute)),
		}, metav1.ConditionTrue, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := aggregateAdminCondition(p, tt.events, live)
			if c.Type != adminConditionType || c.Status != tt.status || c.ObservedGeneration != 3 {
				t.Fatalf("condition %+v, want status %s at generation 3", c, tt.status)
			}
			for _, s := range tt.says {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q does not say %q", c.Message, s)
				}
			}
		})
	}
}

// TestAdminStatusWritesCondition: the aggregation runs on fake clients and writes the condition into
// the policy's status through the dynamic client.
func TestAdminStatusWritesCondition(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	now := time.Now()
	kube := kubefake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		adminEvent("n1", "NotEnforced", "node n1: FailedClosed: spec.egress[0].to[0]: a peer with no field ofsdn knows", now.Add(time.Second)))
	kube.Resources = []*metav1.APIResourceList{{GroupVersion: cnp.Group + "/" + cnp.Version,
		APIResources: []metav1.APIResource{{Name: cnp.Resource.Resource, Kind: cnp.Kind}}}}
	pol, err := cnp.ToUnstructured(&cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
		Spec: cnp.Spec{Tier: cnp.AdminTier, Subject: cnp.Subject{Namespaces: &metav1.LabelSelector{}}}})
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{cnp.Resource: cnp.Kind + "List"}, pol)
	s, err := newAdminStatus(kube, dyn, informers.NewSharedInformerFactory(kube, 0), klog.Background())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u, err := dyn.Resource(cnp.Resource).Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := cnp.FromUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(p.Status.Conditions, adminConditionType); c != nil {
			if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "on n1: FailedClosed") {
				t.Fatalf("condition %+v", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no condition written")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
