// Package sink holds what every sink shares: the contract by which the
// aggregator runs a sink, and the Prometheus series every sink reports
// under its own name. The sinks themselves live in sub-packages.
package sink

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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
	// ReasonShutdown: the aggregator stopped (its drain timeout passed)
	// before the sink had sent the record.
	ReasonShutdown = "shutdown"
	// ReasonQueueFull: a sink's own queue (ClickHouse's rows waiting for
	// an insert) had no room; the oldest were dropped.
	ReasonQueueFull = "queue-full"
)

// Reasons are the values of the "reason" label, in the order logs list them.
func Reasons() []string {
	return []string{ReasonBufferFull, ReasonQueueFull, ReasonSendError, ReasonEncodeError, ReasonShutdown}
}

// BestEffort is implemented by sinks that promise no delivery (the flow
// stream serves live views that may come and go): what they leave unread
// at shutdown is not counted as lost.
type BestEffort interface {
	BestEffort()
}

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
			Help: "Records a sink lost: buffer-full (it fell a whole buffer behind), send-error, encode-error, shutdown (the aggregator stopped before the sink sent them)."}, []string{"sink", "reason"}),
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

// Totals reads the records sink sent and dropped (by reason) so far.
func (m *Metrics) Totals(sink string) (exported uint64, dropped map[string]uint64) {
	exported = counterValue(m.Exported.WithLabelValues(sink))
	dropped = map[string]uint64{}
	for _, r := range Reasons() {
		dropped[r] = counterValue(m.Dropped.WithLabelValues(sink, r))
	}
	return exported, dropped
}

func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}
