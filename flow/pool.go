package flow

import "sync"

// A Pool recycles records a mode has finished with, so that the collectors
// decode into memory that is still in the cache instead of fresh
// allocations, which the garbage collector then has to find and free. Only
// a mode that copies what it needs out of each record (Aggregate) gives
// records back, with Batch.Release; the others hand the records themselves
// to the sinks, which keep them.
//
// It is a bounded stack rather than a sync.Pool: a sync.Pool is emptied by
// every garbage collection, and at a few hundred thousand records a second
// the collectors then decode into fresh memory (page faults, zeroing) after
// each one.
type Pool struct {
	mu   sync.Mutex
	free []*Flow
}

// poolMax bounds the records a Pool keeps (976 octets each: 16 MB).
const poolMax = 16384

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{} }

// Get returns a zeroed record given back earlier, or nil when there is
// none (the caller allocates).
func (p *Pool) Get() *Flow {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.free)
	if n == 0 {
		return nil
	}
	f := p.free[n-1]
	p.free[n-1] = nil
	p.free = p.free[:n-1]
	return f
}

// Take appends to dst up to n zeroed records given back earlier (none
// when there are none): a collector takes them a few dozen at a time.
func (p *Pool) Take(dst []*Flow, n int) []*Flow {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := max(len(p.free)-n, 0)
	dst = append(dst, p.free[k:]...)
	clear(p.free[k:])
	p.free = p.free[:k]
	return dst
}

// Put gives f back. Nothing may use f afterwards.
func (p *Pool) Put(f *Flow) {
	*f = Flow{}
	p.mu.Lock()
	if len(p.free) < poolMax {
		p.free = append(p.free, f)
	}
	p.mu.Unlock()
}

// PutAll gives back every record of fs that is not nil, and sets each
// entry of fs to nil. Nothing may use them afterwards.
func (p *Pool) PutAll(fs []*Flow) {
	for _, f := range fs {
		if f != nil {
			*f = Flow{}
		}
	}
	p.mu.Lock()
	for i, f := range fs {
		if f != nil && len(p.free) < poolMax {
			p.free = append(p.free, f)
		}
		fs[i] = nil
	}
	p.mu.Unlock()
}
