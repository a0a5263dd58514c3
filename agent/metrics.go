package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the agent's Prometheus metrics.
type Metrics struct {
	// OwnerFailures counts owners whose flows could not be installed, by category (pod, svc, ...).
	OwnerFailures *prometheus.CounterVec
	// FailingOwners is how many owners keep their last good flows right now, waiting for a retry.
	FailingOwners prometheus.Gauge
	Registry      *prometheus.Registry
}

// NewMetrics registers the agent's metrics in reg (a fresh registry when nil).
func NewMetrics(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		OwnerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_owner_failures_total",
			Help: "Owners whose new flows could not be rendered or installed (each keeps its last good flows and is retried)."},
			[]string{"category"}),
		FailingOwners: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ofsdn_agent_failing_owners",
			Help: "Owners currently failing: their flows are the last good ones, not what the cluster asks for."}),
		Registry: reg,
	}
	reg.MustRegister(m.OwnerFailures, m.FailingOwners)
	return m
}
