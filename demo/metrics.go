package demo

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Series the demo reads from the aggregator's registry.
const (
	metricReceived    = "sluice_collector_records_received_total"
	metricSkewUnknown = "sluice_skew_unknown_elements_total"
	metricSkewMissing = "sluice_skew_missing_elements_total"
	metricSinkOut     = "sluice_sink_records_exported_total"
	metricSent        = "sluice_demo_records_sent_total"
)

// counters sums the counters of every family in names by the value of
// label: one Gather for several series.
func counters(g prometheus.Gatherer, label string, names ...string) (map[string]map[string]uint64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]uint64{}
	for _, name := range names {
		out[name] = map[string]uint64{}
	}
	for _, mf := range mfs {
		by, ok := out[mf.GetName()]
		if !ok || mf.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			by[key] += uint64(m.GetCounter().GetValue())
		}
	}
	return out, nil
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
