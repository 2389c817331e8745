package flow

import "sync"

// A Pool recycles records a mode has finished with, so that the collectors
// decode into memory that is still in the cache instead of fresh
// allocations, which the garbage collector then has to find and free. Only
// a mode that copies what it needs out of each record (Aggregate) gives
// records back, with Batch.Release; the others hand the records themselves
// to the sinks, which keep them.
//
// Records go in and out in chunks (a batch's records, a collector's next
// few dozen), one sync.Pool operation each rather than one per record:
// per record, that operation was the largest cost of giving records back.
// Like sync.Pool, a Pool may drop what it holds at a garbage collection.
//
// (A mutex-guarded stack that outlives garbage collections was tried: with
// every IPFIX session taking records one at a time it cost Aggregate mode
// over IPFIX about a fifth more CPU per record, and gained gRPC nothing.)
type Pool struct {
	full  sync.Pool // *chunk holding records
	empty sync.Pool // *chunk holding none, to reuse its slice
}

// A chunk is records given back together.
type chunk struct{ fs []*Flow }

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{} }

// Get returns a zeroed record given back earlier, or nil when there is
// none (the caller allocates). Take is cheaper for more than one.
func (p *Pool) Get() *Flow {
	var one [1]*Flow
	if got := p.Take(one[:0], 1); len(got) == 1 {
		return got[0]
	}
	return nil
}

// Take appends to dst up to n zeroed records given back earlier, fewer
// when the pool runs out.
func (p *Pool) Take(dst []*Flow, n int) []*Flow {
	for n > 0 {
		c, _ := p.full.Get().(*chunk)
		if c == nil {
			break
		}
		k := min(n, len(c.fs))
		rest := len(c.fs) - k
		dst = append(dst, c.fs[rest:]...)
		clear(c.fs[rest:])
		c.fs = c.fs[:rest]
		n -= k
		if rest > 0 {
			p.full.Put(c)
		} else {
			p.empty.Put(c)
		}
	}
	return dst
}

// Put gives f back. Nothing may use f afterwards. PutAll is cheaper for
// more than one.
func (p *Pool) Put(f *Flow) {
	one := [1]*Flow{f}
	p.PutAll(one[:])
}

// PutAll gives back every record of fs that is not nil, and sets each
// entry of fs to nil. Nothing may use them afterwards.
func (p *Pool) PutAll(fs []*Flow) {
	var c *chunk
	for i, f := range fs {
		if f == nil {
			continue
		}
		if c == nil {
			if c, _ = p.empty.Get().(*chunk); c == nil {
				c = &chunk{fs: make([]*Flow, 0, len(fs)-i)}
			}
		}
		*f = Flow{}
		c.fs = append(c.fs, f)
		fs[i] = nil
	}
	if c != nil {
		p.full.Put(c)
	}
}
