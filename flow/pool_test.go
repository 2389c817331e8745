package flow_test

import (
	"net/netip"
	"reflect"
	"runtime/debug"
	"testing"

	"sluice/flow"
)

func TestBatchReleaseGivesRecordsBackZeroed(t *testing.T) {
	p := flow.NewPool()
	recs := []*flow.Flow{{SourcePodName: "a", SourceIP: netip.MustParseAddr("10.0.0.1")}, {DestinationPort: 80}}
	b := flow.Batch{Flows: append([]*flow.Flow(nil), recs...), Pool: p}
	b.Release()
	if b.Flows != nil {
		t.Fatalf("the batch still holds %d records", len(b.Flows))
	}
	for _, f := range recs {
		if !reflect.ValueOf(*f).IsZero() {
			t.Fatalf("a record given back is not zeroed: %+v", f)
		}
	}
	// sync.Pool may drop what it holds at any time (a GC), so a Get that
	// finds nothing is allowed; one that finds something must be ours.
	for range 2 {
		if f := p.Get(); f != nil && f != recs[0] && f != recs[1] {
			t.Fatalf("Get returned a record never given back")
		}
	}
}

func TestBatchReleaseWithoutPoolKeepsRecords(t *testing.T) {
	f := &flow.Flow{SourcePodName: "a"}
	b := flow.Batch{Flows: []*flow.Flow{f}}
	b.Release()
	if f.SourcePodName != "a" || len(b.Flows) != 1 {
		t.Fatalf("a batch without a pool changed its records: %+v, %d", f, len(b.Flows))
	}
}

// TestPoolTakesAcrossChunks: records given back in chunks of several sizes
// come out zeroed, each at most once, in takes that span chunks and split
// them; nil entries are skipped. (A garbage collection may empty the pool,
// so fewer may come out, never others or twice; with the collector off,
// all of them come out, but under the race detector, which makes
// sync.Pool drop some at random.)
func TestPoolTakesAcrossChunks(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	p := flow.NewPool()
	given := map[*flow.Flow]bool{}
	for _, n := range []int{1, 7, 64, 3, 100} {
		fs := make([]*flow.Flow, n+1) // and a nil
		for i := range n {
			fs[i] = &flow.Flow{SourcePort: uint16(i + 1), SourcePodName: "x"}
			given[fs[i]] = true
		}
		p.PutAll(fs)
		for i, f := range fs {
			if f != nil {
				t.Fatalf("entry %d of a chunk given back is not cleared", i)
			}
		}
	}
	one := &flow.Flow{DestinationPort: 9}
	given[one] = true
	p.Put(one)
	want := len(given)
	var got []*flow.Flow
	for {
		before := len(got)
		got = p.Take(got, 30)
		if len(got) == before {
			break
		}
	}
	if f := p.Get(); f != nil {
		got = append(got, f)
	}
	if len(got) > want || !raceOn && len(got) != want {
		t.Fatalf("took %d records, gave back %d", len(got), want)
	}
	seen := map[*flow.Flow]bool{}
	for _, f := range got {
		if seen[f] || !given[f] {
			t.Fatal("a record came out twice, or was never given back")
		}
		seen[f] = true
		if !reflect.ValueOf(*f).IsZero() {
			t.Fatalf("a record came out not zeroed: %+v", f)
		}
	}
}
