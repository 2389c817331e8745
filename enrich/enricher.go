package enrich

import (
	"net/netip"
	"strings"
	"time"

	"sluice/flow"
)

// EnricherOptions are the enrichment settings of the aggregator, the same
// in both modes.
type EnricherOptions struct {
	// Store resolves Pods by IP and time, Nodes and Services; nil disables
	// every look-up (records keep what exporters sent).
	Store Store
	// PodLabels adds sourcePodLabels/destinationPodLabels
	// (recordContents.podLabels).
	PodLabels bool
	// UIDs fills Pod, Node, Egress Node and destination Service UIDs
	// (flowCollector.includeK8sUIDs).
	UIDs bool
	// ClusterID is stamped on every record.
	ClusterID string
}

// Enricher completes records with Kubernetes metadata. Aggregate and Proxy
// mode both use it, so that a record gets the same metadata whichever mode
// exports it. It holds no state of its own beyond its options and is safe
// for concurrent use (as its Store is).
type Enricher struct {
	o EnricherOptions
}

// NewEnricher returns an Enricher with options o.
func NewEnricher(o EnricherOptions) *Enricher { return &Enricher{o: o} }

// Options returns the options the Enricher was made with.
func (e *Enricher) Options() EnricherOptions { return e.o }

// Enrich completes f in place. With fillPods, the Pods at either end that
// the record does not name are named after the Pods that held its
// addresses when the flow started (a mode decides when a record needs
// that: Proxy for each half of an inter-Node flow, Aggregate for a flow
// that was never correlated). Then labels, UIDs and the cluster ID.
func (e *Enricher) Enrich(f *flow.Flow, fillPods bool) {
	var src, dst *Pod
	if fillPods || e.o.PodLabels || e.o.UIDs {
		src, dst = e.Pod(f.SourceIP, f.StartTime), e.Pod(f.DestinationIP, f.StartTime)
	}
	if fillPods {
		FillPods(f, src, dst)
	}
	if e.o.PodLabels {
		f.SourcePodLabels = Labels(src, f.SourcePodNamespace, f.SourcePodName)
		f.DestinationPodLabels = Labels(dst, f.DestinationPodNamespace, f.DestinationPodName)
		f.Present.Set(flow.SourcePodLabels)
		f.Present.Set(flow.DestinationPodLabels)
	}
	if e.o.UIDs {
		e.fillUIDs(f, src, dst)
	}
	if e.o.ClusterID != "" {
		f.ClusterID = e.o.ClusterID
		f.Present.Set(flow.ClusterID)
	}
}

// Pod returns the Pod that held ip at time at, or nil when there is no
// store, ip is unset, or no Pod is known.
func (e *Enricher) Pod(ip netip.Addr, at time.Time) *Pod {
	if e.o.Store == nil || !ip.IsValid() {
		return nil
	}
	if p, ok := e.o.Store.PodByIP(ip, at); ok {
		return p
	}
	return nil
}

// IsPod reports whether p is the Pod a record names by namespace and name.
// Metadata of a Pod found by address goes only onto a record that names
// that same Pod: an address may have moved to another Pod, and a Pod name
// may repeat in another namespace.
func IsPod(p *Pod, namespace, name string) bool {
	return p != nil && name != "" && p.Name == name && p.Namespace == namespace
}

// Labels is the labels JSON of the record's Pod: "" when the record names
// no Pod or p is not that Pod, "{}" for a Pod without labels.
func Labels(p *Pod, namespace, name string) string {
	if !IsPod(p, namespace, name) {
		return ""
	}
	return p.LabelsJSON()
}

// fillUIDs sets the UIDs the record lacks: Pods (when the Pod found by
// address is the one the record names), Nodes, the Egress Node and the
// destination Service. UIDs the exporter sent are kept.
func (e *Enricher) fillUIDs(f *flow.Flow, src, dst *Pod) {
	st := e.o.Store
	if st == nil {
		return
	}
	set := func(field flow.Field, u *flow.UID, text string) {
		if *u != (flow.UID{}) {
			return
		}
		if v, ok := flow.ParseUID(text); ok {
			*u = v
			f.Present.Set(field)
		}
	}
	if IsPod(src, f.SourcePodNamespace, f.SourcePodName) {
		set(flow.SourcePodUID, &f.SourcePodUID, src.UID)
	}
	if IsPod(dst, f.DestinationPodNamespace, f.DestinationPodName) {
		set(flow.DestinationPodUID, &f.DestinationPodUID, dst.UID)
	}
	node := func(field flow.Field, u *flow.UID, name string) {
		if name == "" {
			return
		}
		if n, ok := st.NodeByName(name); ok {
			set(field, u, n.UID)
		}
	}
	node(flow.SourceNodeUID, &f.SourceNodeUID, f.SourceNodeName)
	node(flow.DestinationNodeUID, &f.DestinationNodeUID, f.DestinationNodeName)
	node(flow.EgressNodeUID, &f.EgressNodeUID, f.EgressNodeName)
	// destinationServicePortName is "namespace/service:port".
	if pn := f.DestinationServicePortName; pn != "" {
		ns, rest, ok := strings.Cut(pn, "/")
		if name, _, _ := strings.Cut(rest, ":"); ok && name != "" {
			if svc, ok := st.ServiceByName(ns, name); ok {
				set(flow.DestinationServiceUID, &f.DestinationServiceUID, svc.UID)
			}
		}
	}
}
