package grpcexport_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/certs"
	"sluice/collector"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/grpcexport"
	"sluice/ipfix"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// aggregator runs the gRPC collector on ln until the test ends or stop.
func aggregator(t *testing.T, b *certs.Bundle, ln net.Listener) (<-chan collector.Batch, func()) {
	t.Helper()
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	out := make(chan collector.Batch, 1024)
	srv, err := collector.New(collector.Options{Table: tb, Out: out, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeGRPC(ctx, ln, b.ServerTLS(true)) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return out, stop
}

func collect(t *testing.T, out <-chan collector.Batch, n int) []*flow.Flow {
	t.Helper()
	var got []*flow.Flow
	deadline := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case b := <-out:
			got = append(got, b.Flows...)
		case <-deadline:
			t.Fatalf("got %d records, want %d", len(got), n)
		}
	}
	return got
}

func TestNewChecksOptions(t *testing.T) {
	if _, err := grpcexport.New(grpcexport.Options{Address: "x:1"}); err == nil {
		t.Error("no TLS: accepted")
	}
	if _, err := grpcexport.New(grpcexport.Options{Address: "x:1", TLS: &tls.Config{MinVersion: tls.VersionTLS12}}); err == nil {
		t.Error("TLS without a client certificate: accepted")
	}
}

// TestBuffersWhileDisconnectedThenReconnects: records sent before the
// aggregator listens are kept (the newest, up to the buffer size, the rest
// counted) and delivered when it comes up, and again after it restarts.
func TestBuffersWhileDisconnectedThenReconnects(t *testing.T) {
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens yet

	m := grpcexport.NewMetrics(prometheus.NewRegistry())
	s, err := grpcexport.New(grpcexport.Options{Address: addr, TLS: b.ClientTLS("localhost"), BufferSize: 10,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Log: quiet, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	for i := range 15 {
		s.Send(flowtest.Full(i, false))
	}
	if n := testutil.ToFloat64(m.Dropped.WithLabelValues("buffer-full")); n != 5 {
		t.Errorf("buffer-full drops %v, want 5", n)
	}
	for testutil.ToFloat64(m.Reconnects) < 2 {
		time.Sleep(5 * time.Millisecond)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port taken meanwhile: %v", err)
	}
	out, stop := aggregator(t, b, ln)
	got := collect(t, out, 10)
	for i, f := range got {
		if want := "flow-" + itoa(i+5); f.Origin.ID != want {
			t.Errorf("record %d is %s, want %s (the oldest are dropped)", i, f.Origin.ID, want)
		}
	}
	stop()

	// The aggregator restarts: the sender reconnects.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port taken meanwhile: %v", err)
	}
	out, _ = aggregator(t, b, ln)
	s.Send(flowtest.Full(99, false))
	if got := collect(t, out, 1); got[0].Origin.ID != "flow-99" {
		t.Errorf("after restart: %s", got[0].Origin.ID)
	}
	if n := testutil.ToFloat64(m.Sent); n < 11 {
		t.Errorf("sent %v", n)
	}
}

func TestInvalidRecordsAreCounted(t *testing.T) {
	b, _ := certs.Ensure(t.TempDir(), certs.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := aggregator(t, b, ln)
	m := grpcexport.NewMetrics(nil)
	s, _ := grpcexport.New(grpcexport.Options{Address: ln.Addr().String(), TLS: b.ClientTLS("localhost"), Log: quiet, Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	bad := flowtest.Full(1, false)
	bad.SourcePodLabels = "not json"
	s.Send(bad, flowtest.Full(2, false))
	if got := collect(t, out, 1); got[0].Origin.ID != "flow-2" {
		t.Errorf("got %s", got[0].Origin.ID)
	}
	if n := testutil.ToFloat64(m.Dropped.WithLabelValues("invalid")); n != 1 {
		t.Errorf("invalid drops %v", n)
	}
}

// TestDrainOnStop: what is buffered when Run's context ends is sent.
func TestDrainOnStop(t *testing.T) {
	b, _ := certs.Ensure(t.TempDir(), certs.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := aggregator(t, b, ln)
	s, _ := grpcexport.New(grpcexport.Options{Address: ln.Addr().String(), TLS: b.ClientTLS("localhost"), Log: quiet, BatchSize: 3})
	s.Send(flowtest.Full(0, false)) // before Run: sent once connected
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	collect(t, out, 1)
	for i := range 20 {
		s.Send(flowtest.Full(i, false))
	}
	cancel()
	<-done
	collect(t, out, 20)
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
