package ipfixsend

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/ipfix"
)

// sink is a real IPFIX collector over TCP: each connection is a fresh
// transport session, so data is only readable if templates were sent on it.
type sink struct {
	ln      net.Listener
	mu      sync.Mutex
	flows   []flow.Flow
	fields  map[uint16]int // template ID → field count
	domains map[uint32]bool
	conns   []net.Conn
}

func listen(t *testing.T, addr string) *sink {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port of a closed listener may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln, fields: map[uint16]int{}, domains: map[uint32]bool{}}
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
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
						t.Errorf("bad message: %v", err)
						return
					}
					for d.Next() {
						r := d.Record()
						var f flow.Flow
						n.Normalize(r, &f)
						s.mu.Lock()
						s.flows = append(s.flows, f)
						s.fields[r.Template.ID] = r.NumFields()
						s.domains[d.Header().ObservationDomainID] = true
						s.mu.Unlock()
					}
				}
			}()
		}
	}()
	return s
}

func (s *sink) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
}

func (s *sink) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.flows) }

func records(from, n int, v6 bool) []flow.Flow {
	out := make([]flow.Flow, n)
	for i := range out {
		f := &out[i]
		f.SourceIP, f.DestinationIP = netip.MustParseAddr("10.10.1.2"), netip.MustParseAddr("10.10.2.2")
		if v6 {
			f.SourceIP, f.DestinationIP = netip.MustParseAddr("fd00:1::2"), netip.MustParseAddr("fd00:2::2")
		}
		f.SourcePort, f.DestinationPort, f.Protocol = uint16(from+i), 80, 6
		f.StartTime, f.EndTime = time.Unix(1_700_000_000, 0), time.Unix(1_700_000_005, 0)
		f.Stats.OctetTotalCount = uint64(from + i)
		f.SourcePodName, f.SourcePodNamespace, f.FlowType = "client", "web", flow.FlowTypeInterNode
		f.TCPState = "ESTABLISHED"
	}
	return out
}

// TestReconnectResendsTemplatesAndBufferedRecords: records made while the
// aggregator is down wait in the queue and arrive, readable (so templates
// were announced again), once it is back; none is lost or counted as sent
// twice.
func TestReconnectResendsTemplatesAndBufferedRecords(t *testing.T) {
	first := listen(t, "127.0.0.1:0")
	addr := first.ln.Addr().String()
	reg := prometheus.NewRegistry()
	m := Metrics{Sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sent"}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "reconnects"}),
		Connected:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "connected"})}
	reg.MustRegister(m.Sent, m.Reconnects, m.Connected)
	logs := &testkit.LogBuffer{}
	s, err := New(Options{Address: addr, Proto: "tcp", ObservationDomainID: 77, MinBackoff: 50 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(10_000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, q) }()
	defer func() { cancel(); <-done }()

	q.Push(records(0, 100, false))
	q.Push(records(100, 10, true))
	testkit.WaitFor(t, "110 records", func() bool { return first.count() == 110 })
	first.close()
	testkit.WaitFor(t, "the sender to notice", func() bool { return testutil.ToFloat64(m.Connected) == 0 })
	failures := func() int { return strings.Count(logs.String(), "cannot reach the flow aggregator") }
	before := failures()
	q.Push(records(1000, 500, false)) // the aggregator is down
	// Two more failed attempts: the second began after the push, so the
	// sender has held these records through a failed connection.
	testkit.WaitFor(t, "two failed connection attempts", func() bool { return failures() >= before+2 })
	if q.Len() != 500 {
		t.Fatalf("%d records buffered while down, want 500", q.Len())
	}
	second := listen(t, addr)
	defer second.close()
	testkit.WaitFor(t, "the buffered records", func() bool { return second.count() == 500 })
	second.mu.Lock()
	defer second.mu.Unlock()
	seen := map[uint16]bool{}
	for _, f := range second.flows {
		if f.SourcePodName != "client" || f.FlowType != flow.FlowTypeInterNode || f.Stats.OctetTotalCount != uint64(f.SourcePort) {
			t.Fatalf("record decoded wrong: %+v", f)
		}
		seen[f.SourcePort] = true
	}
	if len(seen) != 500 || !second.domains[77] {
		t.Fatalf("%d distinct records, domains %v", len(seen), second.domains)
	}
	if second.fields[TemplateIDv4] != 43 {
		t.Fatalf("v2.7 IPv4 template has %d fields, want 43", second.fields[TemplateIDv4])
	}
	// Counted once written, which may be after the collector read it.
	testkit.WaitFor(t, "610 records sent", func() bool { return testutil.ToFloat64(m.Sent) == 610 })
	if got := testutil.ToFloat64(m.Reconnects); got != 1 {
		t.Fatalf("reconnects %v, want 1", got)
	}
	if q.Len() != 0 {
		t.Fatalf("%d records left unacknowledged", q.Len())
	}
}

// TestProfileAndUDP: an older profile sends its own element set, over UDP.
func TestProfileAndUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	s, err := New(Options{Address: pc.LocalAddr().String(), Proto: "udp", Profile: "v1.13",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, q) }()
	defer func() { cancel(); <-done }()
	q.Push(records(0, 30, false))
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	got := 0
	buf := make([]byte, 65535)
	pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for got < 30 {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %d records: %v", got, err)
		}
		if n > 1400 {
			t.Fatalf("a %d-octet datagram; UDP messages are at most 1400", n)
		}
		if err := d.Reset(buf[:n], time.Now()); err != nil {
			t.Fatal(err)
		}
		for d.Next() {
			if nf := d.Record().NumFields(); nf != 39 {
				t.Fatalf("v1.13 record with %d fields, want 39", nf)
			}
			got++
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Address: "127.0.0.1:1", Proto: "sctp"},
		{Address: "127.0.0.1:1", Proto: "udp", TLS: nil, Profile: "v9.9"},
		{Address: "no-port", Proto: "tcp"},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// TestExtraElementsAndLocalAddr: extra elements follow the profile's in
// the template and reach the collector as unknown elements with their
// values; connections come from LocalAddr.
func TestExtraElementsAndLocalAddr(t *testing.T) {
	local := netip.MustParseAddr("127.0.0.2")
	if ln, err := net.Listen("tcp", local.String()+":0"); err != nil {
		local = netip.MustParseAddr("127.0.0.1") // a host with only 127.0.0.1
	} else {
		ln.Close()
	}
	k := listen(t, "127.0.0.1:0")
	defer k.close()
	extra := []flow.Element{
		{EnterpriseID: ipfix.EnterpriseAntrea, ID: 990, Value: []byte{1, 2, 3, 4}},
		{EnterpriseID: 4242, ID: 7, Value: []byte("future")},
	}
	s, err := New(Options{Address: k.ln.Addr().String(), Proto: "tcp", Extra: extra, LocalAddr: local,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, q) }()
	defer func() { cancel(); <-done }()
	q.Push(records(0, 5, false))
	testkit.WaitFor(t, "5 records", func() bool { return k.count() == 5 })
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := k.fields[TemplateIDv4]; n != 43+2 {
		t.Errorf("template of %d fields, want the 43 of v2.7 and 2 extra", n)
	}
	f := k.flows[4]
	if len(f.Unknown) != 2 {
		t.Fatalf("%d unknown elements, want 2: %+v", len(f.Unknown), f.Unknown)
	}
	for i, x := range f.Unknown {
		if x.EnterpriseID != extra[i].EnterpriseID || x.ID != extra[i].ID || string(x.Value) != string(extra[i].Value) {
			t.Errorf("unknown element %d is %+v, want %+v", i, x, extra[i])
		}
	}
	if f.SourcePodName != "client" || f.Stats.OctetTotalCount != 4 {
		t.Errorf("the profile's values were not read back: %+v", f)
	}
	if got := k.conns[0].RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != local {
		t.Errorf("connected from %v, want %v", got, local)
	}
	if _, err := New(Options{Address: "127.0.0.1:1", Proto: "tcp", Extra: []flow.Element{{ID: 1}}}); err == nil {
		t.Error("an extra element without a value was accepted")
	}
}

// TestLostMessageStaysQueued: records encoded into a message that a
// broken connection discarded are not acknowledged by the template
// message of the next connection; they stay queued and go on it. (Run's
// steps, taken one by one, so that the break falls inside the message.)
func TestLostMessageStaysQueued(t *testing.T) {
	k := listen(t, "127.0.0.1:0")
	defer k.close()
	s, err := New(Options{Address: k.ln.Addr().String(), Proto: "tcp", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(100)
	s.q = q
	q.Push(records(0, 10, false))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.conn.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	first, batch := q.Peek(q.Head(), nil, 10)
	for i := range batch {
		if err := s.writeRecord(&batch[i]); err != nil {
			t.Fatal(err)
		}
		s.committed = first + uint64(i) + 1
	}
	s.conn.Close() // the connection breaks before the message leaves
	if err := s.conn.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	if q.Len() != 10 {
		t.Fatalf("%d records queued after their message was lost, want 10", q.Len())
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx, q) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, "the 10 records", func() bool { return k.count() == 10 })
}
