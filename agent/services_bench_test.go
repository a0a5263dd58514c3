package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/flows/reconcile"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// BenchmarkServiceEndpointChange: the agent's path for one EndpointSlice update with 1,000 services of
// 10 endpoints known: view → snapshot (API objects to ServiceStates) → render (one service again) →
// owner comparison → reconciler, against a switch that only counts. Target < 10 ms per change.
func BenchmarkServiceEndpointChange(b *testing.B) {
	const nSvc, nEps = 1000, 10
	v := testView()
	sliceFor := func(i, gen int) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for j := 0; j < nEps; j++ {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", 129+j%3, i/250, (i%250)+gen%2), "n2", ptr.To(true), nil, nil))
		}
		es := testSlice(fmt.Sprintf("s%d-1", i), fmt.Sprintf("s%d", i), 8080, eps...)
		es.Namespace = "a"
		return es
	}
	v.update(func(v *nodeView) {
		for i := 0; i < nSvc; i++ {
			svc := testService(fmt.Sprintf("s%d", i), func(s *corev1.Service) {
				s.Spec.ClusterIP = fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
			})
			v.services["a/"+svc.Name] = svc
			es := sliceFor(i, 0)
			v.slices["a/"+es.Name] = es
		}
	})
	sw := &countingSwitch{}
	fs := newFlowSync(v, reconcile.New(sw, reconcile.Config{Round: 1}), flowSyncHooks{}, klog.Background())
	ctx := context.Background()
	start := time.Now()
	if _, err := fs.syncNow(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("first sync of %d services × %d endpoints: %s, %d messages", nSvc, nEps, time.Since(start).Round(time.Millisecond), sw.msgs)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		es := sliceFor(500, i+1)
		g := v.update(func(v *nodeView) { v.slices["a/"+es.Name] = es })
		st, err := fs.syncThrough(ctx, g)
		if err != nil {
			b.Fatal(err)
		}
		if st.Changes() == 0 {
			b.Fatal("the endpoint change changed nothing")
		}
	}
}
