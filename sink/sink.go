// Package sink holds what every sink shares: the contract by which the
// aggregator runs a sink, and the Prometheus series every sink reports
// under its own name. The sinks themselves live in sub-packages.
package sink

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/ring"
)

// Sink consumes exported records from the pipeline's broadcast buffer
// until the buffer is closed and drained (then it flushes what it holds
// and returns) or ctx ends (then it returns at once). An error from Run
// stops the aggregator.
type Sink interface {
	Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error
}

// Dropped reasons, the values of the "reason" label.
const (
	// ReasonBufferFull: the sink fell a whole buffer behind.
	ReasonBufferFull = "buffer-full"
	// ReasonSendError: the destination refused or lost the record.
	ReasonSendError = "send-error"
	// ReasonEncodeError: the record could not be rendered.
	ReasonEncodeError = "encode-error"
)

// Metrics are the sinks' Prometheus series, labelled by sink name. One set
// serves every sink of a process.
type Metrics struct {
	Exported   *prometheus.CounterVec // sink
	Dropped    *prometheus.CounterVec // sink, reason
	Filtered   *prometheus.CounterVec // sink
	Connected  *prometheus.GaugeVec   // sink
	Reconnects *prometheus.CounterVec // sink
}

// NewMetrics creates the series and registers them with reg if not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Exported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sink_records_exported_total",
			Help: "Records a sink sent on (or wrote)."}, []string{"sink"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sink_records_dropped_total",
			Help: "Records a sink lost: buffer-full (it fell a whole buffer behind), send-error, encode-error."}, []string{"sink", "reason"}),
		Filtered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sink_records_filtered_total",
			Help: "Records a sink skipped on purpose because its filters did not select them."}, []string{"sink"}),
		Connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_sink_connected",
			Help: "1 while the sink is connected to (or has open) its destination."}, []string{"sink"}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sink_connection_attempts_total",
			Help: "Connection attempts to the destination, successful or not."}, []string{"sink"}),
	}
	if reg != nil {
		reg.MustRegister(m.Exported, m.Dropped, m.Filtered, m.Connected, m.Reconnects)
	}
	return m
}
