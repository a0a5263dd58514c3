package cni

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// BenchmarkPluginRoundTrip is the floor under every CNI ADD: libcni execs the real plugin binary, which
// asks a server whose handler does nothing. 100 ADDs run 10 at a time (as e2e's BenchmarkCNIAdd) and one
// at a time; the gap is what exec'ing ten Go processes at once costs on this machine's cores.
func BenchmarkPluginRoundTrip(b *testing.B) {
	binDir, err := buildPlugin()
	if err != nil {
		b.Fatal(err)
	}
	socket := startServer(b, &recorder{})
	list, err := libcni.ConfListFromBytes(conflist(socket))
	if err != nil {
		b.Fatal(err)
	}
	cniConf := libcni.NewCNIConfigWithCacheDir([]string{binDir}, b.TempDir(), nil)
	for _, parallel := range []int{1, 10} {
		b.Run(fmt.Sprintf("parallel=%d", parallel), func(b *testing.B) {
			var all []time.Duration
			for b.Loop() {
				lat := make([]time.Duration, 100)
				errs := make([]error, 100)
				for batch := 0; batch < 100/parallel; batch++ {
					var wg sync.WaitGroup
					for j := range parallel {
						i := batch*parallel + j
						wg.Go(func() {
							start := time.Now()
							_, errs[i] = cniConf.AddNetworkList(context.Background(), list, runtimeConf(fmt.Sprintf("bench%d", i)))
							lat[i] = time.Since(start)
						})
					}
					wg.Wait()
				}
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
				all = append(all, lat...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(all[len(all)*99/100])/1e6, "p99-ms")
		})
	}
}
