package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"sluice/flow"
	"sluice/ring"
)

// sampler gives a view of the export (the web UI) a bounded sample of
// the records the fast path forwards as octets: at most per records in
// each second, the rest not even decoded.
type sampler struct {
	p      *Proxy
	buf    *ring.Buffer[*flow.Flow]
	per    int64
	window atomic.Int64 // the Unix second being counted
	n      atomic.Int64 // records wanted in it
	mu     sync.Mutex   // the buffer takes one producer at a time
	// now is the clock (Unix seconds); tests set their own.
	now func() int64
}

// Sample implements mode.Encoded.
func (fw *Forwarding) Sample(buf *ring.Buffer[*flow.Flow], perSecond int) flow.Sampler {
	fw.sample = &sampler{p: fw.p, buf: buf, per: int64(perSecond), now: func() int64 { return time.Now().Unix() }}
	return fw.sample
}

func (s *sampler) Want() bool {
	now := s.now()
	if w := s.window.Load(); w != now && s.window.CompareAndSwap(w, now) {
		s.n.Store(0)
	}
	return s.n.Add(1) <= s.per
}

// Put enriches f as the export is, then hands it on.
func (s *sampler) Put(f *flow.Flow) {
	s.p.Process(f)
	s.produce(f)
}

// produce hands on a record enriched already.
func (s *sampler) produce(f *flow.Flow) {
	s.mu.Lock()
	s.buf.Produce(f)
	s.mu.Unlock()
}
