package cluster

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	networkv1 "github.com/ofsdn/ofsdn/apis/network/v1"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// BenchmarkKubeletPodSandbox: pod sandbox creation as kubelet sees it on a real node — containerd's
// RunPodSandbox, which runs the CNI ADD (the plugin, the agent's veth, address, OVS port and flows) —
// for 100 pods started 10 at a time on one node, the stand-in's BenchmarkCNIAdd's load. The figures
// are kubelet's own metric kubelet_runtime_operations_duration_seconds{operation_type="run_podsandbox"}:
// the mean exactly (sum/count), p50 and p99 interpolated within its buckets (as PromQL's
// histogram_quantile does; the buckets grow by 2.5x, so they are estimates). Also the time from
// creating a pod to its Ready condition as the API reports it (p50, p99 over the 100 pods).
func BenchmarkKubeletPodSandbox(b *testing.B) {
	c, ctx := startKubelets(b, Options{Kubelets: true, Mode: networkv1.PluginModeMultitenant})
	n := c.Nodes[0]
	if err := c.EnsureNamespace(ctx, "bench-kubelet"); err != nil {
		b.Fatal(err)
	}
	before, err := sandboxHistogram(ctx, c, n.Name)
	if err != nil {
		b.Fatal(err)
	}
	// The agent's metrics answer tokens allowed get on /metrics, as a Prometheus's would be.
	token, err := c.NodeAPIToken(ctx, "bench-prometheus", "ofsdn-metrics-reader")
	if err != nil {
		b.Fatal(err)
	}
	agentBefore, err := agentADDHistogram(ctx, n, token)
	if err != nil {
		b.Fatal(err)
	}
	var ready []time.Duration
	var mu sync.Mutex
	for b.Loop() {
		for batch := 0; batch < 10; batch++ {
			var wg sync.WaitGroup
			errs := make(chan error, 10)
			for i := 0; i < 10; i++ {
				wg.Go(func() {
					start := time.Now()
					if _, err := c.RunPod(ctx, PodSpec("bench-kubelet", fmt.Sprintf("p%d-%d", batch, i), n.Name)); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					ready = append(ready, time.Since(start))
					mu.Unlock()
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		}
		// The next iteration (make bench runs 3) starts the same 100 names on the node's addresses again:
		// delete these first, untimed. Deletion is kubelet's and the CNI DEL's, not what is measured.
		b.StopTimer()
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for batch := 0; batch < 10; batch++ {
			for i := 0; i < 10; i++ {
				wg.Go(func() {
					if err := c.DeletePod(ctx, "bench-kubelet", fmt.Sprintf("p%d-%d", batch, i)); err != nil {
						errs <- err
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	after, err := sandboxHistogram(ctx, c, n.Name)
	if err != nil {
		b.Fatal(err)
	}
	h := after.minus(before)
	agentAfter, err := agentADDHistogram(ctx, n, token)
	if err != nil {
		b.Fatal(err)
	}
	// The agent's own share of each sandbox: its CNI ADD, from its metrics (buckets double from 1 ms).
	a := agentAfter.minus(agentBefore)
	if a.count > 0 {
		b.ReportMetric(a.sum/a.count*1000, "agent-add-mean-ms")
		b.ReportMetric(a.quantile(0.5)*1000, "agent-add-p50-ms")
		b.ReportMetric(a.quantile(0.99)*1000, "agent-add-p99-ms")
	}
	if want := float64(100 * b.N); h.count < want {
		b.Fatalf("kubelet counted %v sandboxes, want the %v pods'", h.count, want)
	}
	b.ReportMetric(h.sum/h.count*1000, "sandbox-mean-ms")
	b.ReportMetric(h.quantile(0.5)*1000, "sandbox-p50-ms")
	b.ReportMetric(h.quantile(0.99)*1000, "sandbox-p99-ms")
	sort.Slice(ready, func(i, j int) bool { return ready[i] < ready[j] })
	b.ReportMetric(float64(ready[len(ready)/2])/1e6, "create-to-running-p50-ms")
	b.ReportMetric(float64(ready[int(float64(len(ready)-1)*0.99)])/1e6, "create-to-running-p99-ms")
	b.ReportMetric(h.count, "sandboxes")
}

// histogram is one Prometheus histogram: cumulative counts by upper bound.
type histogram struct {
	bounds     []float64
	cumulative []float64
	sum, count float64
}

func (h histogram) minus(o histogram) histogram {
	out := histogram{bounds: h.bounds, cumulative: make([]float64, len(h.cumulative)), sum: h.sum - o.sum, count: h.count - o.count}
	for i := range h.cumulative {
		out.cumulative[i] = h.cumulative[i]
		if i < len(o.cumulative) {
			out.cumulative[i] -= o.cumulative[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket the rank falls in, as histogram_quantile does.
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	lower, prev := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.cumulative[i] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			in := h.cumulative[i] - prev
			if in == 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-prev)/in
		}
		lower, prev = ub, h.cumulative[i]
	}
	return lower
}

// agentADDHistogram reads the agent's ofsdn_agent_cni_request_duration_seconds{verb="ADD",result="ok"}
// from its metrics address (the DaemonSet's :9101, on the node's address, over TLS, for a token allowed
// get on /metrics).
func agentADDHistogram(ctx context.Context, n *Node, token string) (histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:9101/metrics", n.IP), nil)
	if err != nil {
		return histogram{}, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := AgentHTTPClient(30 * time.Second).Do(req)
	if err != nil {
		return histogram{}, fmt.Errorf("agent metrics of %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return histogram{}, fmt.Errorf("agent metrics of %s: %s", n.Name, resp.Status)
	}
	return readHistogram(resp.Body, "ofsdn_agent_cni_request_duration_seconds", map[string]string{"verb": "ADD", "result": "ok"})
}

// readHistogram finds the histogram of the family with the given labels in a Prometheus text page; a
// missing one is empty.
func readHistogram(r io.Reader, family string, labels map[string]string) (histogram, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return histogram{}, err
	}
	fam := families[family]
	if fam == nil {
		return histogram{}, nil
	}
	for _, m := range fam.Metric {
		match := 0
		for _, l := range m.Label {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(labels) || m.Histogram == nil {
			continue
		}
		h := histogram{sum: m.Histogram.GetSampleSum(), count: float64(m.Histogram.GetSampleCount())}
		for _, bk := range m.Histogram.Bucket {
			h.bounds = append(h.bounds, bk.GetUpperBound())
			h.cumulative = append(h.cumulative, float64(bk.GetCumulativeCount()))
		}
		h.bounds = append(h.bounds, math.Inf(1))
		h.cumulative = append(h.cumulative, h.count)
		return h, nil
	}
	return histogram{}, nil
}

// sandboxHistogram reads kubelet's run_podsandbox histogram from the node's /metrics, through the API
// server's node proxy.
func sandboxHistogram(ctx context.Context, c *Cluster, node string) (histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics").DoRaw(ctx)
	if err != nil {
		return histogram{}, fmt.Errorf("kubelet metrics of %s: %w", node, err)
	}
	return readHistogram(strings.NewReader(string(raw)), "kubelet_runtime_operations_duration_seconds",
		map[string]string{"operation_type": "run_podsandbox"})
}

func TestHistogramQuantile(t *testing.T) {
	// 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.2], 2 in (0.2, 0.5].
	h := histogram{bounds: []float64{0.1, 0.2, 0.5, math.Inf(1)}, cumulative: []float64{4, 8, 10, 10}, sum: 1.7, count: 10}
	for _, tc := range []struct{ q, want float64 }{{0.2, 0.05}, {0.5, 0.125}, {0.9, 0.35}, {1, 0.5}} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	d := h.minus(histogram{bounds: h.bounds, cumulative: []float64{2, 2, 2, 2}, sum: 0.1, count: 2})
	if d.count != 8 || d.cumulative[0] != 2 || math.Abs(d.sum-1.6) > 1e-9 {
		t.Errorf("minus: %+v", d)
	}
}
