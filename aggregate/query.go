package aggregate

import (
	"context"
	"fmt"

	"sluice/flow"
)

// Records returns a snapshot of each flow q selects, the most recently
// updated first, and how many flows matched. The snapshots carry what an
// export would (counters since the last export, per-Node views, Pod
// metadata) without exporting anything. Call it from the Store's
// goroutine; Query does so for other goroutines.
func (s *Store) Records(q flow.Query) ([]*flow.Flow, int) {
	var out []*flow.Flow
	take := func(e *entry) {
		if q.Limit <= 0 || len(out) < q.Limit {
			f := s.snapshot(e)
			s.enrich(f, false)
			out = append(out, f)
		}
	}
	if q.Exact() {
		var k key
		k.set(q.SrcIP, q.DstIP, q.SrcPort, q.DstPort, q.Proto)
		if i, _, ok := s.lookup(s.seed.hash(&k), &k); ok {
			take(s.slab.at(i))
			return out, 1
		}
		// A from-external flow is keyed on the proxy's address: look
		// further, by the source the user knows.
	}
	n := 0
	for i := s.lTail; i != nilIdx; {
		e := s.slab.at(i)
		src, sport := e.key.srcAddr(), e.key.sport()
		if e.flags&fSrcIP != 0 {
			m := &s.tups.vals[e.grp[gMisc]]
			src, sport = s.strs.addr(m.s[pSrcIP]), uint16(m.w>>16)
		}
		if q.Matches(src, e.key.dstAddr(), sport, e.key.dport(), e.key.proto()) {
			n++
			take(e)
		}
		i = e.lPrev
	}
	return out, n
}

type queryReq struct {
	q flow.Query
	// forget, when set, makes the request a Forget.
	forget KeyMatch
	flows  []*flow.Flow
	n      int
	done   chan struct{}
}

// Query runs Records in the goroutine of Run, for any goroutine. It fails
// when ctx ends first (Run not running, or busy beyond the caller's
// patience).
func (s *Store) Query(ctx context.Context, q flow.Query) ([]*flow.Flow, int, error) {
	r := &queryReq{q: q, done: make(chan struct{})}
	select {
	case s.queries <- r:
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("aggregate: flow records: %w", context.Cause(ctx))
	}
	<-r.done
	return r.flows, r.n, nil
}

func (s *Store) answer(r *queryReq) {
	if r.forget != nil {
		r.n = s.forget(r.forget)
		close(r.done)
		return
	}
	r.flows, r.n = s.Records(r.q)
	close(r.done)
}
