package agent

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
// Before stale conntrack entries are flushed it purges in any case, the first state included (the
// start-up flush of entries towards endpoints removed while no agent ran).
func TestDatapathPurgerFollowsPolicyState(t *testing.T) {
	base := func() pipeline.NodeState {
		return pipeline.NodeState{Mode: pipeline.ModeNetworkPolicy,
			Pods: []pipeline.PodState{{Namespace: "x", Name: "a", IP: netip.MustParseAddr("10.128.0.4"), OFPort: 5}},
			Policies: []pipeline.PolicyState{{Namespace: "x", Name: "deny", Ingress: true,
				Pods: []pipeline.PolicyPod{{OFPort: 5}}}}}
	}
	purges := 0
	var fail error
	d := &datapathPurger{purge: func(context.Context) error {
		if fail != nil {
			return fail
		}
		purges++
		return nil
	}}
	steps := []struct {
		what     string
		edit     func(*pipeline.NodeState)
		flushing int
		failed   error
		purged   bool
	}{
		{"first state", func(*pipeline.NodeState) {}, 0, nil, false},
		{"same state again", func(*pipeline.NodeState) {}, 0, nil, false},
		{"a service changes", func(st *pipeline.NodeState) { st.Services = []pipeline.ServiceState{{Namespace: "x", Name: "s"}} }, 0, nil, false},
		{"a pod becomes isolated", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true }, 0, nil, true},
		{"a policy is deleted, purge fails", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true; st.Policies = nil }, 0, errors.New("no socket"), false},
		{"the same state: the failed purge is retried", func(st *pipeline.NodeState) { st.Pods[0].IngressIsolated = true; st.Policies = nil }, 0, nil, true},
		{"subnet mode", func(st *pipeline.NodeState) { st.Mode = pipeline.ModeSubnet }, 0, nil, true},
		{"subnet mode, policies change", func(st *pipeline.NodeState) { st.Mode = pipeline.ModeSubnet; st.Policies = nil }, 0, nil, false},
		{"subnet mode, a conntrack flush follows", func(st *pipeline.NodeState) { st.Mode = pipeline.ModeSubnet; st.Policies = nil }, 2, nil, true},
	}
	for _, s := range steps {
		st := base()
		s.edit(&st)
		fail = s.failed
		before := purges
		purged, err := d.synced(context.Background(), st, s.flushing)
		if (err != nil) != (s.failed != nil) || purged != s.purged || (purges > before) != s.purged {
			t.Errorf("%s: purged %v (purges %d→%d), err %v; want purged %v, err %v", s.what, purged, before, purges, err, s.purged, s.failed)
		}
	}
}

// TestDatapathPurgerBeforeStartupFlush: an agent's first synced state, when it flushes entries held
// from before its start, purges; without a flush it only records the state.
func TestDatapathPurgerBeforeStartupFlush(t *testing.T) {
	for _, flushing := range []int{0, 1} {
		purges := 0
		d := &datapathPurger{purge: func(context.Context) error { purges++; return nil }}
		purged, err := d.synced(context.Background(), pipeline.NodeState{Mode: pipeline.ModeMultitenant}, flushing)
		if err != nil || purged != (flushing > 0) || purges != flushing {
			t.Errorf("first state, %d entries to flush: purged %v (%d purges), err %v", flushing, purged, purges, err)
		}
	}
}
