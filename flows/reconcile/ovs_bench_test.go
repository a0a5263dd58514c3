package reconcile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/ofsdn/ofsdn/flows/openflow"
	"github.com/ofsdn/ofsdn/internal/ofbridge"
	"github.com/ofsdn/ofsdn/internal/ovstest"
)

type benchBridge struct {
	inst *ovstest.Instance
	sw   Switch
	br   *ofbridge.Bridge
}

// installedBench is a bench bridge with n flows of 5-flow owners installed by a reconciler and settled,
// and one of the owners to change.
func installedBench(b *testing.B, n int) (*benchBridge, *Reconciler, map[Owner]*OwnerState, Owner) {
	br := newBenchBridge(b)
	r := New(br.sw, Config{Round: 1})
	owners := benchOwners(n, 5)
	var target Owner
	for o := range owners {
		target = o
	}
	if _, err := r.Apply(context.Background(), owners); err != nil {
		b.Fatal(err)
	}
	br.settle(b)
	return br, r, owners, target
}

func newBenchBridge(b *testing.B) *benchBridge {
	b.Helper()
	br := ofbridge.New(b)
	return &benchBridge{inst: br.Inst, sw: br.Switch, br: br}
}

// settle lets ovs-vswitchd finish what a big bundle left it to do after it answered the commit: for
// ~10 ms after a 50,000-flow install it answers nothing else (a barrier sent at once waited 5-9 ms),
// so a change timed right after the setup's install measures the install's aftermath, not the change.
func (br *benchBridge) settle(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	for range 2 {
		if err := br.br.Sess.Barrier(ctx); err != nil {
			b.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
			var text strings.Builder
			for o, st := range owners {
				for _, f := range st.Flows {
					fmt.Fprintf(&text, "cookie=%s,%s\n", MakeCookie(1, o), strings.ReplaceAll(f.String(), ", ", ","))
				}
			}
			file := filepath.Join(b.TempDir(), "flows.txt")
			if err := os.WriteFile(file, []byte(text.String()), 0o644); err != nil {
				b.Fatal(err)
			}
			var ours, theirs, inBundle time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				br.clear(b)
				start := time.Now()
				ts := &timedSwitch{Switch: br.sw}
				r := New(ts, Config{Round: 1})
				if _, err := r.Apply(ctx, owners); err != nil {
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
			b.ReportMetric(float64((ours-inBundle).Microseconds())/1000/float64(b.N), "ofsdn-outside-bundle-ms")
			b.ReportMetric(float64(inBundle.Microseconds())/1000/float64(b.N), "ofsdn-bundle-ms")
			b.ReportMetric(float64(ours)/float64(theirs), "ratio")
		})
	}
}

// BenchmarkChangeOneOwner: with 50,000 flows installed, one owner's 10 flows change (new VNID) and are
// synced (target < 1 ms, 10 flow-mods); then a no-op full resync from the switch (dump, decode, diff:
// target < 150 ms, zero flow-mods) and a no-op SyncAll against the reconciler's memory. The change is
// reported as a mean, median and maximum: one slow sample among a few (the switch or the garbage
// collector busy with what came before) shows as the maximum instead of deciding the mean alone.
func BenchmarkChangeOneOwner(b *testing.B) {
	ctx := context.Background()
	_, r, owners, target := installedBench(b, 50000)
	vnids := []uint32{6, 5}
	var change, resync, noop time.Duration
	changes := make([]time.Duration, 0, b.N)
	var changeMsgs, resyncMsgs, noopMsgs int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fl := benchOwnerFlows(owners[target].Flows, vnids[i%2])
		start := time.Now()
		res, err := r.Apply(ctx, map[Owner]*OwnerState{target: {Flows: fl}})
		if err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		change += took
		changes = append(changes, took)
		changeMsgs += res.Stats.Messages

		start = time.Now()
		res, err = r.Resync(ctx)
		if err != nil {
			b.Fatal(err)
		}
		resync += time.Since(start)
		resyncMsgs += res.Stats.Messages

		start = time.Now()
		res, err = r.syncAllFromMemory(ctx)
		if err != nil {
			b.Fatal(err)
		}
		noop += time.Since(start)
		noopMsgs += res.Stats.Messages
	}
	n := float64(b.N)
	slices.Sort(changes)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(change)/n, "change-10-flows-ms")
	b.ReportMetric(ms(changes[len(changes)/2]), "change-p50-ms")
	b.ReportMetric(ms(changes[len(changes)-1]), "change-max-ms")
	b.ReportMetric(float64(changeMsgs)/n, "change-flow-mods")
	b.ReportMetric(float64(resync.Microseconds())/1000/n, "resync-from-switch-ms")
	b.ReportMetric(float64(resyncMsgs)/n, "resync-flow-mods")
	b.ReportMetric(float64(noop.Microseconds())/1000/n, "noop-syncall-ms")
	b.ReportMetric(float64(noopMsgs)/n, "noop-flow-mods")
}

// benchOwnerFlows re-renders one bench owner's flows with another VNID.
func benchOwnerFlows(fl []Flow, vnid uint32) []Flow {
	out := make([]Flow, len(fl))
	for i, f := range fl {
		f.Actions = []Action{LoadReg(FieldReg0, vnid), Goto{Table: 30}}
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

// BenchmarkBareBundleRoundTrip times what a small change costs on OVS's side alone: with 11,000 flows
// on br0 (what BenchmarkPolicyPodRelabel in agent/ installs), a bundle of 10 pre-encoded flow-mods
// (one owner's flows, their VNID alternating, so each bundle really changes them) is sent through the
// session and timed from the open to the commit's reply, with no compiling, planning or bookkeeping of
// ours; and a bare barrier (one message and its reply) gives the round trip's floor. Percentiles over
// 200 bundles an iteration: the tail of a small change that OVS, not the agent, decides.
func BenchmarkBareBundleRoundTrip(b *testing.B) {
	ctx := context.Background()
	br, _, owners, target := installedBench(b, 11000)
	var bundles [2][][]byte // the target's flows with VNID 6, then 5
	for i, vnid := range []uint32{6, 5} {
		for _, f := range benchOwnerFlows(owners[target].Flows, vnid) {
			f.Cookie = uint64(MakeCookie(1, target))
			c, err := Compile(f)
			if err != nil {
				b.Fatal(err)
			}
			bundles[i] = append(bundles[i], AppendFlowMod(nil, &c, FlowModifyStrict, c.Cookie, ^uint64(0)))
		}
	}
	var bundle, barrier []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for i := range 200 {
			start := time.Now()
			if err := br.sw.Bundle(ctx, bundles[i%2]); err != nil {
				b.Fatal(err)
			}
			bundle = append(bundle, time.Since(start))
			start = time.Now()
			if err := br.br.Sess.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			barrier = append(barrier, time.Since(start))
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, m := range []struct {
		name string
		took []time.Duration
	}{{"bundle-10", bundle}, {"barrier", barrier}} {
		slices.Sort(m.took)
		b.ReportMetric(ms(m.took[len(m.took)/2]), m.name+"-p50-ms")
		b.ReportMetric(ms(m.took[len(m.took)*99/100]), m.name+"-p99-ms")
		b.ReportMetric(ms(m.took[len(m.took)-1]), m.name+"-max-ms")
	}
}
