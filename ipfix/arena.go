package ipfix

import (
	"sync"
	"sync/atomic"
)

// An Arena holds the octets of a batch of EncodedRecords and is reused
// once every one of them has been sent: writing a forwarded message's
// records into memory still warm in the caches, instead of into a fresh
// allocation per message, is most of the cost of forwarding (first touches
// of new memory are slow on virtual machines).
//
// The records of an Arena must have a single consumer, which calls
// Release for each (or in sums) once it has copied them. Records that are
// never released (dropped on the way) only keep the Arena from being
// reused: it is then collected as garbage.
type Arena struct {
	// Buf is where records are appended; records may alias earlier
	// backing arrays of it.
	Buf []byte
	// Recs is a slice of records to reuse with the arena: its own.
	Recs []EncodedRecord
	left atomic.Int64
	pool *ArenaPool
}

// ArenaPool hands out Arenas; safe for concurrent use.
type ArenaPool struct {
	p sync.Pool
}

// Get returns an empty Arena with room for at least n octets. An arena
// much larger than that is not handed out for it: every record held pins
// its whole arena, so a small message (a UDP datagram) in a large arena
// would make memory grow with the records held rather than their size.
func (p *ArenaPool) Get(n int) *Arena {
	a, _ := p.p.Get().(*Arena)
	if a == nil {
		a = &Arena{pool: p}
	}
	if cap(a.Buf) < n || cap(a.Buf) > 2*n+4096 {
		a.Buf = make([]byte, 0, n)
		a.Recs = nil
	}
	a.Buf, a.Recs = a.Buf[:0], a.Recs[:0]
	return a
}

// Hold says that n records refer to a, and must be released before a is
// reused. With n 0, a goes back to its pool at once.
func (a *Arena) Hold(n int) {
	if n == 0 {
		a.pool.p.Put(a)
		return
	}
	a.left.Store(int64(n))
}

// Add says that n more records refer to a, which is held already (by
// Hold, or by the producer's own share taken with Hold(1) and released
// last): a producer that fills one arena over several batches.
func (a *Arena) Add(n int) {
	a.left.Add(int64(n))
}

// Left is how many records (and producers' shares) still hold a: 0 once
// it went back to its pool; never negative unless a record was released
// twice. For tests and checks.
func (a *Arena) Left() int64 { return a.left.Load() }

// Release says that n of a's records have been consumed (or dropped);
// after the last, a goes back to its pool, and Release reports true.
func (a *Arena) Release(n int) bool {
	if a.left.Add(-int64(n)) == 0 {
		a.pool.p.Put(a)
		return true
	}
	return false
}
