package collector

import (
	"sluice/flow"
	"sluice/ipfix"
)

// streamForwarder is a gRPC stream's side of Proxy mode's fast path: each
// decoded flow record is enriched and written as an export record on the
// stream's goroutine, right after it was decoded and while it is still in
// this core's caches, and the record is reused for the next flow. What the
// forwarder declines (records with elements to pass through) goes on as
// flow records.
//
// The export records wait in enc, beside the stream's pending flow
// records, until they are handed on. Their octets are in arenas from the
// server's pool: the stream holds a share of the arena it fills, and adds
// its records to the arena's count in sums (settle), before they are
// handed on or when it moves to another arena, rather than one atomic
// operation per record.
type streamForwarder struct {
	ff     flow.FlowForwarder
	pool   *ipfix.ArenaPool
	sample flow.Sampler // nil without a view to sample for
	arena  *ipfix.Arena
	// unadded are enc's records in arena not yet added to its count.
	unadded int
	// recLen is the longest export record written yet; size the size of
	// the next arena: small for a stream's first (an agent opens a
	// stream per export, and every record held pins its whole arena),
	// doubling up to streamArena.
	recLen int
	size   int
	enc    []ipfix.EncodedRecord
	// errs are the errors of records enriched but not written (dropped),
	// for the mode to report.
	errs []error
	// samples are copies of the current message's forwarded records, for
	// the view, offered once the whole message has decoded.
	samples []*flow.Flow
}

// streamArena is the size of the arenas a busy stream writes into: a few
// hundred records; firstArena that of a stream's first.
const (
	streamArena = 256 << 10
	firstArena  = 16 << 10
)

func newStreamForwarder(o *Options, pool *ipfix.ArenaPool) *streamForwarder {
	if o.Forwarder == nil {
		return nil
	}
	ff, ok := o.Forwarder().(flow.FlowForwarder)
	if !ok || ff == nil {
		return nil
	}
	return &streamForwarder{ff: ff, pool: pool, sample: o.Sample, size: firstArena}
}

// queued is how many records and errors wait to be handed on.
func (s *streamForwarder) queued() int {
	if s == nil {
		return 0
	}
	return len(s.enc) + len(s.errs)
}

// room makes sure the arena has room for n more records.
func (s *streamForwarder) room(n int) {
	need := n * max(s.recLen, 256)
	if a := s.arena; a != nil {
		if cap(a.Buf)-len(a.Buf) >= need {
			return
		}
		s.settle()
		a.Release(1) // the stream's share: the arena goes back once its records are sent
	}
	s.arena = s.pool.Get(max(need, s.size))
	s.arena.Hold(1)
	s.size = min(2*s.size, streamArena)
}

// settle adds the records written into the arena since the last settle to
// its count.
func (s *streamForwarder) settle() {
	if s.unadded > 0 {
		s.arena.Add(s.unadded)
		s.unadded = 0
	}
}

// mark is where the current message's records begin, for rollback.
type fwdMark struct{ enc, buf, errs int }

func (s *streamForwarder) mark() fwdMark {
	clear(s.samples)
	s.samples = s.samples[:0]
	return fwdMark{enc: len(s.enc), buf: len(s.arena.Buf), errs: len(s.errs)}
}

// rollback drops what the current message forwarded: it did not decode
// whole. room was called for the whole message, so its records are all
// in the current arena and none is settled.
func (s *streamForwarder) rollback(m fwdMark) {
	k := len(s.enc) - m.enc
	clear(s.enc[m.enc:])
	s.enc = s.enc[:m.enc]
	s.unadded -= k
	s.arena.Buf = s.arena.Buf[:m.buf]
	clear(s.errs[m.errs:])
	s.errs = s.errs[:m.errs]
	clear(s.samples)
	s.samples = s.samples[:0]
}

// forward offers f to the forwarder and reports whether it took it (f is
// then the caller's to reuse, zeroed).
func (s *streamForwarder) forward(f *flow.Flow) bool {
	if !s.ff.Takes(f) {
		return false // before Want: the mode's run samples the records it takes
	}
	var g *flow.Flow
	if s.sample != nil && s.sample.Want() {
		// Copied before it is enriched: the view's Put enriches it as
		// the export is.
		g = new(flow.Flow)
		*g = *f
	}
	if s.enc == nil {
		s.enc = make([]ipfix.EncodedRecord, 0, 64)
	}
	buf, enc, ok, err := s.ff.ForwardFlow(f, s.arena.Buf, s.enc)
	if !ok {
		return false
	}
	s.arena.Buf = buf
	if err != nil {
		s.errs = append(s.errs, err)
	} else {
		k := len(enc) - 1
		enc[k].Arena = s.arena
		s.recLen = max(s.recLen, len(enc[k].Data))
		s.unadded++
		if g != nil {
			s.samples = append(s.samples, g)
		}
	}
	s.enc = enc
	*f = flow.Flow{}
	return true
}

// offer gives the view the samples of a message that decoded whole.
func (s *streamForwarder) offer() {
	for i, g := range s.samples {
		s.sample.Put(g)
		s.samples[i] = nil
	}
	s.samples = s.samples[:0]
}

// fill adds up to n of the waiting export records and errors to b (the
// errors first).
func (s *streamForwarder) fill(b *flow.Batch, n int) {
	if s == nil || n <= 0 {
		return
	}
	e := min(len(s.errs), n)
	k := min(len(s.enc), n-e)
	if e > 0 {
		b.EncodeErrs = s.errs[:e:e]
	}
	if k > 0 {
		s.settle()
		b.Encoded = s.enc[:k:k]
		b.Rebuilt = k
	}
}

// handed drops from the queue what b, filled by fill, took: the batch owns
// it now (its slices are not reused).
func (s *streamForwarder) handed(b *flow.Batch) {
	if s == nil {
		return
	}
	if s.errs = s.errs[len(b.EncodeErrs):]; len(s.errs) == 0 {
		s.errs = nil
	}
	if s.enc = s.enc[len(b.Encoded):]; len(s.enc) == 0 {
		s.enc = nil
	}
}

// close gives back what was not handed on: the records' places in their
// arenas, and the stream's share of the current one.
func (s *streamForwarder) close() {
	if s == nil {
		return
	}
	s.ff.Release()
	if s.arena == nil {
		return
	}
	s.settle()
	flow.ReleaseEncoded(s.enc)
	s.enc = nil
	s.arena.Release(1)
	s.arena = nil
}
