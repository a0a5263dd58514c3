package flows

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ofsdn/ofsdn/internal/ovstest"
	"github.com/ofsdn/ofsdn/ofswitch"
)

type benchBridge struct {
	inst *ovstest.Instance
	sw   Switch
}

func newBenchBridge(b *testing.B) *benchBridge {
	b.Helper()
	inst := ovstest.Start(b)
	inst.AddBridge("br0")
	sess, err := ofswitch.Dial(context.Background(), ofswitch.Config{Socket: inst.MgmtSocket("br0"), Bridge: "br0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sess.Close() })
	return &benchBridge{inst: inst, sw: ofswitch.FlowsSwitch(sess)}
}

// ofctl runs ovs-ofctl from the root namespace (the management socket is reachable from there), so
// its timing carries no `ip netns exec` overhead.
func (br *benchBridge) ofctl(b *testing.B, args ...string) {
	b.Helper()
	full := append([]string{"-O", "OpenFlow13"}, args...)
	if out, err := exec.Command("ovs-ofctl", full...).CombinedOutput(); err != nil {
		b.Fatalf("ovs-ofctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (br *benchBridge) clear(b *testing.B) {
	br.ofctl(b, "del-flows", "unix:"+br.inst.MgmtSocket("br0"))
}

// BenchmarkInstallVsOvsOfctl installs N pod-shaped flows into an empty bridge through the reconciler
// (typed flows compiled and sent as one bundle over our session) and, in the same run on the same
// bridge, the same flows as text through `ovs-ofctl --bundle add-flows`, the exec approach ofsdn
// replaces. Target: ofsdn ≤ 0.6× ovs-ofctl.
func BenchmarkInstallVsOvsOfctl(b *testing.B) {
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprintf("flows=%d", n), func(b *testing.B) {
			br := newBenchBridge(b)
			ctx := context.Background()
			owners := benchOwners(n, 5)
			batch := make(map[Owner]OwnerState, len(owners))
			for o, fl := range owners {
				batch[o] = OwnerState{Flows: fl}
			}
			var text strings.Builder
			for o, fl := range owners {
				for _, f := range fl {
					fmt.Fprintf(&text, "cookie=%s,%s\n", MakeCookie(1, o), strings.ReplaceAll(f.String(), ", ", ","))
				}
			}
			file := filepath.Join(b.TempDir(), "flows.txt")
			if err := os.WriteFile(file, []byte(text.String()), 0o644); err != nil {
				b.Fatal(err)
			}
			var ours, theirs, compile, inBundle time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				br.clear(b)
				start := time.Now()
				ts := &timedSwitch{Switch: br.sw}
				r := NewReconciler(ts, ReconcilerConfig{Round: 1})
				if err := r.SetDesiredBatch(batch); err != nil {
					b.Fatal(err)
				}
				compile += time.Since(start)
				if _, err := r.SyncAll(ctx); err != nil {
					b.Fatal(err)
				}
				ours += time.Since(start)
				inBundle += ts.spent

				br.clear(b)
				start = time.Now()
				br.ofctl(b, "--bundle", "add-flows", "unix:"+br.inst.MgmtSocket("br0"), file)
				theirs += time.Since(start)
			}
			b.ReportMetric(float64(ours.Microseconds())/1000/float64(b.N), "ofsdn-ms")
			b.ReportMetric(float64(theirs.Microseconds())/1000/float64(b.N), "ovs-ofctl-ms")
			b.ReportMetric(float64(compile.Microseconds())/1000/float64(b.N), "ofsdn-compile-ms")
			b.ReportMetric(float64(inBundle.Microseconds())/1000/float64(b.N), "ofsdn-bundle-ms")
			b.ReportMetric(float64(ours)/float64(theirs), "ratio")
		})
	}
}

// BenchmarkChangeOneOwner: with 50,000 flows installed, one owner's 10 flows change (new VNID) and are
// synced (target < 5 ms, 10 flow-mods); then a no-op full resync from the switch (dump, decode, diff:
// target < 150 ms, zero flow-mods) and a no-op SyncAll against the reconciler's memory.
func BenchmarkChangeOneOwner(b *testing.B) {
	br := newBenchBridge(b)
	ctx := context.Background()
	r := NewReconciler(br.sw, ReconcilerConfig{Round: 1, PipelineVersion: PipelineVersion})
	owners := benchOwners(50000, 5)
	var target Owner
	for o, fl := range owners {
		if err := r.SetDesired(o, fl, nil); err != nil {
			b.Fatal(err)
		}
		target = o
	}
	if err := r.SetDesired(PipelineOwner, RenderBase(), nil); err != nil {
		b.Fatal(err)
	}
	if _, err := r.SyncAll(ctx); err != nil {
		b.Fatal(err)
	}
	vnids := []uint32{6, 5}
	var change, resync, noop time.Duration
	var changeMsgs, resyncMsgs, noopMsgs int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fl := benchOwnerFlows(target, owners[target], vnids[i%2])
		start := time.Now()
		if err := r.SetDesired(target, fl, nil); err != nil {
			b.Fatal(err)
		}
		st, err := r.SyncOwners(ctx, target)
		if err != nil {
			b.Fatal(err)
		}
		change += time.Since(start)
		changeMsgs += st.Messages

		start = time.Now()
		st, err = r.ResyncFromSwitch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		resync += time.Since(start)
		resyncMsgs += st.Messages

		start = time.Now()
		st, err = r.SyncAll(ctx)
		if err != nil {
			b.Fatal(err)
		}
		noop += time.Since(start)
		noopMsgs += st.Messages
	}
	n := float64(b.N)
	b.ReportMetric(float64(change.Microseconds())/1000/n, "change-10-flows-ms")
	b.ReportMetric(float64(changeMsgs)/n, "change-flow-mods")
	b.ReportMetric(float64(resync.Microseconds())/1000/n, "resync-from-switch-ms")
	b.ReportMetric(float64(resyncMsgs)/n, "resync-flow-mods")
	b.ReportMetric(float64(noop.Microseconds())/1000/n, "noop-syncall-ms")
	b.ReportMetric(float64(noopMsgs)/n, "noop-flow-mods")
}

// benchOwnerFlows re-renders one bench owner's flows with another VNID.
func benchOwnerFlows(o Owner, fl []Flow, vnid uint32) []Flow {
	out := make([]Flow, len(fl))
	for i, f := range fl {
		f.Actions = []Action{LoadReg(RegSrcVNID, vnid), Goto{TableConntrack}}
		out[i] = f
	}
	return out
}

// timedSwitch measures the time spent inside Bundle: the switch's share of a sync.
type timedSwitch struct {
	Switch
	spent time.Duration
}

func (t *timedSwitch) Bundle(ctx context.Context, msgs [][]byte) error {
	start := time.Now()
	err := t.Switch.Bundle(ctx, msgs)
	t.spent += time.Since(start)
	return err
}
