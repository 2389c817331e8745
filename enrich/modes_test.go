package enrich_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"sluice/aggregate"
	"sluice/enrich"
	"sluice/flow"
	"sluice/proxy"
	"sluice/ring"
)

// TestModesEnrichAlike runs the same records through Proxy mode and
// Aggregate mode and requires the same Kubernetes metadata on what each
// exports: the modes share one Enricher, so they must never drift apart
// again (Proxy once filled a Pod UID for a Pod of the same name in another
// namespace, and never filled the destination Service's UID).
func TestModesEnrichAlike(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Hour)
	ip := netip.MustParseAddr
	st := enrich.NewStatic([]enrich.Pod{
		{Namespace: "shop", Name: "web", UID: "00000000-0000-4000-8000-000000000001", NodeName: "node-a",
			Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{ip("10.0.1.1")}, Created: t0},
		// The same name in another namespace, on another Node.
		{Namespace: "lab", Name: "web", UID: "00000000-0000-4000-8000-000000000002", NodeName: "node-b",
			Labels: map[string]string{"app": "lab"}, IPs: []netip.Addr{ip("10.0.2.1")}, Created: t0},
		// One address, two Pods over time.
		{Namespace: "shop", Name: "old", UID: "00000000-0000-4000-8000-000000000003", NodeName: "node-b",
			IPs: []netip.Addr{ip("10.0.2.9")}, Created: t0, Deleted: t1},
		{Namespace: "shop", Name: "new", UID: "00000000-0000-4000-8000-000000000004", NodeName: "node-b",
			Labels: map[string]string{"gen": "2"}, IPs: []netip.Addr{ip("10.0.2.9")}, Created: t1},
	}, []enrich.Node{
		{Name: "node-a", UID: "00000000-0000-4000-8000-0000000000aa"},
		{Name: "node-b", UID: "00000000-0000-4000-8000-0000000000bb"},
	}, []enrich.Service{
		{Namespace: "shop", Name: "api", UID: "00000000-0000-4000-8000-0000000000cc"},
	})

	type rec struct {
		name                   string
		typ                    uint8
		src, dst               string // addresses
		srcNS, srcPod, srcNode string
		dstNS, dstPod, dstNode string
		svc                    string // destinationServicePortName
		start                  time.Time
	}
	recs := []rec{
		// An intra-Node flow whose exporter named its Pods.
		{name: "intra", typ: flow.FlowTypeIntraNode, src: "10.0.1.1", dst: "10.0.2.9", srcNS: "shop", srcPod: "web", srcNode: "node-a",
			dstNS: "shop", dstPod: "new", dstNode: "node-b", svc: "shop/api:http", start: t1.Add(time.Minute)},
		// The record names "web" in namespace lab, but the address is
		// shop/web's: no UID or labels of shop/web may go onto it.
		{name: "same name, other namespace", typ: flow.FlowTypeIntraNode, src: "10.0.1.1", dst: "10.0.2.1", srcNS: "lab", srcPod: "web", srcNode: "node-a",
			dstNS: "lab", dstPod: "web", dstNode: "node-b", start: t1.Add(time.Minute)},
		// The source Node's half of an inter-Node flow: the destination
		// Pod is looked up by address and time, before and after the
		// address changed hands.
		{name: "inter-node, old Pod", typ: flow.FlowTypeInterNode, src: "10.0.1.1", dst: "10.0.2.9", srcNS: "shop", srcPod: "web", srcNode: "node-a",
			svc: "shop/api:http", start: t0.Add(time.Minute)},
		{name: "inter-node, new Pod", typ: flow.FlowTypeInterNode, src: "10.0.1.1", dst: "10.0.2.9", srcNS: "shop", srcPod: "web", srcNode: "node-a",
			start: t1.Add(time.Minute)},
		// A Service that is not known, and an unknown address.
		{name: "unknown", typ: flow.FlowTypeToExternal, src: "10.0.1.1", dst: "192.0.2.1", srcNS: "shop", srcPod: "web", srcNode: "node-a",
			svc: "shop/gone:http", start: t1.Add(time.Minute)},
	}
	mk := func() []*flow.Flow {
		var out []*flow.Flow
		for i, r := range recs {
			f := &flow.Flow{
				StartTime: r.start, EndTime: r.start.Add(time.Second), Protocol: 6,
				SourceIP: ip(r.src), DestinationIP: ip(r.dst), SourcePort: uint16(40000 + i), DestinationPort: 80,
				FlowType: r.typ, EndReason: 3, // end of flow
				SourcePodNamespace: r.srcNS, SourcePodName: r.srcPod, SourceNodeName: r.srcNode,
				DestinationPodNamespace: r.dstNS, DestinationPodName: r.dstPod, DestinationNodeName: r.dstNode,
				DestinationServicePortName: r.svc,
			}
			f.Stats.PacketTotalCount, f.Stats.OctetTotalCount = 1, 100
			for _, fl := range []flow.Field{flow.StartTime, flow.EndTime, flow.Protocol, flow.SourceIP, flow.DestinationIP,
				flow.SourcePort, flow.DestinationPort, flow.FlowType, flow.EndReason} {
				f.Present.Set(fl)
			}
			for _, s := range []struct {
				v  string
				fl []flow.Field
			}{
				{r.srcPod, []flow.Field{flow.SourcePodNamespace, flow.SourcePodName, flow.SourceNodeName}},
				{r.dstPod, []flow.Field{flow.DestinationPodNamespace, flow.DestinationPodName, flow.DestinationNodeName}},
				{r.svc, []flow.Field{flow.DestinationServicePortName}},
			} {
				if s.v != "" {
					for _, fl := range s.fl {
						f.Present.Set(fl)
					}
				}
			}
			out = append(out, f)
		}
		return out
	}

	for _, labels := range []bool{false, true} {
		for _, uids := range []bool{false, true} {
			t.Run(fmt.Sprintf("labels=%v,uids=%v", labels, uids), func(t *testing.T) {
				o := enrich.EnricherOptions{Store: st, PodLabels: labels, UIDs: uids, ClusterID: "c-1"}
				px := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(o)})
				byProxy := map[uint16]*flow.Flow{}
				for _, f := range mk() {
					px.Process(f)
					byProxy[f.SourcePort] = f
				}
				byAggregate := runAggregate(t, aggregate.Options{ExportOneSided: true, Enricher: enrich.NewEnricher(o)}, mk())
				if len(byAggregate) != len(recs) {
					t.Fatalf("Aggregate mode exported %d records, want %d", len(byAggregate), len(recs))
				}
				for i, r := range recs {
					p, a := meta(byProxy[uint16(40000+i)]), meta(byAggregate[uint16(40000+i)])
					if p != a {
						t.Errorf("%s: the modes disagree\n proxy:     %+v\n aggregate: %+v", r.name, p, a)
					}
				}
				// The rules themselves, on the Proxy side (the same on both).
				check := func(name string, got, want any) {
					t.Helper()
					if got != want {
						t.Errorf("%s: %v, want %v", name, got, want)
					}
				}
				other := byProxy[40001]
				check("UID of a same-named Pod in another namespace", other.SourcePodUID, flow.UID{})
				if labels {
					check("labels of a same-named Pod in another namespace", other.SourcePodLabels, "")
					check("labels of the Pod holding the address later", byProxy[40003].DestinationPodLabels, `{"gen":"2"}`)
				}
				check("Pod holding the address first", byProxy[40002].DestinationPodName, "old")
				check("Pod holding the address later", byProxy[40003].DestinationPodName, "new")
				if uids {
					check("destination Service UID", byProxy[40000].DestinationServiceUID, mustUID("00000000-0000-4000-8000-0000000000cc"))
					check("old Pod's UID", byProxy[40002].DestinationPodUID, mustUID("00000000-0000-4000-8000-000000000003"))
					check("unknown Service UID", byProxy[40004].DestinationServiceUID, flow.UID{})
				} else {
					check("destination Service UID with UIDs off", byProxy[40000].DestinationServiceUID, flow.UID{})
				}
			})
		}
	}
}

// metadata is what enrichment may set on a record, with its presence.
type metadata struct {
	SrcNS, SrcPod, SrcNode, DstNS, DstPod, DstNode string
	SrcLabels, DstLabels, ClusterID                string
	SrcPodUID, DstPodUID, SrcNodeUID, DstNodeUID   flow.UID
	SvcUID, EgressNodeUID                          flow.UID
	Present                                        [12]bool
}

func meta(f *flow.Flow) metadata {
	if f == nil {
		return metadata{}
	}
	m := metadata{
		SrcNS: f.SourcePodNamespace, SrcPod: f.SourcePodName, SrcNode: f.SourceNodeName,
		DstNS: f.DestinationPodNamespace, DstPod: f.DestinationPodName, DstNode: f.DestinationNodeName,
		SrcLabels: f.SourcePodLabels, DstLabels: f.DestinationPodLabels, ClusterID: f.ClusterID,
		SrcPodUID: f.SourcePodUID, DstPodUID: f.DestinationPodUID, SrcNodeUID: f.SourceNodeUID, DstNodeUID: f.DestinationNodeUID,
		SvcUID: f.DestinationServiceUID, EgressNodeUID: f.EgressNodeUID,
	}
	for i, fl := range []flow.Field{flow.SourcePodName, flow.DestinationPodName, flow.SourceNodeName, flow.DestinationNodeName,
		flow.SourcePodLabels, flow.DestinationPodLabels, flow.ClusterID, flow.SourcePodUID, flow.DestinationPodUID,
		flow.SourceNodeUID, flow.DestinationNodeUID, flow.DestinationServiceUID} {
		m.Present[i] = f.Present.Has(fl)
	}
	return m
}

// runAggregate feeds flows to an Aggregate store and returns what it
// exports when its input closes, by source port.
func runAggregate(t *testing.T, o aggregate.Options, flows []*flow.Flow) map[uint16]*flow.Flow {
	t.Helper()
	in := make(chan flow.Batch, 1)
	out := ring.New[*flow.Flow](1024)
	c := out.Consumer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		aggregate.New(o).Run(context.Background(), in, out, time.Hour)
		out.Close()
	}()
	in <- flow.Batch{Flows: flows}
	close(in)
	got := map[uint16]*flow.Flow{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		fs, ok := c.Next(ctx, nil, 64)
		for _, f := range fs {
			got[f.SourcePort] = f
		}
		if !ok {
			break
		}
	}
	<-done
	return got
}

func mustUID(s string) flow.UID {
	u, ok := flow.ParseUID(s)
	if !ok {
		panic(s)
	}
	return u
}
