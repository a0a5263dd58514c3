// Package metrics is the agent's Prometheus metrics (README, "The agent's metrics and health"):
// counters and histograms updated where things happen (the flow loop's syncs through ObserveSync, the
// bundles through Switch, the CNI verbs through CNIHandler), and the gauges of the node's state read
// at scrape time from the agent (StateCollector).
package metrics

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/ofsdn/ofsdn/cni"
	"github.com/ofsdn/ofsdn/flows/reconcile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// The triggers of the flow loop's drift checks, the label values of DriftChecks and DriftRepairs.
const (
	DriftPeriodic  = "periodic"
	DriftReconnect = "reconnect"
)

// Metrics are the agent's Prometheus metrics (README lists them). Counters and histograms are updated
// where things happen; the gauges of the node's state (flows and groups per category, pods, remote
// nodes, services, OVS sessions) are read at scrape time from the agent (see StateCollector).
type Metrics struct {
	// OwnerFailures counts owners whose flows could not be installed, by category (pod, svc, ...).
	OwnerFailures *prometheus.CounterVec
	// FailingOwners is how many owners keep their last good flows right now, waiting for a retry.
	FailingOwners prometheus.Gauge
	// SyncDuration is how long a flow sync that sent something took, render to switch acknowledgement,
	// by kind: apply (a change), resync (a drift check), round (finishing a restart).
	SyncDuration *prometheus.HistogramVec
	// FlowMods and GroupMods count the flow-mods and group-mods the switch accepted, by op (add, modify,
	// delete).
	FlowMods, GroupMods *prometheus.CounterVec
	// Bundles counts the bundles the switch committed; BundleFailures those it refused or that failed.
	Bundles, BundleFailures prometheus.Counter
	// DriftChecks counts full comparisons of the bridge with the desired state, by trigger (periodic,
	// reconnect); DriftRepairs the flow-mods and group-mods they sent to repair what differed.
	DriftChecks, DriftRepairs *prometheus.CounterVec
	// CNIRequests and CNIDuration count and time the CNI verbs, by verb and result ("ok", or the CNI
	// error code the plugin got).
	CNIRequests *prometheus.CounterVec
	CNIDuration *prometheus.HistogramVec
	Registry    *prometheus.Registry
}

// New registers the agent's metrics in reg (a fresh registry when nil).
func New(reg *prometheus.Registry) *Metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		OwnerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_owner_failures_total",
			Help: "Owners whose new flows could not be rendered or installed (each keeps its last good flows and is retried)."},
			[]string{"category"}),
		FailingOwners: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ofsdn_agent_failing_owners",
			Help: "Owners currently failing: their flows are the last good ones, not what the cluster asks for."}),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ofsdn_agent_sync_duration_seconds",
			Help:    "Flow syncs that sent something: render, diff and bundle until the switch acknowledged it, by kind (apply, resync, round).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"kind"}),
		FlowMods: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_flow_mods_total",
			Help: "Flow-mods the switch accepted, by op (add, modify, delete)."}, []string{"op"}),
		GroupMods: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_group_mods_total",
			Help: "Group-mods the switch accepted, by op (add, modify, delete)."}, []string{"op"}),
		Bundles: prometheus.NewCounter(prometheus.CounterOpts{Name: "ofsdn_agent_bundles_total",
			Help: "OpenFlow bundles the switch committed."}),
		BundleFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "ofsdn_agent_bundle_failures_total",
			Help: "OpenFlow bundles the switch refused or that could not be sent (nothing of them was installed)."}),
		DriftChecks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_drift_checks_total",
			Help: "Full comparisons of the bridge with the desired state, by trigger (periodic, reconnect)."}, []string{"trigger"}),
		DriftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_drift_repairs_total",
			Help: "Flow-mods and group-mods sent to repair drift (entries changed or removed behind the agent's back), by trigger."},
			[]string{"trigger"}),
		CNIRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ofsdn_agent_cni_requests_total",
			Help: "CNI requests served, by verb and result (ok, or the CNI error code returned)."}, []string{"verb", "result"}),
		CNIDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ofsdn_agent_cni_request_duration_seconds",
			Help:    "Time to serve a CNI request in the agent, by verb and result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"verb", "result"}),
		Registry: reg,
	}
	for _, trigger := range []string{DriftPeriodic, DriftReconnect} {
		m.DriftChecks.WithLabelValues(trigger)
		m.DriftRepairs.WithLabelValues(trigger)
	}
	reg.MustRegister(m.OwnerFailures, m.FailingOwners, m.SyncDuration, m.FlowMods, m.GroupMods, m.Bundles, m.BundleFailures,
		m.DriftChecks, m.DriftRepairs, m.CNIRequests, m.CNIDuration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ObserveSync records what one sync sent, by kind (apply, resync, round).
func (m *Metrics) ObserveSync(kind string, st reconcile.SyncStats, took time.Duration) {
	if m == nil || st.Messages == 0 {
		return
	}
	m.SyncDuration.WithLabelValues(kind).Observe(took.Seconds())
	for op, n := range map[string]int{"add": st.FlowAdds, "modify": st.FlowModifies, "delete": st.FlowDeletes} {
		m.FlowMods.WithLabelValues(op).Add(float64(n))
	}
	for op, n := range map[string]int{"add": st.GroupAdds, "modify": st.GroupModifies, "delete": st.GroupDeletes} {
		m.GroupMods.WithLabelValues(op).Add(float64(n))
	}
}

// Switch counts the bundles a reconciler sends through it.
type Switch struct {
	reconcile.Switch
	M *Metrics
}

func (s Switch) Bundle(ctx context.Context, msgs [][]byte) error {
	err := s.Switch.Bundle(ctx, msgs)
	if s.M != nil {
		if err != nil {
			s.M.BundleFailures.Inc()
		} else {
			s.M.Bundles.Inc()
		}
	}
	return err
}

// CNIHandler counts and times the CNI verbs the agent serves.
type CNIHandler struct {
	cni.Handler
	M *Metrics
}

func (h CNIHandler) observe(verb cni.Command, start time.Time, err error) {
	result := "ok"
	var ce *types.Error
	switch {
	case err == nil:
	case errors.As(err, &ce):
		result = strconv.FormatUint(uint64(ce.Code), 10)
	case verb == cni.CmdStatus:
		result = strconv.FormatUint(uint64(cni.ErrPluginNotAvailable), 10) // the server's code for a STATUS error
	default:
		result = strconv.FormatUint(uint64(cni.ErrInternal), 10)
	}
	h.M.CNIRequests.WithLabelValues(string(verb), result).Inc()
	h.M.CNIDuration.WithLabelValues(string(verb), result).Observe(time.Since(start).Seconds())
}

func (h CNIHandler) Add(ctx context.Context, req *cni.Request) (*current.Result, error) {
	start := time.Now()
	res, err := h.Handler.Add(ctx, req)
	h.observe(cni.CmdAdd, start, err)
	return res, err
}

func (h CNIHandler) Del(ctx context.Context, req *cni.Request) error {
	start := time.Now()
	err := h.Handler.Del(ctx, req)
	h.observe(cni.CmdDel, start, err)
	return err
}

func (h CNIHandler) Check(ctx context.Context, req *cni.Request) error {
	start := time.Now()
	err := h.Handler.Check(ctx, req)
	h.observe(cni.CmdCheck, start, err)
	return err
}

func (h CNIHandler) Status(ctx context.Context) error {
	start := time.Now()
	err := h.Handler.Status(ctx)
	h.observe(cni.CmdStatus, start, err)
	return err
}

func (h CNIHandler) GC(ctx context.Context, valid []cni.Attachment) error {
	start := time.Now()
	err := h.Handler.GC(ctx, valid)
	h.observe(cni.CmdGC, start, err)
	return err
}

// NodeCounts is what the state gauges report, read from the agent at scrape time.
type NodeCounts struct {
	Flows, Groups               map[reconcile.Category]int
	Pods, RemoteNodes, Services int
	OpenFlowUp, OVSDBUp         bool
	OpenFlowConnections         int // the first connection and every reconnection
	Ready                       bool
}

// StateCollector reports the node's state gauges from a snapshot function.
type StateCollector struct {
	read                                                         func() NodeCounts
	flows, groups, pods, remote, services, ovsUp, ofConns, ready *prometheus.Desc
}

// NewStateCollector reads the gauges with read at each scrape.
func NewStateCollector(read func() NodeCounts) *StateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &StateCollector{read: read,
		flows:    d("ofsdn_agent_flows", "Desired flows on the bridge, by owner category.", "category"),
		groups:   d("ofsdn_agent_groups", "Desired groups on the bridge, by owner category.", "category"),
		pods:     d("ofsdn_agent_pods", "Pods attached to this node's bridge."),
		remote:   d("ofsdn_agent_remote_nodes", "Other nodes this node tunnels to."),
		services: d("ofsdn_agent_services", "Services this node load-balances."),
		ovsUp:    d("ofsdn_agent_ovs_session_up", "1 while the agent's session to Open vSwitch is up, by session (openflow, ovsdb).", "session"),
		ofConns:  d("ofsdn_agent_openflow_connections_total", "OpenFlow connections established to the bridge: the first and every reconnection."),
		ready:    d("ofsdn_agent_ready", "1 once the agent is ready (first full sync done, CNI server listening, OVS sessions up)."),
	}
}

func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.flows, c.groups, c.pods, c.remote, c.services, c.ovsUp, c.ofConns, c.ready} {
		ch <- d
	}
}

func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.read()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for cat, v := range n.Flows {
		ch <- prometheus.MustNewConstMetric(c.flows, prometheus.GaugeValue, float64(v), cat.String())
	}
	for cat, v := range n.Groups {
		ch <- prometheus.MustNewConstMetric(c.groups, prometheus.GaugeValue, float64(v), cat.String())
	}
	ch <- prometheus.MustNewConstMetric(c.pods, prometheus.GaugeValue, float64(n.Pods))
	ch <- prometheus.MustNewConstMetric(c.remote, prometheus.GaugeValue, float64(n.RemoteNodes))
	ch <- prometheus.MustNewConstMetric(c.services, prometheus.GaugeValue, float64(n.Services))
	ch <- prometheus.MustNewConstMetric(c.ovsUp, prometheus.GaugeValue, b(n.OpenFlowUp), "openflow")
	ch <- prometheus.MustNewConstMetric(c.ovsUp, prometheus.GaugeValue, b(n.OVSDBUp), "ovsdb")
	ch <- prometheus.MustNewConstMetric(c.ofConns, prometheus.CounterValue, float64(n.OpenFlowConnections))
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, b(n.Ready))
}
