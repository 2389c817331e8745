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
	"errors"
	"net/netip"
	"time"

	"sluice/exporter/source"
	"sluice/flow"
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
// names), resolved once when a connection is first seen.
type Options[M any] struct {
	ActiveTimeout, IdleTimeout time.Duration
	// MaxConnections bounds the entries held (tombstones of ended TCP
	// connections included).
	MaxConnections int
	// Keep selects the connections to track; nil tracks all.
	Keep func(c *source.Conn) bool
	// Describe resolves a new connection's metadata; start is its start
	// time. Nil leaves M zero.
	Describe func(c *source.Conn, start time.Time) M
	// Fill writes the metadata into an exported record; nil writes none.
	Fill func(f *flow.Flow, m *M)
}

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

type key struct {
	src, dst         netip.Addr
	srcPort, dstPort uint16
	proto            uint8
}

// entry flags.
const (
	fChanged uint8 = 1 << iota // counters or TCP state changed since the last export
	fQueued                    // waiting for an active or idle timeout
	fEnded                     // the connection ended; export END_OF_FLOW
	fDone                      // END_OF_FLOW exported: a tombstone
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
	replyDst netip.AddrPort
	cur      [4]uint64 // packets, octets, reverse packets, reverse octets
	prev     [4]uint64 // as last exported
	meta     M
}

// Store is the connection store.
type Store[M any] struct {
	o      Options[M]
	index  map[key]uint32
	slab   []entry[M]
	free   []uint32
	gen    uint32
	stats  Stats
	active int64
	idle   int64
	// out collects the records of the Update in progress.
	out []flow.Flow
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
	if o.ActiveTimeout < 0 || o.IdleTimeout < 0 || o.MaxConnections < 0 {
		return nil, errors.New("connstore: timeouts and the connection cap must not be negative")
	}
	return &Store[M]{o: o, index: map[key]uint32{}, active: int64(o.ActiveTimeout), idle: int64(o.IdleTimeout)}, nil
}

// Stats returns the counters.
func (s *Store[M]) Stats() Stats { return s.stats }

func keyOf(c *source.Conn) key {
	return key{src: c.OrigSrc.Addr(), dst: c.ReplySrc.Addr(), srcPort: c.OrigSrc.Port(), dstPort: c.ReplySrc.Port(), proto: c.Proto}
}

// Update applies one snapshot of the connection table taken at now, then
// appends every record due to out, in no particular order, and returns
// it. Records are built in place in out, which is worth reusing across
// calls: a record is large, and copying it is most of the cost.
func (s *Store[M]) Update(now time.Time, conns []source.Conn, out []flow.Flow) []flow.Flow {
	s.out = out
	s.gen++
	if s.gen == 0 { // 0 marks free slots
		s.gen = 1
	}
	ns := now.UnixNano()
	seen := 0
	for i := range conns {
		c := &conns[i]
		if s.o.Keep != nil && !s.o.Keep(c) {
			continue
		}
		seen++
		k := keyOf(c)
		if idx, ok := s.index[k]; ok {
			e := &s.slab[idx]
			if e.id != c.ID && e.id != 0 && c.ID != 0 {
				// The tuple names a new conntrack entry: the old connection
				// ended with its last counters.
				if e.flags&fDone == 0 {
					s.export(e, ReasonEnd)
				}
				s.init(e, c, k, ns)
				continue
			}
			if e.seen == s.gen {
				continue // the same tuple twice in one dump (zones): first wins
			}
			s.update(e, c, ns)
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
		s.init(&s.slab[idx], c, k, ns)
	}
	s.stats.Seen = seen
	s.sweep(ns)
	out, s.out = s.out, nil
	return out
}

func (s *Store[M]) init(e *entry[M], c *source.Conn, k key, ns int64) {
	start := ns
	if !c.Start.IsZero() && c.Start.UnixNano() <= ns {
		start = c.Start.UnixNano()
	}
	*e = entry[M]{key: k, id: c.ID, seen: s.gen, start: start, lastSeen: ns, flags: fChanged | fQueued,
		activeAt: ns + s.active, idleAt: ns + s.idle, tcpState: c.TCPState, replyDst: c.ReplyDst,
		cur: [4]uint64{c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes}}
	if ended(c) {
		e.flags |= fEnded
	}
	if s.o.Describe != nil {
		e.meta = s.o.Describe(c, time.Unix(0, start))
	}
}

func ended(c *source.Conn) bool {
	if c.Proto == source.ProtoTCP && (c.TCPState == source.TCPTimeWait || c.TCPState == source.TCPClose) {
		return true
	}
	return c.Dying
}

func (s *Store[M]) update(e *entry[M], c *source.Conn, ns int64) {
	e.seen = s.gen
	if e.flags&fDone != 0 {
		return // a tombstone: nothing more is exported
	}
	e.lastSeen = ns
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
}

// sweep removes the entries the snapshot no longer had and exports what is
// due.
func (s *Store[M]) sweep(ns int64) {
	tomb := 0
	for i := range s.slab {
		e := &s.slab[i]
		if e.seen == 0 {
			continue
		}
		if e.seen != s.gen {
			// Gone from the table: it ended, whatever its state said.
			if e.flags&fDone == 0 {
				e.lastSeen = ns
				s.export(e, ReasonEnd)
			}
			delete(s.index, e.key)
			*e = entry[M]{}
			s.free = append(s.free, uint32(i))
			continue
		}
		switch {
		case e.flags&fDone != 0:
			tomb++
		case e.flags&fEnded != 0:
			s.export(e, ReasonEnd)
			e.flags |= fDone
			tomb++
		case e.flags&fQueued == 0:
		case ns >= e.idleAt:
			// Quiet for the idle timeout: a last record, then wait for
			// new packets. One that changed since its last export still
			// reports them as active, as the reference does.
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
	s.stats.Connections = len(s.index)
	s.stats.Ended = tomb
}

// export appends e's record to s.out.
func (s *Store[M]) export(e *entry[M], reason uint8) {
	// Reslice rather than append a zero literal: appending a value this
	// large copies it from a temporary.
	if n := len(s.out); n < cap(s.out) {
		s.out = s.out[:n+1]
		s.out[n] = flow.Flow{}
	} else {
		s.out = append(s.out, flow.Flow{})
	}
	f := &s.out[len(s.out)-1]
	f.StartTime = time.Unix(0, e.start)
	f.EndTime = time.Unix(0, e.lastSeen)
	f.EndReason = reason
	f.SourceIP, f.SourcePort = e.key.src, e.key.srcPort
	f.DestinationIP, f.DestinationPort = e.key.dst, e.key.dstPort
	f.Protocol = e.key.proto
	for _, fl := range [...]flow.Field{flow.StartTime, flow.EndTime, flow.EndReason, flow.SourceIP, flow.SourcePort,
		flow.DestinationIP, flow.DestinationPort, flow.Protocol, flow.PacketTotalCount, flow.PacketDeltaCount,
		flow.OctetTotalCount, flow.OctetDeltaCount, flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount,
		flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount} {
		f.Present.Set(fl)
	}
	if e.key.proto == source.ProtoTCP {
		f.TCPState = source.TCPStateName(e.tcpState)
		f.Present.Set(flow.TCPState)
	}
	var d [4]uint64
	for j := range d {
		if e.cur[j] > e.prev[j] {
			d[j] = e.cur[j] - e.prev[j]
		}
	}
	f.Stats = flow.Stats{PacketTotalCount: e.cur[0], OctetTotalCount: e.cur[1], PacketDeltaCount: d[0], OctetDeltaCount: d[1]}
	f.ReverseStats = flow.Stats{PacketTotalCount: e.cur[2], OctetTotalCount: e.cur[3], PacketDeltaCount: d[2], OctetDeltaCount: d[3]}
	// SNAT on this hop: the reply goes to another address than the client's.
	if e.replyDst.IsValid() && e.replyDst != netip.AddrPortFrom(e.key.src, e.key.srcPort) {
		f.ProxySnatIP, f.ProxySnatPort = e.replyDst.Addr(), e.replyDst.Port()
		f.Present.Set(flow.ProxySnatIP)
		f.Present.Set(flow.ProxySnatPort)
	}
	if s.o.Fill != nil {
		s.o.Fill(f, &e.meta)
	}
	e.prev = e.cur
	e.flags &^= fChanged
	s.stats.Exported[reason]++
}
