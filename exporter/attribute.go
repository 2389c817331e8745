package exporter

import (
	"context"
	"time"

	"sluice/exporter/attribution"
	"sluice/exporter/connstore"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
)

// DefaultDeniedRate bounds the denied-connection records queued per
// second (a port scan against a denying policy must not crowd out the
// rest); DefaultDeniedBurst is the bucket's depth.
const (
	DefaultDeniedRate  = 1000
	DefaultDeniedBurst = 2000
)

// connMeta is what the store keeps per connection: its records' metadata
// (shared, see podmeta.Meta), the flow type, the locality of either end
// and the cached attribution. podmeta.Meta's fields are held flat, not
// as one: 24 octets instead of 32 in every store entry.
type connMeta struct {
	rec                *record.Meta
	attr               *attribution.Verdict
	srcLocal, dstLocal bool
	flowType           uint8
	// disagreed: the model denies the connection but it was answered;
	// counted once.
	disagreed bool
	// unnamed: the local ends (podmeta.UnnamedSrc, UnnamedDst) still
	// waiting for a Pod name (latename.go); 0 for nearly every
	// connection, and for any once the wait is over: then nothing more
	// is done.
	unnamed uint8
}

func attrKey(r *record.Record) attribution.Key {
	return attribution.Key{Src: r.Src.Addr().Unmap(), Dst: r.Dst.Addr().Unmap(), Proto: r.Proto, DstPort: r.DstPort}
}

// describe resolves a new connection: Pods, and its verdict at first
// sight. A local end the metadata source cannot name yet makes a young
// connection pending, to be named at a later poll (redescribe); its
// verdict waits for that (fillVerdict judges it when a record is made).
func (e *Exporter) describe(c *source.Conn, start time.Time) (connMeta, bool) {
	pm := e.pm.Describe(c, start)
	m := connMeta{rec: pm.Rec, srcLocal: pm.SrcLocal, dstLocal: pm.DstLocal, flowType: pm.FlowType}
	if pm.Unnamed != 0 && e.waiting(start.UnixNano(), e.pollTime.UnixNano()) {
		m.unnamed = pm.Unnamed
		return m, true
	}
	if e.o.Attributor != nil {
		// The model's runs are bounded (tables, Nodes); they need no
		// cancellation.
		m.attr = e.o.Attributor.Verdict(context.Background(), attribution.Key{Src: c.OrigSrc.Addr().Unmap(),
			Dst: c.ReplySrc.Addr().Unmap(), Proto: c.Proto, DstPort: c.ReplySrc.Port()})
	}
	return m, false
}

// fill writes m into an exported record: the Pods, then the attribution
// on the sides this Node owns. A connection the model denies and that
// saw no reply is a denied connection: the denying side is written
// whichever Node owns it (no other Node sees the connection: the packets
// were dropped before the destination committed them). The record refers
// to the verdict; Attr says which of its parts it carries.
//
// It is called for every record the store makes: the part without an
// Attributor, for a named connection, is kept small enough to be inlined
// into the store's call.
func (e *Exporter) fill(r *record.Record, m *connMeta) {
	r.Meta, r.FlowType = m.rec, m.flowType // as podmeta.Resolver.Fill
	if m.unnamed|e.attributing != 0 {
		e.fillVerdict(r, m)
	}
}

// fillVerdict is fill's attribution part. It also holds back the final
// record of a connection with an unnamed local end (hold), to be filled
// when it is released: one call for both keeps fill inlinable.
func (e *Exporter) fillVerdict(r *record.Record, m *connMeta) {
	if m.unnamed != 0 && r.EndReason == connstore.ReasonEnd && e.hold(r, m) {
		return
	}
	a := e.o.Attributor
	if a == nil {
		return
	}
	if m.attr == nil || m.attr.Gen != a.Generation() {
		m.attr = a.Verdict(context.Background(), attrKey(r))
		if m.attr == nil {
			return
		}
	}
	v := m.attr
	srcLocal, dstLocal := m.srcLocal, m.dstLocal
	denied := v.Denied && r.Counts[record.ReversePacketTotal] == 0
	if v.Denied && !denied && !m.disagreed {
		// The model denies an answered connection. It may lack a change
		// that came after this poll caught it up (a Pod that started
		// meanwhile): once a poll, catch up again and ask anew.
		if !e.lateCatchUp && a.Behind() {
			e.lateCatchUp = true
			a.CatchUp(context.Background(), e.o.CatchUpWait)
			if nv := a.Verdict(context.Background(), attrKey(r)); nv != nil {
				m.attr, v = nv, nv
				denied = v.Denied && r.Counts[record.ReversePacketTotal] == 0
			}
		}
		if v.Denied && !denied {
			m.disagreed = true
			e.m.disagreements.Inc()
		}
	}
	deny := func(p *flow.Policy) bool { return p.RuleAction == flow.ActionDrop || p.RuleAction == flow.ActionReject }
	var bits uint8
	if v.Egress.RuleAction != 0 && (srcLocal || denied) && (denied || !deny(&v.Egress)) {
		bits |= record.AttrEgressPolicy
	}
	if v.Ingress.RuleAction != 0 && (dstLocal || denied) && (denied || !deny(&v.Ingress)) {
		bits |= record.AttrIngressPolicy
	}
	if srcLocal && v.EgressName != "" {
		bits |= record.AttrEgress
	}
	if bits != 0 {
		r.Verdict, r.Attr = v, bits
	}
}

// tokenBucket is a rate limit on one goroutine's clock.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *tokenBucket) take(now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = b.burst
	} else if d := now.Sub(b.last).Seconds(); d > 0 {
		b.tokens = min(b.burst, b.tokens+d*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// limitDenied drops the denied records over the rate limit from batch,
// in place, and counts them.
func (e *Exporter) limitDenied(now time.Time, batch []record.Record) []record.Record {
	if e.o.Attributor == nil {
		return batch
	}
	n := 0
	for i := range batch {
		r := &batch[i]
		if r.Denied() {
			e.m.deniedRecords.Inc()
			if !e.denied.take(now) {
				e.m.deniedDrops.Inc()
				continue
			}
		}
		if n != i {
			batch[n] = batch[i]
		}
		n++
	}
	return batch[:n]
}
