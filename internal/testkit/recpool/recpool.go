// Package recpool produces records into the pipeline's buffer as
// Aggregate mode's store does (aggregate.Store.Run): each record built in
// one the buffer recycled (ring.Buffer.Recycle) once every reader released
// it, or allocated when none is free. Recycled records are poisoned, so a
// sink that uses a record after releasing it writes the poison out, where
// a test sees it. For tests of sinks' allocations and record lifetimes.
package recpool

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"sluice/flow"
	"sluice/ring"
)

// Poison fills every text field of a recycled record until it is reused.
const Poison = "POISONED-RECORD"

// Producer is the buffer's only producer.
type Producer struct {
	Buf  *ring.Buffer[*flow.Flow]
	free []*flow.Flow
	out  []*flow.Flow
	// Made counts records allocated; Recycled those the buffer handed
	// back.
	Made, Recycled int
	// Quarantine keeps recycled records poisoned rather than reusing
	// them: a sink that reads one after it released it reads the poison
	// for sure (reused, it would read another record's valid values).
	Quarantine bool
}

// New makes a buffer of capacity records and its producer.
func New(capacity int) *Producer {
	p := &Producer{Buf: ring.New[*flow.Flow](capacity)}
	p.Buf.Recycle(p.put)
	return p
}

func (p *Producer) put(f *flow.Flow) {
	a := f.Aggregation
	*f = flow.Flow{SourcePodName: Poison, SourcePodNamespace: Poison, DestinationPodName: Poison, TCPState: Poison,
		SourceIP: netip.MustParseAddr("192.0.2.66"), Aggregation: a}
	p.Recycled++
	if !p.Quarantine {
		p.free = append(p.free, f)
	}
}

// Produce copies each of src into a record (a reused one when the buffer
// gave one back) and hands them on at once, with back-pressure's wait if
// the buffer applies it.
func (p *Producer) Produce(ctx context.Context, src []*flow.Flow) {
	p.out = p.out[:0]
	for _, s := range src {
		var f *flow.Flow
		if n := len(p.free); n > 0 {
			f = p.free[n-1]
			p.free = p.free[:n-1]
		} else {
			x := &struct {
				f flow.Flow
				a flow.Aggregation
			}{}
			f = &x.f
			f.Aggregation = &x.a
			p.Made++
		}
		a := f.Aggregation
		*f = *s
		*a = flow.Aggregation{}
		if s.Aggregation != nil {
			*a = *s.Aggregation
		}
		f.Aggregation = a
		p.out = append(p.out, f)
	}
	p.Buf.Hand(ctx, false, p.out...)
	clear(p.out)
}

// Records are n distinct records shaped like Aggregate mode's exports
// of inter-node flows, with their Kubernetes metadata and Aggregation.
func Records(n int) []*flow.Flow {
	out := make([]*flow.Flow, n)
	for i := range out {
		f := &flow.Flow{
			StartTime: time.Unix(1_800_000_000, 0).UTC(), EndTime: time.Unix(1_800_000_060+int64(i%600), 0).UTC(), EndReason: 2,
			SourceIP:      netip.AddrFrom4([4]byte{10, 244, byte(i >> 8 & 15), byte(i)}),
			DestinationIP: netip.AddrFrom4([4]byte{10, 244, 100, byte(i % 50)}),
			SourcePort:    uint16(40000 + i), DestinationPort: 8080, Protocol: 6, TCPState: "ESTABLISHED", FlowType: flow.FlowTypeInterNode,
			Stats:         flow.Stats{PacketTotalCount: uint64(i), OctetTotalCount: uint64(i) * 900, PacketDeltaCount: 10, OctetDeltaCount: 9000},
			ReverseStats:  flow.Stats{PacketTotalCount: uint64(i), OctetTotalCount: uint64(i) * 1200, PacketDeltaCount: 8, OctetDeltaCount: 12000},
			SourcePodName: fmt.Sprintf("frontend-7d9c-%05d", i%64), SourcePodNamespace: "shop", SourceNodeName: fmt.Sprintf("node-%d", i%16),
			DestinationPodName: fmt.Sprintf("cart-%d", i%50), DestinationPodNamespace: "shop", DestinationNodeName: fmt.Sprintf("node-%d", (i+3)%16),
			DestinationClusterIP: netip.MustParseAddr("10.96.0.20"), DestinationServiceIP: netip.MustParseAddr("10.96.0.20"),
			DestinationServicePort: 80, DestinationServicePortName: "shop/cart:http",
			Ingress:         flow.Policy{Type: 2, Namespace: "shop", Name: "allow-frontend", RuleName: "r1", RuleAction: flow.ActionAllow},
			SourcePodLabels: `{"app":"frontend","pod-template-hash":"7d9c"}`, DestinationPodLabels: `{"app":"cart"}`,
			ClusterID: "cluster-1",
			Origin:    flow.Origin{ObservationDomainID: 5, Exporter: netip.MustParseAddr("192.0.2.9")},
			Aggregation: &flow.Aggregation{EndFromSource: time.Unix(1_800_000_060, 0).UTC(), EndFromDestination: time.Unix(1_800_000_059, 0).UTC(),
				Throughput: 1200, ReverseThroughput: 1600, ThroughputFromSource: 1200, ThroughputFromDestination: 1190},
		}
		for _, fl := range []flow.Field{flow.StartTime, flow.EndTime, flow.SourceIP, flow.DestinationIP} {
			f.Present.Set(fl)
		}
		out[i] = f
	}
	return out
}

// Until waits, yielding, for done to hold (allocating nothing itself), and
// fails tb after a minute.
func Until(tb testing.TB, what string, done func() bool) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// Round produces src in chunks of chunk records, then waits for
// caughtUp (the sink has read everything, say).
func (p *Producer) Round(tb testing.TB, ctx context.Context, src []*flow.Flow, chunk int, caughtUp func() bool) {
	for len(src) > 0 {
		n := min(chunk, len(src))
		p.Produce(ctx, src[:n])
		src = src[n:]
	}
	Until(tb, "the sink to catch up", caughtUp)
}

// MeasureRounds is how many times Measure runs its round, warm-up
// included.
func MeasureRounds(warm int) int { return warm + 1 + measured }

const measured = 20

// Measure runs round (which exports perRound records) warm times, then
// reports the allocations per exported record in steady state (across
// every goroutine: the sink's included).
func Measure(warm, perRound int, round func()) float64 {
	for range warm {
		round()
	}
	return testing.AllocsPerRun(measured, round) / float64(perRound)
}

// PerRecordBound is what tests allow per record: a few allocations per
// batch (Next's context watch, a flush) come to a few hundredths of one
// per record, even in small batches on a busy machine, while a single
// allocation per record is 1.
const PerRecordBound = 0.25
