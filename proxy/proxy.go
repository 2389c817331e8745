// Package proxy is the aggregator's Proxy mode: stateless mediation. Each
// record is enriched once and handed to the sinks; nothing is kept per
// connection, so memory does not grow with the number of flows and any
// number of replicas can run side by side.
package proxy

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/enrich"
	"sluice/flow"
	"sluice/ring"
)

// Options configures Proxy mode.
type Options struct {
	// Enricher adds Kubernetes metadata to each record, by the rules
	// Aggregate mode uses too; nil adds none.
	Enricher *enrich.Enricher
	// Metrics are where records are counted; nil for series of its own.
	Metrics *Metrics
	// KeepPods leaves the Pods of inter-Node halves as the exporters
	// named them (sluice.proxy.fillPods false): an ingest tier feeding an
	// Aggregate tier through Kafka, whose correlation tells the halves
	// apart by which Pod each names.
	KeepPods bool
}

// Metrics are Proxy mode's series.
type Metrics struct {
	// Records counts records forwarded, by path: "copied" by the fast
	// path (Forwarding), "rebuilt" as flow records.
	Records *prometheus.CounterVec
}

// NewMetrics creates Proxy mode's series and registers them with reg when
// it is not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_proxy_records_total",
		Help: "Records forwarded in Proxy mode, by path: copied (the fast path) or rebuilt (as flow records)."}, []string{"path"})}
	if reg != nil {
		reg.MustRegister(m.Records)
	}
	return m
}

// Proxy enriches records.
type Proxy struct {
	enr             *enrich.Enricher
	keepPods        bool
	copied, rebuilt prometheus.Counter
}

// New returns a Proxy.
func New(o Options) *Proxy {
	m := o.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	enr := o.Enricher
	if enr == nil {
		enr = enrich.NewEnricher(enrich.EnricherOptions{})
	}
	return &Proxy{enr: enr, keepPods: o.KeepPods, copied: m.Records.WithLabelValues("copied"), rebuilt: m.Records.WithLabelValues("rebuilt")}
}

// Run enriches the batches from in and produces their records to out
// until in is closed or ctx ends.
func (p *Proxy) Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[*flow.Flow]) {
	receive(ctx, in, func(b flow.Batch) {
		for _, f := range b.Flows {
			p.Process(f)
		}
		p.rebuilt.Add(float64(len(b.Flows)))
		out.Produce(b.Flows...)
		if b.Written != nil {
			pos := out.Produced()
			b.Resolve(func(ctx context.Context) error { return out.WaitWritten(ctx, pos) })
		}
	})
}

// receive hands each batch from in to handle until in is closed or ctx
// ends.
func receive(ctx context.Context, in <-chan flow.Batch, handle func(flow.Batch)) {
	for {
		select {
		case <-ctx.Done():
			return
		case b, ok := <-in:
			if !ok {
				return
			}
			handle(b)
		}
	}
}

// Process enriches one record in place: flow direction, decided on the
// record as the exporter sent it (as the reference does: the Pods it
// names are those of its own Node), then the Pod metadata an inter-Node
// half lacks (no correlation will bring the other half's names, so each
// half is made self-describing), labels, UIDs and the cluster ID.
func (p *Proxy) Process(f *flow.Flow) {
	f.FlowDirection = Direction(f)
	f.Present.Set(flow.FlowDirection)
	p.enr.Enrich(f, f.FlowType == flow.FlowTypeInterNode && !p.keepPods)
}

// Direction is Antrea's flowDirection rule for a record of one node:
// egress when the node holds only the source Pod (inter-node) or the flow
// leaves the cluster; ingress when it holds only the destination Pod
// (inter-node) or the flow enters the cluster; unknown otherwise.
func Direction(f *flow.Flow) uint8 {
	return direction(f.FlowType, f.SourcePodName != "", f.DestinationPodName != "")
}

// direction is Direction for a record of flowType naming a source and a
// destination Pod or not.
func direction(flowType uint8, src, dst bool) uint8 {
	switch {
	case flowType == flow.FlowTypeInterNode && src && !dst, flowType == flow.FlowTypeToExternal && src:
		return flow.DirectionEgress
	case flowType == flow.FlowTypeInterNode && dst && !src, flowType == flow.FlowTypeFromExternal && dst:
		return flow.DirectionIngress
	}
	return flow.DirectionUnknown
}
