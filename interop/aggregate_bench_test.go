package interop

// Aggregate mode side by side with go-ipfix v0.17.0's intermediate
// aggregation process (what Antrea's Flow Aggregator used up to v2.3), on
// the same inter-Node records: a source-Node and a destination-Node record
// per connection, as Antrea agents send them.

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/intermediate"

	"sluice/aggregate"
	"sluice/flow"
)

// aggPods, aggNamespaces and aggNodes are the pools of names of the
// benchmark connections: many flows per Pod, shared strings (as collectors
// intern them).
var (
	aggPods       = aggNames("deployment-%03d-7d9f8b6c5d-%05d", 1000)
	aggNamespaces = aggNames("team-%02d", 20)
	aggNodes      = aggNames("node-%02d", 50)
)

func aggNames(format string, n int) (names []string) {
	for i := range n {
		if format[0] == 'd' {
			names = append(names, fmt.Sprintf(format, i/10, i))
		} else {
			names = append(names, fmt.Sprintf(format, i))
		}
	}
	return names
}

// aggAntreaFlow is one Node's record of inter-Node connection i.
func aggAntreaFlow(i int, fromSource bool) antreaFlow {
	start := time.Unix(1_750_000_000, 0).UTC()
	f := antreaFlow{
		FlowStart: start, FlowEnd: start.Add(10 * time.Second), FlowEndReason: 2,
		SrcPort: uint16(i) | 1024, DstPort: 8080, Proto: 6,
		Packets: 100, Octets: 10000, DeltaPackets: 100, DeltaOctets: 10000,
		RevPackets: 50, RevOctets: 5000, RevDeltaPkts: 50, RevDeltaOct: 5000,
		Src:      netip.AddrFrom4([4]byte{10, byte(i >> 24), byte(i >> 16), byte(i >> 8)}),
		Dst:      netip.AddrFrom4([4]byte{10, 128, byte(i >> 4), byte(i)}),
		TCPState: "ESTABLISHED", FlowType: flow.FlowTypeInterNode,
		ClusterIP: netip.MustParseAddr("10.96.0.10"), ServiceIP: netip.MustParseAddr("10.96.0.10"),
		ProxySnatIP: netip.IPv4Unspecified(),
	}
	a, b := i%len(aggPods), (i*7+3)%len(aggPods)
	if fromSource {
		f.SrcPod, f.SrcNamespace, f.SrcNode = aggPods[a], aggNamespaces[a%20], aggNodes[a%50]
		f.DstSvcPort, f.DstSvcPortName = 80, "team-00/web:http"
		f.EgPolicy, f.EgPolicyNamespace, f.EgPolicyType, f.EgRuleAction = "allow-out", "team-00", 2, 1
	} else {
		f.Packets, f.Octets, f.DeltaPackets, f.DeltaOctets = 98, 9800, 98, 9800
		f.DstPod, f.DstNamespace, f.DstNode = aggPods[b], aggNamespaces[b%20], aggNodes[b%50]
		f.InPolicy, f.InPolicyType, f.InRule, f.InRuleAction = "allow-in", 3, "r1", 1
	}
	f.srcIP, f.dstIP = net.IP(f.Src.AsSlice()), net.IP(f.Dst.AsSlice())
	f.clusterIP, f.snatIP, f.serviceIP = net.IP(f.ClusterIP.AsSlice()), net.IP(f.ProxySnatIP.AsSlice()), net.IP(f.ServiceIP.AsSlice())
	return f
}

// aggSluiceFlow is f as Sluice's normalizer makes it (zero addresses
// unset).
func aggSluiceFlow(f *antreaFlow) *flow.Flow {
	g := &flow.Flow{
		StartTime: f.FlowStart, EndTime: f.FlowEnd, EndReason: f.FlowEndReason,
		SourceIP: f.Src, DestinationIP: f.Dst, Protocol: f.Proto, SourcePort: f.SrcPort, DestinationPort: f.DstPort,
		TCPState: f.TCPState, FlowType: f.FlowType,
		Stats:              flow.Stats{PacketTotalCount: f.Packets, OctetTotalCount: f.Octets, PacketDeltaCount: f.DeltaPackets, OctetDeltaCount: f.DeltaOctets},
		ReverseStats:       flow.Stats{PacketTotalCount: f.RevPackets, OctetTotalCount: f.RevOctets, PacketDeltaCount: f.RevDeltaPkts, OctetDeltaCount: f.RevDeltaOct},
		SourcePodNamespace: f.SrcNamespace, SourcePodName: f.SrcPod, SourceNodeName: f.SrcNode,
		DestinationPodNamespace: f.DstNamespace, DestinationPodName: f.DstPod, DestinationNodeName: f.DstNode,
		DestinationClusterIP: f.ClusterIP, DestinationServiceIP: f.ServiceIP,
		DestinationServicePort: f.DstSvcPort, DestinationServicePortName: f.DstSvcPortName,
		Ingress:    flow.Policy{Type: f.InPolicyType, Namespace: f.InPolicyNamespace, Name: f.InPolicy, RuleName: f.InRule, RuleAction: f.InRuleAction},
		Egress:     flow.Policy{Type: f.EgPolicyType, Namespace: f.EgPolicyNamespace, Name: f.EgPolicy, RuleName: f.EgRule, RuleAction: f.EgRuleAction},
		EgressName: f.EgressName, EgressNodeName: f.EgressNode, ProxySnatPort: f.ProxySnatPort,
	}
	for fl := flow.StartTime; fl <= flow.ClusterID; fl++ {
		switch fl {
		case flow.SourcePodUID, flow.SourcePodLabels, flow.SourceNodeUID, flow.DestinationPodUID, flow.DestinationPodLabels,
			flow.DestinationNodeUID, flow.DestinationServiceUID, flow.IngressPolicyUID, flow.EgressPolicyUID,
			flow.EgressNodeUID, flow.EgressUID, flow.AppProtocolName, flow.HTTPVals, flow.FlowDirection,
			flow.ProxySnatIP, flow.EgressIP, flow.ClusterID:
		default:
			g.Present.Set(fl)
		}
	}
	return g
}

// aggGoIPFIXExtra is the number of elements go-ipfix's aggregation adds to
// a record it keeps; its collector reserves room for them.
const aggGoIPFIXExtra = 24

// aggGoIPFIXMessage wraps f as the message go-ipfix's collector would hand
// to the aggregation process.
func aggGoIPFIXMessage(tb testing.TB, f *antreaFlow) *entities.Message {
	elems, err := goIPFIXElements(false)
	if err != nil {
		tb.Fatal(err)
	}
	setGoIPFIX(elems, f)
	set := entities.NewSet(true)
	if err := set.PrepareSet(entities.Data, 256); err != nil {
		tb.Fatal(err)
	}
	if err := set.AddRecordWithExtraElements(elems, aggGoIPFIXExtra, 256); err != nil {
		tb.Fatal(err)
	}
	msg := entities.NewMessage(true)
	msg.AddSet(set)
	return msg
}

// newGoIPFIXAggregation configures go-ipfix's aggregation process as
// Antrea's Flow Aggregator did (correlation fields, per-Node stats,
// throughputs).
func newGoIPFIXAggregation(tb testing.TB) *intermediate.AggregationProcess {
	loadGoIPFIXRegistry()
	fromNode := func(names []string, suffix string) (out []string) {
		for _, n := range names {
			out = append(out, n+suffix)
		}
		return out
	}
	stats := []string{"packetTotalCount", "packetDeltaCount", "octetTotalCount", "octetDeltaCount",
		"reversePacketTotalCount", "reversePacketDeltaCount", "reverseOctetTotalCount", "reverseOctetDeltaCount"}
	ap, err := intermediate.InitAggregationProcess(intermediate.AggregationInput{
		MessageChan: make(chan *entities.Message),
		WorkerNum:   1,
		CorrelateFields: []string{"sourcePodName", "sourcePodNamespace", "sourceNodeName",
			"destinationPodName", "destinationPodNamespace", "destinationNodeName",
			"destinationClusterIPv4", "destinationClusterIPv6", "destinationServicePort", "destinationServicePortName",
			"ingressNetworkPolicyName", "ingressNetworkPolicyNamespace", "ingressNetworkPolicyRuleAction",
			"ingressNetworkPolicyType", "ingressNetworkPolicyRuleName",
			"egressNetworkPolicyName", "egressNetworkPolicyNamespace", "egressNetworkPolicyRuleAction",
			"egressNetworkPolicyType", "egressNetworkPolicyRuleName"},
		AggregateElements: &intermediate.AggregationElements{
			NonStatsElements:                   []string{"flowEndSeconds", "flowEndReason", "tcpState"},
			StatsElements:                      stats,
			AggregatedSourceStatsElements:      fromNode(stats, "FromSourceNode"),
			AggregatedDestinationStatsElements: fromNode(stats, "FromDestinationNode"),
			AntreaFlowEndSecondsElements:       []string{"flowEndSecondsFromSourceNode", "flowEndSecondsFromDestinationNode"},
			ThroughputElements:                 []string{"throughput", "reverseThroughput"},
			SourceThroughputElements:           []string{"throughputFromSourceNode", "reverseThroughputFromSourceNode"},
			DestinationThroughputElements:      []string{"throughputFromDestinationNode", "reverseThroughputFromDestinationNode"},
		},
		ActiveExpiryTimeout:   60 * time.Second,
		InactiveExpiryTimeout: 90 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return ap
}

// aggConns is the number of connections (two records each) one benchmark
// operation aggregates into a fresh store; aggChunk how many are prepared
// (untimed) at a time: a few hundred records, so that they are as fresh in
// the caches as a collector's just-decoded batch.
const (
	aggConns = 100_000
	aggChunk = 250
)

// processCPU is the CPU time the process has used (all its threads,
// the garbage collector's included).
func processCPU(tb testing.TB) time.Duration {
	const clockProcessCPUTime = 2 // CLOCK_PROCESS_CPUTIME_ID
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockProcessCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		tb.Fatalf("clock_gettime: %v", errno)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkAggregate aggregates the same inter-Node pairs with go-ipfix
// and with Sluice. An operation is aggConns connections into an empty
// store; records/s is the figure to compare. Records are built in chunks,
// the way each side's collector hands them over (go-ipfix keeps the record
// itself as its flow state), and only the aggregation of each chunk is
// clocked, by the benchmark itself: b.StopTimer and b.StartTimer around
// every chunk would each read the runtime's memory statistics, which stops
// the world, and that harness cost (paid by both sides) was a third of
// Sluice's measured time. Go's own ns/op therefore includes building the
// records; records/s does not. records/cpu-s is the same work over the
// process's CPU time in those clocked spans (the garbage collector's
// threads included): on a shared machine it does not count the time the
// benchmark waited for a core.
//
// Each side starts with the garbage of the one before collected and its
// memory returned to the operating system (debug.FreeOSMemory, untimed):
// go-ipfix leaves several hundred MB, which the runtime's background scavenger
// otherwise keeps returning (madvise) all through the next side's run.
func BenchmarkAggregate(b *testing.B) {
	b.Run("go-ipfix", func(b *testing.B) {
		debug.FreeOSMemory()
		msgs := make([]*entities.Message, 0, 2*aggChunk)
		var spent, cpu time.Duration
		for range b.N {
			ap := newGoIPFIXAggregation(b)
			for c := 0; c < aggConns; c += aggChunk {
				msgs = msgs[:0]
				for i := c; i < c+aggChunk; i++ {
					src, dst := aggAntreaFlow(i, true), aggAntreaFlow(i, false)
					msgs = append(msgs, aggGoIPFIXMessage(b, &src), aggGoIPFIXMessage(b, &dst))
				}
				start, cpu0 := time.Now(), processCPU(b)
				for _, m := range msgs {
					if err := ap.AggregateMsgByFlowKey(m); err != nil {
						b.Fatal(err)
					}
				}
				spent += time.Since(start)
				cpu += processCPU(b) - cpu0
			}
			if n := ap.GetNumFlows(); n != aggConns {
				b.Fatalf("%d flows, want %d", n, aggConns)
			}
		}
		b.ReportMetric(float64(2*aggConns*b.N)/spent.Seconds(), "records/s")
		b.ReportMetric(float64(2*aggConns*b.N)/cpu.Seconds(), "records/cpu-s")
	})
	sluice := func(b *testing.B, reuse bool) {
		debug.FreeOSMemory()
		flows := make([]*flow.Flow, 0, 2*aggChunk)
		now := time.Unix(1_750_000_010, 0)
		s := aggregate.New(aggregate.Options{})
		var spent, cpu time.Duration
		for range b.N {
			if reuse {
				s.Flush(nil)
			} else {
				s = aggregate.New(aggregate.Options{})
			}
			correlated := s.Stats().Correlated
			for c := 0; c < aggConns; c += aggChunk {
				flows = flows[:0]
				for i := c; i < c+aggChunk; i++ {
					src, dst := aggAntreaFlow(i, true), aggAntreaFlow(i, false)
					flows = append(flows, aggSluiceFlow(&src), aggSluiceFlow(&dst))
				}
				start, cpu0 := time.Now(), processCPU(b)
				for _, f := range flows {
					s.Add(now, f, nil)
				}
				spent += time.Since(start)
				cpu += processCPU(b) - cpu0
			}
			if n := s.Stats().Correlated - correlated; s.Len() != aggConns || n != aggConns {
				b.Fatalf("%d flows, %d correlated, want %d", s.Len(), n, aggConns)
			}
		}
		b.ReportMetric(float64(2*aggConns*b.N)/spent.Seconds(), "records/s")
		b.ReportMetric(float64(2*aggConns*b.N)/cpu.Seconds(), "records/cpu-s")
	}
	// A fresh store per operation, as go-ipfix gets: its memory is
	// allocated (and, on a VM, page-faulted) in the timed part.
	b.Run("sluice", func(b *testing.B) { sluice(b, false) })
	// The store emptied (untimed) between operations: memory reused, as in
	// a running aggregator where forgotten flows' slots take new ones.
	b.Run("sluice-reused", func(b *testing.B) { sluice(b, true) })
}

// BenchmarkAggregateHeap is the heap each side holds per tracked flow
// after 1,000,000 one-sided flows (the source Node's records; neither
// side can let go of them before their timeouts). Reported as B/flow and
// objects/flow; one operation is the whole measurement.
func BenchmarkAggregateHeap(b *testing.B) {
	const n = 1_000_000
	// offHeap is what a side holds outside the Go heap: Sluice's flow
	// table is mapped (but under the race detector), and its address space
	// counts whole, an upper bound of what is in memory.
	measure := func(b *testing.B, add func(i int), held func() int, offHeap func() uint64) {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for i := range n {
			add(i)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		if h := held(); h != n {
			b.Fatalf("%d flows held, want %d", h, n)
		}
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc+offHeap())/n, "B/flow")
		b.ReportMetric(float64(m1.HeapObjects-m0.HeapObjects)/n, "objects/flow")
	}
	b.Run("go-ipfix", func(b *testing.B) {
		for range b.N {
			ap := newGoIPFIXAggregation(b)
			measure(b, func(i int) {
				f := aggAntreaFlow(i, true)
				if err := ap.AggregateMsgByFlowKey(aggGoIPFIXMessage(b, &f)); err != nil {
					b.Fatal(err)
				}
			}, func() int { return int(ap.GetNumFlows()) }, func() uint64 { return 0 })
			runtime.KeepAlive(ap)
		}
	})
	b.Run("sluice", func(b *testing.B) {
		now := time.Unix(1_750_000_010, 0)
		for range b.N {
			s := aggregate.New(aggregate.Options{MaxFlows: n})
			measure(b, func(i int) {
				f := aggAntreaFlow(i, true)
				s.Add(now, aggSluiceFlow(&f), nil)
			}, s.Len, func() uint64 { return s.Stats().TableBytes })
			runtime.KeepAlive(s)
		}
	})
}

// TestAggregateSidesAgree checks that both sides aggregate the benchmark's
// records into the same per-Node counters, so the benchmark compares the
// same work.
func TestAggregateSidesAgree(t *testing.T) {
	ap := newGoIPFIXAggregation(t)
	s := aggregate.New(aggregate.Options{})
	now := time.Unix(1_750_000_010, 0)
	const conns = 50
	for i := range conns {
		src, dst := aggAntreaFlow(i, true), aggAntreaFlow(i, false)
		for _, f := range []*antreaFlow{&src, &dst} {
			if err := ap.AggregateMsgByFlowKey(aggGoIPFIXMessage(t, f)); err != nil {
				t.Fatal(err)
			}
			s.Add(now, aggSluiceFlow(f), nil)
		}
	}
	got := map[string]*flow.Flow{}
	s.Flush(func(f *flow.Flow) { got[fmt.Sprintf("%v:%d", f.SourceIP, f.SourcePort)] = f })
	n := 0
	err := ap.ForAllRecordsDo(func(k intermediate.FlowKey, r *intermediate.AggregationFlowRecord) error {
		n++
		f := got[fmt.Sprintf("%s:%d", k.SourceAddress, k.SourcePort)]
		if f == nil {
			return fmt.Errorf("sluice lacks flow %+v", k)
		}
		u64 := func(name string) uint64 {
			ie, _, ok := r.Record.GetInfoElementWithValue(name)
			if !ok {
				t.Errorf("go-ipfix record lacks %s", name)
				return 0
			}
			return ie.GetUnsigned64Value()
		}
		str := func(name string) string {
			ie, _, _ := r.Record.GetInfoElementWithValue(name)
			return ie.GetStringValue()
		}
		a := f.Aggregation
		for _, c := range []struct {
			name string
			v    uint64
		}{
			{"packetTotalCount", f.Stats.PacketTotalCount}, {"octetTotalCount", f.Stats.OctetTotalCount},
			{"octetDeltaCount", f.Stats.OctetDeltaCount}, {"reverseOctetTotalCount", f.ReverseStats.OctetTotalCount},
			{"octetTotalCountFromSourceNode", a.StatsFromSource.OctetTotalCount},
			{"octetDeltaCountFromSourceNode", a.StatsFromSource.OctetDeltaCount},
			{"octetTotalCountFromDestinationNode", a.StatsFromDestination.OctetTotalCount},
			{"packetDeltaCountFromDestinationNode", a.StatsFromDestination.PacketDeltaCount},
			{"reverseOctetTotalCountFromDestinationNode", a.ReverseStatsFromDestination.OctetTotalCount},
			{"throughput", a.Throughput}, {"throughputFromSourceNode", a.ThroughputFromSource},
			{"throughputFromDestinationNode", a.ThroughputFromDestination},
		} {
			if g := u64(c.name); g != c.v {
				t.Errorf("%+v %s: go-ipfix %d, sluice %d", k, c.name, g, c.v)
			}
		}
		if str("sourcePodName") != f.SourcePodName || str("destinationPodName") != f.DestinationPodName ||
			str("ingressNetworkPolicyName") != f.Ingress.Name || str("egressNetworkPolicyName") != f.Egress.Name {
			t.Errorf("%+v: names differ", k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != conns || len(got) != conns {
		t.Errorf("go-ipfix %d flows, sluice %d, want %d", n, len(got), conns)
	}
}
