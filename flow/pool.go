package flow

import "sync"

// A Pool recycles records a mode has finished with, so that the collectors
// decode into memory that is still in the cache instead of fresh
// allocations, which the garbage collector then has to find and free. Only
// a mode that copies what it needs out of each record (Aggregate) gives
// records back, with Batch.Release; the others hand the records themselves
// to the sinks, which keep them.
//
// (A mutex-guarded stack that outlives garbage collections was tried: with
// every IPFIX session taking records one at a time it cost Aggregate mode
// over IPFIX about a fifth more CPU per record, and gained gRPC nothing.)
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

// Take appends to dst up to n zeroed records given back earlier, fewer
// when the pool runs out.
func (p *Pool) Take(dst []*Flow, n int) []*Flow {
	for range n {
		f := p.Get()
		if f == nil {
			break
		}
		dst = append(dst, f)
	}
	return dst
}

// Put gives f back. Nothing may use f afterwards.
func (p *Pool) Put(f *Flow) {
	*f = Flow{}
	p.p.Put(f)
}

// PutAll gives back every record of fs that is not nil, and sets each
// entry of fs to nil. Nothing may use them afterwards.
func (p *Pool) PutAll(fs []*Flow) {
	for i, f := range fs {
		if f != nil {
			p.Put(f)
			fs[i] = nil
		}
	}
}
