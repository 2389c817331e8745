package collector_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/collector"
	"sluice/exporter/grpcsend"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

type harness struct {
	srv *collector.Server
	out chan flow.Batch
	m   *collector.Metrics
	wg  sync.WaitGroup
}

func newHarness(t testing.TB, buffer int) *harness {
	return newHarnessWith(t, buffer, collector.Options{})
}

// newHarnessWith is newHarness with more options.
func newHarnessWith(t testing.TB, buffer int, o collector.Options) *harness {
	t.Helper()
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{out: make(chan flow.Batch, buffer), m: collector.NewMetrics(prometheus.NewRegistry())}
	o.Table, o.Out, o.Metrics = tb, h.out, h.m
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h.srv, err = collector.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.wg.Wait)
	return h
}

func (h *harness) tcp(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.wg.Add(1)
	go func() { defer h.wg.Done(); h.srv.ServeTCP(ctx, ln, nil) }()
	return ln.Addr().String()
}

func (h *harness) udp(t *testing.T) string {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.wg.Add(1)
	go func() { defer h.wg.Done(); h.srv.ServeUDP(ctx, c) }()
	return c.LocalAddr().String()
}

// collect reads batches until n flows arrived or the deadline passes.
func (h *harness) collect(t testing.TB, n int) []*flow.Flow {
	t.Helper()
	var out []*flow.Flow
	deadline := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case b := <-h.out:
			out = append(out, b.Flows...)
		case <-deadline:
			t.Fatalf("got %d flows, want %d", len(out), n)
		}
	}
	return out
}

func antrea(t testing.TB, n, first, max int) [][]byte {
	t.Helper()
	tmpl, _ := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	var msgs [][]byte
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: max}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	enc.AddTemplate(3, tmpl)
	for i := range n {
		if err := ipfixtest.WriteAntreaV27(enc, 3, tmpl, ipfixtest.SampleFlow(first+i)); err != nil {
			t.Fatal(err)
		}
	}
	enc.Flush()
	return msgs
}

func TestTCPSessionsAreIndependent(t *testing.T) {
	h := newHarness(t, 64)
	addr := h.tcp(t)
	good, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	bad, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	msgs := antrea(t, 100, 0, 1400)
	half := len(msgs) / 2
	for _, m := range msgs[:half] {
		good.Write(m)
	}
	// The bad session announces a template, then sends a broken set.
	tmplMsg := antrea(t, 0, 0, 1400)[0]
	bad.Write(tmplMsg)
	broken := []byte{0, 10, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff}
	bad.Write(broken)
	// The server closes the bad session...
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bad.Read(make([]byte, 1)); err == nil {
		t.Fatal("bad session not closed")
	}
	// ...and the good one goes on.
	for _, m := range msgs[half:] {
		good.Write(m)
	}
	flows := h.collect(t, 100)
	for i, f := range flows {
		want := ipfixtest.SampleFlow(i)
		if f.SourcePodName != want.SrcPod || f.Stats.OctetTotalCount != want.Octets || f.SourceIP != want.Src {
			t.Fatalf("flow %d = %+v", i, f)
		}
		if f.Origin.Transport != "tcp" || f.Origin.Exporter != netip.MustParseAddr("127.0.0.1") || f.Origin.ObservationDomainID != 3 || f.Origin.SequenceNumber != uint32(i) {
			t.Fatalf("flow %d origin %+v", i, f.Origin)
		}
	}
	testkit.WaitFor(t, "1 decode error and 100 records counted", func() bool {
		return testutil.ToFloat64(h.m.DecodeErrors.WithLabelValues("tcp")) == 1 &&
			testutil.ToFloat64(h.m.Records.WithLabelValues("tcp", "127.0.0.1")) == 100
	})
}

func TestUDPDropsWhenFullAndCounts(t *testing.T) {
	h := newHarness(t, 1) // room for one batch only
	addr := h.udp(t)
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs := antrea(t, 50, 0, 1400)
	for _, m := range msgs {
		if _, err := c.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "50 UDP records counted", func() bool {
		return testutil.ToFloat64(h.m.Records.WithLabelValues("udp", "127.0.0.1")) == 50
	})
	b := <-h.out
	dropped := testutil.ToFloat64(h.m.Dropped.WithLabelValues("udp", "pipeline-full"))
	if len(b.Flows)+int(dropped) != 50 || dropped == 0 {
		t.Fatalf("delivered %d + dropped %v != 50 (or nothing dropped)", len(b.Flows), dropped)
	}
	// A malformed datagram is dropped, the next good one decodes.
	c.Write([]byte{0, 10, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, 0, 2})
	more := antrea(t, 5, 100, 1400)
	for _, m := range more {
		c.Write(m)
	}
	flows := h.collect(t, 5)
	if flows[0].SourcePodName != ipfixtest.SampleFlow(100).SrcPod {
		t.Fatalf("after the bad datagram: %+v", flows[0])
	}
}

// TestExporterSeriesOutliveSessions: an exporter's series stay for
// SeriesGrace after its last session closes, so a reconnect continues the
// same counter and a scrape sees the final count; then they are deleted.
func TestExporterSeriesOutliveSessions(t *testing.T) {
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{out: make(chan flow.Batch, 64), m: collector.NewMetrics(prometheus.NewRegistry())}
	const grace = 2 * time.Second
	h.srv, err = collector.New(collector.Options{Table: tb, Out: h.out, Metrics: h.m, SeriesGrace: grace,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.wg.Wait)
	addr := h.tcp(t)
	series := func() int { return testutil.CollectAndCount(h.m.Records) }
	session := func(first int) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range antrea(t, 10, first, 1400) {
			c.Write(m)
		}
		h.collect(t, 10)
		c.Close()
	}
	closed := func() {
		testkit.WaitFor(t, "the session to close", func() bool { return testutil.ToFloat64(h.m.Sessions.WithLabelValues("tcp")) == 0 })
	}
	session(0)
	closed()
	if n := testutil.ToFloat64(h.m.Records.WithLabelValues("tcp", "127.0.0.1")); n != 10 {
		t.Errorf("records %v after the session closed, want 10", n)
	}
	session(10) // within the grace period: the same series goes on
	closed()
	if n := testutil.ToFloat64(h.m.Records.WithLabelValues("tcp", "127.0.0.1")); n != 20 {
		t.Errorf("records %v after two sessions, want 20", n)
	}
	for deadline := time.Now().Add(10 * time.Second); series() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d series left long after the grace period", series())
		}
	}
}

// With Options.Records, batches carry the pool and records given back
// (as Aggregate mode does) are decoded into again, over IPFIX and gRPC.
func TestRecordsGivenBackAreReused(t *testing.T) {
	pool := flow.NewPool()
	h := newHarnessWith(t, 64, collector.Options{Records: pool})
	conn, err := net.Dial("tcp", h.tcp(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	s := sender(t, addr, b, grpcsend.Options{})
	for _, transport := range []string{"ipfix", "grpc"} {
		seen := map[*flow.Flow]bool{}
		reused := false
		// sync.Pool may drop what it holds at a garbage collection, so
		// reuse is looked for over rounds, not asserted for each record.
		for round := 0; round < 50 && !reused; round++ {
			if transport == "ipfix" {
				for _, m := range antrea(t, 4, round*4, 0) {
					if _, err := conn.Write(m); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				for i := range 4 {
					s.Send(flowtest.Full(round*4+i, false))
				}
			}
			var got []*flow.Flow
			deadline := time.After(10 * time.Second)
			for len(got) < 4 {
				select {
				case bt := <-h.out:
					if len(bt.Flows) > 0 && bt.Pool != pool {
						t.Fatalf("%s: a batch does not carry the pool", transport)
					}
					got = append(got, bt.Flows...)
					for _, f := range bt.Flows {
						if f.SourceIP == (netip.Addr{}) {
							t.Fatalf("%s: a record without its values: %+v", transport, f)
						}
						reused = reused || seen[f]
						seen[f] = true
					}
					bt.Release()
				case <-deadline:
					t.Fatalf("%s: %d records of round %d, want 4", transport, len(got), round)
				}
			}
		}
		if !reused {
			t.Errorf("%s: no record given back was decoded into again in 50 rounds", transport)
		}
	}
}
