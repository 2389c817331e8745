package collector

// The gRPC collector speaks gRPC over the standard library's HTTP/2
// server rather than through grpc-go's server. It serves one
// client-streaming method, so what it needs of gRPC is small: the
// length-prefixed messages of a request body, one response message and a
// status. In exchange, a one-Flow ExportRequest costs no allocation and
// no goroutine hand-off of its own (grpc-go's server spends about four
// allocations and a channel hand-off on every message), and a stream's
// messages are read from the body in large chunks.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// grpcReadBuffer is how much of a stream's body one read takes: a
	// few hundred one-Flow messages.
	grpcReadBuffer = 64 << 10
	// HTTP/2 flow-control windows: what an exporter may send ahead of
	// the collector's reading, per stream and per connection. With the
	// read buffers, a connection holds at most about 1.3 MiB. (256 KiB
	// windows cost a fifth of the throughput with 100 Flows per request.)
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

// grpcRequestError refuses a request that is not a gRPC call of the
// service, as grpc-go's server does: an HTTP status for what is not gRPC
// at all, a gRPC status otherwise. It returns false when the request is
// to be served.
func grpcRequestError(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.ProtoMajor != 2 {
		http.Error(w, "gRPC requires HTTP/2", http.StatusHTTPVersionNotSupported)
		return true
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "gRPC requires POST", http.StatusMethodNotAllowed)
		return true
	}
	ct := r.Header.Get("Content-Type")
	if ct != grpcContentType && !strings.HasPrefix(ct, grpcContentType+"+") && !strings.HasPrefix(ct, grpcContentType+";") {
		http.Error(w, fmt.Sprintf("invalid gRPC request content-type %q", ct), http.StatusUnsupportedMediaType)
		return true
	}
	if r.URL.Path != method {
		writeStatus(w, status.Newf(codes.Unimplemented, "unknown method %s", r.URL.Path))
		return true
	}
	// Antrea's agents do not compress; nor does Sluice decompress.
	if enc := r.Header.Get("Grpc-Encoding"); enc != "" && enc != "identity" {
		writeStatus(w, status.Newf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", enc))
		return true
	}
	return false
}

const grpcContentType = "application/grpc"

// writeStatus ends a call that has sent nothing yet with a trailers-only
// response.
func writeStatus(w http.ResponseWriter, st *status.Status) {
	h := w.Header()
	h.Set("Content-Type", grpcContentType)
	h.Set("Grpc-Status", strconv.Itoa(int(st.Code())))
	if m := st.Message(); m != "" {
		h.Set("Grpc-Message", encodeGRPCMessage(m))
	}
	w.WriteHeader(http.StatusOK)
}

// writeResponse ends a call with one (already encoded) response message
// and status OK.
func writeResponse(w http.ResponseWriter, msg []byte) error {
	h := w.Header()
	h.Set("Content-Type", grpcContentType)
	w.WriteHeader(http.StatusOK)
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(msg)))
	if _, err := w.Write(prefix[:]); err != nil {
		return err
	}
	if _, err := w.Write(msg); err != nil {
		return err
	}
	h.Set(http.TrailerPrefix+"Grpc-Status", "0")
	return nil
}

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

// messageReader reads a request body's length-prefixed gRPC messages.
type messageReader struct {
	br  *bufio.Reader
	max int
	buf []byte // a message larger than what br holds
}

var errCompressed = errors.New("a compressed message without a grpc-encoding")

// next returns the next message, valid until the following call; io.EOF
// at a message boundary is the end of the stream. A message larger than
// max is refused with ResourceExhausted, a truncated one with Internal.
func (m *messageReader) next() ([]byte, error) {
	head, err := m.br.Peek(5)
	if err != nil {
		if errors.Is(err, io.EOF) {
			if len(head) == 0 {
				return nil, io.EOF
			}
			return nil, status.Error(codes.Internal, io.ErrUnexpectedEOF.Error())
		}
		return nil, err
	}
	if head[0] != 0 {
		return nil, status.Errorf(codes.Internal, "grpc: %v", errCompressed)
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n > m.max {
		return nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, m.max)
	}
	if 5+n <= m.br.Size() {
		// The common case: the whole message inside the read buffer,
		// decoded where it lies.
		all, err := m.br.Peek(5 + n)
		if err != nil {
			return nil, truncated(err)
		}
		m.br.Discard(5 + n)
		return all[5:], nil
	}
	m.br.Discard(5)
	m.buf = slices.Grow(m.buf[:0], n)[:n]
	if _, err := io.ReadFull(m.br, m.buf); err != nil {
		return nil, truncated(err)
	}
	return m.buf, nil
}

// buffered says whether the next message is read whole already.
func (m *messageReader) buffered() bool {
	k := m.br.Buffered()
	if k < 5 {
		return false
	}
	head, _ := m.br.Peek(5)
	return 5+int(binary.BigEndian.Uint32(head[1:])) <= k
}

// truncated maps the end of a body inside a message to Internal, as
// grpc-go does; other errors (the client reset the stream) pass.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return status.Error(codes.Internal, io.ErrUnexpectedEOF.Error())
	}
	return err
}
