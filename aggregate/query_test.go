package aggregate

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/ring"
)

func TestRecords(t *testing.T) {
	s := New(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{ClusterID: "c1"})})
	var k sink
	// Three flows: the test connection (correlated), the same from another
	// source port (one side only), and a UDP intra-Node flow.
	s.Add(at(10), srcRec(0, 10, counts{pkts: 4, octets: 400, dpkts: 4}), k.emit)
	s.Add(at(10), dstRec(0, 10, counts{pkts: 4, octets: 400, dpkts: 4}), k.emit)
	other := srcRec(0, 10, counts{pkts: 1})
	other.SourcePort = 40001
	s.Add(at(11), mark(other), k.emit)
	udp := srcRec(0, 10, counts{pkts: 2})
	udp.Protocol, udp.FlowType, udp.DestinationPort = 17, flow.FlowTypeIntraNode, 53
	s.Add(at(12), mark(udp), k.emit)
	exportedBefore := s.Stats().Exported

	cases := []struct {
		name  string
		q     flow.Query
		ports []uint16 // source ports of the records, most recent first
	}{
		{"all", flow.Query{}, []uint16{40000, 40001, 40000}},
		{"by protocol", flow.Query{Proto: 17}, []uint16{40000}},
		{"by destination port", flow.Query{DstPort: 8080}, []uint16{40001, 40000}},
		{"by source address", flow.Query{SrcIP: clientIP}, []uint16{40000, 40001, 40000}},
		{"by an address nobody has", flow.Query{DstIP: netip.MustParseAddr("192.0.2.1")}, nil},
		{"exact", flow.Query{SrcIP: clientIP, DstIP: serverIP, Proto: 6, SrcPort: 40001, DstPort: 8080}, []uint16{40001}},
		{"exact, absent", flow.Query{SrcIP: clientIP, DstIP: serverIP, Proto: 6, SrcPort: 9, DstPort: 8080}, nil},
	}
	for _, c := range cases {
		got, n := s.Records(c.q)
		if n != len(c.ports) || len(got) != len(c.ports) {
			t.Errorf("%s: %d records, %d matches, want %d", c.name, len(got), n, len(c.ports))
			continue
		}
		for i, f := range got {
			if f.SourcePort != c.ports[i] {
				t.Errorf("%s: record %d has source port %d, want %d", c.name, i, f.SourcePort, c.ports[i])
			}
			if f.ClusterID != "c1" || f.Aggregation == nil {
				t.Errorf("%s: record %d lacks the export view: %+v", c.name, i, f)
			}
		}
	}
	got, n := s.Records(flow.Query{Limit: 1})
	if n != 3 || len(got) != 1 {
		t.Errorf("limit 1: %d records of %d matches", len(got), n)
	}
	// The correlated flow shows both Pods and its per-Node counters.
	got, _ = s.Records(flow.Query{SrcPort: 40000, Proto: 6})
	if f := got[0]; f.SourcePodName != "client" || f.DestinationPodName != "server" ||
		f.Aggregation.StatsFromSource.PacketTotalCount != 4 || f.Aggregation.StatsFromDestination.OctetTotalCount != 400 {
		t.Errorf("correlated record %+v %+v", f, f.Aggregation)
	}
	// Looking exports nothing and changes no delta.
	if s.Stats().Exported != exportedBefore || len(k.got) != 0 {
		t.Error("a query exported records")
	}
	s.Tick(at(13), k.emit)
	var found bool
	for _, f := range k.take() {
		if f.Protocol == 6 && f.SourcePort == 40000 {
			found = true
			if f.Stats.PacketDeltaCount != 4 {
				t.Errorf("export after a query has packet delta %d, want 4", f.Stats.PacketDeltaCount)
			}
		}
	}
	if !found {
		t.Error("the correlated flow was not exported on the tick after the query")
	}
}

func TestQueryThroughRun(t *testing.T) {
	s := New(Options{})
	in := make(chan flow.Batch, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, in, ring.New[*flow.Flow](8), time.Hour); close(done) }()
	in <- flow.Batch{Flows: []*flow.Flow{srcRec(0, 10, counts{pkts: 1})}}
	qctx, qcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer qcancel()
	var n int
	for n == 0 && qctx.Err() == nil {
		_, n, _ = s.Query(qctx, flow.Query{})
	}
	if n != 1 {
		t.Fatalf("query through Run saw %d flows", n)
	}
	cancel()
	<-done
	// With Run gone, a query gives up with its context.
	short, c2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer c2()
	if _, _, err := s.Query(short, flow.Query{}); err == nil {
		t.Error("a query with Run stopped did not fail")
	}
}
