package queue

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"sluice/exporter/record"
	"sluice/flow"
)

func recs(ports ...uint16) []flow.Flow {
	out := make([]flow.Flow, len(ports))
	for i, p := range ports {
		out[i].SourcePort = p
	}
	return out
}

func ports(fs []flow.Flow) []uint16 {
	var out []uint16
	for _, f := range fs {
		out = append(out, f.SourcePort)
	}
	return out
}

func eq(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPeekAckAndRedelivery(t *testing.T) {
	q := New(4)
	q.Push(recs(1, 2, 3))
	first, got := q.PeekFlows(0, nil, 2)
	if first != 0 || !eq(ports(got), []uint16{1, 2}) {
		t.Fatalf("peek: %d %v", first, ports(got))
	}
	q.Ack(1)
	// A transport that lost its connection starts again from Head: the
	// unacknowledged records come back.
	first, got = q.PeekFlows(q.Head(), nil, 10)
	if first != 1 || !eq(ports(got), []uint16{2, 3}) || q.Len() != 2 {
		t.Fatalf("after ack: %d %v len %d", first, ports(got), q.Len())
	}
	q.Ack(100) // past the end: everything held, nothing more
	if q.Len() != 0 || q.Head() != 3 {
		t.Fatalf("len %d head %d", q.Len(), q.Head())
	}
}

func TestFullDropsOldestAndCounts(t *testing.T) {
	q := New(3)
	if d := q.Push(recs(1, 2)); d != 0 {
		t.Fatal(d)
	}
	if d := q.Push(recs(3, 4)); d != 1 {
		t.Fatalf("dropped %d, want 1", d)
	}
	if d := q.Push(recs(5, 6, 7, 8, 9)); d != 5 {
		t.Fatalf("dropped %d, want 5 (3 held + 2 that never fit)", d)
	}
	_, got := q.PeekFlows(0, nil, 10)
	if !eq(ports(got), []uint16{7, 8, 9}) || q.Dropped() != 6 {
		t.Fatalf("held %v, dropped %d", ports(got), q.Dropped())
	}
	// A reader behind the head skips what was dropped.
	first, _ := q.PeekFlows(2, nil, 1)
	if first != q.Head() || first != 4 {
		t.Fatalf("first %d, want the oldest held, 4", first)
	}
}

func TestWait(t *testing.T) {
	// In a bubble, synctest.Wait returns once the waiting goroutine is
	// blocked inside Wait: the push then tests the wake-up, not a Wait
	// that had not started yet.
	synctest.Test(t, func(t *testing.T) {
		q := New(2)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if q.Wait(ctx, 0) {
			t.Fatal("Wait on an empty queue returned true")
		}
		done := make(chan bool)
		go func() { done <- q.Wait(context.Background(), 0) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Wait returned with nothing pushed")
		default:
		}
		q.Push(recs(1))
		if !<-done {
			t.Fatal("Wait missed a push")
		}
		if !q.Wait(context.Background(), 0) {
			t.Fatal("Wait with a record held")
		}
	})
}

// TestRecordsAcrossTheRingsEnd pushes and peeks compact records in runs
// that wrap around the ring, and checks Full records and flows agree.
func TestRecordsAcrossTheRingsEnd(t *testing.T) {
	q := New(5)
	run := func(from, n int) []record.Record {
		out := make([]record.Record, n)
		for i := range out {
			out[i].SrcPort = uint16(from + i)
		}
		return out
	}
	q.PushRecords(run(1, 3))
	q.Ack(2) // head at sequence 2, port 3 held
	if d := q.PushRecords(run(4, 5)); d != 1 {
		t.Fatalf("dropped %d, want 1 (6 records for 5 places)", d)
	}
	first, got := q.Peek(0, nil, 10)
	var ports []uint16
	for _, r := range got {
		ports = append(ports, r.SrcPort)
	}
	if first != 3 || !eq(ports, []uint16{4, 5, 6, 7, 8}) {
		t.Fatalf("peek from %d: %v", first, ports)
	}
	if first, got = q.Peek(first+1, got[:0], 2); first != 4 || len(got) != 2 || got[0].SrcPort != 5 || got[1].SrcPort != 6 {
		t.Fatalf("peek of 2 from %d: %+v", first, got)
	}
	q.Push(recs(9))
	_, fl := q.PeekFlows(q.Head(), nil, 10)
	if p := ports2(fl); !eq(p, []uint16{5, 6, 7, 8, 9}) {
		t.Fatalf("the records as flows: %v", p)
	}
}

func ports2(fs []flow.Flow) []uint16 { return ports(fs) }

// TestReserveCommit writes records straight into the ring: a reservation
// stops at the ring's end and at the free room, only what is committed
// is held, and a consumer peeking and acknowledging at the same time
// sees every committed record once, in order (run with -race).
func TestReserveCommit(t *testing.T) {
	q := New(5)
	q.PushRecords(make([]record.Record, 3))
	q.Ack(2) // head at 2: one held, at slot 2
	r := q.Reserve(10)
	if len(r) != 2 { // slots 3 and 4, then the ring's end
		t.Fatalf("reserved %d at the ring's end, want 2", len(r))
	}
	r[0].SrcPort, r[1].SrcPort = 10, 11
	q.Commit(1)
	if q.Len() != 2 {
		t.Fatalf("%d held after committing one of two", q.Len())
	}
	r = q.Reserve(10)
	if len(r) != 1 { // slot 4 was reserved and not committed: given again
		t.Fatalf("reserved %d, want 1 (slot 4, then the ring's end)", len(r))
	}
	r[0].SrcPort = 12
	q.Commit(1)
	r = q.Reserve(10) // slots 0 and 1: free since the Ack
	if len(r) != 2 {
		t.Fatalf("reserved %d after the wrap, want 2", len(r))
	}
	r[0].SrcPort, r[1].SrcPort = 13, 14
	q.Commit(2)
	if r = q.Reserve(1); len(r) != 0 || q.Len() != 5 {
		t.Fatalf("a full queue reserved %d, holds %d", len(r), q.Len())
	}
	_, got := q.Peek(0, nil, 10)
	var ports []uint16
	for _, r := range got[1:] {
		ports = append(ports, r.SrcPort)
	}
	if !eq(ports, []uint16{10, 12, 13, 14}) {
		t.Fatalf("held %v", ports)
	}

	// One producer, one consumer.
	q = New(64)
	const total = 20_000
	done := make(chan []uint16)
	go func() {
		var seen []uint16
		var buf []record.Record
		next := uint64(0)
		for len(seen) < total {
			if !q.Wait(context.Background(), next) {
				return
			}
			var first uint64
			first, buf = q.Peek(next, buf[:0], 16)
			for _, r := range buf {
				seen = append(seen, r.SrcPort)
			}
			next = first + uint64(len(buf))
			q.Ack(next)
		}
		done <- seen
	}()
	for n := 0; n < total; {
		r := q.Reserve(min(7, total-n))
		for i := range r {
			r[i] = record.Record{SrcPort: uint16(n + i)}
		}
		q.Commit(len(r))
		n += len(r)
	}
	seen := <-done
	for i, p := range seen {
		if p != uint16(i) {
			t.Fatalf("record %d is %d", i, p)
		}
	}
}
