package kafka

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/certs"
	"sluice/flow"
	"sluice/internal/kafkatest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
)

func ingestYAML(brokers []string, extra ...string) string {
	return fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
kafka: {enable: true, brokers: [%s], topic: flows%s}
sluice:
  ipfixAddress: 127.0.0.1:0
  apiAddress: 127.0.0.1:0
  grpcAddress: ""
  proxy: {fillPods: false}
`, strings.Join(brokers, ", "), strings.Join(extra, ""))
}

func aggregateYAML(brokers []string, collector string) string {
	return fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: none
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  apiAddress: 127.0.0.1:0
  grpcAddress: ""
  kafkaInput: {enable: true, brokers: [%s], topic: flows, group: aggregate, sessionTimeout: 6s}
`, collector, strings.Join(brokers, ", "))
}

func singleYAML(collector string) string {
	return fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  ipfixAddress: 127.0.0.1:0
  apiAddress: 127.0.0.1:0
  grpcAddress: ""
`, collector)
}

// byConnection indexes exported records by their source endpoint (each
// connection of the workload has its own), with what depends on the
// exporting process's timing (the IPFIX message header) cleared.
func byConnection(t *testing.T, recs []stubcollector.Record) (map[string]flow.Flow, int) {
	t.Helper()
	out := map[string]flow.Flow{}
	dups := 0
	for _, r := range recs {
		f := r.Flow
		f.Origin = flow.Origin{}
		k := fmt.Sprintf("%s:%d", f.SourceIP, f.SourcePort)
		if _, ok := out[k]; ok {
			dups++
		}
		out[k] = f
	}
	return out, dups
}

func sum(t testing.TB, ps []*proc, series string) float64 {
	var n float64
	for _, p := range ps {
		if v := p.metric(t, series); v > 0 {
			n += v
		}
	}
	return n
}

// TestSameResultAsOneAggregator: 4 agents, 2 ingest replicas, 3
// Aggregate replicas. Every connection is exported correlated once, and
// the records equal, field by field, what one aggregator exports for the
// same input.
func TestSameResultAsOneAggregator(t *testing.T) {
	const n = 400
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	conns := workload(0, n)

	refColl := stubcollector.New(t)
	ref := startAgg(t, "single", singleYAML(refColl.Addr()))
	agents(t, conns, func(int) string { return ref.ipfix })

	coll := stubcollector.New(t)
	var aggs []*proc
	for i := range 3 {
		aggs = append(aggs, startAgg(t, fmt.Sprintf("aggregate-%d", i), aggregateYAML(k.Addrs(), coll.Addr())))
	}
	ingest := []*proc{startAgg(t, "ingest-0", ingestYAML(k.Addrs())), startAgg(t, "ingest-1", ingestYAML(k.Addrs()))}
	// The group settled first: a partition that moves while records flow
	// is replayed by its next owner, and what its first owner exported
	// already may be exported twice (counted; the scenario is the steady
	// state, the other tests cover the moves).
	testkit.WaitFor(t, "the 12 partitions spread over the 3 replicas", func() bool {
		total := 0.0
		for _, a := range aggs {
			p := a.metric(t, "sluice_kafka_input_partitions")
			if p <= 0 {
				return false
			}
			total += p
		}
		return total == 12
	})
	agents(t, conns, func(node int) string { return ingest[node/2].ipfix })

	testkit.WaitFor(t, fmt.Sprintf("%d records from one aggregator", n), func() bool { return refColl.Len() >= n })
	testkit.WaitFor(t, fmt.Sprintf("%d records from the Aggregate tier", n), func() bool { return coll.Len() >= n })
	// The ingest tier counts a record written on Kafka's acknowledgement,
	// which may come after a replica fetched it.
	testkit.WaitFor(t, "the ingest tier to count every record written", func() bool {
		return sum(t, ingest, `sluice_sink_records_exported_total{sink="kafka"}`) >= 2*n
	})
	testkit.WaitFor(t, "the Aggregate tier to have taken every half and sent every export", func() bool {
		// Records a replica replays after a rebalance are taken twice,
		// and counted as replayed.
		return sum(t, aggs, "sluice_aggregate_records_total") == 2*n+sum(t, aggs, "sluice_kafka_input_records_replayed_total") &&
			sum(t, aggs, `sluice_sink_records_exported_total{sink="flowCollector"}`) == float64(coll.Len())
	})
	if got := sum(t, ingest, `sluice_sink_records_exported_total{sink="kafka"}`); got != 2*n {
		t.Errorf("the ingest tier wrote %v records to Kafka, want %d", got, 2*n)
	}
	want, refDups := byConnection(t, refColl.Records())
	got, dups := byConnection(t, coll.Records())
	if refDups != 0 || dups != 0 {
		t.Errorf("connections exported more than once: %d by one aggregator, %d by the tier", refDups, dups)
	}
	if len(got) != n || len(want) != n {
		t.Fatalf("%d connections from the tier, %d from one aggregator, want %d", len(got), len(want), n)
	}
	shown := 0
	for key, w := range want {
		g, ok := got[key]
		if !ok {
			t.Errorf("%s: not exported by the tier", key)
			continue
		}
		if g.SourcePodName == "" || g.DestinationPodName == "" {
			t.Errorf("%s: not correlated: %+v", key, g)
		}
		if !reflect.DeepEqual(g, w) && shown < 3 {
			shown++
			t.Errorf("%s differs:\n tier:   %+v\n single: %+v", key, g, w)
		}
	}
	// The work was shared.
	for _, a := range aggs {
		if v := a.metric(t, "sluice_aggregate_records_total"); v <= 0 {
			t.Errorf("%s aggregated no record", a.name)
		}
	}
}

// TestReplicaKilled: one Aggregate replica is killed (kill -9) while
// records flow. Every connection is still exported correlated, nothing is
// lost, and what is exported twice is counted and within the bound: no
// more connections than the survivors replayed records of.
func TestReplicaKilled(t *testing.T) {
	const n = 600
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	coll := stubcollector.New(t)
	var aggs []*proc
	for i := range 3 {
		aggs = append(aggs, startAgg(t, fmt.Sprintf("aggregate-%d", i), aggregateYAML(k.Addrs(), coll.Addr())))
	}
	ingest := []*proc{startAgg(t, "ingest-0", ingestYAML(k.Addrs())), startAgg(t, "ingest-1", ingestYAML(k.Addrs()))}
	testkit.WaitFor(t, "every replica to own partitions", func() bool {
		for _, a := range aggs {
			if a.metric(t, "sluice_kafka_input_partitions") <= 0 {
				return false
			}
		}
		return true
	})
	conns := workload(0, n)
	// The first half of the connections, then the kill, then the rest:
	// the victim holds state of the first half, and records of the second
	// land on its partitions while it is gone.
	agents(t, conns[:n/2], func(node int) string { return ingest[node/2].ipfix })
	victim := aggs[1]
	testkit.WaitFor(t, "the victim to have taken records", func() bool {
		return victim.metric(t, "sluice_aggregate_records_total") > 0
	})
	victim.kill()
	agents(t, conns[n/2:], func(node int) string { return ingest[node/2].ipfix })
	survivors := []*proc{aggs[0], aggs[2]}

	testkit.WaitFor(t, fmt.Sprintf("all %d connections exported", n), func() bool {
		got, _ := byConnection(t, coll.Records())
		return len(got) == n
	})
	got, dups := byConnection(t, coll.Records())
	for key, f := range got {
		if f.SourcePodName == "" || f.DestinationPodName == "" {
			t.Errorf("%s: not correlated", key)
		}
	}
	replayed := sum(t, survivors, "sluice_kafka_input_records_replayed_total")
	// A connection exported twice had records replayed.
	if float64(dups) > replayed {
		t.Errorf("%d connections exported twice, but only %v records replayed (counted)", dups, replayed)
	}
	t.Logf("kill -9 of one of 3 replicas: %d connections, %d exported twice, %v records replayed", n, dups, replayed)
}

// TestScaleOneToThree: records flow to one Aggregate replica, then two
// more join (partitions move by the cooperative-sticky protocol) while
// records keep coming. Every connection is exported correlated; none is
// lost.
func TestScaleOneToThree(t *testing.T) {
	const n = 600
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	coll := stubcollector.New(t)
	first := startAgg(t, "aggregate-0", aggregateYAML(k.Addrs(), coll.Addr()))
	ingest := []*proc{startAgg(t, "ingest-0", ingestYAML(k.Addrs())), startAgg(t, "ingest-1", ingestYAML(k.Addrs()))}
	testkit.WaitFor(t, "the first replica to own every partition", func() bool {
		return first.metric(t, "sluice_kafka_input_partitions") == 12
	})
	conns := workload(0, n)
	// Each connection's source half now, its destination half once the
	// tier has grown: the first replica holds half-built state when
	// partitions move away from it.
	var srcs, dsts []connection
	for _, c := range conns {
		s, d := c, c
		s.dstNode, d.srcNode = -1, -1
		srcs, dsts = append(srcs, s), append(dsts, d)
	}
	agents(t, srcs, func(node int) string { return ingest[node/2].ipfix })
	testkit.WaitFor(t, "the first replica to take every source half", func() bool {
		return first.metric(t, "sluice_aggregate_records_total") == n
	})
	aggs := []*proc{first,
		startAgg(t, "aggregate-1", aggregateYAML(k.Addrs(), coll.Addr())),
		startAgg(t, "aggregate-2", aggregateYAML(k.Addrs(), coll.Addr()))}
	testkit.WaitFor(t, "the partitions to spread over 3 replicas", func() bool {
		total := 0.0
		for _, a := range aggs {
			p := a.metric(t, "sluice_kafka_input_partitions")
			if p <= 0 {
				return false
			}
			total += p
		}
		return total == 12
	})
	agents(t, dsts, func(node int) string { return ingest[node/2].ipfix })
	testkit.WaitFor(t, fmt.Sprintf("all %d connections exported", n), func() bool {
		got, _ := byConnection(t, coll.Records())
		return len(got) == n
	})
	got, dups := byConnection(t, coll.Records())
	for key, f := range got {
		if f.SourcePodName == "" || f.DestinationPodName == "" {
			t.Errorf("%s: not correlated", key)
		}
	}
	handed := first.metric(t, "sluice_kafka_input_flows_handed_over_total")
	if handed <= 0 {
		t.Errorf("the first replica handed over %v flows: the partitions it lost held none?", handed)
	}
	replayed := sum(t, aggs, "sluice_kafka_input_records_replayed_total")
	if float64(dups) > replayed {
		t.Errorf("%d connections exported twice, %v records replayed", dups, replayed)
	}
	t.Logf("1 -> 3 replicas: %d connections, %v flows handed over, %d exported twice, %v records replayed", n, handed, dups, replayed)
}

// TestKafkaUnavailable: the brokers stop for 10 s, then start again (with
// their data). The ingest tier keeps what fits its bound (the aggregator's
// buffer, recordBufferSize, and the client's, kafka.maxBufferedRecords)
// and delivers it once the brokers are back; past the bound it drops the
// oldest records and counts them.
func TestKafkaUnavailable(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12, Persist: true})
	coll := stubcollector.New(t)
	agg := startAgg(t, "aggregate", aggregateYAML(k.Addrs(), coll.Addr()))
	ingest := startAgg(t, "ingest", ingestYAML(k.Addrs(), ", maxBufferedRecords: 100")+"recordBufferSize: 64\n")
	to := func(int) string { return ingest.ipfix }
	sent := func() float64 { return ingest.metric(t, `sluice_proxy_records_total{path="rebuilt"}`) }
	exported := func() float64 { return ingest.metric(t, `sluice_sink_records_exported_total{sink="kafka"}`) }
	dropped := func() float64 {
		return ingest.metric(t, `sluice_sink_records_dropped_total{reason="buffer-full",sink="kafka"}`)
	}
	outage := func() {
		t.Helper()
		// The outage itself lasts 10 s, as the scenario says.
		time.Sleep(10 * time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
		defer cancel()
		k.Restart(ctx)
	}

	// The Aggregate replica commits what it exported before each stop:
	// otherwise it replays it after the outage (its partitions are lost
	// with its session), and the counts below see the replays.
	caughtUp := func() {
		t.Helper()
		testkit.WaitFor(t, "the Aggregate replica to commit everything it took", func() bool {
			return groupLag(t, k, "aggregate") == 0
		})
	}

	agents(t, workload(0, 50), to)
	testkit.WaitFor(t, "50 connections exported", func() bool { return coll.Len() == 50 })
	caughtUp()

	// Within the bound: 120 halves while the brokers are down.
	k.Stop()
	agents(t, workload(50, 60), to)
	testkit.WaitFor(t, "the ingest replica to take the 120 halves", func() bool { return sent() == 220 })
	outage()
	testkit.WaitFor(t, "110 connections exported", func() bool { return coll.Len() == 110 })
	if d := dropped(); d > 0 {
		t.Errorf("%v records dropped within the bound", d)
	}
	caughtUp()

	// Past the bound: 600 halves while the brokers are down.
	k.Stop()
	agents(t, workload(110, 300), to)
	testkit.WaitFor(t, "the ingest replica to take the 600 halves", func() bool { return sent() == 820 })
	outage()
	testkit.WaitFor(t, "every record written to Kafka or counted as dropped", func() bool {
		return exported()+dropped() == 820
	})
	if d := dropped(); d == 0 || d > 600-164 {
		t.Errorf("%v records dropped past the bound: want some, and at most 600 less the bound (164)", d)
	}
	testkit.WaitFor(t, "the Aggregate replica to take what was written", func() bool {
		return agg.metric(t, "sluice_kafka_input_records_total") == exported()
	})
	t.Logf("brokers down twice for 10 s: %v records written, %v dropped (buffer-full) past the bound of 164", exported(), dropped())
}

// TestKafkaUnavailableGRPC: an exporter sends over gRPC to an ingest
// replica while the brokers stop for 10 s and start again. A stream is
// confirmed only once Kafka acknowledged its records, so the exporter
// keeps what was not confirmed and sends it again: it drops nothing, and
// everything the ingest replica received is on the topic.
func TestKafkaUnavailableGRPC(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12, Persist: true})
	certDir := t.TempDir()
	ingest := startAgg(t, "ingest", fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: none
kafka: {enable: true, brokers: [%s], topic: flows}
sluice:
  apiAddress: 127.0.0.1:0
  grpcAddress: 127.0.0.1:0
  tls: {certDir: %q}
  proxy: {fillPods: false}
`, strings.Join(k.Addrs(), ", "), certDir))
	expDir := t.TempDir()
	for _, f := range []string{certs.CACertFile, certs.ClientCertFile, certs.ClientKeyFile} {
		b, err := os.ReadFile(filepath.Join(certDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(expDir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exp := startProc(t, "exporter", "exporter running", "exporter stopped", "exporter", "--source", "synthetic",
		"--node", "node-1", "--pod-cidr", "10.244.1.0/24", "--rate", "200", "--poll-interval", "1s",
		"--active-timeout", "2s", "--idle-timeout", "2s", "--collector", ingest.grpc+":grpc",
		"--tls-cert-dir", expDir, "--tls-server-name", "localhost", "--metrics-address", "127.0.0.1:0")
	received := func() float64 {
		return ingest.metric(t, `sluice_collector_records_received_total{exporter="127.0.0.1",transport="grpc"}`)
	}
	written := func() float64 { return ingest.metric(t, `sluice_sink_records_exported_total{sink="kafka"}`) }
	testkit.WaitFor(t, "records on the topic", func() bool { return written() > 100 })

	k.Stop()
	before := received()
	time.Sleep(10 * time.Second) // the outage itself, as the scenario says
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	k.Restart(ctx)
	testkit.WaitFor(t, "records taken again after the outage", func() bool {
		return received() > before+100
	})

	_ = exp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exp.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the exporter did not stop")
	}
	exp.mu.Lock()
	totals := exp.last
	exp.mu.Unlock()
	if totals == nil {
		t.Fatal("the exporter logged no totals")
	}
	for _, key := range []string{"dropped_buffer-full", "dropped_encode-error", "unsent"} {
		if v, _ := totals[key].(float64); v != 0 {
			t.Errorf("the exporter lost records: %s = %v (totals %v)", key, v, totals)
		}
	}
	testkit.WaitFor(t, "everything received written to Kafka", func() bool { return written() == received() })
	for _, reason := range []string{"buffer-full", "send-error", "shutdown"} {
		if d := ingest.metric(t, fmt.Sprintf(`sluice_sink_records_dropped_total{reason=%q,sink="kafka"}`, reason)); d > 0 {
			t.Errorf("the ingest replica dropped %v records (%s)", d, reason)
		}
	}
	exported, _ := totals["exported"].(float64)
	if written() < exported {
		t.Errorf("the exporter had %v records confirmed, only %v are on the topic", exported, written())
	}
	t.Logf("brokers down 10 s under gRPC: exporter confirmed %v (resent %v), %v on the topic", exported, totals["resent"], written())
}

// TestProxyReadsKafka: a Proxy-mode aggregator reads the topic too
// (sluice.kafkaInput in Proxy mode): every record is forwarded once, and
// its offsets are committed once the sink wrote it, so a second replica
// that starts later in the group reads nothing again.
func TestProxyReadsKafka(t *testing.T) {
	const n = 100
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	coll := stubcollector.New(t)
	yaml := fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: none
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  apiAddress: 127.0.0.1:0
  grpcAddress: ""
  kafkaInput: {enable: true, brokers: [%s], topic: flows, group: proxy, sessionTimeout: 6s}
`, coll.Addr(), strings.Join(k.Addrs(), ", "))
	first := startAgg(t, "proxy-0", yaml)
	ingest := startAgg(t, "ingest", ingestYAML(k.Addrs()))
	agents(t, workload(0, n), func(int) string { return ingest.ipfix })
	testkit.WaitFor(t, fmt.Sprintf("%d records forwarded", 2*n), func() bool { return coll.Len() == 2*n })
	testkit.WaitFor(t, "the offsets committed", func() bool {
		return first.metric(t, "sluice_kafka_input_commits_total") > 0 && first.metric(t, "sluice_kafka_input_records_total") == 2*n
	})
	first.stop(t)
	second := startAgg(t, "proxy-1", yaml)
	testkit.WaitFor(t, "the second replica to own every partition", func() bool {
		return second.metric(t, "sluice_kafka_input_partitions") == 12
	})
	agents(t, workload(n, 1), func(int) string { return ingest.ipfix })
	testkit.WaitFor(t, "the new records forwarded", func() bool { return coll.Len() >= 2*n+2 })
	if got := second.metric(t, "sluice_kafka_input_records_total"); got != 2 {
		t.Errorf("the second replica read %v records, want only the 2 new ones", got)
	}
	if coll.Len() != 2*n+2 {
		t.Errorf("%d records forwarded, want %d", coll.Len(), 2*n+2)
	}
}

// TestAggregateGracefulStop: an Aggregate replica stopped gracefully
// (SIGTERM) flushes its flows, and its last commit covers them: the next
// replica of the group reads nothing again.
func TestAggregateGracefulStop(t *testing.T) {
	const n = 100
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	coll := stubcollector.New(t)
	first := startAgg(t, "aggregate-0", aggregateYAML(k.Addrs(), coll.Addr()))
	ingest := startAgg(t, "ingest", ingestYAML(k.Addrs()))
	conns := workload(0, n)
	// Only the source halves: the flows wait for their other side when
	// the replica stops, and the stop exports them one-sided.
	var srcs []connection
	for _, c := range conns {
		c.dstNode = -1
		srcs = append(srcs, c)
	}
	agents(t, srcs, func(int) string { return ingest.ipfix })
	testkit.WaitFor(t, "the replica to take every half", func() bool {
		return first.metric(t, "sluice_aggregate_records_total") == n
	})
	first.stop(t)
	testkit.WaitFor(t, fmt.Sprintf("the %d one-sided records exported at the stop", n), func() bool { return coll.Len() == n })
	second := startAgg(t, "aggregate-1", aggregateYAML(k.Addrs(), coll.Addr()))
	testkit.WaitFor(t, "the second replica to own every partition", func() bool {
		return second.metric(t, "sluice_kafka_input_partitions") == 12
	})
	agents(t, workload(n, 1), func(int) string { return ingest.ipfix })
	testkit.WaitFor(t, "the new connection taken", func() bool { return second.metric(t, "sluice_aggregate_records_total") >= 2 })
	if got := second.metric(t, "sluice_kafka_input_records_total"); got != 2 {
		t.Errorf("the second replica read %v records, want only the 2 new ones (the first committed what it flushed)", got)
	}
}

// groupLag is the records of the topic the group has not committed past
// (-1 when it cannot be read now).
func groupLag(t testing.TB, k *kafkatest.Cluster, group string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lags, err := kadm.NewClient(cl).Lag(ctx, group)
	if err != nil {
		return -1
	}
	l, ok := lags[group]
	if !ok || l.DescribeErr != nil || l.FetchErr != nil || len(l.Lag) == 0 {
		return -1
	}
	for _, ps := range l.Lag {
		for _, p := range ps {
			if p.Err != nil {
				return -1
			}
		}
	}
	return l.Lag.Total()
}
