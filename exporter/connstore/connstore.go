// Package connstore is the exporter's connection store: it takes one
// snapshot of the connection table per poll, keeps per-connection state
// between polls and decides which connections are exported when, with
// which end reason and which delta counts, following Antrea's agent:
//
//   - The key is the original direction's source and the reply direction's
//     source as destination (the endpoint after DNAT), so both Nodes of a
//     Service connection agree on it.
//   - A new connection is first exported ActiveTimeout after it was first
//     seen, then once per ActiveTimeout while it changes (ACTIVE_TIMEOUT).
//   - A connection that has not changed for IdleTimeout is exported once
//     (IDLE_TIMEOUT) and then waits, unexported, until it changes again.
//   - A connection that ends (TCP TIME_WAIT or CLOSE, the conntrack dying
//     bit, or gone from the table) is exported at once with END_OF_FLOW,
//     and never again; a TCP entry lingering in TIME_WAIT is remembered
//     until it leaves the table, so it is not taken for a new connection.
//   - Delta counts are the totals minus the totals last exported, clamped
//     at zero when a counter goes backwards.
//
// Unlike the reference, an active connection that did not change since its
// last export is not exported again at its active timeout: the record would
// carry nothing new.
//
// The store holds at most MaxConnections entries; connections beyond that
// are not tracked and are counted. A Store is used from one goroutine.
package connstore

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"sluice/exporter/record"
	"sluice/exporter/source"
)

// End reasons (IPFIX flowEndReason).
const (
	ReasonIdle   uint8 = 1
	ReasonActive uint8 = 2
	ReasonEnd    uint8 = 3
)

// Defaults of Options, as Antrea's agent.
const (
	DefaultActiveTimeout  = 5 * time.Second
	DefaultIdleTimeout    = 15 * time.Second
	DefaultMaxConnections = 262_144
)

// Options configures a Store. M is the per-connection metadata (Kubernetes
// names), resolved when a connection is first seen and, while Describe
// says it is pending, again at the later polls that see it (Redescribe).
type Options[M any] struct {
	ActiveTimeout, IdleTimeout time.Duration
	// MaxConnections bounds the entries held (tombstones of ended TCP
	// connections included).
	MaxConnections int
	// Keep selects the connections to track; nil tracks all. It must
	// depend on the connection's tuple alone (addresses, ports, protocol).
	Keep func(c *source.Conn) bool
	// Describe resolves a new connection's metadata; start is its start
	// time. Nil leaves M zero. pending says the metadata may still become
	// more complete (a Pod the metadata source does not know yet): with
	// Redescribe set, the store then calls it at later polls.
	Describe func(c *source.Conn, start time.Time) (m M, pending bool)
	// Redescribe completes a pending connection's metadata in place, at
	// a poll at now that sees the connection still open, before any
	// record of that poll; it returns whether the metadata is still
	// pending, and must bound that itself (the store calls it as long as
	// it says so). Nil: metadata is resolved once.
	Redescribe func(c *source.Conn, start, now time.Time, m *M) (pending bool)
	// Fill writes the metadata into an exported record; nil writes none.
	// It may update the metadata (its copy in the store).
	Fill func(r *record.Record, m *M)
	// Emit, if set, is handed the records of an Update in runs of
	// EmitEvery (DefaultEmitEvery if 0) as they are made, and the rest at
	// its end, so that they can be sent while the store goes on; it
	// returns those it keeps, moved to the front of the run (it may drop
	// some), and Update returns only those (UpdateEmit does not use the
	// result).
	Emit      func(recs []record.Record) []record.Record
	EmitEvery int
	// Buffer, with Emit, lets UpdateEmit write the records where they are
	// going instead of into a batch: it returns the space for the next
	// run of at most n records (at least one record long), which the
	// store fills and then hands to Emit.
	Buffer func(n int) []record.Record
}

// DefaultEmitEvery is Options.EmitEvery's default.
const DefaultEmitEvery = 2048

// Stats are a Store's counters.
type Stats struct {
	// Connections is the number of entries held; Ended of them are
	// tombstones of exported ended connections.
	Connections, Ended int
	// Seen is the number of connections the last snapshot had after Keep.
	Seen int
	// Dropped counts connections not tracked because the store was full.
	Dropped uint64
	// Exported counts records produced, by end reason (index 1..3).
	Exported [4]uint64
}

// key is a connection's 5-tuple in a fixed-size, pointer-free form of
// 40 octets, so that hashing it is one pass over them and comparing it
// (eq) five word compares, with no call. The addresses are their 16-octet
// (IPv4-mapped) forms, as netip.Addr.As16 gives them and record.Addr
// holds them (so that a record's address is a copy); ports holds the
// source and destination ports, the protocol and the family bits (bit 0:
// src is IPv4, bit 1: dst is IPv4, as opposed to their IPv4-mapped IPv6
// form), so the record gets the address back as the source gave it.
type key struct {
	src, dst [16]byte
	ports    uint64 // srcPort<<48 | dstPort<<32 | proto<<8 | four
}

// eq compares the keys word by word (the byte order of a word does not
// matter to equality; little-endian loads are plain loads here).
func (k *key) eq(o *key) bool {
	le := binary.LittleEndian
	return (le.Uint64(k.src[:8])^le.Uint64(o.src[:8]))|(le.Uint64(k.src[8:])^le.Uint64(o.src[8:]))|
		(le.Uint64(k.dst[:8])^le.Uint64(o.dst[:8]))|(le.Uint64(k.dst[8:])^le.Uint64(o.dst[8:]))|
		(k.ports^o.ports) == 0
}

func (k *key) srcPort() uint16 { return uint16(k.ports >> 48) }
func (k *key) dstPort() uint16 { return uint16(k.ports >> 32) }
func (k *key) proto() uint8    { return uint8(k.ports >> 8) }

// entry flags.
const (
	fChanged uint8 = 1 << iota // counters or TCP state changed since the last export
	fQueued                    // waiting for an active or idle timeout
	fEnded                     // the connection ended; export END_OF_FLOW
	fDone                      // END_OF_FLOW exported: a tombstone
	fPending                   // the metadata is pending: Redescribe at each poll
)

type entry[M any] struct {
	key      key
	id       uint32
	flags    uint8
	tcpState uint8
	// seen is the poll generation that last saw the entry; 0 marks a free
	// slot.
	seen     uint32
	start    int64 // ns
	lastSeen int64
	activeAt int64
	idleAt   int64
	cur      [4]uint64 // packets, octets, reverse packets, reverse octets
	prev     [4]uint64 // as last exported
	meta     M
}

// Store is the connection store.
type Store[M any] struct {
	o     Options[M]
	index map[key]uint32
	slab  []entry[M]
	free  []uint32
	gen   uint32
	stats Stats
	// live counts the entries the snapshot in progress has seen (each
	// once), tombs the tombstones among them.
	live, tombs int
	active      int64
	idle        int64
	// out collects the records of the Update in progress; those from
	// emitted on are not emitted yet.
	out     []record.Record
	emitted int
	// With direct (UpdateEmit), the records go into buf instead, the
	// first nbuf of them written.
	direct bool
	buf    []record.Record
	nbuf   int
}

// New returns an empty store.
func New[M any](o Options[M]) (*Store[M], error) {
	if o.ActiveTimeout == 0 {
		o.ActiveTimeout = DefaultActiveTimeout
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	if o.EmitEvery <= 0 {
		o.EmitEvery = DefaultEmitEvery
	}
	if o.ActiveTimeout < 0 || o.IdleTimeout < 0 || o.MaxConnections < 0 {
		return nil, errors.New("connstore: timeouts and the connection cap must not be negative")
	}
	return &Store[M]{o: o, index: map[key]uint32{}, active: int64(o.ActiveTimeout), idle: int64(o.IdleTimeout)}, nil
}

// Stats returns the counters.
func (s *Store[M]) Stats() Stats { return s.stats }

// set makes k c's key.
func (k *key) set(c *source.Conn) {
	// Naming netip here keeps its import, without which the compiler
	// does not inline AddrPort's methods (two calls per address).
	var src, dst netip.Addr = c.OrigSrc.Addr(), c.ReplySrc.Addr()
	k.src = src.As16()
	k.dst = dst.As16()
	p := uint64(c.OrigSrc.Port())<<48 | uint64(c.ReplySrc.Port())<<32 | uint64(c.Proto)<<8
	if src.Is4() {
		p |= 1
	}
	if dst.Is4() {
		p |= 2
	}
	k.ports = p
}

// Update applies one snapshot of the connection table taken at now, then
// appends every record due to out, in no particular order, and returns
// it. out is worth reusing across calls.
func (s *Store[M]) Update(now time.Time, conns []source.Conn, out []record.Record) []record.Record {
	s.out, s.emitted = out, len(out)
	s.apply(now, conns)
	s.emit()
	out, s.out = s.out, nil
	return out
}

// UpdateEmit is Update without the batch: the records are written in
// runs straight into the space Options.Buffer gives and handed to
// Options.Emit (a copy less per record, and no batch of the whole
// poll's records streaming through the caches). Buffer and Emit must be
// set.
func (s *Store[M]) UpdateEmit(now time.Time, conns []source.Conn) {
	if s.o.Buffer == nil || s.o.Emit == nil {
		panic("connstore: UpdateEmit without Options.Buffer and Emit")
	}
	s.direct = true
	s.apply(now, conns)
	s.flush()
	s.direct = false
}

// apply applies a snapshot and makes the records due.
func (s *Store[M]) apply(now time.Time, conns []source.Conn) {
	s.gen++
	if s.gen == 0 { // 0 marks free slots
		s.gen = 1
	}
	ns := now.UnixNano()
	seen := 0
	s.live, s.tombs = 0, 0
	// A dump lists the table in much the same order every time, and the
	// slab holds entries in the order they were first seen: the entry
	// after the last one found is tried first, and only a miss (a new,
	// gone or moved connection) costs a look-up in the index. A hit needs
	// no Keep either, as Keep depends on the tuple alone.
	next := 0
	var k key
	for i := range conns {
		c := &conns[i]
		k.set(c)
		if next < len(s.slab) {
			if e := &s.slab[next]; e.seen != 0 && e.key.eq(&k) {
				seen++
				next++
				s.touch(e, c, ns)
				continue
			}
		}
		if s.o.Keep != nil && !s.o.Keep(c) {
			continue
		}
		seen++
		if idx, ok := s.index[k]; ok {
			next = int(idx) + 1
			s.touch(&s.slab[idx], c, ns)
			continue
		}
		if len(s.index) >= s.o.MaxConnections {
			s.stats.Dropped++
			continue
		}
		var idx uint32
		if n := len(s.free); n > 0 {
			idx = s.free[n-1]
			s.free = s.free[:n-1]
		} else {
			s.slab = append(s.slab, entry[M]{})
			idx = uint32(len(s.slab) - 1)
		}
		s.index[k] = idx
		e := &s.slab[idx]
		s.init(e, c, &k, ns)
		s.live++
		s.due(e, ns)
		next = int(idx) + 1
	}
	s.stats.Seen = seen
	if s.live < len(s.index) {
		s.sweep(ns)
	}
	s.stats.Connections = len(s.index)
	s.stats.Ended = s.tombs
}

// newSlot is the place of the next record when it is the first of a
// run (UpdateEmit) or one more in the batch (Update); export takes the
// others in the run itself. The place is as it was left: export writes
// every field.
func (s *Store[M]) newSlot() *record.Record {
	if !s.direct {
		s.out = append(s.out, record.Record{})
		return &s.out[len(s.out)-1]
	}
	s.buf, s.nbuf = s.o.Buffer(s.o.EmitEvery), 1
	return &s.buf[0]
}

// flush hands the records written in buf to Options.Emit.
func (s *Store[M]) flush() {
	if s.nbuf > 0 {
		s.o.Emit(s.buf[:s.nbuf])
	}
	s.buf, s.nbuf = nil, 0
}

// emit hands the records not emitted yet to Options.Emit.
func (s *Store[M]) emit() {
	if s.o.Emit == nil || s.emitted == len(s.out) {
		return
	}
	kept := s.o.Emit(s.out[s.emitted:])
	s.out = s.out[:s.emitted+len(kept)]
	s.emitted = len(s.out)
}

// touch applies a snapshot's c to its entry e (of c's key) and exports
// what is due.
func (s *Store[M]) touch(e *entry[M], c *source.Conn, ns int64) {
	if e.seen == s.gen {
		// The same tuple twice in one dump (zones): the first wins,
		// whatever the second's ID. Checked before the ID, or each would
		// end the other on every poll (END_OF_FLOW records of live
		// connections, two identical ones if both were new).
		return
	}
	s.live++
	if e.id != c.ID && e.id != 0 && c.ID != 0 {
		// The tuple names a new conntrack entry: the old connection
		// ended with its last counters.
		if e.flags&fDone == 0 {
			s.export(e, ReasonEnd)
		}
		k := e.key
		s.init(e, c, &k, ns)
		s.due(e, ns)
		return
	}
	e.seen = s.gen
	if e.flags&fDone != 0 {
		s.tombs++
		return // a tombstone: nothing more is exported
	}
	e.lastSeen = ns
	if e.flags&fPending != 0 {
		s.redescribe(e, c, ns)
	}
	cur := [4]uint64{c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes}
	if cur != e.cur || c.TCPState != e.tcpState {
		e.cur, e.tcpState = cur, c.TCPState
		e.flags |= fChanged
		e.idleAt = ns + s.idle
		if e.flags&fQueued == 0 {
			e.flags |= fQueued
			e.activeAt = ns + s.active
		}
	}
	if ended(c) {
		e.flags |= fEnded
	}
	s.due(e, ns)
}

func (s *Store[M]) init(e *entry[M], c *source.Conn, k *key, ns int64) {
	start := ns
	if !c.Start.IsZero() && c.Start.UnixNano() <= ns {
		start = c.Start.UnixNano()
	}
	*e = entry[M]{key: *k, id: c.ID, seen: s.gen, start: start, lastSeen: ns, flags: fChanged | fQueued,
		activeAt: ns + s.active, idleAt: ns + s.idle, tcpState: c.TCPState,
		cur: [4]uint64{c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes}}
	if ended(c) {
		e.flags |= fEnded
	}
	if s.o.Describe != nil {
		var pending bool
		e.meta, pending = s.o.Describe(c, time.Unix(0, start))
		if pending && s.o.Redescribe != nil {
			e.flags |= fPending
		}
	}
}

// redescribe asks Options.Redescribe to complete e's pending metadata.
func (s *Store[M]) redescribe(e *entry[M], c *source.Conn, ns int64) {
	if !s.o.Redescribe(c, time.Unix(0, e.start), time.Unix(0, ns), &e.meta) {
		e.flags &^= fPending
	}
}

func ended(c *source.Conn) bool {
	if c.Proto == source.ProtoTCP && (c.TCPState == source.TCPTimeWait || c.TCPState == source.TCPClose) {
		return true
	}
	return c.Dying
}

// due exports what is due of an entry the snapshot has seen, once it
// has been applied: its state then depends on the entry and the time
// alone, so deciding while the entry is in cache, rather than in a
// second pass over the whole store, gives the same records.
func (s *Store[M]) due(e *entry[M], ns int64) {
	switch {
	case e.flags&fDone != 0:
		s.tombs++
	case e.flags&fEnded != 0:
		s.export(e, ReasonEnd)
		e.flags |= fDone
		s.tombs++
	case e.flags&fQueued == 0:
	case ns >= e.idleAt:
		// Quiet for the idle timeout: a last record, then wait for new
		// packets. One that changed since its last export still reports
		// them as active, as the reference does.
		r := ReasonIdle
		if e.flags&fChanged != 0 {
			r = ReasonActive
		}
		s.export(e, r)
		e.flags &^= fQueued
	case ns >= e.activeAt:
		if e.flags&fChanged != 0 {
			s.export(e, ReasonActive)
		}
		e.activeAt = ns + s.active
	}
}

// sweep removes the entries the snapshot no longer had, with an
// END_OF_FLOW record for those not ended yet. apply calls it only when
// some entry was not seen: every entry held is in the index, so when the
// snapshot saw as many distinct entries as the index holds, none is gone.
func (s *Store[M]) sweep(ns int64) {
	for i := range s.slab {
		e := &s.slab[i]
		if e.seen == 0 || e.seen == s.gen {
			continue
		}
		// Gone from the table: it ended, whatever its state said.
		if e.flags&fDone == 0 {
			e.lastSeen = ns
			s.export(e, ReasonEnd)
		}
		delete(s.index, e.key)
		*e = entry[M]{}
		s.free = append(s.free, uint32(i))
	}
}

// export writes e's record into the next slot, every field of it (the
// slot may hold an older record), and hands the run on when it is full.
func (s *Store[M]) export(e *entry[M], reason uint8) {
	var r *record.Record
	if s.direct && s.nbuf < len(s.buf) {
		r = &s.buf[s.nbuf]
		s.nbuf++
	} else {
		r = s.newSlot()
	}
	k := &e.key
	r.Start, r.End = e.start, e.lastSeen
	c := &r.Counts
	c[record.PacketTotal], c[record.OctetTotal] = e.cur[0], e.cur[1]
	c[record.PacketDelta], c[record.OctetDelta] = delta(e.cur[0], e.prev[0]), delta(e.cur[1], e.prev[1])
	c[record.ReversePacketTotal], c[record.ReverseOctetTotal] = e.cur[2], e.cur[3]
	c[record.ReversePacketDelta], c[record.ReverseOctetDelta] = delta(e.cur[2], e.prev[2]), delta(e.cur[3], e.prev[3])
	r.Src.Set16(&k.src, k.ports&1 != 0)
	r.Dst.Set16(&k.dst, k.ports&2 != 0)
	r.SrcPort, r.DstPort, r.Proto = k.srcPort(), k.dstPort(), k.proto()
	r.EndReason, r.TCPState, r.FlowType, r.Attr = reason, e.tcpState, 0, 0
	r.Meta, r.Verdict = nil, nil
	if s.o.Fill != nil {
		s.o.Fill(r, &e.meta)
	}
	e.prev = e.cur
	e.flags &^= fChanged
	s.stats.Exported[reason]++
	switch {
	case s.direct:
		if s.nbuf == len(s.buf) {
			s.flush()
		}
	case len(s.out)-s.emitted >= s.o.EmitEvery:
		s.emit()
	}
}

// delta is a counter's increase since its last export, 0 when it went
// backwards.
func delta(cur, prev uint64) uint64 {
	if cur > prev {
		return cur - prev
	}
	return 0
}
