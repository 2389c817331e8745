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

	"sluice/flow"
)

// Queue is a bounded FIFO of flow records, addressed by sequence numbers
// that grow by one per record stored. Safe for concurrent use by one
// producer and one consumer.
type Queue struct {
	mu      sync.Mutex
	buf     []flow.Flow
	head    uint64 // sequence number of the oldest record held
	n       int
	dropped uint64
	notify  chan struct{}
}

// New returns a queue holding at most capacity records (at least 1).
func New(capacity int) *Queue {
	return &Queue{buf: make([]flow.Flow, max(capacity, 1)), notify: make(chan struct{}, 1)}
}

// Cap is the capacity.
func (q *Queue) Cap() int { return len(q.buf) }

// Push copies recs in, dropping the oldest records held if there is no
// room, and returns how many were dropped.
func (q *Queue) Push(recs []flow.Flow) (dropped int) {
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
		q.head += uint64(over)
		q.n -= over
		dropped += over
	}
	for i := range recs {
		q.buf[(q.head+uint64(q.n))%uint64(c)] = recs[i]
		q.n++
	}
	q.dropped += uint64(dropped)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return dropped
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
func (q *Queue) Peek(from uint64, dst []flow.Flow, max int) (uint64, []flow.Flow) {
	q.mu.Lock()
	defer q.mu.Unlock()
	from = maxU(from, q.head)
	end := q.head + uint64(q.n)
	c := uint64(len(q.buf))
	for s := from; s < end && max > 0; s++ {
		dst = append(dst, q.buf[s%c])
		max--
	}
	return from, dst
}

// Ack releases every record with a sequence number below upto.
func (q *Queue) Ack(upto uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	end := q.head + uint64(q.n)
	upto = min(upto, end)
	c := uint64(len(q.buf))
	for ; q.head < upto; q.head++ {
		q.buf[q.head%c] = flow.Flow{} // let the strings go
		q.n--
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
