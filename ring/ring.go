// Package ring is a bounded single-producer, multi-consumer broadcast
// buffer. By default the producer never blocks: when a consumer falls a
// whole buffer behind, the oldest items are overwritten and that consumer
// learns how many it lost. With BackPressure the producer instead waits
// for a consumer that is behind while it keeps reading (a slow but live
// sink slows the pipeline down rather than losing records), and laps only
// a consumer that has stopped reading for the stall timeout, or says it
// is Stalled, or is best-effort: one dead sink still neither stalls the
// pipeline nor the other sinks for longer than that.
package ring

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Buffer holds the last Cap items produced.
type Buffer[T any] struct {
	mu     sync.Mutex
	wake   *sync.Cond
	items  []T
	mask   uint64
	head   uint64 // sequence number of the next item to produce
	closed bool
	done   chan struct{} // closed by Close
	// consumers are the open consumers; room wakes a ProduceWait when
	// one of them reads or closes.
	consumers map[*Consumer[T]]struct{}
	room      *sync.Cond
	waiting   int
	// flushing makes Produce wait for room as ProduceWait does (see
	// Flushing).
	flushing bool
	// written wakes WaitWritten when a consumer commits, reads or
	// closes; wanted is the furthest position a WaitWritten waits for
	// (0 when none waits), so that consumers know to commit soon.
	written *sync.Cond
	wanted  uint64
	writers int
	// stall is the back-pressure stall timeout (0: Produce never waits,
	// see BackPressure); waited is how long producers waited in all.
	stall  time.Duration
	waited time.Duration
	// onStall is told of each consumer back-pressure stops waiting for
	// after the stall timeout (see OnStall); stalls are those to tell of.
	onStall func(*Consumer[T])
	stalls  []*Consumer[T]
	// recycle, when set (see Recycle), takes each overwritten item no
	// reader holds; readers are every open consumer and observer, whose
	// holds it checks; pins are ranges of positions that closed readers
	// left held, never recycled.
	recycle func(T)
	readers []*Consumer[T]
	pins    []span
}

// span is the positions [from, to).
type span struct{ from, to uint64 }

// maxPins bounds the pins kept apart; past it they merge into one (which
// holds back more items from recycling, never fewer).
const maxPins = 8

// New returns a buffer of at least capacity items (rounded up to a power
// of two).
func New[T any](capacity int) *Buffer[T] {
	n := 1
	for n < capacity {
		n <<= 1
	}
	b := &Buffer[T]{items: make([]T, n), done: make(chan struct{}), mask: uint64(n - 1), consumers: map[*Consumer[T]]struct{}{}}
	b.wake = sync.NewCond(&b.mu)
	b.room = sync.NewCond(&b.mu)
	b.written = sync.NewCond(&b.mu)
	return b
}

// Cap is the number of items the buffer retains.
func (b *Buffer[T]) Cap() int { return len(b.items) }

// Produce appends items. When a consumer has not read the oldest item
// yet, it overwrites it (the consumer counts it as lost), unless the
// buffer is flushing (see Flushing: it then waits as ProduceWait does)
// or applies back-pressure (see BackPressure: it then waits for that
// consumer while it makes progress).
func (b *Buffer[T]) Produce(items ...T) {
	b.Hand(context.Background(), false, items...)
}

// BackPressure makes Produce wait, before overwriting an item a consumer
// has not read, for that consumer to read, as long as it keeps making
// progress: a consumer that has not read anything for stall while it was
// a whole buffer behind is lapped (it counts what it lost), and so is one
// marked Stalled or BestEffort, and an Observer is never waited for.
// stall 0 turns back-pressure off (the default: the producer never
// waits). Set it before producing.
func (b *Buffer[T]) BackPressure(stall time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stall = stall
}

// OnStall has f called, by a producer and without the buffer's lock, for
// each consumer that back-pressure stops waiting for because it read
// nothing for the stall timeout (once until it reads again): the caller
// logs it. Set it before producing.
func (b *Buffer[T]) OnStall(f func(*Consumer[T])) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onStall = f
}

// Waited is how long producers have waited for consumers so far (for
// back-pressure or a flush).
func (b *Buffer[T]) Waited() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waited
}

// Waiting is the number of producers waiting for consumers now.
func (b *Buffer[T]) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// Flushing makes every later Produce a ProduceWait that waits until each
// open consumer has room: at the end of a run, what is still on its way
// must reach the sinks rather than lap them. A consumer that stops
// reading must then be closed for producers to go on; what it leaves
// unread is its Unread.
func (b *Buffer[T]) Flushing() {
	b.mu.Lock()
	b.flushing = true
	b.mu.Unlock()
}

// ProduceWait is Produce, except that before each item it waits until
// every open consumer (but the best-effort ones) has read far enough for
// the item to overwrite nothing unread, or until ctx ends (then it
// overwrites, as Produce). It is for the end of a run, when a flush of
// many records must reach the sinks rather than lap them; a consumer
// that stops reading must be closed for it to go on.
func (b *Buffer[T]) ProduceWait(ctx context.Context, items ...T) {
	b.Hand(ctx, true, items...)
}

// Hand is Produce, or ProduceWait when wait is set: a final flush, which
// waits for its readers rather than overwrite what they have not read.
// Under back-pressure, ctx ending stops Produce's wait too (it then
// overwrites).
func (b *Buffer[T]) Hand(ctx context.Context, wait bool, items ...T) {
	b.mu.Lock()
	wait = wait || b.flushing
	if !wait && b.stall == 0 {
		for _, it := range items {
			b.put(it)
		}
		b.mu.Unlock()
		b.wake.Broadcast()
		return
	}
	b.mu.Unlock()
	b.produceWait(ctx, wait, items)
}

// produceWait produces items one by one, each once no consumer it must
// wait for (see mustWait) would lose an item, or once ctx ends.
func (b *Buffer[T]) produceWait(ctx context.Context, flush bool, items []T) {
	// ctx's end wakes the wait; watched from the first wait on, so that
	// a Produce that finds room costs no more than without back-pressure.
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	b.mu.Lock()
	var since time.Time // when this call first waited
	free := 0           // items that surely overwrite nothing a consumer waited for has not read
	for _, it := range items {
		if free == 0 {
			free = b.free()
		}
		for free == 0 && ctx.Err() == nil {
			now := time.Now()
			wait, until := b.mustWait(flush, now)
			if !wait {
				break
			}
			if since.IsZero() {
				since = now
				if ctx.Done() != nil {
					stop = context.AfterFunc(ctx, func() {
						b.mu.Lock()
						defer b.mu.Unlock()
						b.room.Broadcast()
					})
				}
			}
			b.waiting++
			var t *time.Timer
			if !until.IsZero() {
				// Wake at the stall deadline: a consumer that stopped
				// reading sends no signal.
				t = time.AfterFunc(until.Sub(now), func() {
					b.mu.Lock()
					defer b.mu.Unlock()
					b.room.Broadcast()
				})
			}
			b.wake.Broadcast() // let consumers see what is there before sleeping
			b.room.Wait()
			if t != nil {
				t.Stop()
			}
			b.waiting--
			free = b.free()
		}
		if free > 0 {
			free--
		}
		b.put(it)
	}
	if !since.IsZero() {
		b.waited += time.Since(since)
	}
	stalls, onStall := b.stalls, b.onStall
	b.stalls = nil
	b.mu.Unlock()
	b.wake.Broadcast()
	for _, c := range stalls {
		onStall(c)
	}
}

// put stores it at head, handing the item it overwrites to recycle when
// no reader holds it. Called with mu held.
func (b *Buffer[T]) put(it T) {
	i := b.head & b.mask
	if b.recycle != nil && b.head >= uint64(len(b.items)) {
		if old := b.head - uint64(len(b.items)); !b.held(old) {
			b.recycle(b.items[i])
		}
	}
	b.items[i] = it
	b.head++
}

// held reports whether a reader may still use the item at position p:
// one read it and has not released it (see Release), or one that closed
// left it so. Called with mu held.
func (b *Buffer[T]) held(p uint64) bool {
	for _, c := range b.readers {
		if c.released <= p && p < c.next {
			return true
		}
	}
	for _, s := range b.pins {
		if s.from <= p && p < s.to {
			return true
		}
	}
	return false
}

// Recycle has put called for each item the buffer overwrites once no
// reader holds it any more (see Release), so that the producer can reuse
// it (pool records rather than allocate one per item). An item a reader
// still holds when it is overwritten (a lapped observer, a reader that
// never releases) is not recycled: it is left to the garbage collector.
// put runs on the producer's goroutine, inside Produce (or ProduceWait,
// Hand), with the buffer's lock held: it must be quick and must not call
// the buffer. Set it before producing.
func (b *Buffer[T]) Recycle(put func(T)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recycle = put
}

// free is how many items can be produced before one overwrites an item
// an open consumer (but a best-effort one) has not read. Called with mu
// held.
func (b *Buffer[T]) free() int {
	n := uint64(len(b.items))
	free := n
	for c := range b.consumers {
		if c.bestEffort {
			continue
		}
		if d := b.head - c.done(); d >= n {
			return 0
		} else if n-d < free {
			free = n - d
		}
	}
	return int(free)
}

// mustWait reports whether producing one more item must wait: it would
// overwrite an item an open consumer has not read, and that consumer is
// one to wait for. A flush waits for every consumer but the best-effort
// ones; back-pressure also skips the Stalled ones, and those that have
// not read for the stall timeout while behind (until is the earliest
// time one of those it waits for would reach it). Called with mu held.
func (b *Buffer[T]) mustWait(flush bool, now time.Time) (wait bool, until time.Time) {
	for c := range b.consumers {
		if b.head-c.done() < uint64(len(b.items)) || c.bestEffort {
			continue
		}
		if flush {
			return true, time.Time{}
		}
		if c.stalled {
			continue
		}
		if c.behindSince.IsZero() {
			c.behindSince = now
		}
		d := c.behindSince.Add(b.stall)
		if !now.Before(d) {
			// Stopped reading: lapped.
			if !c.lapped {
				c.lapped = true
				if b.onStall != nil {
					b.stalls = append(b.stalls, c)
				}
			}
			continue
		}
		if !wait || d.Before(until) {
			until = d
		}
		wait = true
	}
	return wait, until
}

// Produced is the number of items produced so far.
func (b *Buffer[T]) Produced() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.head
}

// Close wakes every consumer; they drain what is left and then see the end.
func (b *Buffer[T]) Close() {
	b.mu.Lock()
	if !b.closed {
		close(b.done)
	}
	b.closed = true
	b.mu.Unlock()
	b.wake.Broadcast()
}

// Done is closed when the buffer is closed.
func (b *Buffer[T]) Done() <-chan struct{} { return b.done }

// Consumer reads the buffer at its own pace.
type Consumer[T any] struct {
	b    *Buffer[T]
	next uint64
	// Lost counts items overwritten before this consumer read them.
	Lost uint64
	// committed is the position up to which the consumer has written
	// what it read (see CommitOnWrite); manual says it commits itself,
	// otherwise reading commits. bestEffort consumers are never waited
	// for by WaitWritten.
	committed  uint64
	manual     bool
	bestEffort bool
	// stalled consumers cannot write for now (their destination is
	// down): WaitWritten and back-pressure do not wait for them.
	stalled bool
	// behindSince is when a producer under back-pressure first found
	// this consumer a whole buffer behind since it last read (zero when
	// it read since).
	behindSince time.Time
	// lapped is set when back-pressure stopped waiting for it for the
	// stall timeout, until it reads again.
	lapped bool
	// released is the position before which the consumer holds nothing
	// it read (see Release); it holds [released, next). releases is set
	// once it calls Release.
	released uint64
	releases bool
}

// done is the position up to which a producer may overwrite what the
// consumer read without waiting for it: what it released, when it
// releases (so that, under back-pressure, what it still holds is not
// overwritten and can be recycled later), else what it read. Called with
// mu held.
func (c *Consumer[T]) done() uint64 {
	if c.releases {
		return c.released
	}
	return c.next
}

// Consumer returns a consumer starting at the current head (it sees only
// items produced from now on).
func (b *Buffer[T]) Consumer() *Consumer[T] {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := &Consumer[T]{b: b, next: b.head, committed: b.head, released: b.head}
	b.consumers[c] = struct{}{}
	b.readers = append(b.readers, c)
	return c
}

// CommitOnWrite says that this consumer writes what it reads somewhere
// later than it reads it (a sink that batches into messages), and tells
// the buffer with Commit when it has. Until then WaitWritten waits for it.
// Without it, reading an item is writing it.
func (c *Consumer[T]) CommitOnWrite() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.manual = true
}

// BestEffort says that neither WaitWritten nor a producer (back-pressure,
// flush) may wait for this consumer (a live view that promises no
// delivery): it loses, and counts, what it reads too slowly.
func (c *Consumer[T]) BestEffort() {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	c.bestEffort = true
	c.b.written.Broadcast()
	c.b.room.Broadcast()
}

// Stalled says whether the consumer can write for now. While it cannot
// (its destination is down), neither WaitWritten nor back-pressure waits
// for it, so that one dead destination does not hold back the others;
// what it holds is lost, and counted, if the buffer laps it.
func (c *Consumer[T]) Stalled(stalled bool) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.stalled != stalled {
		c.stalled = stalled
		b.written.Broadcast()
		b.room.Broadcast()
	}
}

// Commit says that everything this consumer has read, except the last
// held items, is written (or lost and counted by the consumer).
func (c *Consumer[T]) Commit(held int) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	pos := c.next - min(uint64(held), c.next)
	if pos > c.committed {
		c.committed = pos
		if b.writers > 0 {
			b.written.Broadcast()
		}
	}
}

// CommitWanted reports whether a WaitWritten waits for items this
// consumer has read and not committed: it should write them out now
// rather than on its own clock.
func (c *Consumer[T]) CommitWanted() bool {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	return c.commitWanted()
}

// commitWanted is CommitWanted with mu held.
func (c *Consumer[T]) commitWanted() bool {
	return c.manual && c.b.writers > 0 && c.committed < c.next && c.committed < c.b.wanted
}

// writtenTo is how far the consumer has written: what it committed
// (what it read, unless it commits itself), or, when it was lapped, the
// oldest item the buffer still holds (what it lost is counted as lost
// when it reads again). Called with mu held.
func (c *Consumer[T]) writtenTo() uint64 {
	b := c.b
	w := c.next
	if c.manual {
		w = c.committed
	}
	if n := uint64(len(b.items)); b.head > n && w < b.head-n {
		w = b.head - n
	}
	return w
}

// WaitWritten waits until every open consumer (but the best-effort and
// the stalled ones) has written the items produced before position pos (a value of
// Produced), has lost them, or has closed; or until ctx ends (its error
// is returned). It is how a producer confirms delivery to its own source.
func (b *Buffer[T]) WaitWritten(ctx context.Context, pos uint64) error {
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.written.Broadcast()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writers++
	defer func() {
		if b.writers--; b.writers == 0 {
			b.wanted = 0
		}
	}()
	for {
		behind := false
		for c := range b.consumers {
			if !c.bestEffort && !c.stalled && c.writtenTo() < pos {
				behind = true
				break
			}
		}
		if !behind {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if pos > b.wanted {
			b.wanted = pos
			b.wake.Broadcast() // consumers waiting in Next: commit what they hold
		}
		b.written.Wait()
	}
}

// Observer returns a consumer starting at the oldest item the buffer
// still holds, so that it first reads the retained history. Unlike a
// Consumer, no producer ever waits for it (ProduceWait, back-pressure): an observer (a user's live
// view) must not hold back the pipeline, and it only loses, and counts,
// what it reads too slowly.
func (b *Buffer[T]) Observer() *Consumer[T] {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := &Consumer[T]{b: b}
	if n := uint64(len(b.items)); b.head > n {
		c.next = b.head - n
	}
	c.released = c.next
	b.readers = append(b.readers, c)
	return c
}

// Close says the consumer will read no more, so that ProduceWait stops
// waiting for it. What it read and did not release stays held for good
// (it may still be in use): it is never recycled.
func (c *Consumer[T]) Close() {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.readers, c); i >= 0 {
		b.readers = slices.Delete(b.readers, i, i+1)
		if c.released < c.next {
			b.pin(span{c.released, c.next})
		}
	}
	delete(b.consumers, c)
	b.room.Broadcast()
	b.written.Broadcast()
}

// pin keeps the items of s from being recycled: dropping the pins whose
// items are all overwritten already, and merging all into one past
// maxPins. Called with mu held.
func (b *Buffer[T]) pin(s span) {
	oldest := uint64(0)
	if n := uint64(len(b.items)); b.head > n {
		oldest = b.head - n
	}
	pins := b.pins[:0]
	for _, p := range b.pins {
		if p.to > oldest {
			pins = append(pins, p)
		}
	}
	if s.to > oldest {
		pins = append(pins, s)
	}
	if len(pins) > maxPins {
		m := pins[0]
		for _, p := range pins[1:] {
			m.from, m.to = min(m.from, p.from), max(m.to, p.to)
		}
		pins = append(pins[:0], m)
	}
	b.pins = pins
}

// Release says that the consumer is done with everything it has read
// except the last held items it read: it keeps no reference to them and
// will not read them again, so that the buffer may recycle them once it
// overwrites them (see Recycle). A consumer that never calls Release holds
// everything it reads, which is then never recycled. Once a consumer
// releases, back-pressure and a flush wait for it to release (not only
// to read) before overwriting: a sink slower than the producer then
// still gets its records recycled rather than each overwritten while it
// holds it. Call it from the
// goroutine that calls Next (held counts back from what Next returned
// last).
func (c *Consumer[T]) Release(held int) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	// What was read before a lap is overwritten already (and was held,
	// so not recycled): only what was read since matters, and that is
	// the last items read.
	c.releases = true
	if pos := c.next - min(uint64(held), c.next); pos > c.released {
		c.released = pos
		c.behindSince, c.lapped = time.Time{}, false // it made progress
		if b.waiting > 0 {
			b.room.Broadcast()
		}
	}
}

// Behind is how far the consumer is behind as a producer waiting for it
// sees it (back-pressure, a flush): the items produced since what it
// released, when it releases, else since what it read. A consumer that
// holds items it read is as far behind as one that has not read them:
// at a whole buffer (Cap), producing waits for it.
func (c *Consumer[T]) Behind() uint64 {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.head - c.done()
}

// Unread is the number of items produced that this consumer has not
// read (nor counted in Lost). Once the consumer is closed and the buffer
// too, it is what the consumer will never see.
func (c *Consumer[T]) Unread() uint64 {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.head - c.next
}

// Next appends up to max available items to dst, blocking until at least
// one is available, the buffer is closed and drained (ok false), or ctx
// ends (ok false). A consumer that commits on write also gets (dst, true)
// with no item when a WaitWritten waits for what it holds (see
// CommitWanted).
func (c *Consumer[T]) Next(ctx context.Context, dst []T, max int) (out []T, ok bool) {
	b := c.b
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.wake.Broadcast()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for c.next == b.head {
		if b.closed || ctx.Err() != nil {
			return dst, false
		}
		if c.commitWanted() {
			return dst, true
		}
		b.wake.Wait()
	}
	if oldest := b.head - uint64(len(b.items)); b.head > uint64(len(b.items)) && c.next < oldest {
		c.Lost += oldest - c.next
		c.next = oldest
	}
	for n := 0; c.next < b.head && n < max; n++ {
		dst = append(dst, b.items[c.next&b.mask])
		c.next++
	}
	c.behindSince, c.lapped = time.Time{}, false // it made progress
	if b.waiting > 0 {
		b.room.Broadcast()
	}
	if b.writers > 0 && !c.manual {
		b.written.Broadcast()
	}
	return dst, true
}
