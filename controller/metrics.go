package controller

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the controller's Prometheus metrics.
type Metrics struct {
	Allocations    *prometheus.CounterVec   // by kind: subnet, vnid, network-vni, network-subnet
	Errors         *prometheus.CounterVec   // sync errors by queue
	SyncDuration   *prometheus.HistogramVec // by queue
	IsLeader       prometheus.Gauge
	Networks       prometheus.Gauge // Networks holding a VNI
	NetworkSubnets prometheus.Gauge // NetworkSubnets' subnets allocated, over all Networks
	registry       *prometheus.Registry
}

// NewMetrics registers the metrics in reg (a fresh registry when nil).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		Allocations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_controller_allocations_total",
			Help: "Host subnets, VNIDs, Networks' VNIs and Networks' node subnets allocated."}, []string{"kind"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_controller_sync_errors_total",
			Help: "Failed syncs, retried with backoff."}, []string{"queue"}),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ofsdn_controller_sync_duration_seconds",
			Help: "Time to sync one object.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"queue"}),
		IsLeader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ofsdn_controller_is_leader", Help: "1 while this replica leads."}),
		Networks: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ofsdn_controller_networks",
			Help: "Networks holding a VNI (valid, or being deleted while pods are attached)."}),
		NetworkSubnets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ofsdn_controller_network_subnets",
			Help: "Node subnets allocated to Networks (one per NetworkSubnet)."}),
		registry: reg,
	}
	reg.MustRegister(m.Allocations, m.Errors, m.SyncDuration, m.IsLeader, m.Networks, m.NetworkSubnets,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves /metrics, /healthz (the process is alive) and /readyz (ready reports whether this
// replica is either allocating or standing by as a healthy follower).
func (m *Metrics) Handler(ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
