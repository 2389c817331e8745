package fault

import (
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
)

// TestDownstreamDown is scenario 2: the IPFIX collector behind the
// aggregator goes down for 10 s (60 s in the words; shortened for
// the suite) while an exporter keeps sending. The aggregator buffers up to
// its cap (recordBufferSize), drops beyond it with a count, and resumes by
// itself when the collector is back. Every record it handed to the sink is
// delivered or counted, but for what the collector had received into its
// socket and not read when it went down (the one window of IPFIX over TCP,
// which has no acknowledgement: measured, and bounded by what was written
// and not yet read then).
func TestDownstreamDown(t *testing.T) {
	const buffer = 4096
	p := newPipelineBuffer(t, "tcp", "5s", buffer)
	agg := p.startAggregator()
	exp := p.startExporter("node-1", "tcp", 400)
	first := p.coll
	testkit.WaitFor(t, "records at the collector", func() bool { return first.Len() >= 1000 })
	atClose := first.Len()
	first.Close()
	down := time.Now()
	// What the sink had written when it noticed the collector was gone:
	// only those the collector had not read can be lost without a count.
	connected := regexp.MustCompile(`(?m)^sluice_sink_connected\{sink="flowCollector"\} (\S+)$`)
	exportedRe := regexp.MustCompile(`(?m)^sluice_sink_records_exported_total\{sink="flowCollector"\} (\S+)$`)
	testkit.WaitFor(t, "the sink to notice", func() bool { return metric(t, p.api, connected) == 0 })
	inFlight := metric(t, p.api, exportedRe) - atClose
	// The fault: the collector stays down for 10 s.
	time.Sleep(10 * time.Second)
	second := stubcollector.NewAt(t, first.Addr())
	back := time.Now()
	testkit.WaitFor(t, "records at the collector once it is back", func() bool { return second.Len() >= 2000 })
	resumed := time.Since(back)

	exp.signal(t, syscall.SIGTERM)
	e := exp.line("exporter stopped", nil)
	agg.signal(t, syscall.SIGTERM)
	s := agg.line("sink totals", map[string]any{"sink": "flowCollector"})
	end := agg.line("aggregator stopped", nil)
	if e == nil || s == nil || end == nil {
		t.Fatal("a process did not log its totals")
	}
	handed, exported := num(t, end, "records_to_sinks"), num(t, s, "exported")
	bufferFull, sendErr := num(t, s, "dropped_buffer-full"), num(t, s, "dropped_send-error")
	dropped := bufferFull + sendErr + num(t, s, "dropped_encode-error") + num(t, s, "dropped_shutdown")
	// The collector may still be reading what the aggregator sent before
	// it exited.
	testkit.WaitFor(t, fmt.Sprintf("every record exported, but at most the %d in flight at the close, at a collector", inFlight), func() bool {
		return first.Len()+second.Len() >= exported-inFlight
	})
	delivered := first.Len() + second.Len()
	window := exported - delivered
	t.Logf("down %v: exporter produced %d; aggregator handed %d to the sink, exported %d, dropped %d (buffer-full %d, send-error %d); delivered %d (%d before, %d after); unread by the collector that went down %d (at most %d in flight); resumed %v after it came back",
		back.Sub(down).Round(time.Millisecond), num(t, e, "records"), handed, exported, dropped, bufferFull, sendErr,
		delivered, first.Len(), second.Len(), window, inFlight, resumed.Round(time.Millisecond))
	if exported+dropped != handed {
		t.Errorf("the sink exported %d and dropped %d of %d records handed to it", exported, dropped, handed)
	}
	if bufferFull == 0 {
		t.Errorf("no record dropped for room after 10 s down with a %d-record buffer (handed %d)", buffer, handed)
	}
	if window < 0 || window > inFlight {
		t.Errorf("%d records counted as exported never reached a collector, more than the %d written and unread when it went down", window, inFlight)
	}
	if errs := second.Errors(); len(errs) > 0 {
		t.Errorf("the collector saw errors: %v", errs)
	}
}
