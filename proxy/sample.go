package proxy

import (
	"sync"

	"sluice/flow"
	"sluice/ring"
)

// sampler gives a view of the export (the web UI) a bounded sample of
// the records the fast path forwards as octets: at most a budget's share
// in each second, the rest not even decoded.
type sampler struct {
	*flow.SampleBudget
	p   *Proxy
	buf *ring.Buffer[*flow.Flow]
	mu  sync.Mutex // the buffer takes one producer at a time
}

// Sample implements mode.Encoded.
func (fw *Forwarding) Sample(buf *ring.Buffer[*flow.Flow], perSecond int) flow.Sampler {
	fw.sample = &sampler{SampleBudget: flow.NewSampleBudget(perSecond), p: fw.p, buf: buf}
	return fw.sample
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
