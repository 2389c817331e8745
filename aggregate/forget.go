package aggregate

import (
	"context"
	"fmt"
	"net/netip"
)

// KeyMatch selects flows by their correlation key: the 5-tuple, with the
// proxy's SNAT address and port as the source for the ingress-Node half
// of an inter-Node from-external flow.
type KeyMatch func(src, dst netip.Addr, sport, dport uint16, proto uint8) bool

// forget drops the flows match selects, without exporting them, and
// returns how many. Call it from the Store's goroutine.
func (s *Store) forget(match KeyMatch) int {
	n := 0
	for i := s.lTail; i != nilIdx; {
		e := s.slab.at(i)
		prev := e.lPrev
		if match(e.key.srcAddr(), e.key.dstAddr(), e.key.sport(), e.key.dport(), e.key.proto()) {
			s.remove(i, e)
			n++
		}
		i = prev
	}
	return n
}

// Forget drops, in the goroutine of Run, the flows match selects without
// exporting them: the Kafka input hands a partition's flows over to the
// replica that owns it next, which rebuilds them from the partition. It
// fails when ctx ends first (Run not running).
func (s *Store) Forget(ctx context.Context, match KeyMatch) (int, error) {
	r := &queryReq{forget: match, done: make(chan struct{})}
	select {
	case s.queries <- r:
	case <-ctx.Done():
		return 0, fmt.Errorf("aggregate: forget flows: %w", context.Cause(ctx))
	}
	<-r.done
	return r.n, nil
}
