package clickhouse_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/chserver"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/clickhouse"
)

// record i, told apart by its source port and address.
func record(i int) *flow.Flow {
	return &flow.Flow{
		StartTime: time.Unix(1_800_000_000, 0), EndTime: time.Unix(1_800_000_000+int64(i%3600), 0),
		SourceIP:      netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
		DestinationIP: netip.MustParseAddr("10.244.2.9"), SourcePort: uint16(i), DestinationPort: 80, Protocol: 6,
		Stats:         flow.Stats{PacketDeltaCount: 1, OctetDeltaCount: uint64(i)},
		SourcePodName: fmt.Sprintf("client-%d", i%50), SourcePodNamespace: "web", FlowType: flow.FlowTypeIntraNode,
	}
}

type running struct {
	s    *clickhouse.Sink
	buf  *ring.Buffer[*flow.Flow]
	m    *sink.Metrics
	logs *testkit.LogBuffer
	stop func() error
}

// runSink runs a sink on its own buffer until the test ends (or stop).
func runSink(t *testing.T, o clickhouse.Options) *running {
	t.Helper()
	r := &running{m: sink.NewMetrics(nil), logs: &testkit.LogBuffer{}}
	o.Metrics, o.Log = r.m, slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o.Registry = prometheus.NewRegistry()
	s, err := clickhouse.New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	r.buf = ring.New[*flow.Flow](1 << 16)
	c := r.buf.Consumer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, c) }()
	stopped := false
	var runErr error
	r.stop = func() error {
		if !stopped {
			stopped = true
			r.buf.Close()
			select {
			case runErr = <-done:
			case <-time.After(o.FlushTimeout + testkit.WaitTimeout):
				cancel()
				runErr = <-done
			}
			cancel()
		}
		return runErr
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("sink log:\n%s", r.logs.String())
		}
	})
	return r
}

func (r *running) produce(from, to int) {
	for i := from; i < to; i++ {
		r.buf.Produce(record(i))
	}
}

func counter(c prometheus.Collector) int { return int(testutil.ToFloat64(c)) }

// TestServerKilledAndRestarted: ClickHouse killed mid-stream and started
// again on the same data. While the queue has room nothing is lost and
// nothing doubled; when it has not, the oldest rows are dropped and
// exactly those are counted.
func TestServerKilledAndRestarted(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{})
	conn := srv.Conn()

	t.Run("queue with room", func(t *testing.T) {
		conn.Exec(context.Background(), "DROP TABLE IF EXISTS flows")
		r := runSink(t, clickhouse.Options{Addr: srv.Addr, CommitInterval: 200 * time.Millisecond, CreateSchema: true,
			QueueSize: 100_000, BatchRows: 1000, FlushTimeout: 20 * time.Second})
		r.produce(0, 3000)
		// Acknowledged, not only in the table: a kill between the commit and
		// the acknowledgement makes the sink send the batch again (at least
		// once), which is not what this test is about.
		exported := r.m.Exported.WithLabelValues("clickHouse")
		testkit.WaitFor(t, "the first rows", func() bool { return counter(exported) == 3000 })
		srv.Kill()
		r.produce(3000, 8000)
		failed := r.m.Connected.WithLabelValues("clickHouse")
		testkit.WaitFor(t, "the sink to see the server gone", func() bool {
			return strings.Contains(r.logs.String(), "ClickHouse insert failed") && counter(failed) == 0
		})
		r.produce(8000, 10000)
		srv.Restart()
		testkit.WaitFor(t, "every row after the restart", func() bool { return srv.Count(conn, "flows") >= 10000 })
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		var n, distinct uint64
		if err := conn.QueryRow(context.Background(), "SELECT count(), uniqExact(sourceTransportPort) FROM flows").Scan(&n, &distinct); err != nil {
			t.Fatal(err)
		}
		if n != 10000 || distinct != 10000 {
			t.Errorf("%d rows, %d distinct, want 10000 of each\n%s", n, distinct, partsOf(t, conn))
		}
		if d := counter(r.m.Dropped.WithLabelValues("clickHouse", clickhouse.ReasonQueueFull)); d != 0 {
			t.Errorf("%d rows counted dropped with room in the queue", d)
		}
		if e := counter(exported); e != 10000 {
			t.Errorf("exported %d, want 10000", e)
		}
	})

	t.Run("queue full", func(t *testing.T) {
		conn.Exec(context.Background(), "DROP TABLE IF EXISTS flows")
		r := runSink(t, clickhouse.Options{Addr: srv.Addr, CommitInterval: 200 * time.Millisecond, CreateSchema: true,
			QueueSize: 1000, BatchRows: 500, FlushTimeout: 20 * time.Second})
		r.produce(0, 500)
		exported := r.m.Exported.WithLabelValues("clickHouse")
		testkit.WaitFor(t, "the first rows", func() bool { return counter(exported) == 500 })
		srv.Kill()
		r.produce(500, 3500) // 3,000 rows for a queue of 1,000
		dropped := r.m.Dropped.WithLabelValues("clickHouse", clickhouse.ReasonQueueFull)
		testkit.WaitFor(t, "2,000 rows counted dropped", func() bool { return counter(dropped) >= 2000 })
		srv.Restart()
		testkit.WaitFor(t, "the queued rows after the restart", func() bool { return srv.Count(conn, "flows") >= 1500 })
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if d := counter(dropped); d != 2000 {
			t.Errorf("dropped %d, want 2000\n%s", d, partsOf(t, conn))
		}
		// The newest 1,000 are the ones kept.
		var n uint64
		var lo, hi uint16
		if err := conn.QueryRow(context.Background(), "SELECT count(), min(sourceTransportPort), max(sourceTransportPort) FROM flows WHERE sourceTransportPort >= 500").Scan(&n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		if n != 1000 || lo != 2500 || hi != 3499 {
			t.Errorf("after the outage %d rows, ports %d..%d; want the newest 1000, 2500..3499", n, lo, hi)
		}
		if got := srv.Count(conn, "flows"); got != 1500 {
			t.Errorf("%d rows in all, want 1500", got)
		}
	})
}

// TestFinalFlushGivesUpAndCounts: at the end of the run, rows the server
// cannot take within FlushTimeout are counted lost, and Run still ends.
func TestFinalFlushGivesUpAndCounts(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{})
	r := runSink(t, clickhouse.Options{Addr: srv.Addr, CommitInterval: time.Hour, CreateSchema: true,
		FlushTimeout: 2 * time.Second, DialTimeout: time.Second})
	srv.Kill()
	r.produce(0, 100)
	testkit.WaitFor(t, "the rows queued", func() bool { return r.s.Queued() == 100 })
	start := time.Now()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the final flush took %s with a timeout of 2s", d)
	}
	if lost := counter(r.m.Dropped.WithLabelValues("clickHouse", sink.ReasonSendError)); lost != 100 {
		t.Errorf("%d rows counted lost, want 100", lost)
	}
}

// partsOf describes the table's parts and duplicated rows, for a failure.
func partsOf(t *testing.T, conn driver.Conn) string {
	var b strings.Builder
	for _, q := range []string{
		"SELECT _part, count(), min(sourceTransportPort), max(sourceTransportPort) FROM flows GROUP BY _part ORDER BY _part",
		"SELECT count(), min(sourceTransportPort), max(sourceTransportPort) FROM (SELECT sourceTransportPort, count() AS c FROM flows GROUP BY sourceTransportPort HAVING c > 1)",
	} {
		rows, err := conn.Query(context.Background(), q)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", q, err)
			continue
		}
		for rows.Next() {
			var part string
			var n uint64
			var lo, hi uint16
			if strings.Contains(q, "_part") {
				rows.Scan(&part, &n, &lo, &hi)
			} else {
				rows.Scan(&n, &lo, &hi)
			}
			fmt.Fprintf(&b, "%s %d rows, ports %d..%d\n", part, n, lo, hi)
		}
		rows.Close()
	}
	return b.String()
}
