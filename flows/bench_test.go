package flows

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
)

// benchOwners renders n flows as n/10 owners of 10 flows each, shaped like pod flows.
func benchOwners(n int, vnid uint32) map[Owner][]Flow {
	out := make(map[Owner][]Flow, n/10)
	for o := 0; o < n/10; o++ {
		owner := PodOwner("bench", fmt.Sprint("pod-", o))
		fl := make([]Flow, 0, 10)
		for i := 0; i < 10; i++ {
			k := o*10 + i
			ip := netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)})
			fl = append(fl, F(TablePodIngress, 100, M(append(IP, InPort(uint32(10+o)), IPSrc(ip))...),
				LoadReg(RegSrcVNID, vnid), Goto{TableConntrack}))
		}
		out[owner] = fl
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
		r := NewReconciler(nopSwitch{}, ReconcilerConfig{Round: 1})
		for o, fl := range benchOwners(50000, 5) {
			if err := r.SetDesired(o, fl, nil); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := r.SyncAll(context.Background()); err != nil {
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
	r := NewReconciler(nopSwitch{}, ReconcilerConfig{Round: 1})
	for o, fl := range benchOwners(50000, 5) {
		if err := r.SetDesired(o, fl, nil); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := r.SyncAll(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var msgs int
	for i := 0; i < b.N; i++ {
		st, err := r.SyncAll(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		msgs += st.Messages
	}
	b.ReportMetric(float64(msgs)/float64(b.N), "flow-mods/op")
}

// nopSwitch accepts every bundle: it isolates the reconciler's own cost.
type nopSwitch struct{}

func (nopSwitch) Bundle(context.Context, [][]byte) error { return nil }
func (nopSwitch) DumpFlows(context.Context, uint64, uint64) ([][]byte, error) {
	return nil, nil
}
func (nopSwitch) DumpGroups(context.Context) ([][]byte, error) { return nil, nil }

// BenchmarkCompileFlow: encoding one pod-shaped flow to its wire form.
func BenchmarkCompileFlow(b *testing.B) {
	f := benchOwners(10, 5)
	var one Flow
	for _, fl := range f {
		one = fl[0]
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := compileFlow(one); err != nil {
			b.Fatal(err)
		}
	}
}
