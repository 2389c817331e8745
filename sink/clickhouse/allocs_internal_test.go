package clickhouse

import (
	"context"
	"slices"
	"testing"

	"sluice/flow"
	"sluice/internal/testkit/recpool"
)

// TestRowsAllocateNothingPerRecord: in Aggregate mode's steady state
// (records recycled by the buffer once every reader released them), the
// sink's own work per row allocates nothing: Run's read, the copy into a
// queued record of its own (reused once inserted), the take and the
// column-wise block of an insert (the driver's INSERT itself costs its
// allocations per batch of up to BatchRows rows, not per row). No row
// carries a recycled record's poison, even when the sink is lapped.
func TestRowsAllocateNothingPerRecord(t *testing.T) {
	for _, lapped := range []bool{false, true} {
		s, err := New(Options{Addr: "127.0.0.1:1", QueueSize: 1 << 16, BatchRows: 4096})
		if err != nil {
			t.Fatal(err)
		}
		s.blk = newBlock("default", nil)
		capacity, chunk := 8192, 256
		if lapped {
			capacity, chunk = 64, 64
		}
		p := recpool.New(capacity)
		p.Quarantine = lapped
		c := p.Buf.Consumer()
		recs := recpool.Records(2048)
		var batch []*flow.Flow
		poisoned := false
		ctx := context.Background()
		// read is Run's loop body, insert flushOnce's without the driver.
		read := func() {
			batch, _ = c.Next(ctx, batch[:0], 4096)
			s.push(batch)
			clear(batch)
			c.Release(0)
		}
		insert := func() {
			for s.take() > 0 {
				s.blk.reset()
				for _, f := range s.taken {
					s.blk.add(f)
				}
				if slices.Contains(s.blk.strs[2], recpool.Poison) || slices.Contains(s.blk.strs[0], "192.0.2.66") {
					poisoned = true
				}
				s.settle(true)
			}
		}
		round := func() {
			for i := 0; i < len(recs); i += chunk {
				p.Produce(ctx, recs[i:i+chunk])
				if !lapped || i%(4*chunk) == 0 {
					for c.Unread() > 0 {
						read()
					}
				}
			}
			for c.Unread() > 0 {
				read()
			}
			insert()
		}
		per := recpool.Measure(8, len(recs), round)
		t.Logf("lapped %v: %.4f allocations per row; %d records made, %d recycled, %d lost", lapped, per, p.Made, p.Recycled, c.Lost)
		if !lapped && per > recpool.PerRecordBound {
			t.Errorf("%.3f allocations per row, want none", per)
		}
		if poisoned {
			t.Errorf("lapped %v: a recycled record became a row", lapped)
		}
		s.Close()
	}
}
