package flow_test

import (
	"net/netip"
	"reflect"
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
