package aggregate

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/ring"
)

func TestRun(t *testing.T) {
	var clock atomic.Int64
	clock.Store(at(10).UnixNano())
	s := New(Options{Clock: func() time.Time { return time.Unix(0, clock.Load()).UTC() }, ExportOneSided: true, Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
	in := make(chan flow.Batch, 4)
	out := ring.New[*flow.Flow](64)
	c := out.Consumer()
	done := make(chan struct{})
	go func() { s.Run(context.Background(), in, out, time.Millisecond); close(done) }()

	intra := srcRec(0, 10, counts{pkts: 3})
	intra.FlowType = flow.FlowTypeIntraNode
	intra.SourcePort = 1
	waiting := srcRec(0, 10, counts{pkts: 1})
	in <- flow.Batch{Flows: []*flow.Flow{intra, waiting}, Pool: flow.NewPool()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, ok := c.Next(ctx, nil, 10) // the ticker exports the complete flow
	if !ok || len(got) != 1 || got[0].FlowType != flow.FlowTypeIntraNode || got[0].Aggregation == nil {
		t.Fatalf("got %v %+v", ok, got)
	}
	for s.Stats().RecordsIn != 2 { // readable while Run owns the Store
		time.Sleep(time.Millisecond)
	}
	clock.Store(at(20).UnixNano())
	close(in) // graceful: the waiting flow is flushed one-sided
	<-done
	got, ok = c.Next(ctx, nil, 10)
	if !ok || len(got) != 1 || got[0].FlowType != flow.FlowTypeInterNode || got[0].DestinationPodName != "server" {
		t.Fatalf("flushed %v %+v", ok, got)
	}
	if st := s.Stats(); st.Flows != 0 || st.OneSidedExported != 1 || st.Exported != 2 {
		t.Errorf("stats %+v", st)
	}
	// The records in were given back (zeroed), and none was handed on:
	// what the sinks got are the store's own.
	for _, f := range []*flow.Flow{intra, waiting} {
		if !reflect.ValueOf(*f).IsZero() {
			t.Errorf("a record in was not given back: %+v", f)
		}
	}
	if got[0] == intra || got[0] == waiting {
		t.Errorf("the store handed on a record it was given")
	}
}

func TestRunCancel(t *testing.T) {
	s := New(Options{})
	in := make(chan flow.Batch)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, in, ring.New[*flow.Flow](8), 0); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestRunReusesRecords: records come back from the buffer once its reader
// released them, and exports are built in them: across many laps of the
// buffer the store makes no more records than the buffer and a chunk
// hold, and the reader never sees one changed while it holds it.
func TestRunReusesRecords(t *testing.T) {
	s := New(Options{ExportOneSided: true, Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
	in := make(chan flow.Batch)
	out := ring.New[*flow.Flow](512) // more than a chunk (runChunk), as in production
	out.BackPressure(time.Hour)      // sinkOverflow block: nothing lapped
	c := out.Consumer()
	done := make(chan struct{})
	go func() { s.Run(context.Background(), in, out, time.Millisecond); close(done) }()
	seen := map[*flow.Flow]bool{}
	read := make(chan int)
	go func() {
		n := 0
		var buf []*flow.Flow
		for {
			var ok bool
			buf, ok = c.Next(context.Background(), buf[:0], 16)
			if !ok {
				read <- n
				return
			}
			ports := make([]uint16, len(buf))
			for i, f := range buf {
				seen[f] = true
				ports[i] = f.SourcePort
			}
			for i, f := range buf { // unchanged while held
				if f.SourcePort != ports[i] || f.Aggregation == nil {
					t.Errorf("record %d changed under its reader", i)
				}
			}
			n += len(buf)
			c.Release(0)
		}
	}()
	const total = 20000
	for i := range total / 50 {
		var fs []*flow.Flow
		for j := range 50 {
			f := srcRec(0, 10, counts{pkts: 3})
			f.FlowType = flow.FlowTypeIntraNode
			f.SourcePort = uint16(1 + i*50 + j)
			fs = append(fs, f)
		}
		in <- flow.Batch{Flows: fs, Pool: flow.NewPool()}
	}
	close(in)
	<-done
	out.Close()
	if n := <-read; n+int(c.Lost) != total {
		t.Fatalf("read %d + lost %d, want %d", n, c.Lost, total)
	}
	if len(seen) > out.Cap()+runChunk+64 {
		t.Fatalf("%d records made for %d exports through a buffer of %d", len(seen), total, out.Cap())
	}
	t.Logf("%d records made for %d exports (lost %d)", len(seen), total, c.Lost)
}
