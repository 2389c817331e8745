package main

import (
	"context"
	"net"
	"os"
	"testing"

	"sluice/internal/testkit"
)

// The receiver counts each connection's side once, whichever agent sent
// it and however often: the race's "lost" rests on it.
func TestReceiverCountsSidesOnce(t *testing.T) {
	const n = 1000
	r, err := newReceiver(n, 2*n*99/100)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	ctx := context.Background()
	var closers []func()
	for a := range agents {
		c, err := sendIPFIX(ctx, r.addr(), a, n)
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, c)
	}
	testkit.WaitFor(t, "every side at the receiver", func() bool { d, _, _, _ := r.counts(); return d == 2*n })
	// One agent again: duplicates, not new records.
	c, err := sendIPFIX(ctx, r.addr(), 0, n)
	if err != nil {
		t.Fatal(err)
	}
	closers = append(closers, c)
	testkit.WaitFor(t, "the duplicates", func() bool { _, recs, _, _ := r.counts(); return recs == 2*n+n/2 })
	d, _, last, mark := r.counts()
	if d != 2*n || last.IsZero() || mark.IsZero() || mark.After(last) {
		t.Fatalf("distinct %d (want %d), last %v, mark %v", d, 2*n, last, mark)
	}
	for _, c := range closers {
		c()
	}
	if errs := r.close(); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// A cancelled run closes the agents' connections, so that a sender
// blocked on an aggregator that stopped reading returns.
func TestSendIPFIXGivesUpWhenCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			<-t.Context().Done() // accepts, never reads
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := sendIPFIX(ctx, ln.Addr().String(), 0, 200000); done <- err }()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled send into a peer that never reads succeeded")
	}
}

func TestProcFigures(t *testing.T) {
	pid := os.Getpid()
	if _, err := cpuSeconds(pid); err != nil {
		t.Fatal(err)
	}
	hwm, rss, err := memKB(pid)
	if err != nil || hwm <= 0 || rss <= 0 || rss > hwm {
		t.Fatalf("VmHWM %d kB, VmRSS %d kB, %v", hwm, rss, err)
	}
	if _, err := cpuSeconds(1 << 30); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
	if _, err := parseInts("100k,1M,3"); err != nil {
		t.Fatal(err)
	}
	if _, err := parseInts("1x"); err == nil {
		t.Fatal("no error for 1x")
	}
}
