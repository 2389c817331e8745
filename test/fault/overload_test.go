package fault

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
)

// floodMessages encodes n distinct inter-Node records (one side of each
// connection, held for correlation) for sender w, as IPFIX messages.
func floodMessages(t *testing.T, w, n int) []byte {
	t.Helper()
	now := time.Now().Truncate(time.Second)
	flows := make([]flow.Flow, n)
	for i := range flows {
		f := &flows[i]
		*f = flow.Flow{StartTime: now.Add(-time.Second), EndTime: now,
			SourceIP: netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 8), byte(i)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
			SourcePort: uint16(1024 + i%60000), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeInterNode,
			SourcePodNamespace: "web", SourcePodName: "client", SourceNodeName: "node-a"}
		f.Stats.PacketTotalCount, f.Stats.OctetTotalCount = 10, 1000
	}
	return ipfixgen.Messages(t, 1, flows)
}

// TestOverload is scenario 5: far more records than the aggregator can
// process (four senders writing as fast as TCP lets them, new connections
// every record) for 8 s. Its heap stays under its configured bound
// (GOMEMLIMIT, with sluice.aggregate.maxFlows and recordBufferSize
// bounding what it holds), what it cannot pass on is counted, and once the
// flood stops it serves a well-behaved exporter again.
func TestOverload(t *testing.T) {
	p := newPipelineBuffer(t, "tcp", "5s", 8192)
	// Aggregate mode, a bounded flow table.
	writeFile(t, p.config, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
activeFlowRecordTimeout: 1s
inactiveFlowRecordTimeout: 2s
recordBufferSize: 8192
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  ipfixAddress: %q
  grpcAddress: ""
  apiAddress: %q
  drainTimeout: 5s
  tls: {certDir: %s}
  aggregate: {maxFlows: 50000, exportOneSided: true}
`, p.coll.Addr(), p.ipfix, p.api, filepath.Join(t.TempDir(), "certs")))
	// The bound: Go's soft memory limit, as a Deployment sets it from the
	// container's limit. The flood must not push the heap past it.
	t.Setenv("GOMEMLIMIT", "192MiB")
	agg := p.startAggregator()
	heapRe := regexp.MustCompile(`(?m)^go_memstats_heap_inuse_bytes (\S+)$`)
	// The flow table is mapped outside the Go heap (in huge pages); the
	// aggregator lowers the Go limit by its size, so heap and table
	// together are what GOMEMLIMIT bounds.
	tableRe := regexp.MustCompile(`(?m)^sluice_aggregate_table_bytes (\S+)$`)
	receivedRe := regexp.MustCompile(`(?m)^sluice_collector_records_received_total\{[^}]*\} (\S+)$`)

	ctx, stop := context.WithTimeout(context.Background(), 8*time.Second)
	defer stop()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		msgs := floodMessages(t, w+1, 20000)
		wg.Go(func() {
			c, err := net.Dial("tcp", p.ipfix)
			if err != nil {
				return
			}
			defer c.Close()
			for ctx.Err() == nil {
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write(msgs); err == nil {
					sent.Add(20000)
				}
			}
		})
	}
	var peak int
	for ctx.Err() == nil {
		if h := metric(t, p.api, heapRe) + metric(t, p.api, tableRe); h > peak {
			peak = h
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	wg.Wait()
	received := metric(t, p.api, receivedRe)

	// The flood is over: a well-behaved exporter is served again.
	before := p.coll.Len()
	exp := p.startExporter("node-1", "tcp", 200)
	testkit.WaitFor(t, "the well-behaved exporter's records after the flood", func() bool {
		return p.coll.Len() >= before+500
	})
	exp.signal(t, syscall.SIGTERM)
	agg.signal(t, syscall.SIGTERM)
	s := agg.line("sink totals", map[string]any{"sink": "flowCollector"})
	end := agg.line("aggregator stopped", nil)
	if s == nil || end == nil {
		t.Fatal("the aggregator did not log its totals")
	}
	handed, exported := num(t, end, "records_to_sinks"), num(t, s, "exported")
	dropped := num(t, s, "dropped_buffer-full") + num(t, s, "dropped_send-error") + num(t, s, "dropped_encode-error") + num(t, s, "dropped_shutdown")
	// The sink is waited for (sluice.sinkOverflow block) unless it sends
	// nothing for sluice.sinkStallTimeout, as it may on a starved
	// machine: then its buffer-full drops are explained here.
	for l := range strings.SplitSeq(agg.logText(), "\n") {
		if strings.Contains(l, "sinkStallTimeout") {
			t.Log(l)
		}
	}
	t.Logf("flood: %d records written by the senders in 8 s, %d received by the aggregator; peak heap in use and flow table %d MiB; sink: %d handed, %d exported, %d dropped (buffer-full %d)",
		sent.Load(), received, peak>>20, handed, exported, dropped, num(t, s, "dropped_buffer-full"))
	// GOMEMLIMIT is soft: the collector may overshoot it briefly while it
	// catches up, hence the quarter of margin.
	const limit = 192 << 20
	if bound := limit * 5 / 4; peak > bound {
		t.Errorf("peak heap in use and flow table %d MiB, over GOMEMLIMIT (%d MiB) by more than a quarter, with 50,000 flows and an 8,192-record buffer", peak>>20, limit>>20)
	}
	if exported+dropped != handed {
		t.Errorf("the sink exported %d and dropped %d of %d records handed to it", exported, dropped, handed)
	}
}
