package aggregator

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/aggregate"
	"sluice/config"
	"sluice/enrich"
	"sluice/flow"
	"sluice/mode"
	"sluice/proxy"
	"sluice/ring"
)

// newMode makes the configured mode, with the one Enricher both modes use.
func (a *Aggregator) newMode() (mode.Mode, error) {
	cfg := a.cfg
	o := enrich.EnricherOptions{PodLabels: cfg.RecordContents.PodLabels, UIDs: cfg.FlowCollector.IncludeK8sUIDs, ClusterID: a.clusterID()}
	if a.meta != nil {
		o.Store = a.meta
	}
	enr := enrich.NewEnricher(o)
	if cfg.Mode == config.ModeProxy {
		return proxy.New(proxy.Options{Enricher: enr, Metrics: proxy.NewMetrics(a.reg), KeepPods: !cfg.Sluice.Proxy.FillPods}), nil
	}
	m := aggregateMode{aggregate.New(aggregate.Options{
		ActiveTimeout: cfg.ActiveFlowRecordTimeout.Duration, InactiveTimeout: cfg.InactiveFlowRecordTimeout.Duration,
		MaxFlows: cfg.Sluice.Aggregate.MaxFlows, ExportOneSided: cfg.Sluice.Aggregate.ExportOneSided, Enricher: enr,
	})}
	registerAggregateMetrics(a.reg, m.Store)
	return m, nil
}

// registerAggregateMetrics exposes the correlation store's counters
// (atomics, read at each scrape).
func registerAggregateMetrics(reg prometheus.Registerer, s *aggregate.Store) {
	counter := func(name, help string, v func(aggregate.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(s.Stats())) })
	}
	reg.MustRegister(
		counter("sluice_aggregate_records_total", "Records taken by the correlation store.", func(st aggregate.Stats) uint64 { return st.RecordsIn }),
		counter("sluice_aggregate_records_invalid_total", "Records dropped for lacking a start or end time.", func(st aggregate.Stats) uint64 { return st.RecordsInvalid }),
		counter("sluice_aggregate_records_stale_total", "Records not newer than the last one from the same Node (no counter changed).", func(st aggregate.Stats) uint64 { return st.RecordsStale }),
		counter("sluice_aggregate_correlated_total", "Flows whose two sides were matched.", func(st aggregate.Stats) uint64 { return st.Correlated }),
		counter("sluice_aggregate_exported_total", "Records the store exported.", func(st aggregate.Stats) uint64 { return st.Exported }),
		counter("sluice_aggregate_one_sided_exported_total", "Flows exported with one side only.", func(st aggregate.Stats) uint64 { return st.OneSidedExported }),
		counter("sluice_aggregate_one_sided_dropped_total", "One-sided flows dropped (sluice.aggregate.exportOneSided off).", func(st aggregate.Stats) uint64 { return st.OneSidedDropped }),
		counter("sluice_aggregate_evicted_total", "Flows evicted because the store was full (sluice.aggregate.maxFlows).", func(st aggregate.Stats) uint64 { return st.Evicted }),
		counter("sluice_aggregate_expired_total", "Flows forgotten after their inactive timeout.", func(st aggregate.Stats) uint64 { return st.Expired }),
		counter("sluice_aggregate_table_heap_fallbacks_total", "Parts of the flow table put on the Go heap because the kernel refused to map them outside it (vm.max_map_count, vm.overcommit_memory): still correct, in small pages.", func(st aggregate.Stats) uint64 { return st.TableHeapFallbacks }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_aggregate_flows", Help: "Flows held for correlation."},
			func() float64 { return float64(s.Stats().Flows) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_aggregate_table_bytes",
			Help: "Address space of the flow table (entries and index) outside the Go heap; committed as first written, kept for reuse."},
			func() float64 { return float64(s.Stats().TableBytes) }),
	)
}

// aggregateMode is Aggregate mode's Store as a mode.Mode, ticking at the
// default rate. Its Query and Stats serve the flow-record API.
type aggregateMode struct {
	*aggregate.Store
}

// Run aggregates until in closes (then exports every tracked flow).
func (m aggregateMode) Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[*flow.Flow]) {
	m.Store.Run(ctx, in, out, aggregate.DefaultTick)
}
