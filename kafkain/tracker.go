package kafkain

import (
	"sync"
	"time"
)

// tracker decides, per partition, up to which offset the group may
// commit: up to the oldest record that still contributes to state not
// exported yet. It follows each record from its fetch to the export of
// its flow:
//
//   - fetched: the record's flow (its key) gets a part for the record's
//     partition, which holds the record's offset as pending;
//   - resolved: the mode took the batch (its Written answer came back);
//     pos is then the number of records handed to the export buffer so
//     far, read after the answer, so that every export at a position from
//     pos on was built after the record was added;
//   - exported: an export of the flow at position p, once the sinks wrote
//     it (ring.Buffer.WaitWritten), releases the records taken at a pos
//     of at most p (see part); a part holding nothing more is removed.
//
// A part whose flow never exports again (a record that changed nothing, a
// one-sided flow dropped) is forgotten horizon after its last record: by
// then the store has exported or forgotten the flow. Without parts, a
// partition commits up to the last record fetched.
//
// Stateless (Proxy mode): a record is done once its batch is written
// (the Written answer waits for the sinks), so resolved is enough.
type tracker struct {
	mu       sync.Mutex
	stateful bool
	horizon  time.Duration
	flows    map[string][]*part
	parts    map[int32]*partition
	// read is, per partition this member owned before, the offset after
	// the last record it took: if the partition comes back (its session
	// expired while the brokers were away, say), what it reads again
	// below it is a replay even when its last commit's metadata is older.
	read      map[int32]int64
	now       func() time.Time
	expiredFn func(n int)
}

// part is what one flow holds of one partition: its records the mode
// has not taken yet (pend, their offsets, in order; the mode takes them
// in that order), and those it took, in at most two segments: a, the
// oldest, and b, those taken after an export could have been built
// between them and a's. An export at position e releases a segment whose
// pos is at most e, so that a flow whose records keep coming releases
// what each export covers instead of holding its first record until an
// export finds nothing pending.
type part struct {
	partition int32
	pend      []int64
	a, b      segment
	lastSeen  time.Time
}

// segment is records of a part the mode took: first is the oldest's
// offset, pos the export buffer's position when the last was taken.
type segment struct {
	ok    bool
	first int64
	pos   uint64
}

// first is the oldest offset the part holds.
func (pt *part) first() int64 {
	switch {
	case pt.a.ok:
		return pt.a.first
	case len(pt.pend) > 0:
		return pt.pend[0]
	}
	return -1 // holds nothing (not kept as such)
}

// take notes that the mode took the oldest pending record when the
// export buffer had had pos records.
func (pt *part) take(pos uint64) {
	if len(pt.pend) == 0 {
		return
	}
	o := pt.pend[0]
	pt.pend = pt.pend[1:]
	switch {
	case !pt.a.ok:
		pt.a = segment{ok: true, first: o, pos: pos}
	case !pt.b.ok && pos == pt.a.pos:
		// No export can tell them apart: one segment.
	case !pt.b.ok:
		pt.b = segment{ok: true, first: o, pos: pos}
	default:
		pt.b.pos = max(pt.b.pos, pos)
	}
}

// release applies an export at position pos; it reports whether the
// part holds nothing more.
func (pt *part) release(pos uint64) bool {
	if pt.a.ok && pt.a.pos <= pos {
		pt.a = pt.b
		pt.b = segment{}
		if pt.a.ok && pt.a.pos <= pos {
			pt.a = segment{}
		}
	}
	return !pt.a.ok && len(pt.pend) == 0
}

// partition is an owned partition.
type partition struct {
	// next is the offset after the last record fetched; done (stateless)
	// the offset after the last record written.
	next, done int64
	// committed is the last offset committed by this member; replayUntil
	// is the previous owner's next (from the commit's metadata): records
	// before it were taken already, and may be exported twice.
	committed   int64
	replayUntil int64
	live        int // parts
	// metaNext is the next offset in the last commit's metadata.
	metaNext int64
	// leaving partitions take no more records: they are being handed
	// over.
	leaving bool
}

func newTracker(stateful bool, horizon time.Duration, now func() time.Time) *tracker {
	return &tracker{stateful: stateful, horizon: horizon, flows: map[string][]*part{},
		parts: map[int32]*partition{}, read: map[int32]int64{}, now: now}
}

// assign starts tracking p, whose committed offset is committed (-1 if
// none) and previous owner's last fetch replayUntil (-1 if unknown).
func (t *tracker) assign(p int32, committed, replayUntil int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.parts[p]; ok {
		return
	}
	metaNext := replayUntil
	if r, ok := t.read[p]; ok {
		replayUntil = max(replayUntil, r)
	}
	t.parts[p] = &partition{next: committed, done: committed, committed: committed, replayUntil: replayUntil, metaNext: metaNext}
}

// leave stops taking records of ps, which are being handed over.
func (t *tracker) leave(ps []int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		if pp := t.parts[p]; pp != nil {
			pp.leaving = true
		}
	}
}

// revoke stops tracking ps and returns the keys of the flows that still
// held state of them (state the next owner rebuilds by replaying).
func (t *tracker) revoke(ps []int32) map[string]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := map[int32]bool{}
	for _, p := range ps {
		if pp, ok := t.parts[p]; ok {
			gone[p] = true
			t.read[p] = max(t.read[p], pp.next)
			delete(t.parts, p)
		}
	}
	keys := map[string]bool{}
	for k, list := range t.flows {
		kept := list[:0]
		for _, pt := range list {
			if gone[pt.partition] {
				keys[k] = true
				continue
			}
			kept = append(kept, pt)
		}
		if len(kept) == 0 {
			delete(t.flows, k)
		} else {
			t.flows[k] = kept
		}
	}
	return keys
}

// fetched notes a record of flow key at offset in p, and reports
// whether a previous owner had taken it already (a replay), and whether
// p is owned (if not, the record must be left to p's owner). It returns
// the part to resolve later (nil when stateless).
func (t *tracker) fetched(key string, p int32, offset int64) (pt *part, replay, owned bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pp := t.parts[p]
	if pp == nil || pp.leaving {
		return nil, false, false
	}
	replay = offset < pp.replayUntil
	if offset+1 > pp.next {
		pp.next = offset + 1
	}
	if !t.stateful {
		return nil, replay, true
	}
	for _, x := range t.flows[key] {
		if x.partition == p {
			x.pend = append(x.pend, offset)
			x.lastSeen = t.now()
			return x, replay, true
		}
	}
	pt = &part{partition: p, pend: []int64{offset}, lastSeen: t.now()}
	t.flows[key] = append(t.flows[key], pt)
	pp.live++
	return pt, replay, true
}

// skipped notes a record of p at offset that holds no state (refused).
func (t *tracker) skipped(p int32, offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pp := t.parts[p]; pp != nil && !pp.leaving && offset+1 > pp.next {
		pp.next = offset + 1
	}
}

// resolved notes that the mode took the records of parts (one entry per
// record) when the export buffer had had pos records; upTo are, per
// partition, the offsets after the batch's records.
func (t *tracker) resolved(parts []*part, pos uint64, upTo map[int32]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// The store's timeouts run from when it took a record, which may be
	// well after the fetch when the mode is behind: the horizon starts
	// here, not at the fetch.
	now := t.now()
	for _, pt := range parts {
		pt.take(pos)
		pt.lastSeen = now
	}
	for p, o := range upTo {
		if pp := t.parts[p]; pp != nil && o > pp.done {
			pp.done = o
		}
	}
}

// exported notes that the flow of key was exported at position pos, and
// that the sinks wrote it.
func (t *tracker) exported(key string, pos uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	list := t.flows[key]
	kept := list[:0]
	for _, pt := range list {
		if pt.release(pos) {
			if pp := t.parts[pt.partition]; pp != nil {
				pp.live--
			}
			continue
		}
		kept = append(kept, pt)
	}
	if len(kept) == 0 {
		delete(t.flows, key)
	} else {
		t.flows[key] = kept
	}
}

// expire forgets the parts whose last record was taken before cut and
// that are resolved: by then the store exported or forgot their flows.
// The caller must first wait until the sinks wrote every export produced
// before cut (see Input.commit): an export under a key other than its
// records' (or one not yet applied) is then still covered.
func (t *tracker) expire(cut time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stateful {
		return
	}
	expired := 0
	for k, list := range t.flows {
		kept := list[:0]
		for _, pt := range list {
			if len(pt.pend) == 0 && pt.lastSeen.Before(cut) {
				expired++
				if pp := t.parts[pt.partition]; pp != nil {
					pp.live--
				}
				continue
			}
			kept = append(kept, pt)
		}
		if len(kept) == 0 {
			delete(t.flows, k)
		} else {
			t.flows[k] = kept
		}
	}
	if expired > 0 && t.expiredFn != nil {
		t.expiredFn(expired)
	}
}

// commitable returns, for each owned partition, the offset it may commit
// now if it is past the last one committed, and the metadata (the next
// offset fetched).
func (t *tracker) commitable() map[int32][2]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	oldest := map[int32]int64{}
	if t.stateful {
		for _, list := range t.flows {
			for _, pt := range list {
				if o, ok := oldest[pt.partition]; !ok || pt.first() < o {
					oldest[pt.partition] = pt.first()
				}
			}
		}
	}
	out := map[int32][2]int64{}
	for p, pp := range t.parts {
		at := pp.done
		if t.stateful {
			at = pp.next
			if o, ok := oldest[p]; ok {
				at = o
			}
		}
		// A commit that does not move still refreshes the metadata: the
		// next owner counts what it replays from it.
		if at >= 0 && (at > pp.committed || pp.next > pp.metaNext) {
			out[p] = [2]int64{at, pp.next}
		}
	}
	return out
}

// committedAt notes a successful commit of p at offset, with next in
// its metadata.
func (t *tracker) committedAt(p int32, offset, next int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pp := t.parts[p]; pp != nil {
		pp.committed = max(pp.committed, offset)
		pp.metaNext = max(pp.metaNext, next)
	}
}

// live is the number of flows holding uncommitted records.
func (t *tracker) live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, pp := range t.parts {
		n += pp.live
	}
	return n
}
