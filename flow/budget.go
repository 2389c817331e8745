package flow

import (
	"sync/atomic"
	"time"
)

// SampleBudget lets at most a number of records a second be sampled for a
// view (the web UI) of a path that otherwise makes no flow records. Want
// is asked per record, so it only reads a counter once the second's share
// is taken; Run starts each second.
type SampleBudget struct {
	per int64
	n   atomic.Int64 // records wanted in the current second
}

// NewSampleBudget returns a budget of perSecond records a second.
func NewSampleBudget(perSecond int) *SampleBudget { return &SampleBudget{per: int64(perSecond)} }

// Want reports whether the current second's share has room for one more;
// safe for concurrent use.
func (b *SampleBudget) Want() bool {
	return b.n.Load() < b.per && b.n.Add(1) <= b.per
}

// NewSecond gives the budget its next second's share.
func (b *SampleBudget) NewSecond() { b.n.Store(0) }

// Run starts a second every second until stop closes.
func (b *SampleBudget) Run(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			b.NewSecond()
		}
	}
}
