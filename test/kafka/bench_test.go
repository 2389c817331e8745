package kafka

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/internal/kafkatest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
)

// BenchmarkThroughput measures records per second end to end: 4 agents
// send both halves of 100,000 inter-Node connections per operation, and an
// operation ends when every connection was exported (IPFIX to a stub
// collector). "direct": one aggregator in Aggregate mode fed by the
// agents; "kafka-N": 2 ingest replicas, the kfake cluster (3 brokers, 12
// partitions) and N Aggregate replicas. Every process is a `sluice
// aggregator`; the brokers are kfake, not Apache Kafka.
func BenchmarkThroughput(b *testing.B) {
	// A buffer that holds an operation's exports: a tick exports them
	// all at once, and a sink a whole buffer behind would drop.
	const big = "recordBufferSize: 262144\n"
	const per = 100000
	for _, replicas := range []int{0, 1, 2, 3} {
		name := "direct"
		if replicas > 0 {
			name = fmt.Sprintf("kafka-%d", replicas)
		}
		b.Run(name, func(b *testing.B) {
			coll := stubcollector.NewCounting(b)
			var to func(int) string
			// pids are every process's; aggPids the Aggregate replicas'
			// (or the single aggregator's), ingestPids the ingest tier's.
			var pids, aggPids, ingestPids []int
			if replicas == 0 {
				a := startAgg(b, "single", singleYAML(coll.Addr())+big)
				to = func(int) string { return a.ipfix }
				pids = append(pids, a.cmd.Process.Pid)
				aggPids = pids
			} else {
				k := kafkatest.Start(b, kafkatest.Options{Brokers: 3, Partitions: 12})
				var aggs []*proc
				for i := range replicas {
					aggs = append(aggs, startAgg(b, fmt.Sprintf("aggregate-%d", i), aggregateYAML(k.Addrs(), coll.Addr())+big))
				}
				ingest := []*proc{startAgg(b, "ingest-0", ingestYAML(k.Addrs())+big), startAgg(b, "ingest-1", ingestYAML(k.Addrs())+big)}
				testkit.WaitFor(b, "the partitions assigned", func() bool {
					n := 0.0
					for _, a := range aggs {
						n += a.metric(b, "sluice_kafka_input_partitions")
					}
					return n == 12
				})
				to = func(node int) string { return ingest[node/2].ipfix }
				for _, p := range aggs {
					aggPids = append(aggPids, p.cmd.Process.Pid)
				}
				for _, p := range ingest {
					ingestPids = append(ingestPids, p.cmd.Process.Pid)
				}
				pids = append(append(append(pids, aggPids...), ingestPids...), k.Pid())
			}
			cpu0, agg0, ingest0 := cpuTime(b, pids), cpuTime(b, aggPids), cpuTime(b, ingestPids)
			next := 0
			b.ResetTimer()
			for b.Loop() {
				conns := workload(next, per)
				next += per
				agents(b, conns, to)
				want := next
				testkit.WaitFor(b, "the operation's connections exported", func() bool { return coll.Len() >= want })
			}
			b.ReportMetric(float64(2*per*b.N)/b.Elapsed().Seconds(), "records/s")
			perRecord := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(2*per*b.N) }
			b.ReportMetric(perRecord(cpuTime(b, pids)-cpu0), "cpu-µs/record")
			b.ReportMetric(perRecord(cpuTime(b, aggPids)-agg0), "agg-cpu-µs/record")
			if replicas > 0 {
				b.ReportMetric(perRecord(cpuTime(b, ingestPids)-ingest0), "ingest-cpu-µs/record")
			}
		})
	}
}

// cpuTime is the user and system CPU time the processes used so far
// (/proc/<pid>/stat, in clock ticks of 10 ms).
func cpuTime(b *testing.B, pids []int) time.Duration {
	b.Helper()
	var ticks int64
	for _, pid := range pids {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatal(err)
		}
		// The fields after the command name, which may hold spaces.
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		for _, i := range []int{11, 12} { // utime, stime (fields 14, 15)
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
