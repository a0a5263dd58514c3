package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	. "github.com/ofsdn/ofsdn/flows/openflow"
)

// benchOwners renders n flows as n/10 owners of 10 flows each, shaped like pod flows.
func benchOwners(n int, vnid uint32) map[Owner]*OwnerState {
	out := make(map[Owner]*OwnerState, n/10)
	for o := 0; o < n/10; o++ {
		fl := make([]Flow, 0, 10)
		for i := 0; i < 10; i++ {
			k := o*10 + i
			ip := netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)})
			fl = append(fl, F(20, 100, M(append(IP, InPort(uint32(10+o)), IPSrc(ip))...), LoadReg(FieldReg0, vnid), Goto{Table: 30}))
		}
		out[Owner{Category: CategoryPod, Name: fmt.Sprint("bench/pod-", o)}] = &OwnerState{Flows: fl}
	}
	return out
}

// BenchmarkReconcilerHeap reports the Go heap held by a reconciler with 50,000 desired and installed
// flows (target < 60 MB).
func BenchmarkReconcilerHeap(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		r := New(nopSwitch{}, Config{Round: 1})
		if _, err := r.Apply(context.Background(), benchOwners(50000, 5)); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1e6, "heap-MB")
		runtime.KeepAlive(r)
	}
}

// BenchmarkReconcilerNoopSyncAll: a full diff of 50,000 flows against what is installed (target <
// 150 ms, zero flow-mods).
func BenchmarkReconcilerNoopSyncAll(b *testing.B) {
	r := New(nopSwitch{}, Config{Round: 1})
	if _, err := r.Apply(context.Background(), benchOwners(50000, 5)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var msgs int
	for i := 0; i < b.N; i++ {
		res, err := r.syncAllFromMemory(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		msgs += res.Stats.Messages
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "flow-mods/op")
}

// syncAllFromMemory is a full diff against what the reconciler believes is installed, without
// re-reading the switch: the diff's own cost.
func (r *Reconciler) syncAllFromMemory(ctx context.Context) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Failed: map[Owner]error{}}
	return res, r.syncLocked(ctx, nil, false, &res)
}

// nopSwitch accepts every bundle: it isolates the reconciler's own cost.
type nopSwitch struct{}

func (nopSwitch) Bundle(context.Context, [][]byte) error { return nil }
func (nopSwitch) DumpFlows(context.Context, uint64, uint64) ([][]byte, error) {
	return nil, nil
}
func (nopSwitch) DumpGroups(context.Context) ([][]byte, error) { return nil, nil }

// BenchmarkApplyOwnSide is the reconciler's own share of the two syncs BenchmarkInstallVsOvsOfctl and
// BenchmarkChangeOneOwner time against OVS (compile, stage, plan, lay out the bundle, record it),
// with a switch that accepts everything at once: its time and allocations are what the Go side costs.
func BenchmarkApplyOwnSide(b *testing.B) {
	ctx := context.Background()
	b.Run("install-10k-flows", func(b *testing.B) {
		owners := benchOwners(10000, 5)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(nopSwitch{}, Config{Round: 1}).Apply(ctx, owners); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("change-10-of-50k-flows", func(b *testing.B) {
		r := New(nopSwitch{}, Config{Round: 1})
		owners := benchOwners(50000, 5)
		if _, err := r.Apply(ctx, owners); err != nil {
			b.Fatal(err)
		}
		var target Owner
		for o := range owners {
			target = o
		}
		changed := []*OwnerState{{Flows: benchOwnerFlows(owners[target].Flows, 6)}, {Flows: benchOwnerFlows(owners[target].Flows, 5)}}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := r.Apply(ctx, map[Owner]*OwnerState{target: changed[i%2]}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
