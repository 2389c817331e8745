package aggregate

import (
	"context"
	"fmt"
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

// TestForgetKeepsInvariants: forgetting every other flow of many leaves
// the index, the timing wheel, the idle list, the interned values and
// the counters as if only the others had been added.
func TestForgetKeepsInvariants(t *testing.T) {
	const n = 200
	recs := func(keep func(i int) bool) []*flow.Flow {
		var out []*flow.Flow
		for i := range n {
			if !keep(i) {
				continue
			}
			f := srcRec(0, 10, counts{pkts: uint64(i + 1)})
			f.SourcePort = uint16(30000 + i)
			f.SourcePodName = fmt.Sprintf("client-%d", i) // interned, one per flow
			out = append(out, f)
		}
		return out
	}
	s := New(Options{ExportOneSided: true})
	for _, f := range recs(func(int) bool { return true }) {
		s.Add(at(10), f, nil)
	}
	got := s.forget(func(_, _ netip.Addr, sport, _ uint16, _ uint8) bool { return sport%2 == 1 })
	if got != n/2 {
		t.Fatalf("forgot %d flows, want %d", got, n/2)
	}
	ref := New(Options{ExportOneSided: true})
	for _, f := range recs(func(i int) bool { return i%2 == 0 }) {
		ref.Add(at(10), f, nil)
	}
	check := func(s *Store) (idle, wheel, strs int) {
		for i := s.lHead; i != nilIdx; i = s.slab.at(i).lNext {
			e := s.slab.at(i)
			if j, _, ok := s.lookup(s.seed.hash(&e.key), &e.key); !ok || j != i {
				t.Errorf("flow %d on the idle list is not in the index", i)
			}
			idle++
		}
		for _, head := range s.wheel {
			for i := head; i != nilIdx; i = s.slab.at(i).wNext {
				wheel++
			}
		}
		for _, r := range s.strs.refs {
			if r.n > 0 {
				strs++
			}
		}
		return
	}
	i1, w1, s1 := check(s)
	i2, w2, s2 := check(ref)
	if s.Len() != n/2 || s.Stats().Flows != n/2 || i1 != n/2 || w1 != n/2 {
		t.Errorf("after Forget: %d flows, Stats %d, idle list %d, wheel %d; want %d each", s.Len(), s.Stats().Flows, i1, w1, n/2)
	}
	if i1 != i2 || w1 != w2 || s1 != s2 {
		t.Errorf("after Forget: idle %d wheel %d interned %d; only the kept flows added: %d %d %d", i1, w1, s1, i2, w2, s2)
	}
	// The rest expires as usual, and nothing is left interned.
	var exported int
	for sec := 11; sec < 600; sec++ {
		s.Tick(at(sec), func(*flow.Flow) { exported++ })
	}
	if exported != n/2 {
		t.Errorf("%d flows exported one-sided, want %d", exported, n/2)
	}
	if s.Len() != 0 {
		t.Errorf("%d flows left after their timeouts", s.Len())
	}
	if _, _, strs := check(s); strs != 0 {
		t.Errorf("%d values still interned with no flow", strs)
	}
}
