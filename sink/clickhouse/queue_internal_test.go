package clickhouse

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
)

// TestQueueAccounting: every row that leaves the queue without being
// inserted is counted once, whether or not an insert had taken it.
func TestQueueAccounting(t *testing.T) {
	rows := func(from, to int) []*flow.Flow {
		var out []*flow.Flow
		for i := from; i < to; i++ {
			out = append(out, &flow.Flow{SourcePort: uint16(i)})
		}
		return out
	}
	for _, c := range []struct {
		name      string
		ok        bool
		wantDrops int
		wantFront uint16
	}{
		{"insert fails", false, 2000, 2500},
		{"insert succeeds", true, 1500, 2500},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(Options{Addr: "127.0.0.1:1", QueueSize: 1000, BatchRows: 500})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.push(rows(500, 1500))
			if n := s.take(); n != 500 {
				t.Fatalf("took %d", n)
			}
			s.push(rows(1500, 3500)) // evicts the 500 taken, then 1,500 more
			s.settle(c.ok)
			if got := int(testutil.ToFloat64(s.dropped)); got != c.wantDrops {
				t.Errorf("dropped %d, want %d", got, c.wantDrops)
			}
			if s.q.len() != 1000 || s.q.at(0).SourcePort != c.wantFront {
				t.Errorf("queue %d rows from port %d", s.q.len(), s.q.at(0).SourcePort)
			}
		})
	}
}
