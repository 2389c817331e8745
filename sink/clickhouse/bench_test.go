package clickhouse_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"sluice/flow"
	"sluice/internal/testkit/chserver"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/clickhouse"
)

// benchFlows are distinct records shaped like an aggregated inter-node
// flow with its Kubernetes metadata.
func benchFlows(n int) []*flow.Flow {
	out := make([]*flow.Flow, n)
	for i := range out {
		out[i] = &flow.Flow{
			StartTime: time.Unix(1_800_000_000, 0), EndTime: time.Unix(1_800_000_060+int64(i%600), 0), EndReason: 2,
			SourceIP:      netip.AddrFrom4([4]byte{10, 244, byte(i >> 8 & 15), byte(i)}),
			DestinationIP: netip.AddrFrom4([4]byte{10, 244, 100, byte(i % 50)}),
			SourcePort:    uint16(i), DestinationPort: 8080, Protocol: 6, TCPState: "ESTABLISHED", FlowType: flow.FlowTypeInterNode,
			Stats:         flow.Stats{PacketTotalCount: uint64(i), OctetTotalCount: uint64(i) * 900, PacketDeltaCount: 10, OctetDeltaCount: 9000},
			ReverseStats:  flow.Stats{PacketTotalCount: uint64(i), OctetTotalCount: uint64(i) * 1200, PacketDeltaCount: 8, OctetDeltaCount: 12000},
			SourcePodName: fmt.Sprintf("frontend-7d9c-%05d", i%4096), SourcePodNamespace: "shop", SourceNodeName: fmt.Sprintf("node-%d", i%16),
			DestinationPodName: fmt.Sprintf("cart-%d", i%50), DestinationPodNamespace: "shop", DestinationNodeName: fmt.Sprintf("node-%d", (i+3)%16),
			DestinationClusterIP: netip.MustParseAddr("10.96.0.20"), DestinationServiceIP: netip.MustParseAddr("10.96.0.20"),
			DestinationServicePort: 80, DestinationServicePortName: "shop/cart:http",
			Ingress:         flow.Policy{Type: 2, Namespace: "shop", Name: "allow-frontend", RuleName: "r1", RuleAction: flow.ActionAllow},
			SourcePodLabels: `{"app":"frontend","pod-template-hash":"7d9c"}`, DestinationPodLabels: `{"app":"cart"}`,
			ClusterID: "cluster-1",
			Aggregation: &flow.Aggregation{EndFromSource: time.Unix(1_800_000_060, 0), EndFromDestination: time.Unix(1_800_000_059, 0),
				Throughput: 1200, ReverseThroughput: 1600, ThroughputFromSource: 1200, ThroughputFromDestination: 1190},
		}
	}
	return out
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkInsert: one op is one row, into the same local server. "sluice"
// is the sink (records through its queue, column-wise batches of 65,536
// rows, the run ended by closing the buffer, which flushes); "reference"
// is the reference's way: database/sql, a transaction with a prepared
// INSERT, one Exec per row, committed every 65,536 rows. Reported beside
// ns/op, B/op, allocs/op: rows/s, the client's CPU per row and the
// server's.
func BenchmarkInsert(b *testing.B) {
	srv := chserver.Start(b, chserver.Options{})
	flows := benchFlows(1 << 16)
	const batch = 65536
	report := func(b *testing.B, elapsed, cpu, srvCPU time.Duration) {
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/row")
		b.ReportMetric(float64(srvCPU.Nanoseconds())/float64(b.N), "server-cpu-ns/row")
	}
	create := func(b *testing.B) {
		conn := srv.Conn()
		conn.Exec(context.Background(), "DROP TABLE IF EXISTS flows")
		stmts, _ := clickhouse.Schema(clickhouse.SchemaOptions{Server: clickhouse.Version{Major: 18, Minor: 16}})
		if err := conn.Exec(context.Background(), stmts[0].SQL); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("sluice", func(b *testing.B) {
		create(b)
		m := sink.NewMetrics(nil)
		s, err := clickhouse.New(clickhouse.Options{Addr: srv.Addr, Compress: true, CommitInterval: time.Hour,
			QueueSize: max(b.N, 1), BatchRows: batch, Metrics: m, FlushTimeout: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		buf := ring.New[*flow.Flow](1 << 16)
		c := buf.Consumer()
		done := make(chan error, 1)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0, srv0, t0 := cpuTime(), srv.CPUTime(), time.Now()
		go func() { done <- s.Run(context.Background(), c) }()
		for i := range b.N {
			buf.ProduceWait(context.Background(), flows[i%len(flows)])
		}
		buf.Close()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		report(b, time.Since(t0), cpuTime()-cpu0, srv.CPUTime()-srv0)
		b.StopTimer()
		if got := int(testutilValue(m)); got != b.N {
			b.Fatalf("inserted %d rows of %d", got, b.N)
		}
	})

	b.Run("reference", func(b *testing.B) {
		create(b)
		db := ch.OpenDB(&ch.Options{Addr: []string{srv.Addr}, Compression: &ch.Compression{Method: ch.CompressionLZ4}})
		defer db.Close()
		var names []string
		for _, c := range clickhouse.Columns() {
			if c.Name != "destinationServiceIP" { // the reference's 51 columns
				names = append(names, c.Name)
			}
		}
		query := "INSERT INTO flows (" + strings.Join(names, ", ") + ")"
		b.ReportAllocs()
		b.ResetTimer()
		cpu0, srv0, t0 := cpuTime(), srv.CPUTime(), time.Now()
		for done := 0; done < b.N; {
			n := min(batch, b.N-done)
			if err := referenceCommit(db, query, flows, done, n); err != nil {
				b.Fatal(err)
			}
			done += n
		}
		report(b, time.Since(t0), cpuTime()-cpu0, srv.CPUTime()-srv0)
	})
}

// referenceCommit writes rows as the reference does: a transaction, a
// prepared INSERT, the row's values converted and appended one row at a
// time, a commit.
func referenceCommit(db *sql.DB, query string, flows []*flow.Flow, from, n int) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	stmt, err := tx.Prepare(query)
	if err != nil {
		tx.Rollback()
		return err
	}
	addr := func(a netip.Addr) string {
		if !a.IsValid() {
			return ""
		}
		return a.String()
	}
	for i := from; i < from+n; i++ {
		f := flows[i%len(flows)]
		ag := f.Aggregation
		if _, err := stmt.Exec(
			f.StartTime, f.EndTime, ag.EndFromSource, ag.EndFromDestination, f.EndReason,
			addr(f.SourceIP), addr(f.DestinationIP), f.SourcePort, f.DestinationPort, f.Protocol,
			f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.Stats.PacketDeltaCount, f.Stats.OctetDeltaCount,
			f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount, f.ReverseStats.PacketDeltaCount, f.ReverseStats.OctetDeltaCount,
			f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName, f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName,
			addr(f.DestinationClusterIP), f.DestinationServicePort, f.DestinationServicePortName,
			f.Ingress.Name, f.Ingress.Namespace, f.Ingress.RuleName, f.Ingress.RuleAction, f.Ingress.Type,
			f.Egress.Name, f.Egress.Namespace, f.Egress.RuleName, f.Egress.RuleAction, f.Egress.Type,
			f.TCPState, f.FlowType, f.SourcePodLabels, f.DestinationPodLabels,
			ag.Throughput, ag.ReverseThroughput, ag.ThroughputFromSource, ag.ThroughputFromDestination,
			ag.ReverseThroughputFromSource, ag.ReverseThroughputFromDestination,
			f.ClusterID, f.EgressName, addr(f.EgressIP), f.EgressNodeName,
		); err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

func testutilValue(m *sink.Metrics) float64 {
	return float64(counter(m.Exported.WithLabelValues("clickHouse")))
}
