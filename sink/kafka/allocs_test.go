package kafka

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"sluice/config"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/internal/kafkatest"
	"sluice/internal/testkit/recpool"
	"sluice/kafkaclient"
	"sluice/sink"
)

// startOn runs a sink on a consumer of p's buffer until the test ends.
func startOn(t testing.TB, k *kafkatest.Cluster, topic string, p *recpool.Producer, json bool) *Sink {
	t.Helper()
	opts, err := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Client: opts, Topic: topic, JSON: json, Metrics: sink.NewMetrics(nil)})
	if err != nil {
		t.Fatal(err)
	}
	c := p.Buf.Consumer()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, c); c.Close() }()
	t.Cleanup(func() { stop(); <-done })
	return s
}

// settled is how many records the sink has settled (acknowledged, or
// lost and counted).
func (s *Sink) settled() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.base
}

// TestProduceAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled by the buffer once every reader released them), the
// sink and its client allocate less than one object a record (a few per
// batch) between reading a record and its acknowledgement, in either
// format.
func TestProduceAllocatesNothingPerRecord(t *testing.T) {
	for _, format := range []string{"protobuf", "json"} {
		t.Run(format, func(t *testing.T) { produceAllocatesNothing(t, format == "json") })
	}
}

func produceAllocatesNothing(t *testing.T, json bool) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 3})
	p := recpool.New(8192)
	s := startOn(t, k, "flows", p, json)
	recs := recpool.Records(2048)
	var want uint64
	round := func() {
		want += uint64(len(recs))
		p.Round(t, context.Background(), recs, 256, func() bool { return s.settled() == want })
	}
	per := recpool.Measure(8, len(recs), round)
	t.Logf("%.4f allocations per record; %d records made, %d recycled", per, p.Made, p.Recycled)
	if per > recpool.PerRecordBound {
		t.Errorf("%.3f allocations per record, want none (but a few per batch)", per)
	}
	if p.Recycled == 0 {
		t.Error("no record was recycled: the sink never released")
	}
	if e, d := s.o.Metrics.Totals("kafka"); e != want || d[sink.ReasonSendError]+d[sink.ReasonBufferFull] != 0 {
		t.Errorf("exported %d of %d, dropped %v", e, want, d)
	}
}

// TestLappedNeverProducesRecycled: a sink the producer laps again and
// again (a small buffer) never writes a record that was recycled under
// it; what it writes are the records produced, whole.
func TestLappedNeverProducesRecycled(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 2})
	p := recpool.New(64)
	p.Quarantine = true
	s := startOn(t, k, "flows", p, false)
	recs := recpool.Records(1024)
	for range 8 {
		p.Round(t, context.Background(), recs, 64, func() bool { return true })
	}
	p.Buf.Close()
	var lost uint64
	recpool.Until(t, "the sink to settle what it read", func() bool {
		e, d := s.o.Metrics.Totals("kafka")
		lost = d[sink.ReasonBufferFull]
		return e+lost == 8*1024 && s.settled() == e
	})
	e, _ := s.o.Metrics.Totals("kafka")
	// Records' present fields are their times and addresses (and the
	// aggregation): the source address tells them apart.
	bySource := map[string]*flow.Flow{}
	for _, f := range recs {
		bySource[string(f.SourceIP.AsSlice())] = f
	}
	for _, r := range consume(t, k.Addrs(), "flows", int(e)) {
		if bytes.Contains(r.Value, []byte(recpool.Poison)) {
			t.Fatal("Kafka holds a recycled record")
		}
		var m flowpb.Flow
		if err := proto.Unmarshal(r.Value, &m); err != nil {
			t.Fatal(err)
		}
		w := bySource[string(m.GetIp().GetSource())]
		if w == nil || string(m.GetIp().GetDestination()) != string(w.DestinationIP.AsSlice()) ||
			!m.GetEndTs().AsTime().Equal(w.EndTime) || m.GetAggregation().GetThroughput() != w.Aggregation.Throughput {
			t.Fatalf("a record that was not produced: %v", &m)
		}
	}
	t.Logf("%d written, %d lost, %d recycled", e, lost, p.Recycled)
	if lost == 0 || p.Recycled == 0 {
		t.Errorf("the sink was not lapped (%d lost) or nothing was recycled (%d)", lost, p.Recycled)
	}
}

// BenchmarkProduce is one record through the sink, from the producer to
// the broker's acknowledgement.
// warmRounds of 1024 records go through before the benchmark: 1.5 laps
// of its buffer.
const warmRounds = 12

func BenchmarkProduce(b *testing.B) {
	k := kafkatest.Start(b, kafkatest.Options{Brokers: 1, Partitions: 3})
	p := recpool.New(8192)
	s := startOn(b, k, "flows", p, false)
	recs := recpool.Records(1024)
	var want uint64
	for range warmRounds { // the buffer's first lap allocates its records
		want += uint64(len(recs))
		p.Round(b, context.Background(), recs, 256, func() bool { return s.settled() == want })
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(recs) {
		chunk := recs[:min(len(recs), b.N-n)]
		want += uint64(len(chunk))
		p.Round(b, context.Background(), chunk, 256, func() bool { return s.settled() == want })
	}
}
