package hostnet

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/ofsdn/ofsdn/flows/pipeline"
)

// TestDatapathPurgerFollowsPolicyState: the cache is purged when what decides policy verdicts changed
// since the last synced state (policies, isolated pods, a selected pod's address), never for the
// first state, for other changes, or outside networkpolicy mode; a failed purge is retried next time.
func TestDatapathPurgerFollowsPolicyState(t *testing.T) {
	base := func() pipeline.NodeState {
		return pipeline.NodeState{Mode: pipeline.ModeNetworkPolicy,
			Pods: []pipeline.PodState{{Namespace: "x", Name: "a", IP: netip.MustParseAddr("10.128.0.4"), OFPort: 5}},
			Policies: []pipeline.PolicyState{{Namespace: "x", Name: "deny", Ingress: true,
				Pods: []pipeline.PolicyPod{{OFPort: 5}}}}}
	}
	purges := 0
	var fail error
	d := &DatapathPurger{purge: func(context.Context) error {
		if fail != nil {
			return fail
		}
		purges++
		return nil
	}}
	steps := []struct {
		what   string
		edit   func(*pipeline.NodeState)
		failed error
		purged bool
	}{
		{"first state", func(*pipeline.NodeState) {}, nil, false},
		{"same state again", func(*pipeline.NodeState) {}, nil, false},
		{"a service changes", func(st *pipeline.NodeState) { st.Services = []pipeline.ServiceState{{Namespace: "x", Name: "s"}} }, nil, false},
		{"a pod becomes isolated", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true }, nil, true},
		{"a policy is deleted, purge fails", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true; st.Policies = nil }, errors.New("no socket"), false},
		{"the same state: the failed purge is retried", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true; st.Policies = nil }, nil, true},
		{"subnet mode", func(st *pipeline.NodeState) { st.Mode = pipeline.ModeSubnet }, nil, true},
		{"subnet mode, policies change", func(st *pipeline.NodeState) { st.Mode = pipeline.ModeSubnet; st.Policies = nil }, nil, false},
	}
	for _, s := range steps {
		st := base()
		s.edit(&st)
		fail = s.failed
		before := purges
		purged, err := d.Synced(context.Background(), st)
		if (err != nil) != (s.failed != nil) || purged != s.purged || (purges > before) != s.purged {
			t.Errorf("%s: purged %v (purges %d→%d), err %v; want purged %v, err %v", s.what, purged, before, purges, err, s.purged, s.failed)
		}
	}
}
