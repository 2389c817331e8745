package aggregator

import (
	"context"
	"fmt"

	"sluice/aggregate"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/mode"
	"sluice/ring"
)

// Encoded is Aggregate mode's fast path (mode.Encoder): when the only
// sink sends IPFIX, each exported record is encoded as the store builds
// it, in arenas it reuses once the sink has sent their records, instead of
// a flow record allocated per export that the sink encodes later. The records are the same, octet for octet:
// the sink's own exporter writes them (TestAggregateFastPathMatches).
func (m aggregateMode) Encoded(_ *ipfixmap.Table, ex *ipfixmap.Exporter) (mode.Encoded, error) {
	// An encoder that never sends: it only builds records (EncodeRecord).
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		return nil, fmt.Errorf("aggregate fast path: %w", err)
	}
	return &aggregateEncoded{s: m.Store, ex: ex, enc: enc}, nil
}

type aggregateEncoded struct {
	s      *aggregate.Store
	ex     *ipfixmap.Exporter
	enc    *ipfix.Encoder
	sample *exportSample
	// arenas hold the records' octets. The buffer Run writes to has one
	// consumer, the IPFIX sink, which releases each record once it has
	// copied it: the records are written into memory still warm in the
	// caches, not into a fresh allocation (first touches of new memory
	// cost most of the copy).
	arenas ipfix.ArenaPool
}

// encodedArena is the size of the arenas Run writes into: a few hundred
// records.
const encodedArena = 256 << 10

// NewForwarder: records are not forwarded as octets in Aggregate mode
// (each is correlated first), so sessions have none.
func (*aggregateEncoded) NewForwarder() flow.Forwarder { return nil }

// Run aggregates until in closes, writing export records to out.
func (e *aggregateEncoded) Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[ipfix.EncodedRecord], encodeErr func(error)) {
	if e.sample != nil {
		stop := make(chan struct{})
		defer close(stop)
		go e.sample.Run(stop)
	}
	pending := make([]ipfix.EncodedRecord, 0, 256)
	// arena is the one being filled: Run holds a share of it until it
	// moves on, and adds its records to its count (unadded) before
	// handing them on.
	var arena *ipfix.Arena
	unadded := 0
	settle := func() {
		if unadded > 0 {
			arena.Add(unadded)
			unadded = 0
		}
	}
	defer func() {
		if arena != nil {
			settle()
			arena.Release(1)
		}
	}()
	put := func(f *flow.Flow) {
		if e.sample != nil && e.sample.Want() {
			e.sample.produce(f)
		}
		t, _, err := e.ex.Template(f)
		if err != nil {
			encodeErr(err)
			return
		}
		data, err := e.enc.EncodeRecord(t, func(rb ipfix.RecordBuilder) error { return e.ex.Write(rb, t, f) })
		if err != nil {
			encodeErr(err)
			return
		}
		// A full arena is replaced, not overwritten: its records go
		// back to the pool with it once the sink has sent them all.
		if arena == nil || cap(arena.Buf)-len(arena.Buf) < len(data) {
			if arena != nil {
				settle()
				arena.Release(1)
			}
			arena = e.arenas.Get(max(encodedArena, len(data)))
			arena.Hold(1)
		}
		start := len(arena.Buf)
		arena.Buf = append(arena.Buf, data...)
		pending = append(pending, ipfix.EncodedRecord{Template: t, Data: arena.Buf[start:len(arena.Buf):len(arena.Buf)], Arena: arena})
		unadded++
	}
	e.s.RunEach(ctx, in, aggregate.DefaultTick, put, func(flushing bool) {
		settle() // before the sink can release them
		out.Hand(ctx, flushing, pending...)
		clear(pending)
		pending = pending[:0]
	})
}

// Sample gives buf a copy of at most perSecond exported records a second
// (the web UI's Flows and Map pages). The returned Sampler is for the
// collectors, which forward nothing as octets in this mode.
func (e *aggregateEncoded) Sample(buf *ring.Buffer[*flow.Flow], perSecond int) flow.Sampler {
	e.sample = &exportSample{SampleBudget: flow.NewSampleBudget(perSecond), buf: buf}
	return noSample{}
}

// noSample wants nothing.
type noSample struct{}

func (noSample) Want() bool     { return false }
func (noSample) Put(*flow.Flow) {}

// exportSample takes copies of exported records for a view, at most a
// budget's share a second; Run's goroutine asks, the budget's ticker
// starts each second.
type exportSample struct {
	*flow.SampleBudget
	buf *ring.Buffer[*flow.Flow]
}

// produce hands on a copy of f: the store builds the next record in f's
// memory.
func (s *exportSample) produce(f *flow.Flow) {
	c := &struct {
		f flow.Flow
		a flow.Aggregation
	}{f: *f}
	if f.Aggregation != nil {
		c.a = *f.Aggregation
		c.f.Aggregation = &c.a
	}
	s.buf.Produce(&c.f)
}
