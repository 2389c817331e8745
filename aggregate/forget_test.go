package aggregate

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/ring"
)

// TestForget: flows a Forget selects are dropped unexported; the others
// are exported as usual.
func TestForget(t *testing.T) {
	s := New(Options{Clock: func() time.Time { return at(10) }, ExportOneSided: true})
	in := make(chan flow.Batch, 1)
	out := ring.New[*flow.Flow](64)
	c := out.Consumer()
	done := make(chan struct{})
	go func() { s.Run(context.Background(), in, out, time.Hour); close(done) }()
	keep, drop := srcRec(0, 10, counts{pkts: 1}), srcRec(0, 10, counts{pkts: 2})
	drop.SourcePort = keep.SourcePort + 1
	in <- flow.Batch{Flows: []*flow.Flow{keep, drop}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	var err error
	for n == 0 && err == nil { // Forget may come before Run took the batch
		n, err = s.Forget(ctx, func(src, dst netip.Addr, sport, dport uint16, proto uint8) bool {
			return sport == drop.SourcePort
		})
	}
	if err != nil || n != 1 {
		t.Fatalf("forgot %d flows (%v), want 1", n, err)
	}
	close(in)
	<-done
	got, _ := c.Next(ctx, nil, 10)
	if len(got) != 1 || got[0].SourcePort != keep.SourcePort {
		t.Fatalf("exported %d records (%+v), want only the flow kept", len(got), got)
	}
	if st := s.Stats(); st.Flows != 0 {
		t.Errorf("%d flows left", st.Flows)
	}
}
