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
// each second, the rest not even decoded. Want is asked of every
// forwarded record, so it only reads a counter once the second's share
// is taken; Run's ticker starts each second (newSecond).
type sampler struct {
	p   *Proxy
	buf *ring.Buffer[*flow.Flow]
	per int64
	n   atomic.Int64 // records wanted in the current second
	mu  sync.Mutex   // the buffer takes one producer at a time
}

// Sample implements mode.Encoded.
func (fw *Forwarding) Sample(buf *ring.Buffer[*flow.Flow], perSecond int) flow.Sampler {
	fw.sample = &sampler{p: fw.p, buf: buf, per: int64(perSecond)}
	return fw.sample
}

func (s *sampler) Want() bool {
	return s.n.Load() < s.per && s.n.Add(1) <= s.per
}

// newSecond gives the sample its next second's share.
func (s *sampler) newSecond() { s.n.Store(0) }

// run starts a second every second until stop closes.
func (s *sampler) run(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.newSecond()
		}
	}
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
