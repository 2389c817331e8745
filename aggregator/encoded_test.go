package aggregator

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"sluice/aggregate"
	"sluice/config"
	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ring"
	"sluice/sink"
)

// aggregateExporter is the IPFIX sink's exporter in Aggregate mode with
// the default configuration, and its table.
func aggregateExporter(t *testing.T) (*ipfixmap.Table, *ipfixmap.Exporter) {
	t.Helper()
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Mode = config.ModeAggregate
	ex, err := sink.NewExporter(cfg, table)
	if err != nil {
		t.Fatal(err)
	}
	return table, ex
}

// aggregateInput is records of both kinds the store exports: the two
// halves of inter-Node connections (correlated), intra-Node ones, and
// halves whose other side never comes (exported one-sided).
func aggregateInput() []*flow.Flow {
	var in []*flow.Flow
	for i := range 60 {
		f := flowtest.Full(i, false)
		f.Egress.RuleAction, f.Ingress.RuleAction = flow.ActionAllow, flow.ActionAllow
		switch i % 3 {
		case 0:
			f.FlowType = flow.FlowTypeIntraNode
			in = append(in, f)
		default:
			f.FlowType = flow.FlowTypeInterNode
			src, dst := *f, *f
			src.DestinationPodName, src.DestinationPodNamespace = "", ""
			dst.SourcePodName, dst.SourcePodNamespace = "", ""
			in = append(in, &src)
			if i%3 == 1 {
				in = append(in, &dst)
			}
		}
	}
	return in
}

// TestAggregateFastPathMatches: Aggregate mode's fast path writes the
// records the normal path's sink would, octet for octet.
func TestAggregateFastPathMatches(t *testing.T) {
	table, ex := aggregateExporter(t)
	now := time.Date(2026, 11, 1, 12, 5, 0, 0, time.UTC)
	store := func() aggregateMode {
		// The clock stands still: every flow is exported by the final
		// flush, in the same order on both paths.
		return aggregateMode{aggregate.New(aggregate.Options{Clock: func() time.Time { return now }, ExportOneSided: true,
			Enricher: enrich.NewEnricher(enrich.EnricherOptions{ClusterID: "c1"})})}
	}
	feed := func() <-chan flow.Batch {
		in := make(chan flow.Batch, 64)
		recs := aggregateInput()
		for i := 0; i < len(recs); i += 7 {
			in <- flow.Batch{Flows: recs[i:min(i+7, len(recs))]}
		}
		close(in)
		return in
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The normal path: flow records, encoded as the IPFIX sink does.
	flows := ring.New[*flow.Flow](1024)
	fc := flows.Consumer()
	store().Run(ctx, feed(), flows)
	got, _ := fc.Next(ctx, nil, 1024)
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	for _, f := range got {
		tm, _, err := ex.Template(f)
		if err != nil {
			t.Fatal(err)
		}
		data, err := enc.EncodeRecord(tm, func(rb ipfix.RecordBuilder) error { return ex.Write(rb, tm, f) })
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, bytes.Clone(data))
	}

	// The fast path.
	m := store()
	e, err := m.Encoded(table, ex)
	if err != nil {
		t.Fatal(err)
	}
	sampled := ring.New[*flow.Flow](1024)
	sc := sampled.Consumer()
	e.Sample(sampled, 5)
	recs := ring.New[ipfix.EncodedRecord](1024)
	rc := recs.Consumer()
	e.Run(ctx, feed(), recs, func(err error) { t.Errorf("encoding: %v", err) })
	fast, _ := rc.Next(ctx, nil, 1024)

	if len(want) < 40 || len(fast) != len(want) {
		t.Fatalf("the fast path wrote %d records, the normal path %d", len(fast), len(want))
	}
	for i := range want {
		if !bytes.Equal(fast[i].Data, want[i]) {
			t.Fatalf("record %d differs:\nfast   %x\nnormal %x", i, fast[i].Data, want[i])
		}
	}
	// Run has returned, so it holds no share of an arena: each arena goes
	// back to its pool exactly when the sink releases its last record.
	left := map[*ipfix.Arena]int{}
	for _, r := range fast {
		if r.Arena == nil {
			t.Fatal("a record without its arena")
		}
		left[r.Arena]++
	}
	for i, r := range fast {
		left[r.Arena]--
		if back := r.Arena.Release(1); back != (left[r.Arena] == 0) {
			t.Fatalf("record %d: its arena went back %v, %d of its records still held", i, back, left[r.Arena])
		}
	}
	// The sample (5 a second) holds copies, not the store's reused memory.
	sample, _ := sc.Next(ctx, nil, 1024)
	if len(sample) != 5 {
		t.Fatalf("%d records sampled, want 5", len(sample))
	}
	for i, f := range sample {
		if f.SourceIP != got[i].SourceIP || f.Aggregation == nil || *f.Aggregation != *got[i].Aggregation {
			t.Errorf("sampled record %d is not the %d-th exported: %+v", i, i, f)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("timed out")
	}
}

// TestAggregateFastPathArenaHeldWhileRunning: records the sink releases
// while the store keeps exporting do not give their arena back to the
// pool: Run still writes into it (its share), and has counted every
// record it handed on.
func TestAggregateFastPathArenaHeldWhileRunning(t *testing.T) {
	table, ex := aggregateExporter(t)
	var now atomic.Int64
	now.Store(time.Date(2026, 11, 1, 12, 5, 0, 0, time.UTC).UnixNano())
	m := aggregateMode{aggregate.New(aggregate.Options{Clock: func() time.Time { return time.Unix(0, now.Load()) },
		Enricher: enrich.NewEnricher(enrich.EnricherOptions{ClusterID: "c1"})})}
	e, err := m.Encoded(table, ex)
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan flow.Batch)
	recs := ring.New[ipfix.EncodedRecord](1024)
	rc := recs.Consumer()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx, in, recs, func(err error) { t.Errorf("encoding: %v", err) }) }()
	const rounds, per = 3, 40
	for r := range rounds {
		b := flow.Batch{}
		for i := range per {
			f := flowtest.Full(r*per+i, false)
			f.FlowType = flow.FlowTypeIntraNode
			b.Flows = append(b.Flows, f)
		}
		in <- b
		// Past the active timeout: the next tick exports them.
		now.Add(int64(2 * aggregate.DefaultActiveTimeout))
		var got []ipfix.EncodedRecord
		for len(got) < per {
			var ok bool
			if got, ok = rc.Next(ctx, got, per-len(got)); !ok {
				t.Fatalf("round %d: %d of %d records", r, len(got), per)
			}
		}
		for i, rec := range got {
			if rec.Arena.Release(1) {
				t.Fatalf("round %d, record %d: its arena went back while Run writes into it", r, i)
			}
		}
	}
	close(in)
	<-done
}
