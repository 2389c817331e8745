package queue

import (
	"context"
	"testing"
	"time"

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
	q := New(2)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if q.Wait(ctx, 0) {
		t.Fatal("Wait on an empty queue returned true")
	}
	done := make(chan bool)
	go func() { done <- q.Wait(context.Background(), 0) }()
	time.Sleep(10 * time.Millisecond)
	q.Push(recs(1))
	if !<-done {
		t.Fatal("Wait missed a push")
	}
	if !q.Wait(context.Background(), 0) {
		t.Fatal("Wait with a record held")
	}
}
