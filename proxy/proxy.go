// Package proxy is the aggregator's Proxy mode: stateless mediation. Each
// record is enriched once and handed to the sinks; nothing is kept per
// connection, so memory does not grow with the number of flows and any
// number of replicas can run side by side.
package proxy

import (
	"context"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/collector"
	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ring"
)

// Options configures the enrichment.
type Options struct {
	// Store resolves Pods by IP and time; nil disables look-ups.
	Store enrich.Store
	// PodLabels adds sourcePodLabels/destinationPodLabels
	// (recordContents.podLabels).
	PodLabels bool
	// UIDs fills Pod, Node and Service UIDs (flowCollector.includeK8sUIDs).
	UIDs bool
	// ClusterID is stamped on every record.
	ClusterID string
	// Metrics are where records are counted; nil for series of its own.
	Metrics *Metrics
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
	o               Options
	copied, rebuilt prometheus.Counter
}

// New returns a Proxy.
func New(o Options) *Proxy {
	m := o.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Proxy{o: o, copied: m.Records.WithLabelValues("copied"), rebuilt: m.Records.WithLabelValues("rebuilt")}
}

// Run enriches the batches from in and produces their records to out
// until in is closed or ctx ends.
func (p *Proxy) Run(ctx context.Context, in <-chan collector.Batch, out *ring.Buffer[*flow.Flow]) {
	receive(ctx, in, func(b collector.Batch) {
		for _, f := range b.Flows {
			p.Process(f)
		}
		p.rebuilt.Add(float64(len(b.Flows)))
		out.Produce(b.Flows...)
	})
}

// receive hands each batch from in to handle until in is closed or ctx
// ends.
func receive(ctx context.Context, in <-chan collector.Batch, handle func(collector.Batch)) {
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

// RunEncoded is Run for an export that is IPFIX only (see Forwarding):
// batches carry records the collector's forwarders encoded already, and
// flow records, which are enriched here and written with ex; out receives
// export records only. encodeErr hears of a flow record that cannot be
// written (it is dropped). ex is this goroutine's from now on.
func (p *Proxy) RunEncoded(ctx context.Context, in <-chan collector.Batch, out *ring.Buffer[ipfix.EncodedRecord],
	ex *ipfixmap.Exporter, encodeErr func(error)) {
	// An encoder that never sends: it only builds records (EncodeRecord).
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		panic(err) // the default options are valid
	}
	receive(ctx, in, func(b collector.Batch) {
		recs := b.Encoded
		var arena []byte
		for _, f := range b.Flows {
			p.Process(f)
			t, _, err := ex.Template(f)
			if err != nil {
				encodeErr(err)
				continue
			}
			data, err := enc.EncodeRecord(t, func(rb ipfix.RecordBuilder) error { return ex.Write(rb, t, f) })
			if err != nil {
				encodeErr(err)
				continue
			}
			start := len(arena)
			arena = append(arena, data...)
			recs = append(recs, ipfix.EncodedRecord{Template: t, Data: arena[start:len(arena):len(arena)]})
		}
		p.copied.Add(float64(len(b.Encoded)))
		p.rebuilt.Add(float64(len(b.Flows))) // as Run: those that fail to encode too
		out.Produce(recs...)
	})
}

// Process enriches one record in place: flow direction, the Pod metadata
// an inter-node half lacks, labels, UIDs and the cluster ID.
func (p *Proxy) Process(f *flow.Flow) {
	srcPod, dstPod := p.pod(f.SourceIP, f.StartTime), p.pod(f.DestinationIP, f.StartTime)
	// Each half of an inter-node flow is made self-describing, since no
	// correlation will bring the other half's names.
	if f.FlowType == flow.FlowTypeInterNode {
		enrich.FillPods(f, srcPod, dstPod)
	}
	f.FlowDirection = Direction(f)
	f.Present.Set(flow.FlowDirection)
	if p.o.PodLabels {
		f.SourcePodLabels = labels(srcPod, f.SourcePodNamespace, f.SourcePodName)
		f.DestinationPodLabels = labels(dstPod, f.DestinationPodNamespace, f.DestinationPodName)
		f.Present.Set(flow.SourcePodLabels)
		f.Present.Set(flow.DestinationPodLabels)
	}
	if p.o.UIDs {
		p.fillUIDs(f, srcPod, dstPod)
	}
	if p.o.ClusterID != "" {
		f.ClusterID = p.o.ClusterID
		f.Present.Set(flow.ClusterID)
	}
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

func (p *Proxy) pod(ip netip.Addr, at time.Time) *enrich.Pod {
	if p.o.Store == nil || !ip.IsValid() {
		return nil
	}
	if pod, ok := p.o.Store.PodByIP(ip, at); ok {
		return pod
	}
	return nil
}

// labels is the labels JSON of the record's Pod: "" when the record names
// no Pod or the Pod is not known (or not the same one), "{}" for a Pod
// without labels.
func labels(pod *enrich.Pod, namespace, name string) string {
	if name == "" || pod == nil || pod.Name != name || pod.Namespace != namespace {
		return ""
	}
	return pod.LabelsJSON()
}

func (p *Proxy) fillUIDs(f *flow.Flow, src, dst *enrich.Pod) {
	if p.o.Store == nil {
		return
	}
	set := func(field flow.Field, dstUID *flow.UID, text string) {
		if u, ok := flow.ParseUID(text); ok && *dstUID == (flow.UID{}) {
			*dstUID = u
			f.Present.Set(field)
		}
	}
	if src != nil && src.Name == f.SourcePodName {
		set(flow.SourcePodUID, &f.SourcePodUID, src.UID)
	}
	if dst != nil && dst.Name == f.DestinationPodName {
		set(flow.DestinationPodUID, &f.DestinationPodUID, dst.UID)
	}
	if n, ok := p.o.Store.NodeByName(f.SourceNodeName); ok && f.SourceNodeName != "" {
		set(flow.SourceNodeUID, &f.SourceNodeUID, n.UID)
	}
	if n, ok := p.o.Store.NodeByName(f.DestinationNodeName); ok && f.DestinationNodeName != "" {
		set(flow.DestinationNodeUID, &f.DestinationNodeUID, n.UID)
	}
	if n, ok := p.o.Store.NodeByName(f.EgressNodeName); ok && f.EgressNodeName != "" {
		set(flow.EgressNodeUID, &f.EgressNodeUID, n.UID)
	}
}
