package flowlog_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sluice/internal/testkit/recpool"
	"sluice/sink"
	"sluice/sink/flowlog"
)

// TestExportAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled by the buffer once every reader released them), the
// flow log allocates nothing per record (a few allocations a batch, for
// the wait's timer); and no line carries a recycled record's poison.
func TestExportAllocatesNothingPerRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flows.log")
	s, err := flowlog.New(flowlog.Options{Path: path, Metrics: sink.NewMetrics(nil)})
	if err != nil {
		t.Fatal(err)
	}
	p := recpool.New(8192)
	c := p.Buf.Consumer()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	recs := recpool.Records(2048)
	round := func() {
		p.Round(t, context.Background(), recs, 256, func() bool { return c.Unread() == 0 })
	}
	per := recpool.Measure(8, len(recs), round)
	t.Logf("%.4f allocations per record; %d records made, %d recycled", per, p.Made, p.Recycled)
	p.Buf.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if per > recpool.PerRecordBound {
		t.Errorf("%.3f allocations per record, want none (but a few per batch)", per)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), recpool.Poison) || strings.Contains(string(b), "192.0.2.66") {
		t.Fatal("the log holds a recycled record")
	}
	if n := strings.Count(string(b), "\n"); n != recpool.MeasureRounds(8)*len(recs) {
		t.Fatalf("%d lines, want %d", n, recpool.MeasureRounds(8)*len(recs))
	}
}

// TestLappedNeverWritesRecycled: a flow log lapped by the producer again
// and again (a small buffer) never writes a record that was recycled
// under it.
func TestLappedNeverWritesRecycled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flows.log")
	s, err := flowlog.New(flowlog.Options{Path: path, Metrics: sink.NewMetrics(nil)})
	if err != nil {
		t.Fatal(err)
	}
	p := recpool.New(64)
	p.Quarantine = true
	c := p.Buf.Consumer()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	recs := recpool.Records(4096)
	for range 10 {
		p.Round(t, context.Background(), recs, 64, func() bool { return c.Unread() == 0 })
	}
	p.Buf.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), recpool.Poison) || strings.Contains(string(b), "192.0.2.66") {
		t.Fatal("the log holds a recycled record")
	}
	t.Logf("%d lines, %d lost, %d recycled", strings.Count(string(b), "\n"), c.Lost, p.Recycled)
}

func BenchmarkExport(b *testing.B) {
	s, err := flowlog.New(flowlog.Options{Path: filepath.Join(b.TempDir(), "flows.log"), Metrics: sink.NewMetrics(nil)})
	if err != nil {
		b.Fatal(err)
	}
	p := recpool.New(8192)
	c := p.Buf.Consumer()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	recs := recpool.Records(1024)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(recs) {
		p.Round(b, context.Background(), recs[:min(len(recs), b.N-n)], 256, func() bool { return c.Unread() == 0 })
	}
	b.StopTimer()
	p.Buf.Close()
	<-done
}
