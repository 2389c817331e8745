package aggregator

import (
	"sluice/api"
	"sluice/config"
	"sluice/flow/flowjson"
	"sluice/sink"
)

// setupAPI adds the flow-record endpoints to the HTTP API.
func (a *Aggregator) setupAPI() {
	// Aggregate mode answers queries; Proxy mode keeps no flows.
	src, _ := a.mode.(api.FlowSource)
	a.api.HandleFlowRecords(src, func() (*flowjson.Renderer, error) {
		// An exporter per request: exporters cache templates and are not
		// safe for concurrent use.
		ex, err := sink.NewExporter(a.cfg, a.table)
		if err != nil {
			return nil, err
		}
		return flowjson.New(ex), nil
	})
	a.api.HandleRecordMetrics(a.recordMetrics)
}

// recordMetrics reads the figures of GET /recordmetrics off the metrics
// registry, so the API and /metrics always agree.
func (a *Aggregator) recordMetrics() api.RecordMetrics {
	sums := map[string]float64{}
	if mfs, err := a.reg.Gather(); err == nil {
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch {
				case m.GetCounter() != nil:
					sums[mf.GetName()] += m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					sums[mf.GetName()] += m.GetGauge().GetValue()
				}
			}
		}
	}
	exported := a.buf.Produced()
	if a.encBuf != nil { // Proxy mode's fast path: records go through encBuf
		exported += a.encBuf.Produced()
	}
	rm := api.RecordMetrics{
		NumRecordsExported:     int64(exported),
		NumRecordsReceived:     int64(sums["sluice_collector_records_received_total"]),
		NumRecordsDropped:      int64(sums["sluice_sink_records_dropped_total"] + sums["sluice_collector_records_dropped_total"]),
		NumConnToCollector:     int64(sums["sluice_collector_sessions_open"]),
		WithIPFIXExporter:      a.running(config.SinkFlowCollector),
		WithLogExporter:        a.running(config.SinkFlowLogger),
		WithClickHouseExporter: a.running(config.SinkClickHouse),
		WithS3Exporter:         a.running(config.SinkS3Uploader),
	}
	if m, ok := a.mode.(aggregateMode); ok {
		rm.NumFlows = int64(m.Stats().Flows)
	}
	return rm
}

// running reports whether the sink of that key runs.
func (a *Aggregator) running(key string) bool {
	for _, s := range a.sinks {
		if s.key == key {
			return true
		}
	}
	return false
}
