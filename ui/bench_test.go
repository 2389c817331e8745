package ui

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/flow/flowtest"
)

// BenchmarkTap is the tap's work per record: the row, the history, the
// map (see docs/performance.md).
func BenchmarkTap(b *testing.B) {
	pool := make([]*flow.Flow, 500)
	for i := range pool {
		pool[i] = flowtest.Full(i, true)
	}
	h := newHistory(DefaultHistory)
	g := newEdges(DefaultMaxEdges, prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}))
	wl := &workloads{}
	es := make([]entry, 0, 512)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := pool[i%len(pool)]
		e := entry{row: newRow(uint64(i+1), f, wl), f: f}
		g.add(&e.row, now)
		es = append(es, e)
		if len(es) == cap(es) {
			h.add(es)
			es = es[:0]
		}
	}
}
