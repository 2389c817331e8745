package exporter

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"sluice/exporter/attribution"
	"sluice/exporter/connstore"
	"sluice/exporter/queue"
)

type metrics struct {
	open, ended  prometheus.Gauge
	seen         prometheus.Gauge
	storeDrops   prometheus.Counter
	records      [4]prometheus.Counter // by end reason
	lastRecords  [4]uint64
	lastDropped  uint64
	bufferDrops  prometheus.Counter
	polls        prometheus.Counter
	pollErrors   prometheus.Counter
	pollSeconds  prometheus.Histogram
	transport    queue.SenderMetrics
	encodeErrors prometheus.Counter
	// Attribution.
	deniedRecords, deniedDrops, disagreements prometheus.Counter
	// Late naming (latename.go).
	lateNames                                        prometheus.Counter
	held                                             prometheus.Gauge
	unnamedTimeout, unnamedHeldFull, unnamedShutdown prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, q *queue.Queue, a *attribution.Attributor) *metrics {
	conns := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_exporter_connections",
		Help: "Connections in the store: open, or ended (exported with END_OF_FLOW, kept until they leave the conntrack table)."}, []string{"state"})
	records := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_exporter_records_total",
		Help: "Flow records produced, by end reason (idle, active, end_of_flow)."}, []string{"reason"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_exporter_records_dropped_total",
		Help: "Flow records lost: buffer-full (the aggregator fell a whole buffer behind), encode-error."}, []string{"reason"})
	m := &metrics{
		open:  conns.WithLabelValues("open"),
		ended: conns.WithLabelValues("ended"),
		seen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_exporter_source_connections",
			Help: "Connections of this Node's Pods in the last snapshot of the connection table."}),
		storeDrops: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_connections_dropped_total",
			Help: "Polls of connections that were not tracked because the store was full (--max-connections)."}),
		bufferDrops:  dropped.WithLabelValues("buffer-full"),
		encodeErrors: dropped.WithLabelValues("encode-error"),
		polls: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_polls_total",
			Help: "Polls of the connection table."}),
		pollErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_poll_errors_total",
			Help: "Polls that failed to read the connection table."}),
		pollSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_exporter_poll_duration_seconds",
			Help: "Time of one poll: read the table, update the store, queue the records.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9)}),
	}
	for i, r := range []string{"", "idle", "active", "end_of_flow"} {
		if i > 0 {
			m.records[i] = records.WithLabelValues(r)
		}
	}
	m.transport = queue.SenderMetrics{
		Sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_records_exported_total",
			Help: "Flow records written to the aggregator."}),
		EncodeErrors: m.encodeErrors,
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_exporter_connected",
			Help: "1 while connected to the aggregator."}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_reconnects_total",
			Help: "Connections to the aggregator made after the first."}),
		ConnectFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_connection_failures_total",
			Help: "Failed attempts to connect to the aggregator."}),
		Resent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_records_resent_total",
			Help: "Flow records written again because the aggregator had not confirmed them when the connection broke (gRPC): at most that many duplicates."}),
	}
	m.lateNames = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_late_names_total",
		Help: "Local Pods named after their connection was first seen (the metadata source learnt the Pod's IP later): at a later poll, or while the connection's final record was held back."})
	m.held = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_exporter_held_records",
		Help: "Final records held back for a local Pod the metadata source does not know yet."})
	unnamed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_exporter_unnamed_records_total",
		Help: "Final records written without the local Pod name they waited for: timeout (still unknown when the wait ended), held-full (not held: too many held already), shutdown (still held when the exporter stopped)."}, []string{"reason"})
	m.unnamedTimeout, m.unnamedHeldFull, m.unnamedShutdown = unnamed.WithLabelValues("timeout"),
		unnamed.WithLabelValues("held-full"), unnamed.WithLabelValues("shutdown")
	m.deniedDrops = dropped.WithLabelValues("denied-rate")
	m.deniedRecords = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_denied_records_total",
		Help: "Records of denied connections (unanswered, and dropped or rejected by a policy in the model), before the rate limit."})
	m.disagreements = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_exporter_attribution_disagreements_total",
		Help: "Connections the model denies that were answered: the model and the datapath disagree (the denying rule is not exported)."})
	if a != nil {
		stat := func(name, help string, get func(attribution.Stats) float64, counter bool) prometheus.Collector {
			f := func() float64 { return get(a.Stats()) }
			if counter {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
			}
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
		}
		reg.MustRegister(m.deniedRecords, m.disagreements,
			stat("sluice_exporter_attribution_cache_hits_total", "Verdicts answered from the attribution cache.",
				func(s attribution.Stats) float64 { return float64(s.Hits) }, true),
			stat("sluice_exporter_attribution_computed_total", "Verdicts computed by running the datapath model.",
				func(s attribution.Stats) float64 { return float64(s.Computed) }, true),
			stat("sluice_exporter_attribution_errors_total", "Connections the model could not run (no attribution).",
				func(s attribution.Stats) float64 { return float64(s.Errors) }, true),
			stat("sluice_exporter_attribution_cache_evictions_total", "Verdicts dropped from the full attribution cache.",
				func(s attribution.Stats) float64 { return float64(s.Evicted) }, true),
			stat("sluice_exporter_attribution_cache_entries", "Verdicts in the attribution cache.",
				func(s attribution.Stats) float64 { return float64(s.Entries) }, false),
			stat("sluice_exporter_attribution_generation", "Generation of the policy model (one more each time the cluster state changed).",
				func(s attribution.Stats) float64 { return float64(s.Generation) }, false),
			stat("sluice_exporter_attribution_load_errors_total", "Loads of the policy model that failed (state not readable or not modelled); the previous model stayed.",
				func(s attribution.Stats) float64 { return float64(s.LoadErrors) }, true),
			stat("sluice_exporter_attribution_catch_ups_total", "Waits for a load of the policy model (successful or not) because the cluster state had changed since its last load: at a poll's start, or for a connection the model denied though it was answered.",
				func(s attribution.Stats) float64 { return float64(s.CatchUps) }, true),
			stat("sluice_exporter_attribution_catch_up_timeouts_total", "Of those, the loads not done within the poll's wait (the poll went on with the previous model).",
				func(s attribution.Stats) float64 { return float64(s.CatchUpTimeouts) }, true),
			stat("sluice_exporter_attribution_watch_events_total", "Changes of the live cluster's objects the attribution's informers received.",
				func(s attribution.Stats) float64 { return float64(s.Watch.Events) }, true),
			stat("sluice_exporter_attribution_watch_errors_total", "Failed lists and dropped watches of the attribution's informers (retried).",
				func(s attribution.Stats) float64 { return float64(s.Watch.Errors) }, true),
			stat("sluice_exporter_attribution_watch_objects", "Objects of the live cluster held by the attribution's informers (trimmed to what the model reads).",
				func(s attribution.Stats) float64 { return float64(s.Watch.Objects) }, false))
	}
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_exporter_buffered_records",
		Help: "Flow records waiting to be written to the aggregator."}, func() float64 { return float64(q.Len()) })
	bufCap := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_exporter_buffer_capacity_records",
		Help: "Capacity of the buffer (--buffer-size)."}, func() float64 { return float64(q.Cap()) })
	reg.MustRegister(conns, records, dropped, m.lateNames, m.held, unnamed, m.seen, m.storeDrops, m.polls, m.pollErrors, m.pollSeconds,
		m.transport.Sent, m.transport.Connected, m.transport.Reconnects, m.transport.ConnectFailures, m.transport.Resent, buffered, bufCap)
	return m
}

// observe publishes the store's counters after a poll.
func (m *metrics) observe(st connstore.Stats) {
	m.open.Set(float64(st.Connections - st.Ended))
	m.ended.Set(float64(st.Ended))
	m.seen.Set(float64(st.Seen))
	m.storeDrops.Add(float64(st.Dropped - m.lastDropped))
	m.lastDropped = st.Dropped
	for i := 1; i < 4; i++ {
		m.records[i].Add(float64(st.Exported[i] - m.lastRecords[i]))
		m.lastRecords[i] = st.Exported[i]
	}
}

// totals are the run's record counts as key-value pairs for the last log
// line: the process's metrics end with it, that line stays.
func (m *metrics) totals() []any {
	var produced uint64
	for _, c := range m.records[1:] {
		produced += counterValue(c)
	}
	return []any{"records", produced, "exported", counterValue(m.transport.Sent), "resent", counterValue(m.transport.Resent),
		"dropped_buffer-full", counterValue(m.bufferDrops), "dropped_encode-error", counterValue(m.encodeErrors),
		"dropped_denied-rate", counterValue(m.deniedDrops)}
}

func counterValue(c prometheus.Counter) uint64 {
	var d dto.Metric
	if c == nil || c.Write(&d) != nil {
		return 0
	}
	return uint64(d.GetCounter().GetValue())
}
