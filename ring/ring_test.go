package ring

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestBroadcastAndLoss(t *testing.T) {
	b := New[int](4)
	fast, slow := b.Consumer(), b.Consumer()
	b.Produce(1, 2, 3)
	got, ok := fast.Next(context.Background(), nil, 10)
	if !ok || len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Fatalf("fast got %v %v", got, ok)
	}
	b.Produce(4, 5, 6, 7, 8, 9) // slow falls 5 behind a buffer of 4
	got, _ = slow.Next(context.Background(), nil, 10)
	if slow.Lost != 5 || len(got) != 4 || got[0] != 6 || got[3] != 9 {
		t.Fatalf("slow got %v, lost %d", got, slow.Lost)
	}
	got, _ = fast.Next(context.Background(), nil, 2)
	if len(got) != 2 || got[0] != 6 || fast.Lost != 2 {
		t.Fatalf("fast after lapping: %v lost %d", got, fast.Lost)
	}
}

func TestCloseDrainsAndContextStops(t *testing.T) {
	b := New[int](8)
	c := b.Consumer()
	b.Produce(1)
	b.Close()
	if got, ok := c.Next(context.Background(), nil, 10); !ok || len(got) != 1 {
		t.Fatalf("drain: %v %v", got, ok)
	}
	if _, ok := c.Next(context.Background(), nil, 10); ok {
		t.Fatal("closed and drained buffer still yields")
	}
	b2 := New[int](8)
	c2 := b2.Consumer()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, ok := c2.Next(ctx, nil, 1); ok {
		t.Fatal("Next returned without items or cancellation")
	}
}

func TestConcurrent(t *testing.T) {
	b := New[int](1024)
	var wg sync.WaitGroup
	for range 3 {
		c := b.Consumer()
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen, last := 0, -1
			for {
				got, ok := c.Next(context.Background(), nil, 64)
				if !ok {
					break
				}
				for _, v := range got {
					if v <= last {
						t.Errorf("out of order: %d after %d", v, last)
					}
					last = v
				}
				seen += len(got)
			}
			if uint64(seen)+c.Lost != 100000 {
				t.Errorf("seen %d + lost %d != 100000", seen, c.Lost)
			}
		}()
	}
	for i := range 100000 {
		b.Produce(i)
	}
	b.Close()
	wg.Wait()
}

func TestProduceWaitLosesNothing(t *testing.T) {
	b := New[int](8)
	c := b.Consumer()
	const n = 1000
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	done := make(chan struct{})
	go func() { b.ProduceWait(context.Background(), items...); b.Close(); close(done) }()
	var got []int
	for {
		time.Sleep(time.Microsecond) // a slow reader
		out, ok := c.Next(context.Background(), nil, 3)
		if !ok {
			break
		}
		got = append(got, out...)
	}
	<-done
	if c.Lost != 0 || len(got) != n {
		t.Fatalf("read %d, lost %d", len(got), c.Lost)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("item %d is %d", i, v)
		}
	}
}

func TestProduceWaitStopsForClosedConsumersAndContext(t *testing.T) {
	b := New[int](4)
	stuck := b.Consumer()
	done := make(chan struct{})
	go func() { b.ProduceWait(context.Background(), 1, 2, 3, 4, 5, 6); close(done) }()
	select {
	case <-done:
		t.Fatal("ProduceWait lapped a consumer that had not read")
	case <-time.After(50 * time.Millisecond):
	}
	stuck.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ProduceWait still waits for a closed consumer")
	}

	b2 := New[int](4)
	_ = b2.Consumer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	b2.ProduceWait(ctx, 1, 2, 3, 4, 5, 6) // returns once ctx ends
	if b2.Produced() != 6 {
		t.Fatalf("produced %d", b2.Produced())
	}
}

func TestObserverReadsHistoryAndIsNotWaitedFor(t *testing.T) {
	b := New[int](4)
	b.Produce(1, 2)
	o := b.Observer()
	got, ok := o.Next(context.Background(), nil, 10)
	if !ok || len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("history %v %v", got, ok)
	}
	b.Produce(3, 4, 5, 6, 7, 8)
	// A second observer sees only what is retained.
	o2 := b.Observer()
	got, _ = o2.Next(context.Background(), nil, 10)
	if len(got) != 4 || got[0] != 5 {
		t.Errorf("retained %v", got)
	}
	// The first one lapped: it lost 3, 4.
	got, _ = o.Next(context.Background(), nil, 10)
	if o.Lost != 2 || got[0] != 5 {
		t.Errorf("lost %d, got %v", o.Lost, got)
	}
	// ProduceWait does not wait for an observer that stopped reading.
	done := make(chan struct{})
	go func() { b.ProduceWait(context.Background(), 9, 10, 11, 12, 13); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ProduceWait waited for an observer")
	}
	o.Close()
	o2.Close()
}

// After Flushing, Produce waits for a slow consumer instead of lapping
// it; a consumer closed part-way leaves the rest as its Unread.
func TestFlushingWaitsAndCountsUnread(t *testing.T) {
	b := New[int](4)
	slow, quitter := b.Consumer(), b.Consumer()
	b.Flushing()
	done := make(chan struct{})
	go func() {
		for i := range 20 {
			b.Produce(i)
		}
		b.Close()
		close(done)
	}()
	// quitter reads two items, then stops for good.
	var got []int
	for len(got) < 2 {
		var ok bool
		if got, ok = quitter.Next(context.Background(), got, 2-len(got)); !ok {
			t.Fatal("buffer ended early")
		}
	}
	quitter.Close()
	var all []int
	for {
		out, ok := slow.Next(context.Background(), nil, 3)
		if !ok {
			break
		}
		all = append(all, out...)
	}
	<-done
	if slow.Lost != 0 || len(all) != 20 {
		t.Fatalf("slow read %d, lost %d: a flushing buffer lapped it", len(all), slow.Lost)
	}
	if slow.Unread() != 0 {
		t.Fatalf("slow unread %d after draining", slow.Unread())
	}
	if quitter.Unread() != 18 || quitter.Lost != 0 {
		t.Fatalf("quitter unread %d lost %d, want 18 and 0", quitter.Unread(), quitter.Lost)
	}
}

// waitUntil polls cond until it holds or a deadline passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWaitWrittenWaitsForCommits(t *testing.T) {
	b := New[int](16)
	writer, reader, live := b.Consumer(), b.Consumer(), b.Consumer()
	writer.CommitOnWrite()
	live.BestEffort() // never read: must not hold the wait back
	b.Produce(1, 2, 3, 4)
	pos := b.Produced()

	done := make(chan error, 1)
	go func() { done <- b.WaitWritten(context.Background(), pos) }()

	if got, ok := writer.Next(context.Background(), nil, 10); !ok || len(got) != 4 {
		t.Fatalf("writer read %v %v", got, ok)
	}
	waitUntil(t, "the writer to be asked to commit", writer.CommitWanted)
	// The writer holds what it read, and asks for nothing more: Next
	// returns at once, empty, so that it can write out and commit.
	if got, ok := writer.Next(context.Background(), nil, 10); !ok || len(got) != 0 {
		t.Fatalf("writer's Next while a commit is wanted: %v %v", got, ok)
	}
	writer.Commit(1) // one item still held
	if _, ok := reader.Next(context.Background(), nil, 10); !ok {
		t.Fatal("reader read nothing")
	}
	select {
	case err := <-done:
		t.Fatalf("WaitWritten returned (%v) with an item uncommitted", err)
	default:
	}
	if !writer.CommitWanted() {
		t.Fatal("CommitWanted false with an item held")
	}
	writer.Commit(0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the wish to commit to end", func() bool { return !writer.CommitWanted() })
}

func TestWaitWrittenLappedClosedAndContext(t *testing.T) {
	b := New[int](4)
	slow := b.Consumer()
	slow.CommitOnWrite()
	b.Produce(1, 2)
	pos := b.Produced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.WaitWritten(ctx, pos) }()
	waitUntil(t, "the waiter", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.writers == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("WaitWritten returned nil after its context ended")
	}
	// Lapped: the items are gone (and counted when slow reads again).
	b.Produce(3, 4, 5, 6)
	if err := b.WaitWritten(context.Background(), pos); err != nil {
		t.Fatal(err)
	}
	got, _ := slow.Next(context.Background(), nil, 10)
	if slow.Lost != 2 || len(got) != 4 {
		t.Fatalf("lapped consumer: lost %d, got %v", slow.Lost, got)
	}
	// Closed consumers are not waited for.
	b.Produce(7)
	pos = b.Produced()
	go func() { done <- b.WaitWritten(context.Background(), pos) }()
	waitUntil(t, "the waiter", func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.writers == 1 })
	slow.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHand: without wait, Hand laps a reader that is behind (it loses the
// oldest); with wait, it waits for the reader and nothing is lost.
func TestHand(t *testing.T) {
	ctx := context.Background()
	b := New[int](2)
	c := b.Consumer()
	b.Hand(ctx, false, 1, 2, 3)
	got, _ := c.Next(ctx, nil, 10)
	if c.Lost != 1 || len(got) != 2 || got[0] != 2 {
		t.Fatalf("without wait: got %v, lost %d", got, c.Lost)
	}
	done := make(chan struct{})
	go func() { b.Hand(ctx, true, 4, 5, 6, 7); close(done) }()
	var all []int
	for len(all) < 4 {
		out, ok := c.Next(ctx, nil, 1)
		if !ok {
			t.Fatal("the buffer closed")
		}
		all = append(all, out...)
	}
	<-done
	if c.Lost != 1 || all[0] != 4 || all[3] != 7 {
		t.Fatalf("with wait: got %v, lost %d in all", all, c.Lost)
	}
}

// readAll reads c until the buffer is closed and drained, one item at a
// time with a pause after each (a slow but live sink), and returns what
// it read.
func readAll(c *Consumer[int], pause time.Duration) []int {
	var got []int
	for {
		items, ok := c.Next(context.Background(), nil, 1)
		if !ok {
			return got
		}
		got = append(got, items...)
		time.Sleep(pause) // the sink's slowness, not synchronisation
	}
}

// A slow consumer that keeps reading is waited for: it loses nothing;
// best-effort consumers and observers that never read do not hold the
// producer back (they are lapped and count it).
func TestBackPressureWaitsForLiveConsumer(t *testing.T) {
	b := New[int](4)
	b.BackPressure(time.Minute)
	slow := b.Consumer()
	live := b.Consumer()
	live.BestEffort()
	obs := b.Observer()
	const n = 200
	done := make(chan []int)
	go func() { done <- readAll(slow, 100*time.Microsecond) }()
	for i := range n {
		b.Produce(i)
	}
	b.Close()
	got := <-done
	if slow.Lost != 0 || len(got) != n {
		t.Fatalf("slow consumer read %d of %d, lost %d", len(got), n, slow.Lost)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("item %d is %d", i, v)
		}
	}
	if b.Waited() == 0 {
		t.Error("the producer never waited for a consumer 196 items behind")
	}
	for name, c := range map[string]*Consumer[int]{"best-effort": live, "observer": obs} {
		items, _ := c.Next(context.Background(), nil, n)
		if uint64(len(items))+c.Lost != n || c.Lost == 0 {
			t.Errorf("%s: read %d, lost %d, want %d in all and some lost", name, len(items), c.Lost, n)
		}
	}
}

// A consumer that reads nothing for the stall timeout is lapped, once: the
// producer does not wait for it again until it reads, and then does.
func TestBackPressureLapsSilentConsumer(t *testing.T) {
	const stall = 200 * time.Millisecond
	b := New[int](4)
	b.BackPressure(stall)
	var told []*Consumer[int]
	b.OnStall(func(c *Consumer[int]) { told = append(told, c) }) // the producer's goroutine: this one
	dead := b.Consumer()
	start := time.Now()
	for i := range 100 {
		b.Produce(i)
	}
	if d := time.Since(start); d < stall {
		t.Fatalf("lapped a silent consumer after %s, before the stall timeout %s", d, stall)
	}
	waited := b.Waited()
	if waited < stall {
		t.Fatalf("Waited = %s, want at least %s", waited, stall)
	}
	for i := range 100 {
		b.Produce(100 + i)
	}
	if w := b.Waited(); w != waited {
		t.Fatalf("the producer waited %s more for a consumer it had lapped", w-waited)
	}
	if len(told) != 1 || told[0] != dead {
		t.Fatalf("OnStall told of %d consumers, want the silent one once", len(told))
	}
	got, _ := dead.Next(context.Background(), nil, 100)
	if dead.Lost != 196 || len(got) != 4 || got[0] != 196 {
		t.Fatalf("lapped consumer: read %v, lost %d, want 196..199 and 196 lost", got, dead.Lost)
	}
	// It read again: it is waited for again (for the stall timeout, as
	// it reads no more).
	start = time.Now()
	b.Produce(1, 2, 3, 4, 5)
	if d := time.Since(start); d < stall {
		t.Fatalf("a consumer that read again was lapped after %s, before the stall timeout", d)
	}
	if len(told) != 2 {
		t.Fatalf("OnStall told of %d stalls, want 2 (it read in between)", len(told))
	}
}

// A consumer marked Stalled (its destination is down) is not waited for;
// one that is live beside it is, and loses nothing.
func TestBackPressureStalledAndLive(t *testing.T) {
	b := New[int](8)
	b.BackPressure(time.Hour)
	down := b.Consumer()
	down.Stalled(true)
	slow := b.Consumer()
	done := make(chan []int)
	go func() { done <- readAll(slow, 50*time.Microsecond) }()
	const n = 500
	for i := range n {
		b.Produce(i)
	}
	b.Close()
	if got := <-done; len(got) != n || slow.Lost != 0 {
		t.Fatalf("live consumer read %d of %d, lost %d", len(got), n, slow.Lost)
	}
	got, _ := down.Next(context.Background(), nil, n)
	if down.Lost != n-8 || len(got) != 8 {
		t.Fatalf("stalled consumer: read %d, lost %d, want 8 and %d", len(got), down.Lost, n-8)
	}
}

// A producer waiting for a live consumer stops waiting when its context
// ends (Hand), and overwrites as without back-pressure.
func TestBackPressureContextEndsWait(t *testing.T) {
	b := New[int](2)
	b.BackPressure(time.Hour)
	c := b.Consumer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Hand(ctx, false, 1, 2, 3, 4)
	}()
	// The producer is blocked on the third item until c reads or ctx
	// ends; c reads one item, so that the producer is known to be past
	// its first wait.
	if got, _ := c.Next(context.Background(), nil, 1); len(got) != 1 || got[0] != 1 {
		t.Fatalf("read %v", got)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Hand still waits after its context ended")
	}
	if b.Produced() != 4 {
		t.Fatalf("produced %d, want 4", b.Produced())
	}
}

// Without BackPressure, Produce never waits (the "drop" overflow).
func TestNoBackPressureLaps(t *testing.T) {
	b := New[int](4)
	c := b.Consumer()
	for i := range 1000 {
		b.Produce(i)
	}
	if b.Waited() != 0 {
		t.Fatalf("Produce waited %s without back-pressure", b.Waited())
	}
	got, _ := c.Next(context.Background(), nil, 10)
	if c.Lost != 996 || len(got) != 4 {
		t.Fatalf("read %d, lost %d", len(got), c.Lost)
	}
}

// A flush (ProduceWait) does not wait for a best-effort consumer either.
func TestFlushSkipsBestEffort(t *testing.T) {
	b := New[int](4)
	c := b.Consumer()
	c.BestEffort()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.ProduceWait(context.Background(), 1, 2, 3, 4, 5, 6, 7, 8, 9)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ProduceWait waits for a best-effort consumer")
	}
}

// BenchmarkProduce hands batches of 64 items to a buffer one consumer
// drains: without back-pressure (the consumer may be lapped) and with it
// (the producer waits when the consumer is a whole buffer behind).
func BenchmarkProduce(b *testing.B) {
	for _, bp := range []bool{false, true} {
		b.Run(fmt.Sprintf("backpressure=%v", bp), func(b *testing.B) {
			buf := New[int](8192)
			if bp {
				buf.BackPressure(time.Minute)
			}
			c := buf.Consumer()
			done := make(chan struct{})
			go func() {
				defer close(done)
				var dst []int
				for {
					var ok bool
					if dst, ok = c.Next(context.Background(), dst[:0], 512); !ok {
						return
					}
				}
			}()
			items := make([]int, 64)
			b.ResetTimer()
			for range b.N {
				buf.Produce(items...)
			}
			buf.Close()
			<-done
			b.ReportMetric(float64(c.Lost)/float64(b.N*64), "lost/item")
		})
	}
}
