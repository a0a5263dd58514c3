package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/agent/attach"
	"github.com/ofsdn/ofsdn/agent/k8sobj"
	"github.com/ofsdn/ofsdn/agent/metrics"
	"github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/flows/pipeline"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
)

// TestRefusedOwnerDoesNotStopTheNode: an owner OVS refuses (a flow towards a group that does not
// exist) is injected into every render, while pods keep being added and must reach each other. The
// refused owner fails alone — reported, counted, retried with back-off — and every pod's ADD-style
// sync succeeds with its flows installed.
func TestRefusedOwnerDoesNotStopTheNode(t *testing.T) {
	b := ofbridge.New(t)
	ctx := context.Background()
	v := testView()
	v.update(func(v *nodeView) { v.pods = map[string]attach.Pod{} })
	fs := newFlowSync(v, reconcile.New(b.Switch, reconcile.Config{Round: 1, PipelineVersion: pipeline.PipelineVersion, VersionOf: pipeline.VersionOf}), flowSyncHooks{}, klog.Background())
	fs.metrics = metrics.New(nil)
	var reported []string
	fs.onFailure = func(o reconcile.Owner, fail *ownerFailure) {
		reported = append(reported, fmt.Sprintf("%s#%d", o, fail.attempts))
	}
	bad := reconcile.Owner{Category: reconcile.CategoryTest, Name: "refused"}
	fs.injected = map[reconcile.Owner]reconcile.OwnerState{bad: {Flows: []openflow.Flow{
		openflow.F(pipeline.TableServices, 100, openflow.M(append(openflow.TCP, openflow.IPDst(netip.MustParseAddr("172.30.0.9")), openflow.TCPDst(80))...),
			openflow.ToGroup{ID: 99})}}}
	now := time.Now()
	fs.clock = func() time.Time { return now }

	var pods []*ovstest.Pod
	for i := 0; i < 6; i++ {
		host := byte(10 + i)
		mac := net.HardwareAddr{0x0a, 0x58, 10, 128, 0, host}
		p := b.Inst.AddPod(ofbridge.Name, fmt.Sprint("p", i), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, host}), 23), mac, 20+i)
		pods = append(pods, p)
		gen := v.update(func(v *nodeView) {
			v.pods[k8sobj.PodKey("a", p.Name)] = attach.Pod{Namespace: "a", Name: p.Name, IP: p.IP.Addr(), MAC: mac, OFPort: uint32(p.OFPort)}
		})
		if _, err := fs.syncThrough(ctx, gen, pipeline.PodOwner("a", p.Name)); err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if i > 0 {
			if got, err := pods[0].Ping(p.IP.Addr(), 2, 100*time.Millisecond); got != 2 {
				t.Fatalf("%s → %s: %d/2 pings (%v)", pods[0].Name, p.Name, got, err)
			}
		}
		now = now.Add(700 * time.Millisecond) // retries come due as time passes
	}
	failing := fs.failingOwners()
	if err := failing[bad]; err == nil || !strings.Contains(err.Error(), "OFPBAC_BAD_OUT_GROUP") || len(failing) != 1 {
		t.Fatalf("failing owners %v; want only %s, refused with OFPBAC_BAD_OUT_GROUP", failing, bad)
	}
	if n := testutil.ToFloat64(fs.metrics.OwnerFailures.WithLabelValues("test")); n < 2 {
		t.Errorf("owner failures counted %v times, want retries counted too", n)
	}
	if g := testutil.ToFloat64(fs.metrics.FailingOwners); g != 1 {
		t.Errorf("failing owners gauge %v, want 1", g)
	}
	if len(reported) < 2 || reported[0] != bad.String()+"#1" {
		t.Errorf("reported failures %v; want %s reported and retried", reported, bad)
	}
	for _, l := range b.OfctlFlows(t) {
		if strings.Contains(l, "group:99") {
			t.Fatalf("the refused flow is on the bridge: %s", l)
		}
	}
	// The input is fixed: the owner goes, and nothing is left failing.
	fs.injected = nil
	if _, err := fs.syncNow(ctx); err != nil {
		t.Fatal(err)
	}
	if f := fs.failingOwners(); len(f) != 0 {
		t.Fatalf("still failing after the bad owner went: %v", f)
	}
}
