package fault

import (
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// TestGracefulStopUnderLoad is scenario 6: SIGTERM while exporters send
// at full rate. Everything the aggregator accepted reaches its sink before
// it exits (what it handed to its sinks equals what the sink sent, none
// dropped, and the collector holds as many), within the drain timeout.
func TestGracefulStopUnderLoad(t *testing.T) {
	p := newPipeline(t, "tcp", "5s")
	agg := p.startAggregator()
	// Two exporters, one per transport the aggregator takes here.
	p.startExporter("node-1", "tcp", 2000)
	p.startExporter("node-2", "grpc", 2000)
	testkit.WaitFor(t, "records at the collector", func() bool { return p.coll.Len() >= 5000 })

	stopped := time.Now()
	agg.signal(t, syscall.SIGTERM)
	took := time.Since(stopped)
	s := agg.line("sink totals", map[string]any{"sink": "flowCollector"})
	end := agg.line("aggregator stopped", nil)
	if s == nil || end == nil {
		t.Fatal("the aggregator did not log its totals")
	}
	handed, exported := num(t, end, "records_to_sinks"), num(t, s, "exported")
	dropped := num(t, s, "dropped_buffer-full") + num(t, s, "dropped_send-error") + num(t, s, "dropped_encode-error") + num(t, s, "dropped_shutdown")
	t.Logf("stopped in %v: %d records handed to the sink, %d exported, %d dropped", took.Round(time.Millisecond), handed, exported, dropped)
	if exported != handed || dropped != 0 {
		t.Errorf("the sink exported %d of %d records (dropped %d)", exported, handed, dropped)
	}
	// The collector reads what the aggregator wrote before it exited.
	testkit.WaitFor(t, "every exported record at the collector", func() bool { return p.coll.Len() == exported })
	if took > 5*time.Second+testkit.WaitTimeout {
		t.Errorf("the stop took %v with a 5 s drain timeout", took)
	}
	if errs := p.coll.Errors(); len(errs) > 0 {
		t.Errorf("the collector saw errors: %v", errs)
	}
}
