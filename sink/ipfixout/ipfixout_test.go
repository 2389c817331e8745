package ipfixout_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/ipfix"
	"sluice/ring"
	"sluice/sink/ipfixout"
)

func testFlow(i int) *flow.Flow {
	return &flow.Flow{
		StartTime: time.Unix(1767225600, 0).UTC(), EndTime: time.Unix(1767225601, 0).UTC(),
		SourceIP: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), DestinationIP: netip.MustParseAddr("10.2.0.1"),
		SourcePort: uint16(i), DestinationPort: 80, Protocol: 6, SourcePodName: "p", FlowType: flow.FlowTypeInterNode,
		Stats:  flow.Stats{OctetDeltaCount: uint64(i)},
		Origin: flow.Origin{ObservationDomainID: 5, Exporter: netip.MustParseAddr("192.0.2.9")},
	}
}

type received struct {
	mu    sync.Mutex
	flows []flow.Flow
}

func (r *received) len() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.flows) }

// serveIPFIX decodes every TCP session on ln into r.
func serveIPFIX(t *testing.T, ln net.Listener, r *received) {
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
				n := ipfixmap.NewNormalizer(tb)
				mr := ipfix.NewMessageReader(c)
				for {
					m, err := mr.Next()
					if err != nil {
						return
					}
					if err := d.Reset(m, time.Now()); err != nil {
						t.Errorf("collector got a bad message: %v", err)
						return
					}
					for d.Next() {
						var f flow.Flow
						n.Normalize(d.Record(), &f)
						r.mu.Lock()
						r.flows = append(r.flows, f)
						r.mu.Unlock()
					}
					if d.Err() != nil || d.Session().Stats.UnknownTemplateSets > 0 {
						t.Errorf("collector: %v, stats %+v", d.Err(), d.Session().Stats)
					}
				}
			}()
		}
	}()
}

func newSink(t *testing.T, addr, proto string, json bool, m *ipfixout.Metrics) *ipfixout.Sink {
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, 256)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ipfixout.New(ipfixout.Options{Address: addr, Proto: proto, JSON: json, Exporter: ex, Metrics: m,
		FlushInterval: 20 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestOutageBuffersThenDelivers: the collector is down at first; records
// wait in the buffer and arrive when it comes up; a buffer too small for
// the outage loses the oldest, and counts them.
func TestOutageBuffersThenDelivers(t *testing.T) {
	port := testkit.ReservePort(t) // down
	addr := port.Addr

	m := ipfixout.NewMetrics(prometheus.NewRegistry())
	buf := ring.New[*flow.Flow](64)
	s := newSink(t, addr, "tcp", false, m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := buf.Consumer()
	go func() { defer close(done); s.Run(ctx, c) }()
	for i := range 100 {
		buf.Produce(testFlow(i))
	}
	time.Sleep(100 * time.Millisecond) // a few failed attempts
	var r received
	ln2, err := port.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	serveIPFIX(t, ln2, &r)
	testkit.WaitFor(t, "64 buffered records", func() bool { return r.len() == 64 })
	// The 36 oldest were overwritten while down: counted, not silent.
	if v := testutil.ToFloat64(m.Dropped.WithLabelValues("ipfix", "buffer-full")); v != 36 {
		t.Errorf("buffer-full drops %v, want 36", v)
	}
	r.mu.Lock()
	if r.flows[0].SourcePort != 36 || r.flows[63].SourcePort != 99 {
		t.Errorf("delivered %d..%d, want 36..99", r.flows[0].SourcePort, r.flows[63].SourcePort)
	}
	f := r.flows[0]
	r.mu.Unlock()
	if f.SourcePodName != "p" || f.Stats.OctetDeltaCount != 36 {
		t.Errorf("values lost: %+v", f)
	}
	// Live records flow too.
	buf.Produce(testFlow(500))
	testkit.WaitFor(t, "a live record", func() bool { return r.len() == 65 })
	// Counted once written, which may be after the collector read it.
	testkit.WaitFor(t, "65 exported", func() bool { return testutil.ToFloat64(m.Exported.WithLabelValues("ipfix")) == 65 })
	cancel()
	<-done
}

// TestReconnectResendsTemplates: the collector restarts; the new session
// gets the templates again before data (the collector checks it saw no
// data set of an unknown template).
func TestReconnectResendsTemplates(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var r received
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
				d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
				n := ipfixmap.NewNormalizer(tb)
				mr := ipfix.NewMessageReader(c)
				for {
					m, err := mr.Next()
					if err != nil {
						return
					}
					d.Reset(m, time.Now())
					for d.Next() {
						var f flow.Flow
						n.Normalize(d.Record(), &f)
						r.mu.Lock()
						r.flows = append(r.flows, f)
						r.mu.Unlock()
					}
					if d.Session().Stats.UnknownTemplateSets > 0 {
						t.Errorf("data before templates on a new session")
					}
				}
			}()
		}
	}()
	defer ln.Close()
	buf := ring.New[*flow.Flow](1024)
	s := newSink(t, ln.Addr().String(), "tcp", false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := buf.Consumer()
	go s.Run(ctx, c)
	buf.Produce(testFlow(1))
	testkit.WaitFor(t, "first record", func() bool { return r.len() == 1 })
	mu.Lock()
	conns[0].Close() // the collector drops the session
	mu.Unlock()
	// Writes after the close eventually fail; keep producing until the
	// sink reconnects and records arrive on the second session.
	testkit.WaitFor(t, "a second session with data", func() bool {
		buf.Produce(testFlow(2))
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return len(conns) >= 2 && r.len() >= 2
	})
}

func TestJSONLines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lines := make(chan map[string]any, 10)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			var v map[string]any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Errorf("bad JSON line %q: %v", sc.Text(), err)
			}
			lines <- v
		}
	}()
	buf := ring.New[*flow.Flow](16)
	s := newSink(t, ln.Addr().String(), "tcp", true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, buf.Consumer())
	buf.Produce(testFlow(7))
	select {
	case v := <-lines:
		rec, _ := v["ipfix"].(map[string]any)
		if rec["sourceIPv4Address"] != "10.1.0.7" || rec["sourcePodName"] != "p" || rec["originalObservationDomainId"] != 5.0 ||
			rec["originalExporterIPv4Address"] != "192.0.2.9" || v["@timestamp"] == nil {
			t.Errorf("JSON record %v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no JSON line")
	}
}

// TestCloseDrains: when the buffer closes, Run sends what is left and
// returns at once, without waiting for a flush tick or a timeout.
func TestCloseDrains(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var r received
	serveIPFIX(t, ln, &r)
	buf := ring.New[*flow.Flow](64)
	s := newSink(t, ln.Addr().String(), "tcp", false, nil)
	c := buf.Consumer()
	done := make(chan struct{})
	go func() { defer close(done); s.Run(context.Background(), c) }()
	for i := range 10 {
		buf.Produce(testFlow(i))
	}
	buf.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the buffer closed")
	}
	testkit.WaitFor(t, "the last records", func() bool { return r.len() == 10 })
}

// TestTrickleIsFlushed: records that keep coming, each before the flush
// interval ends, still go out within about one interval.
func TestTrickleIsFlushed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var r received
	serveIPFIX(t, ln, &r)
	buf := ring.New[*flow.Flow](1024)
	s := newSink(t, ln.Addr().String(), "tcp", false, nil) // flush interval 20 ms
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := buf.Consumer()
	go func() { defer close(done); s.Run(ctx, c) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	for i := 0; r.len() == 0; i++ {
		if time.Since(start) > 2*time.Second {
			t.Fatal("no record arrived within 2 s of a steady trickle")
		}
		buf.Produce(testFlow(i))
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("the first record took %v to arrive with a 20 ms flush interval", d)
	}
}

// TestCommitsWhatItWrote: a producer waiting for the sink to write
// (ring.Buffer.WaitWritten, how Proxy mode confirms gRPC streams) makes it
// send at once rather than on its minute-long flush clock, and is released
// only once the records were written; a sink whose collector is down is
// not waited for.
func TestCommitsWhatItWrote(t *testing.T) {
	newSlowSink := func(addr string, m *ipfixout.Metrics) *ipfixout.Sink {
		tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
		ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, 256)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ipfixout.New(ipfixout.Options{Address: addr, Proto: "tcp", Exporter: ex, Metrics: m,
			FlushInterval: time.Minute, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := func(s *ipfixout.Sink, buf *ring.Buffer[*flow.Flow]) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		c := buf.Consumer()
		go func() { defer close(done); s.Run(ctx, c) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	wait := func(buf *ring.Buffer[*flow.Flow]) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return buf.WaitWritten(ctx, buf.Produced())
	}

	t.Run("written before released", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var r received
		serveIPFIX(t, ln, &r)
		m := ipfixout.NewMetrics(prometheus.NewRegistry())
		buf := ring.New[*flow.Flow](1024)
		run(newSlowSink(ln.Addr().String(), m), buf)
		for i := range 100 {
			buf.Produce(testFlow(i))
		}
		if err := wait(buf); err != nil {
			t.Fatalf("WaitWritten: %v (the sink did not write on demand)", err)
		}
		// Committed only after the write: the count is already there.
		if v := testutil.ToFloat64(m.Exported.WithLabelValues("ipfix")); v != 100 {
			t.Fatalf("released with %v of 100 records written", v)
		}
		testkit.WaitFor(t, "the 100 records at the collector", func() bool { return r.len() == 100 })
	})

	t.Run("a collector down is not waited for", func(t *testing.T) {
		addr := testkit.RefusedAddr(t)
		m := ipfixout.NewMetrics(prometheus.NewRegistry())
		buf := ring.New[*flow.Flow](1024)
		run(newSlowSink(addr, m), buf)
		for i := range 10 {
			buf.Produce(testFlow(i))
		}
		if err := wait(buf); err != nil {
			t.Fatalf("WaitWritten waited for a sink whose collector is down: %v", err)
		}
		if v := testutil.ToFloat64(m.Exported.WithLabelValues("ipfix")); v != 0 {
			t.Fatalf("%v records exported to a collector that is down", v)
		}
	})
}
