package collector

// The gRPC collector speaks gRPC over an HTTP/2 server of its own (h2.go)
// rather than through grpc-go's server or the standard library's. It
// serves one client-streaming method, so what it needs of gRPC is small:
// the length-prefixed messages of a request body, one response message
// and a status. In exchange, a one-Flow ExportRequest costs no
// allocation and no goroutine hand-off of its own: grpc-go's server
// spends about four allocations and a channel hand-off on every message,
// the standard library's a few goroutine switches on every DATA frame.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// HTTP/2 flow-control windows: what an exporter may send ahead of
	// the collector's reading, per stream and per connection: a
	// connection holds at most the connection's window of octets not
	// yet taken, and each stream what it took (up to maxTake chunks)
	// plus one message put together (MaxMessageSize). (256 KiB windows
	// cost a fifth of the throughput with 100 Flows per request.)
	grpcStreamWindow = 1 << 20
	grpcConnWindow   = 1 << 20
)

// handlerCount tracks running handlers so that the collector returns
// only after the last; once closed, no handler starts.
type handlerCount struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   *sync.Cond
}

func (c *handlerCount) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.n++
	return true
}

func (c *handlerCount) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.idle != nil {
		c.idle.Broadcast()
	}
}

func (c *handlerCount) closeAndWait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.idle == nil {
		c.idle = sync.NewCond(&c.mu)
	}
	for c.n > 0 {
		c.idle.Wait()
	}
}

// withH2 returns a copy of cfg that offers HTTP/2 in ALPN, also through
// GetConfigForClient (the certificate reloader answers each handshake
// with its current configuration). gRPC clients require "h2".
func withH2(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.NextProtos = addH2(c.NextProtos)
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hello)
			if err != nil || cc == nil {
				return cc, err
			}
			cc = cc.Clone()
			cc.NextProtos = addH2(cc.NextProtos)
			return cc, nil
		}
	}
	return c
}

func addH2(protos []string) []string {
	if slices.Contains(protos, "h2") {
		return protos
	}
	return append([]string{"h2"}, protos...)
}

// handshakeListener completes each connection's TLS handshake before
// Accept returns it, off the accept loop (a slow client delays only
// itself), within timeout, and reports failures to failed. The HTTP
// server then finds a finished *tls.Conn with "h2" negotiated.
type handshakeListener struct {
	inner   net.Listener
	cfg     *tls.Config
	timeout time.Duration
	failed  func(raw net.Conn, err error)
	// watch, if set, watches an accepted connection's client certificate
	// (its expiry, a change of CAs); raw is the connection under tc. It
	// returns what stops watching.
	watch func(tc *tls.Conn, raw net.Conn) (stop func())

	ctx       context.Context // cancelled by Close: ends handshakes
	cancel    context.CancelFunc
	conns     chan net.Conn
	acceptErr chan error // the inner listener's failure, once
	closeOnce sync.Once
	wg        sync.WaitGroup // the accept loop and handshakes in flight
}

func newHandshakeListener(inner net.Listener, cfg *tls.Config, timeout time.Duration, failed func(net.Conn, error), watch func(*tls.Conn, net.Conn) func()) *handshakeListener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &handshakeListener{inner: inner, cfg: cfg, timeout: timeout, failed: failed, watch: watch,
		ctx: ctx, cancel: cancel, conns: make(chan net.Conn), acceptErr: make(chan error, 1)}
	l.wg.Go(l.acceptLoop)
	return l
}

func (l *handshakeListener) acceptLoop() {
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			l.acceptErr <- err
			return
		}
		l.wg.Go(func() { l.handshake(raw) })
	}
}

func (l *handshakeListener) handshake(raw net.Conn) {
	hc := &hookConn{Conn: raw}
	tc := tls.Server(hc, l.cfg)
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		if l.ctx.Err() == nil {
			l.failed(raw, err)
		}
		raw.Close()
		return
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		l.failed(raw, fmt.Errorf("the client did not negotiate HTTP/2 (ALPN %q)", p))
		tc.Close()
		return
	}
	if l.watch != nil {
		hc.setOnClose(l.watch(tc, hc))
	}
	select {
	case l.conns <- tc:
	case <-l.ctx.Done():
		tc.Close()
	}
}

// hookConn runs onClose when it closes: what watches the connection
// stops with it. (The TLS connection above it must stay a *tls.Conn for
// the HTTP server to find HTTP/2.)
type hookConn struct {
	net.Conn
	mu      sync.Mutex
	onClose func()
	closed  bool
}

func (c *hookConn) Close() error {
	c.mu.Lock()
	f := c.onClose
	c.onClose, c.closed = nil, true
	c.mu.Unlock()
	if f != nil {
		f()
	}
	return c.Conn.Close()
}

// setOnClose sets what Close runs, running it now if Close came first.
func (c *hookConn) setOnClose(f func()) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		f()
		return
	}
	c.onClose = f
	c.mu.Unlock()
}

func (l *handshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.acceptErr:
		l.acceptErr <- err // for the next caller
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting and waits for the handshakes in flight to end.
func (l *handshakeListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.cancel()
		err = l.inner.Close()
		l.wg.Wait()
	})
	return err
}

func (l *handshakeListener) Addr() net.Addr { return l.inner.Addr() }

const grpcContentType = "application/grpc"

// encodeGRPCMessage percent-encodes what the gRPC protocol does not allow
// raw in grpc-message: octets outside printable ASCII, and '%'.
func encodeGRPCMessage(m string) string {
	clean := true
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// grpcTimeout reads a grpc-timeout header ("100m", "5S"): the deadline
// the client gave the call.
func grpcTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, false // beyond any deadline: none
	}
	return time.Duration(n) * unit, true
}

var errCompressed = errors.New("a compressed message without a grpc-encoding")
