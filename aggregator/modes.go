package aggregator

import (
	"context"

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
	o := enrich.EnricherOptions{PodLabels: cfg.RecordContents.PodLabels, UIDs: cfg.FlowCollector.IncludeK8sUIDs, ClusterID: cfg.ClusterID}
	if a.meta != nil {
		o.Store = a.meta
	}
	enr := enrich.NewEnricher(o)
	if cfg.Mode == config.ModeProxy {
		return proxy.New(proxy.Options{Enricher: enr, Metrics: proxy.NewMetrics(a.reg)}), nil
	}
	return aggregateMode{aggregate.New(aggregate.Options{
		ActiveTimeout: cfg.ActiveFlowRecordTimeout.Duration, InactiveTimeout: cfg.InactiveFlowRecordTimeout.Duration,
		MaxFlows: cfg.Sluice.Aggregate.MaxFlows, ExportOneSided: cfg.Sluice.Aggregate.ExportOneSided, Enricher: enr,
	})}, nil
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
