package aggregator

import (
	"sluice/api"
	"sluice/config"
	"sluice/flow/flowjson"
	"sluice/flow/ipfixmap"
)

// setupAPI adds the flow-record endpoints to the HTTP API.
func (a *Aggregator) setupAPI(table *ipfixmap.Table) {
	var src api.FlowSource
	if a.store != nil {
		src = a.store
	}
	a.api.HandleFlowRecords(src, func() (*flowjson.Renderer, error) {
		// An exporter per request: exporters cache templates and are not
		// safe for concurrent use.
		ex, err := a.exporter(table)
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
		NumRecordsExported: int64(exported),
		NumRecordsReceived: int64(sums["sluice_collector_records_received_total"]),
		NumRecordsDropped:  int64(sums["sluice_sink_records_dropped_total"] + sums["sluice_collector_records_dropped_total"]),
		NumConnToCollector: int64(sums["sluice_collector_sessions_open"]),
		WithIPFIXExporter:  a.cfg.FlowCollector.Enable,
		WithLogExporter:    a.cfg.FlowLogger.Enable,
		// Not supported yet; config refuses to enable them.
		WithClickHouseExporter: a.cfg.ClickHouse.Enable && config.SupportedSinks()[config.SinkClickHouse],
		WithS3Exporter:         a.cfg.S3Uploader.Enable && config.SupportedSinks()[config.SinkS3Uploader],
	}
	if a.store != nil {
		rm.NumFlows = int64(a.store.Stats().Flows)
	}
	return rm
}
