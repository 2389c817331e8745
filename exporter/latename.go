package exporter

import (
	"context"
	"net/netip"
	"time"

	"sluice/exporter/record"
	"sluice/exporter/source"
)

// Late naming. The kubelet posts a new Pod's IP (status.podIP) a moment
// after its containers start, and the Pod metadata cache learns it only
// then; a connection the Pod makes at once may be first seen before. So a
// connection with a local end the cache cannot name (podmeta.Meta.Unnamed)
// is looked up again at each later poll that sees it (redescribe), and
// its final record, when it ends still unnamed, is held back and looked up
// again at the next polls (releaseHeld), for at most LateNaming after the
// connection's start. Connections named at first sight pay nothing.

// Defaults of Options.LateNaming and Options.MaxHeld.
const (
	// DefaultLateNaming covers the kubelet's status update, the API
	// server's watch and the informer's delivery on a busy Node.
	DefaultLateNaming = 10 * time.Second
	// DefaultMaxHeld: a Node starting a hundred Pods at once, each with
	// a few short connections before its IP is known, fits (168 octets
	// a record held: under 700 KiB full).
	DefaultMaxHeld = 4096
)

// heldRecord is a final record held back for a Pod name: the record as
// the store made it (fill writes it again when it is released) and the
// connection's metadata.
type heldRecord struct {
	rec  record.Record
	meta connMeta
}

// waiting reports whether a connection that started at startNs may still
// be named late at nowNs (Options.LateNaming).
func (e *Exporter) waiting(startNs, nowNs int64) bool {
	return e.lateNaming > 0 && nowNs-startNs < e.lateNaming
}

// redescribe is the store's Options.Redescribe: it looks the unnamed
// local ends of an open connection up again, and says whether to go on.
// Past the wait it gives up: an address no Pod has, or a cache lagging
// far behind.
func (e *Exporter) redescribe(c *source.Conn, start, now time.Time, m *connMeta) bool {
	if !e.waiting(start.UnixNano(), now.UnixNano()) {
		m.unnamed = 0
		return false
	}
	e.rename(m, c.OrigSrc.Addr(), c.ReplySrc.Addr(), start)
	return m.unnamed != 0
}

// rename looks m's unnamed local ends up again. The policy model learns
// a Pod from the same informers as the cache, up to half a second later:
// when the cache has named one and the model is behind, the model is
// caught up (once a poll, as fillVerdict does) before the connection is
// judged. No verdict judged without the Pod sticks: a pending connection
// is not judged at first sight (describe), and a verdict of an older
// model generation is judged again (fillVerdict).
func (e *Exporter) rename(m *connMeta, src, dst netip.Addr, start time.Time) {
	rec, unnamed := e.pm.Rename(m.rec, m.unnamed, src, dst, start)
	m.unnamed = unnamed
	if rec == m.rec {
		return
	}
	m.rec = rec
	e.m.lateNames.Inc()
	if a := e.o.Attributor; a != nil && !e.lateCatchUp && a.Behind() {
		e.lateCatchUp = true
		a.CatchUp(context.Background(), e.o.CatchUpWait)
	}
}

// hold takes r, the final record of a connection with an unnamed local
// end, out of the run the store is writing, to be filled when the Pod is
// named or the wait is over (releaseHeld). It returns false when the
// connection is past the wait (gone from the table before a poll gave
// up on it) or, counted, when the held records are at their cap: r is
// then filled and written as it is.
func (e *Exporter) hold(r *record.Record, m *connMeta) bool {
	switch {
	case !e.waiting(r.Start, e.pollTime.UnixNano()):
		return false
	case len(e.held) >= e.o.MaxHeld:
		e.m.unnamedHeldFull.Inc()
		return false
	}
	e.held = append(e.held, heldRecord{rec: *r, meta: *m})
	r.EndReason = 0 // no record has it: emit leaves this one out
	e.holes++
	return true
}

// dropHoles removes the records hold took, in place.
func dropHoles(recs []record.Record) []record.Record {
	n := 0
	for i := range recs {
		if recs[i].EndReason == 0 {
			continue
		}
		if n != i {
			recs[n] = recs[i]
		}
		n++
	}
	return recs[:n]
}

// releaseHeld looks the held records' Pods up again and queues those now
// named, those past the wait and, when final (shutdown), all of them,
// appended to batch too when it is not nil.
func (e *Exporter) releaseHeld(batch *[]record.Record, final bool) {
	if len(e.held) == 0 {
		return
	}
	now := e.pollTime.UnixNano()
	out, kept := e.releasing[:0], e.held[:0]
	for _, h := range e.held {
		r := &h.rec
		e.rename(&h.meta, r.Src.Addr(), r.Dst.Addr(), time.Unix(0, r.Start))
		switch {
		case h.meta.unnamed == 0:
		case final:
			e.m.unnamedShutdown.Inc()
		case !e.waiting(r.Start, now):
			e.m.unnamedTimeout.Inc()
		default:
			kept = append(kept, h)
			continue
		}
		h.meta.unnamed = 0 // named, or given up: fill writes it
		e.fill(r, &h.meta)
		out = append(out, *r)
	}
	clear(e.held[len(kept):]) // the released ones' Pods and verdicts
	e.held = kept
	e.reserved = nil
	if queued := e.emit(out); batch != nil {
		*batch = append(*batch, queued...)
	}
	clear(out) // copied into the queue: drop the Pods and verdicts
	e.releasing = out[:0]
}

// Flush queues the final records still held for a Pod name (named if the
// metadata source knows the Pod by now) and returns them appended to
// batch. Run calls it when it stops; a caller of Poll calls it before it
// drops the exporter.
func (e *Exporter) Flush(batch []record.Record) []record.Record {
	e.flush(&batch)
	return batch
}

func (e *Exporter) flush(batch *[]record.Record) {
	e.pollTime, e.lateCatchUp = time.Now(), false
	e.releaseHeld(batch, true)
	e.m.held.Set(float64(len(e.held)))
}
