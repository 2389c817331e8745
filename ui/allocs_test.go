package ui

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/testkit/recpool"
)

// tapUpTo reports whether the tap has read (or lost) everything produced
// into p's buffer, allocating nothing.
func tapUpTo(s *Server, p *recpool.Producer) func() bool {
	return func() bool {
		s.hist.mu.Lock()
		read := s.hist.next - 1
		s.hist.mu.Unlock()
		return read+s.tapLost.Load() >= p.Buf.Produced()
	}
}

// TestTapAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled by the buffer once every reader released them), the
// UI's tap allocates nothing per record for its history and map; the
// history never shows a recycled record, even when the tap is lapped.
func TestTapAllocatesNothingPerRecord(t *testing.T) {
	for _, lapped := range []bool{false, true} {
		capacity, chunk := 8192, 256
		if lapped {
			capacity, chunk = 64, 64
		}
		p := recpool.New(capacity)
		p.Quarantine = lapped
		s, _ := testServer(t, Options{Buffer: p.Buf, History: 4096})
		recs := recpool.Records(2048)
		round := func() {
			p.Round(t, context.Background(), recs, chunk, tapUpTo(s, p))
		}
		per := recpool.Measure(8, len(recs), round)
		t.Logf("lapped %v: %.4f allocations per record; %d records made, %d recycled", lapped, per, p.Made, p.Recycled)
		if !lapped && per > recpool.PerRecordBound {
			t.Errorf("%.3f allocations per record, want none", per)
		}
		rows, _ := s.hist.last(4096)
		for _, r := range rows {
			if r.SrcPod == recpool.Poison || r.SrcIP == "192.0.2.66" {
				t.Fatalf("lapped %v: the history shows a recycled record", lapped)
			}
			if f, ok := s.hist.record(r.Seq); ok && (strings.Contains(f.SourcePodName, recpool.Poison) || f.TCPState == recpool.Poison) {
				t.Fatalf("lapped %v: the history holds a recycled record", lapped)
			}
		}
	}
}

func BenchmarkTapExport(b *testing.B) {
	p := recpool.New(8192)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Buffer: p.Buf, History: 4096, Registerer: reg, Gatherer: reg})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	recs := recpool.Records(1024)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(recs) {
		p.Round(b, context.Background(), recs[:min(len(recs), b.N-n)], 256, tapUpTo(s, p))
	}
	b.StopTimer()
	cancel()
	<-done
}
