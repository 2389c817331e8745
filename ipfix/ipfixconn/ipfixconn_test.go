package ipfixconn_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/certs"
	"sluice/internal/testkit"
	"sluice/ipfix"
	"sluice/ipfix/ipfixconn"
)

// sessions is a collecting process on the loopback: every connection it
// accepts is a transport session of its own, so a data record is read
// only if its template was announced on that same connection.
type sessions struct {
	mu    sync.Mutex
	conns []net.Conn
	// values are the records read, per connection in accept order.
	values [][]uint64
	// unknown counts data sets of templates a session had not seen.
	unknown uint64
}

func collect(t *testing.T, ln net.Listener) *sessions {
	t.Helper()
	s := &sessions{}
	t.Cleanup(func() { ln.Close(); s.closeAll() })
	go func() {
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			go s.read(c, s.add(c))
		}
	}()
	return s
}

// add keeps c and returns its index.
func (s *sessions) add(c net.Conn) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns = append(s.conns, c)
	s.values = append(s.values, nil)
	return len(s.conns) - 1
}

// read decodes the messages of connection i until it ends.
func (s *sessions) read(c net.Conn, i int) {
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	mr := ipfix.NewMessageReader(c)
	for m, err := mr.Next(); err == nil && d.Reset(m, time.Now()) == nil; m, err = mr.Next() {
		vs := recordValues(d)
		s.mu.Lock()
		s.values[i] = append(s.values[i], vs...)
		s.unknown += d.Session().Stats.UnknownTemplateSets
		d.Session().Stats.UnknownTemplateSets = 0
		s.mu.Unlock()
	}
}

// recordValues returns the first field of each record of the message d
// was reset to.
func recordValues(d *ipfix.Decoder) (vs []uint64) {
	for d.Next() {
		v, _ := d.Record().Uint(0)
		vs = append(vs, v)
	}
	return vs
}

// got returns the values read on connection i (nil before it exists).
func (s *sessions) got(i int) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.values) {
		return nil
	}
	return append([]uint64(nil), s.values[i]...)
}

// hangUp closes the collector's side of connection i.
func (s *sessions) hangUp(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[i].Close()
}

func (s *sessions) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

// exporter is an exporting process over a Conn: one template of one
// element, announced through an encoder whose output is the Conn. It
// records what the hooks saw.
type exporter struct {
	conn *ipfixconn.Conn
	enc  *ipfix.Encoder
	tmpl *ipfix.Template

	announced, attempts int
	dialed              []string
	retries             []time.Duration
	failures            []error
	lost                []error
	// onFail, if set, runs after each failure is recorded.
	onFail func()
}

func newExporter(t *testing.T, o ipfixconn.Options) *exporter {
	t.Helper()
	ie, ok := ipfix.DefaultRegistry().ByName("octetDeltaCount")
	if !ok {
		t.Fatal("no octetDeltaCount in the registry")
	}
	x := &exporter{}
	var err error
	if x.tmpl, err = ipfix.TemplateOf(300, ie); err != nil {
		t.Fatal(err)
	}
	o.Announce = func() error {
		x.announced++
		if err := x.enc.AddTemplate(1, x.tmpl); err != nil {
			return err
		}
		return x.enc.Flush()
	}
	o.Hooks = ipfixconn.Hooks{
		Attempt:   func() { x.attempts++ },
		Connected: func(addr string) { x.dialed = append(x.dialed, addr) },
		Failed: func(err error, retryIn time.Duration) {
			x.failures = append(x.failures, err)
			x.retries = append(x.retries, retryIn)
			if x.onFail != nil {
				x.onFail()
			}
		},
		Lost: func(err error) { x.lost = append(x.lost, err) },
	}
	if x.conn, err = ipfixconn.New(o); err != nil {
		t.Fatal(err)
	}
	if x.enc, err = ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: ipfixconn.MessageSize(o.Proto)}, x.conn.Write); err != nil {
		t.Fatal(err)
	}
	return x
}

// send writes one message of records with values vs.
func (x *exporter) send(vs ...uint64) error {
	for _, v := range vs {
		if err := x.enc.Begin(1, x.tmpl).Uint(v).End(); err != nil {
			return err
		}
	}
	return x.enc.Flush()
}

func tlsPair(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b.ServerTLS(true), b.ClientTLS(certs.DefaultServerName)
}

var errHungUp = errors.New("test: the collector hung up")

// TestReconnectAfterPeerCloses, over TCP and mutual TLS: the collector
// hangs up; the Conn notices without writing, reports it with
// Options.PeerClosed, refuses writes, and on the next Connect announces
// the templates again before the new session's data.
func TestReconnectAfterPeerCloses(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		name := "tcp"
		if withTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			o := ipfixconn.Options{Address: ln.Addr().String(), Proto: "tcp", PeerClosed: errHungUp}
			if withTLS {
				var server *tls.Config
				server, o.TLS = tlsPair(t)
				ln = tls.NewListener(ln, server)
			}
			col := collect(t, ln)
			x := newExporter(t, o)
			ctx := context.Background()

			if err := x.conn.Connect(ctx); err != nil {
				t.Fatal(err)
			}
			if x.attempts != 1 || len(x.dialed) != 1 || x.dialed[0] != o.Address || x.announced != 1 {
				t.Fatalf("after connecting: %d attempts, dialed %v, %d announcements", x.attempts, x.dialed, x.announced)
			}
			if err := x.send(1, 2, 3); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, "3 records on the first session", func() bool { return slices.Equal(col.got(0), []uint64{1, 2, 3}) })

			col.hangUp(0)
			testkit.WaitFor(t, "the hang-up to be noticed", func() bool { return !x.conn.Alive() })
			if !x.conn.Connected() || len(x.lost) != 0 {
				t.Fatalf("Alive dropped the connection: connected %v, Lost saw %v", x.conn.Connected(), x.lost)
			}
			if err := x.conn.Write([]byte("x")); !errors.Is(err, ipfixconn.ErrNotConnected) {
				t.Fatalf("Write after the hang-up: %v", err)
			}
			if x.conn.Connected() || len(x.lost) != 1 || !errors.Is(x.lost[0], errHungUp) {
				t.Fatalf("after Write: connected %v, Lost saw %v, want one %v", x.conn.Connected(), x.lost, errHungUp)
			}

			if err := x.conn.Connect(ctx); err != nil {
				t.Fatal(err)
			}
			if x.announced != 2 || len(x.dialed) != 2 {
				t.Fatalf("after reconnecting: %d announcements, dialed %v", x.announced, x.dialed)
			}
			if err := x.conn.Connect(ctx); err != nil || x.attempts != 2 {
				t.Fatalf("Connect while connected: %v, %d attempts", err, x.attempts)
			}
			if err := x.send(4, 5); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, "2 records on the second session", func() bool { return slices.Equal(col.got(1), []uint64{4, 5}) })
			col.mu.Lock()
			unknown := col.unknown
			col.mu.Unlock()
			if unknown != 0 {
				t.Fatalf("%d data sets came before their template", unknown)
			}

			x.conn.Close()
			if x.conn.Connected() || len(x.lost) != 2 || x.lost[1] != nil {
				t.Fatalf("after Close: connected %v, Lost saw %v", x.conn.Connected(), x.lost)
			}
			x.conn.Close() // a second Close does nothing
			if len(x.lost) != 2 {
				t.Fatalf("a second Close reached Lost: %v", x.lost)
			}
		})
	}
}

// TestWriteNoticesHangUp: a Write after the collector hung up fails and
// drops the connection (a TLS one here), whichever comes first: the
// hang-up seen or the write failing.
func TestWriteNoticesHangUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := ipfixconn.Options{Address: ln.Addr().String(), Proto: "tcp"}
	var server *tls.Config
	server, o.TLS = tlsPair(t)
	col := collect(t, tls.NewListener(ln, server))
	x := newExporter(t, o)
	if err := x.conn.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := x.send(7); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the record", func() bool { return len(col.got(0)) == 1 })
	col.hangUp(0)
	testkit.WaitFor(t, "a write to fail", func() bool { return x.send(8) != nil })
	if x.conn.Connected() || len(x.lost) != 1 || x.lost[0] == nil {
		t.Fatalf("connected %v, Lost saw %v", x.conn.Connected(), x.lost)
	}
}

// TestUDPTemplateRefresh: over UDP the templates go out on connecting and
// again each refresh interval, not before; records reach the collector.
func TestUDPTemplateRefresh(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx := context.Background()

	slow := newExporter(t, ipfixconn.Options{Address: pc.LocalAddr().String(), Proto: "udp", TemplateRefresh: time.Hour})
	if err := slow.conn.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	slow.conn.Refresh()
	if slow.announced != 1 {
		t.Fatalf("%d announcements within the refresh interval, want 1", slow.announced)
	}
	slow.conn.Close()

	fast := newExporter(t, ipfixconn.Options{Address: pc.LocalAddr().String(), Proto: "udp", TemplateRefresh: 20 * time.Millisecond})
	if err := fast.conn.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a refresh", func() bool { fast.conn.Refresh(); return fast.announced == 2 })
	if err := fast.send(42); err != nil {
		t.Fatal(err)
	}
	if !fast.conn.Alive() {
		t.Fatal("a UDP connection is not alive")
	}

	// Datagrams: slow's template, fast's template twice, fast's record.
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	buf := make([]byte, 65535)
	var templateSets int
	var values []uint64
	if err := pc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %d template sets and records %v: %v", templateSets, values, err)
		}
		if n > 1400 {
			t.Fatalf("a %d-octet datagram", n)
		}
		if set := uint16(buf[16])<<8 | uint16(buf[17]); set == 2 {
			templateSets++
		}
		if err := d.Reset(buf[:n], time.Now()); err != nil {
			t.Fatal(err)
		}
		values = append(values, recordValues(d)...)
	}
	if templateSets != 3 || !slices.Equal(values, []uint64{42}) {
		t.Fatalf("%d template sets and records %v, want 3 and [42]", templateSets, values)
	}
}

// refused returns an address nothing listens on: every attempt fails.
func refused(t *testing.T) string {
	t.Helper()
	return testkit.RefusedAddr(t)
}

// TestBackoff: failed attempts wait MinBackoff, doubling up to
// MaxBackoff, and report each failure.
func TestBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := newExporter(t, ipfixconn.Options{Address: refused(t), Proto: "tcp", MinBackoff: 5 * time.Millisecond,
		MaxBackoff: 20 * time.Millisecond})
	x.onFail = func() {
		if len(x.retries) == 5 {
			cancel()
		}
	}
	if err := x.conn.Connect(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Connect: %v, want context.Canceled", err)
	}
	ms := time.Millisecond
	want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 20 * ms, 20 * ms}
	if !slices.Equal(x.retries, want) || x.attempts != 5 || len(x.dialed) != 0 || len(x.lost) != 0 {
		t.Fatalf("waits %v after %d attempts (dialed %v, lost %v), want %v after 5", x.retries, x.attempts, x.dialed, x.lost, want)
	}
	for _, err := range x.failures {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("failure %v, want connection refused", err)
		}
	}
}

// TestCancelEndsBackoff: a context that ends while Connect waits between
// attempts ends the wait, however long.
func TestCancelEndsBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := newExporter(t, ipfixconn.Options{Address: refused(t), Proto: "tcp", MinBackoff: time.Hour})
	waiting := make(chan struct{})
	x.onFail = func() { close(waiting) }
	done := make(chan error, 1)
	go func() { done <- x.conn.Connect(ctx) }()
	<-waiting
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Connect: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Connect still waiting 10 s after its context ended")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Connect took %v to return after the cancel", d)
	}
}

// TestResolveAndLocalAddr: Resolve is asked for the address before each
// attempt (its failure is a failed attempt), and connections come from
// LocalAddr.
func TestResolveAndLocalAddr(t *testing.T) {
	// Linux routes all of 127/8 to the loopback: an address other than
	// the one the kernel would pick.
	local := netip.MustParseAddr("127.0.0.3")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := collect(t, ln)
	errNoService := errors.New("test: no endpoints yet")
	asked := 0
	resolve := func(context.Context) (string, error) {
		if asked++; asked == 1 {
			return "", errNoService
		}
		return ln.Addr().String(), nil
	}
	x := newExporter(t, ipfixconn.Options{Address: "svc/collector", Proto: "tcp", Resolve: resolve, LocalAddr: local,
		MinBackoff: time.Millisecond})
	if err := x.conn.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if asked != 2 || len(x.failures) != 1 || !errors.Is(x.failures[0], errNoService) {
		t.Fatalf("resolved %d times, failures %v", asked, x.failures)
	}
	if len(x.dialed) != 1 || x.dialed[0] != ln.Addr().String() {
		t.Fatalf("Connected saw %v, want the resolved %s", x.dialed, ln.Addr())
	}
	testkit.WaitFor(t, "the connection", func() bool { col.mu.Lock(); defer col.mu.Unlock(); return len(col.conns) == 1 })
	col.mu.Lock()
	from := col.conns[0].RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
	col.mu.Unlock()
	if from != local {
		t.Fatalf("connected from %v, want %v", from, local)
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []ipfixconn.Options{
		{Address: "127.0.0.1:4739", Proto: "sctp"},
		{Address: "127.0.0.1:4739", Proto: "udp", TLS: &tls.Config{}},
		{Address: "127.0.0.1:4739", Proto: "udp", TLSConfig: func(context.Context) (*tls.Config, error) { return &tls.Config{}, nil }},
		{Address: "no-port", Proto: "tcp"},
	} {
		if _, err := ipfixconn.New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	c, err := ipfixconn.New(ipfixconn.Options{Address: "127.0.0.1:4739", Proto: "udp"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Connected() || c.Alive() || !errors.Is(c.Write([]byte{0}), ipfixconn.ErrNotConnected) {
		t.Error("a new Conn is not unconnected")
	}
	c.Refresh() // nothing to refresh, nothing to fail
	c.Close()
	if ipfixconn.MessageSize("udp") != 1400 || ipfixconn.MessageSize("tcp") != ipfix.MaxMessageLen {
		t.Error("default message sizes")
	}
}

// TestWriteTimeout: a collector that accepts but never reads fills the
// socket buffers; Write then fails within the write timeout instead of
// blocking for ever, and the connection is dropped.
func TestWriteTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // kept open, never read
		}
	}()
	defer func() {
		select {
		case c := <-held:
			c.Close()
		default:
		}
	}()
	var lost []error
	c, err := ipfixconn.New(ipfixconn.Options{Address: ln.Addr().String(), Proto: "tcp", WriteTimeout: 200 * time.Millisecond,
		Announce: func() error { return nil }, Hooks: ipfixconn.Hooks{Lost: func(err error) { lost = append(lost, err) }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 60000)
	deadline := time.Now().Add(testkit.WaitTimeout)
	for {
		err = c.Write(msg)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a collector that reads nothing never failed")
		}
	}
	if !errors.Is(err, ipfixconn.ErrWriteTimeout) {
		t.Errorf("Write: %v, want ErrWriteTimeout", err)
	}
	if c.Connected() || len(lost) != 1 || !errors.Is(lost[0], ipfixconn.ErrWriteTimeout) {
		t.Errorf("connected %v, Lost saw %v", c.Connected(), lost)
	}
}

// TestTLSConfigPerAttempt: Options.TLSConfig is asked before each
// connection attempt; its error fails that attempt, which is retried, and
// the configuration it gives next is the one the connection uses.
func TestTLSConfigPerAttempt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server, client := tlsPair(t)
	col := collect(t, tls.NewListener(ln, server))
	calls := 0
	errNotYet := errors.New("test: the Secret is not there yet")
	o := ipfixconn.Options{Address: ln.Addr().String(), Proto: "tcp", MinBackoff: time.Millisecond,
		TLSConfig: func(context.Context) (*tls.Config, error) {
			calls++
			if calls == 1 {
				return nil, errNotYet
			}
			return client, nil
		}}
	x := newExporter(t, o)
	if err := x.conn.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || x.attempts != 2 {
		t.Fatalf("%d TLSConfig calls for %d attempts, want 2 and 2", calls, x.attempts)
	}
	if err := x.send(9); err != nil {
		t.Fatal(err)
	}
	// The collector requires the client certificate: the record arriving
	// means the configuration TLSConfig gave was used.
	testkit.WaitFor(t, "the record over TLS", func() bool { return slices.Equal(col.got(0), []uint64{9}) })
}

// TestStopWrites: with StopWrites, a Write blocked on a collector that
// reads nothing fails as soon as the context of the connection's Connect
// ends, long before the write timeout, and drops the connection; without
// the context ending it would wait the whole timeout.
func TestStopWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // kept open, never read
		}
	}()
	defer func() {
		select {
		case c := <-held:
			c.Close()
		default:
		}
	}()
	c, err := ipfixconn.New(ipfixconn.Options{Address: ln.Addr().String(), Proto: "tcp", WriteTimeout: time.Hour,
		StopWrites: true, Announce: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	// Write until a Write blocks (the socket buffers are full), then end
	// the context: the blocked Write must return.
	wrote := make(chan struct{}, 1)
	failed := make(chan error, 1)
	go func() {
		msg := make([]byte, 60000)
		for {
			if err := c.Write(msg); err != nil {
				failed <- err
				return
			}
			select {
			case wrote <- struct{}{}:
			default:
			}
		}
	}()
	blocked := false
	for !blocked {
		select {
		case <-wrote:
		case err := <-failed:
			t.Fatalf("Write failed before the context ended: %v", err)
		case <-time.After(500 * time.Millisecond):
			blocked = true // no Write returned for a while: one is blocked
		}
	}
	cancel()
	select {
	case err := <-failed:
		if err == nil || errors.Is(err, ipfixconn.ErrWriteTimeout) {
			t.Errorf("Write: %v, want the stop's error", err)
		}
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("a blocked Write went on after its connection's context ended")
	}
	if c.Connected() {
		t.Error("still connected after a stopped Write")
	}
}
