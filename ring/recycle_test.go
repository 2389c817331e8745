package ring

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// rec is a pooled item: seq is what the producer wrote, poisoned is set
// when the buffer hands it back for reuse.
type rec struct {
	seq      uint64
	poisoned bool
}

// pool is the producer's side of Recycle.
type pool struct {
	free     []*rec
	recycled int
	made     int
}

func (p *pool) get(seq uint64) *rec {
	if n := len(p.free); n > 0 {
		r := p.free[n-1]
		p.free = p.free[:n-1]
		r.seq, r.poisoned = seq, false
		return r
	}
	p.made++
	return &rec{seq: seq}
}

func (p *pool) put(r *rec) {
	r.poisoned, r.seq = true, ^uint64(0)
	p.recycled++
	p.free = append(p.free, r)
}

func TestRecycleOnlyWhatNoReaderHolds(t *testing.T) {
	b := New[*rec](4)
	p := &pool{}
	b.Recycle(p.put)
	c := b.Consumer()
	seq := uint64(0)
	produce := func(n int) {
		for range n {
			b.Produce(p.get(seq))
			seq++
		}
	}
	produce(4)
	got, _ := c.Next(context.Background(), nil, 4)
	c.Release(1) // keeps the last one read (seq 3)
	produce(4)   // overwrites 0..3
	if p.recycled != 3 {
		t.Fatalf("recycled %d, want 3 (seq 3 is held)", p.recycled)
	}
	if got[3].poisoned || got[3].seq != 3 {
		t.Fatalf("held item reused: %+v", got[3])
	}
	// A consumer that never releases holds all it reads.
	nr := b.Consumer()
	c.Release(0)
	got, _ = c.Next(context.Background(), got[:0], 4)
	c.Release(0)
	if nr.Unread() != 0 {
		t.Fatal("new consumer has items produced before it")
	}
	produce(2)
	got2, _ := nr.Next(context.Background(), nil, 4)
	before := p.recycled
	produce(6) // overwrites seq 6..11: 8, 9 held by nr (never released)
	_, _ = c.Next(context.Background(), got[:0], 8)
	c.Release(0)
	if p.recycled-before != 4 {
		t.Fatalf("recycled %d, want 4 (two held by a consumer that never released)", p.recycled-before)
	}
	for _, r := range got2 {
		if r.poisoned {
			t.Fatalf("item of a non-releasing consumer reused: %+v", r)
		}
	}
	// Closing leaves what was read and not released held for good.
	nr.Close()
	produce(8)
	for _, r := range got2 {
		if r.poisoned {
			t.Fatalf("item a closed consumer held reused: %+v", r)
		}
	}
}

func TestRecycleLappedObserverKeepsItsItems(t *testing.T) {
	b := New[*rec](4)
	p := &pool{}
	b.Recycle(p.put)
	b.BackPressure(time.Hour)
	o := b.Observer()
	c := b.Consumer()
	c.BestEffort() // never waited for either: the producer laps both
	seq := uint64(0)
	for range 4 {
		b.Produce(p.get(seq))
		seq++
	}
	held, _ := o.Next(context.Background(), nil, 4) // holds 0..3 and is lapped below
	cHeld, _ := c.Next(context.Background(), nil, 2)
	c.Release(2)
	for range 12 {
		b.Produce(p.get(seq))
		seq++
	}
	for i, r := range held {
		if r.poisoned || r.seq != uint64(i) {
			t.Fatalf("lapped observer's item %d reused: %+v", i, r)
		}
	}
	for i, r := range cHeld {
		if r.poisoned || r.seq != uint64(i) {
			t.Fatalf("best-effort consumer's held item %d reused: %+v", i, r)
		}
	}
	// Items 4..11, which nobody read, were recycled (as were 2 and 3 for
	// c, which released them... but o held them).
	if p.recycled != 8 {
		t.Fatalf("recycled %d, want 8", p.recycled)
	}
	// After the lap the observer reads on; what it releases is
	// recycled again.
	got, _ := o.Next(context.Background(), nil, 4)
	if o.Lost != 8 || len(got) != 4 || got[0].seq != 12 {
		t.Fatalf("observer after lap: lost %d, %d items", o.Lost, len(got))
	}
	o.Release(0)
	_, _ = c.Next(context.Background(), nil, 4)
	c.Release(0)
	before := p.recycled
	for range 4 {
		b.Produce(p.get(seq))
		seq++
	}
	if p.recycled-before != 4 {
		t.Fatalf("recycled %d after both released, want 4", p.recycled-before)
	}
}

// TestRecycleNeverReusesHeld runs readers of every kind, each holding a
// random number of items across reads, against a producer that reuses
// what the buffer recycles (and poisons it when recycled): a reader
// never sees poison nor a rewritten item while it holds it, and -race
// sees no write to an item a reader reads.
func TestRecycleNeverReusesHeld(t *testing.T) {
	for _, bp := range []bool{false, true} {
		b := New[*rec](64)
		p := &pool{}
		b.Recycle(p.put)
		if bp {
			b.BackPressure(20 * time.Millisecond)
		}
		const total = 200000
		var wg sync.WaitGroup
		reader := func(c *Consumer[*rec], seed uint64, slow bool, closeEarly bool) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 1))
			var held []*rec
			var seqs []uint64
			var buf []*rec
			check := func() {
				for i, x := range held {
					if x.poisoned || x.seq != seqs[i] {
						t.Errorf("held item reused: want seq %d, have %+v", seqs[i], *x)
						return
					}
				}
			}
			for n := 0; ; n++ {
				var ok bool
				buf, ok = c.Next(context.Background(), buf[:0], 1+r.IntN(40))
				if !ok {
					break
				}
				for _, x := range buf {
					if x.poisoned {
						t.Errorf("read a recycled item")
						return
					}
					held, seqs = append(held, x), append(seqs, x.seq)
				}
				if slow && n%16 == 0 {
					time.Sleep(time.Millisecond) // be lapped (load, not synchronisation)
				}
				check()
				keep := r.IntN(len(held) + 1)
				if r.IntN(4) == 0 {
					keep = len(held) // hold everything for a while
				}
				held, seqs = held[len(held)-keep:], seqs[len(seqs)-keep:]
				c.Release(keep)
				if closeEarly && n == 200 {
					c.Close()
					time.Sleep(5 * time.Millisecond)
					check() // still held after Close
					return
				}
			}
			check()
			c.Release(0)
			c.Close()
		}
		for i := range 3 {
			wg.Add(1)
			go reader(b.Consumer(), uint64(i), false, false)
		}
		wg.Add(2)
		go reader(b.Observer(), 10, true, false)
		be := b.Consumer()
		be.BestEffort()
		go reader(be, 11, true, false)
		wg.Add(1)
		go reader(b.Consumer(), 12, false, true)
		for seq := range uint64(total) {
			b.Produce(p.get(seq))
		}
		b.Close()
		wg.Wait()
		if p.recycled == 0 {
			t.Fatalf("back-pressure %v: nothing recycled", bp)
		}
		t.Logf("back-pressure %v: made %d items for %d produced, recycled %d", bp, p.made, total, p.recycled)
	}
}

func TestRecycleAllocsNothing(t *testing.T) {
	b := New[*rec](256)
	p := &pool{}
	b.Recycle(p.put)
	b.BackPressure(time.Hour)
	c, o := b.Consumer(), b.Observer()
	buf := make([]*rec, 0, 256)
	seq := uint64(0)
	round := func() {
		for range 128 {
			b.Produce(p.get(seq))
			seq++
		}
		for _, r := range []*Consumer[*rec]{c, o} {
			buf, _ = r.Next(context.Background(), buf[:0], 256)
			r.Release(0)
		}
	}
	for range 8 {
		round()
	}
	made := p.made
	// Next's context watch costs an allocation or two per call; none per
	// item.
	if a := testing.AllocsPerRun(100, round); a > 8 {
		t.Fatalf("%v allocations per 128 items", a)
	}
	if p.made != made {
		t.Fatalf("made %d new items in steady state", p.made-made)
	}
}

// TestBehindCountsWhatIsHeld: a consumer that releases is behind by what
// it holds as well as by what it has not read, which is what a flush
// waits for: at Cap behind, producing waits even though it has read
// everything.
func TestBehindCountsWhatIsHeld(t *testing.T) {
	b := New[int](8)
	c := b.Consumer()
	other := b.Consumer() // never releases: behind by what it has not read
	for i := range 8 {
		b.Produce(i)
	}
	got, _ := c.Next(context.Background(), nil, 8)
	if len(got) != 8 {
		t.Fatalf("read %d, want 8", len(got))
	}
	c.Release(4)
	if u, bh := c.Unread(), c.Behind(); u != 0 || bh != 4 {
		t.Fatalf("unread %d, behind %d; want 0 and 4", u, bh)
	}
	if bh := other.Behind(); bh != 8 {
		t.Fatalf("the consumer that never read is behind %d, want 8", bh)
	}
	other.Close()
	b.Flushing()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Produce(8, 9, 10, 11, 12) // the fifth waits: c is then Cap behind
	}()
	waitUntil(t, "the flush to wait", func() bool { return b.Waiting() == 1 })
	if u, bh := c.Unread(), c.Behind(); u != 4 || bh != uint64(b.Cap()) {
		t.Fatalf("while the flush waits: unread %d, behind %d; want 4 and %d", u, bh, b.Cap())
	}
	c.Release(0)
	<-done
}
