package flow

import "sync"

// A Pool recycles records a mode has finished with, so that the collectors
// decode into memory that is still in the cache instead of fresh
// allocations, which the garbage collector then has to find and free. Only
// a mode that copies what it needs out of each record (Aggregate) gives
// records back, with Batch.Release; the others hand the records themselves
// to the sinks, which keep them.
type Pool struct {
	p sync.Pool
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{} }

// Get returns a zeroed record given back earlier, or nil when there is
// none (the caller allocates).
func (p *Pool) Get() *Flow {
	f, _ := p.p.Get().(*Flow)
	return f
}

// Put gives f back. Nothing may use f afterwards.
func (p *Pool) Put(f *Flow) {
	*f = Flow{}
	p.p.Put(f)
}
