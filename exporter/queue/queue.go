// Package queue is the exporter's bounded buffer between the connection
// store and the transport. Records stay in it until the transport
// acknowledges them (once written to the aggregator), so records made while
// the aggregator is unreachable are sent when it comes back, and a message
// lost with a broken connection is sent again on the next one. When full,
// the oldest records are dropped and counted: newer records carry the same
// totals, so the oldest are the cheapest to lose.
package queue

import (
	"context"
	"sync"

	"sluice/exporter/record"
	"sluice/flow"
)

// Queue is a bounded FIFO of records, addressed by sequence numbers that
// grow by one per record stored. Safe for concurrent use by one producer
// and one consumer.
type Queue struct {
	mu      sync.Mutex
	buf     []record.Record
	head    uint64 // sequence number of the oldest record held
	n       int
	dropped uint64
	notify  chan struct{}
	// reserved is the length of the last Reserve's run, until Commit or
	// PushRecords.
	reserved int
	// full counts the records held that keep a whole flow.Flow
	// (Meta.Full):
	// only those need releasing, and a queue of store records (none) is
	// not scanned on every acknowledgement.
	full int
}

// New returns a queue holding at most capacity records (at least 1).
func New(capacity int) *Queue {
	return &Queue{buf: make([]record.Record, max(capacity, 1)), notify: make(chan struct{}, 1)}
}

// Cap is the capacity.
func (q *Queue) Cap() int { return len(q.buf) }

// Push copies whole flow records in (each kept as a record.Record's
// Meta.Full), as PushRecords does.
func (q *Queue) Push(flows []flow.Flow) (dropped int) {
	recs := make([]record.Record, len(flows))
	for i := range flows {
		// One allocation per flow: the Meta and the flow it points to.
		b := &struct {
			m record.Meta
			f flow.Flow
		}{f: flows[i]}
		b.m.Full = &b.f
		recs[i].Meta = &b.m
	}
	return q.PushRecords(recs)
}

// PushRecords copies recs in, dropping the oldest records held if there
// is no room, and returns how many were dropped.
func (q *Queue) PushRecords(recs []record.Record) (dropped int) {
	if len(recs) == 0 {
		return 0
	}
	q.mu.Lock()
	c := len(q.buf)
	if len(recs) > c { // more than fits at all: the newest c are kept
		dropped = len(recs) - c
		recs = recs[dropped:]
	}
	if over := q.n + len(recs) - c; over > 0 {
		q.release(q.head, q.head+uint64(over))
		q.head += uint64(over)
		q.n -= over
		dropped += over
	}
	for i := range recs {
		if m := recs[i].Meta; m != nil && m.Full != nil {
			q.full++
		}
	}
	// In at most two runs of the ring.
	for len(recs) > 0 {
		at := int((q.head + uint64(q.n)) % uint64(c))
		k := copy(q.buf[at:], recs)
		recs = recs[k:]
		q.n += k
	}
	q.dropped += uint64(dropped)
	q.reserved = 0
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return dropped
}

// Reserve returns the free slots of the ring after the newest record
// held, at most n of them, in one run (fewer at the end of the ring; none
// when the queue is full), for the producer to write records into without
// a copy; Commit then stores the first of them. Until then they are not
// held: the consumer does not see them, and only the producer may write
// them. A new Reserve or PushRecords gives up what was not committed.
func (q *Queue) Reserve(n int) []record.Record {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := len(q.buf)
	at := int((q.head + uint64(q.n)) % uint64(c))
	// The consumer's Ack moves the head and the count alike: the slots
	// after the newest stay where they are, and free.
	k := min(n, c-q.n, c-at)
	q.reserved = k
	return q.buf[at : at+k : at+k]
}

// Commit stores the first k records of the last Reserve's slots, as if
// they had been pushed.
func (q *Queue) Commit(k int) {
	if k <= 0 {
		return
	}
	q.mu.Lock()
	if k > q.reserved {
		q.mu.Unlock()
		panic("queue: Commit of more records than reserved")
	}
	c := uint64(len(q.buf))
	at := (q.head + uint64(q.n)) % c
	for i := range uint64(k) {
		if m := q.buf[at+i].Meta; m != nil && m.Full != nil {
			q.full++
		}
	}
	q.n += k
	q.reserved = 0
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Head is the sequence number of the oldest record held (the next one to
// acknowledge).
func (q *Queue) Head() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head
}

// Peek copies up to max records from sequence number from on (or from the
// oldest held, if that is later) into dst and returns the sequence number
// of the first copied and dst. Records stay in the queue.
func (q *Queue) Peek(from uint64, dst []record.Record, max int) (uint64, []record.Record) {
	q.mu.Lock()
	defer q.mu.Unlock()
	from = maxU(from, q.head)
	first := from
	end := q.head + uint64(q.n)
	c := uint64(len(q.buf))
	for from < end && max > 0 {
		at := from % c
		n := min(uint64(max), end-from, c-at)
		dst = append(dst, q.buf[at:at+n]...)
		max -= int(n)
		from += n
	}
	return first, dst
}

// PeekFlows is Peek for transports that send flow.Flows: the records come
// converted.
func (q *Queue) PeekFlows(from uint64, dst []flow.Flow, max int) (uint64, []flow.Flow) {
	q.mu.Lock()
	defer q.mu.Unlock()
	from = maxU(from, q.head)
	first := from
	end := q.head + uint64(q.n)
	c := uint64(len(q.buf))
	for ; from < end && max > 0; from++ {
		dst = append(dst, flow.Flow{})
		q.buf[from%c].Flow(&dst[len(dst)-1])
		max--
	}
	return first, dst
}

// Ack releases every record with a sequence number below upto.
func (q *Queue) Ack(upto uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	end := q.head + uint64(q.n)
	upto = min(upto, end)
	if upto <= q.head {
		return
	}
	q.release(q.head, upto)
	q.n -= int(upto - q.head)
	q.head = upto
}

// release lets the records from..upto go (their pointers, for the
// garbage collector). Records that refer to shared metadata only are
// left as they are: the next Push overwrites them, and clearing them
// would cost as much as writing them.
func (q *Queue) release(from, upto uint64) {
	c := uint64(len(q.buf))
	for s := from; s < upto && q.full > 0; s++ {
		if r := &q.buf[s%c]; r.Meta != nil && r.Meta.Full != nil {
			r.Meta = nil
			q.full--
		}
	}
}

// Len is the number of records held.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Dropped is the number of records dropped so far for lack of room.
func (q *Queue) Dropped() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

// Wait blocks until a record with sequence number from or later is held,
// or ctx ends; it reports whether one is.
func (q *Queue) Wait(ctx context.Context, from uint64) bool {
	for {
		q.mu.Lock()
		ok := q.head+uint64(q.n) > from
		q.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-q.notify:
		}
	}
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
