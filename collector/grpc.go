package collector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
)

// GRPCOptions tunes the gRPC collector.
type GRPCOptions struct {
	// MaxMessageSize bounds one ExportRequest, in bytes; default 4 MiB. A
	// larger message ends its stream with ResourceExhausted.
	MaxMessageSize int
	// MaxFlows bounds the flows of one ExportRequest; default 16384 (a
	// Flow with every field set is about 710 octets: 4 MiB of them is
	// about 5,900). Bytes alone do not
	// bound memory: an empty Flow is 2 octets on the wire and about 1 KiB
	// once decoded. A request with more ends its stream with
	// ResourceExhausted, and its flows are counted as dropped.
	MaxFlows int
	// MaxStreams bounds the concurrent Export streams of one connection;
	// default 4 (an exporter needs one).
	MaxStreams uint32
	// StopTimeout bounds the graceful stop; default 5 s.
	StopTimeout time.Duration
	// ConfirmWritten delays a stream's response (the exporter's
	// confirmation) until the pipeline's sinks have written its records,
	// rather than until the records entered the pipeline: what an
	// aggregator killed in between had confirmed is then never lost. Needs
	// a mode that answers flow.Batch.Written (both do).
	ConfirmWritten bool
}

func (o *GRPCOptions) defaults() {
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = 4 << 20
	}
	if o.MaxFlows == 0 {
		o.MaxFlows = 16384
	}
	if o.MaxStreams == 0 {
		o.MaxStreams = 4
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 5 * time.Second
	}
}

// ServeGRPC runs FlowExportService on ln until ctx ends. tlsConfig must
// require and verify client certificates: the gRPC collector only speaks
// mutual TLS. Each record's exporter is the connection's peer address,
// whatever the record says; records go to Options.Out like IPFIX ones,
// blocking the stream (and so, through HTTP/2 flow control, the exporter)
// while the pipeline is full. When ctx ends, open streams end with
// Unavailable, and ServeGRPC returns once their handlers have.
func (s *Server) ServeGRPC(ctx context.Context, ln net.Listener, tlsConfig *tls.Config) error {
	if tlsConfig == nil || tlsConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		ln.Close()
		return errors.New("collector: the gRPC collector needs a TLS configuration that requires client certificates")
	}
	o := &s.o
	log := o.Log.With("transport", "grpc")
	handshakeRefused := o.Metrics.Refused.WithLabelValues("grpc", "tls-handshake")
	ln = &slotListener{Listener: ln, s: s, log: log,
		limitRefused: o.Metrics.Refused.WithLabelValues("grpc", "session-limit"),
		sessions:     o.Metrics.Sessions.WithLabelValues("grpc")}
	hl := newHandshakeListener(ln, withH2(tlsConfig), o.HandshakeTimeout, func(raw net.Conn, err error) {
		handshakeFailed(o.Metrics, handshakeRefused, log.With("peer", raw.RemoteAddr().String()), "grpc", "gRPC connection", err)
	}, func(tc *tls.Conn, raw net.Conn) func() {
		return s.watchClientCert(tc, raw, "grpc", log.With("peer", tc.RemoteAddr().String()))
	})
	svc := &exportService{s: s, ctx: ctx}
	var handlers handlerCount
	srv := s.newH2Server(svc, &handlers, log)
	served := make(chan error, 1)
	go func() { served <- srv.serve(hl) }()
	var err error
	select {
	case err = <-served:
		hl.Close()
		srv.closeAll()
	case <-ctx.Done():
		// Streams see ctx and end with Unavailable, so the graceful
		// stop is quick; the timeout is the bound.
		hl.Close()
		<-served
		if !srv.shutdown(o.GRPC.StopTimeout) {
			o.Log.Warn("gRPC collector did not stop gracefully in time; closing its connections", "timeout", o.GRPC.StopTimeout.String())
		}
	}
	handlers.closeAndWait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("collector: grpc: %w", err)
	}
	return nil
}

// newH2Server returns the HTTP/2 server of the gRPC collector, serving
// svc's streams while handlers admits them.
func (s *Server) newH2Server(svc *exportService, handlers *handlerCount, log *slog.Logger) *h2Server {
	o := &s.o
	return &h2Server{
		log:            log,
		maxStreams:     o.GRPC.MaxStreams,
		handle:         svc.serve,
		admit:          handlers.enter,
		done:           handlers.leave,
		protocolError:  o.Metrics.DecodeErrors.WithLabelValues("grpc").Inc,
		prefaceTimeout: o.HandshakeTimeout,
		writeTimeout:   grpcWriteTimeout,
		// Keeps a dead peer from holding its streams forever, as
		// grpc-go's keepalive would.
		pingIdle:    2 * time.Hour,
		pingTimeout: 20 * time.Second,
		conns:       map[*h2Conn]struct{}{},
	}
}

// grpcWriteTimeout bounds one write to a gRPC client (a response, a
// window update): a client that does not read is closed.
const grpcWriteTimeout = 30 * time.Second

// slotListener gives each accepted connection a session slot, shared
// with the IPFIX TCP sessions, or closes it at once when none is free. The
// slot is taken on the raw connection, which is closed on every path
// (a failed handshake, the end of the connection), so it always comes
// back.
type slotListener struct {
	net.Listener
	s            *Server
	limitRefused prometheus.Counter
	sessions     prometheus.Gauge
	log          *slog.Logger
}

func (l *slotListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.s.slots <- struct{}{}:
			l.sessions.Inc()
			return &slotConn{Conn: conn, release: func() { <-l.s.slots; l.sessions.Dec() }}, nil
		default:
			l.limitRefused.Inc()
			l.log.Warn("refusing gRPC connection: too many sessions", "peer", conn.RemoteAddr().String(), "limit", l.s.o.MaxSessions)
			conn.Close()
		}
	}
}

// slotConn gives its session slot back on the first Close.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

type exportService struct {
	s   *Server
	ctx context.Context // the collector's run
}

// maxKeptRequestBuffer is the largest receive buffer a stream keeps
// between reads; a larger one (after a rare large request) is let go.
const maxKeptRequestBuffer = 256 << 10

// streamEnd is how a stream's receiving ended: err is the error to
// return (nil for the exporter's end of stream); counted says the ending
// was already counted and logged.
type streamEnd struct {
	err     error
	counted bool
	n, bad  uint64
}

// serve answers one HTTP/2 request stream: an Export call or a refusal.
func (e *exportService) serve(c *h2Conn, st *h2Stream) {
	if e.refuse(c, st) {
		return
	}
	sctx := st.ctx
	if v := st.req.timeout; v != "" {
		if d, ok := grpcTimeout(v); ok {
			var cancel context.CancelFunc
			sctx, cancel = context.WithTimeout(sctx, d)
			defer cancel()
		}
	}
	if err := e.export(sctx, c, st); err != nil {
		s := status.Convert(err)
		c.respondStatus(st, uint32(s.Code()), s.Message())
		return
	}
	// An ExportResponse has no fields: its encoding is empty.
	c.respondOK(st, nil)
}

// refuse answers a request that is not a gRPC call of the service, as
// grpc-go's server does: an HTTP status for what is not gRPC at all, a
// gRPC status otherwise. It returns false when the request is to be
// served.
func (e *exportService) refuse(c *h2Conn, st *h2Stream) bool {
	r := &st.req
	if r.method != http.MethodPost {
		c.respondHTTP(st, http.StatusMethodNotAllowed, "gRPC requires POST\n", hpack.HeaderField{Name: "allow", Value: http.MethodPost})
		return true
	}
	ct := r.contentType
	if ct != grpcContentType && !strings.HasPrefix(ct, grpcContentType+"+") && !strings.HasPrefix(ct, grpcContentType+";") {
		c.respondHTTP(st, http.StatusUnsupportedMediaType, fmt.Sprintf("invalid gRPC request content-type %q\n", ct))
		return true
	}
	if r.path != flowpb.FlowExportService_Export_FullMethodName {
		c.respondStatus(st, uint32(codes.Unimplemented), "unknown method "+r.path)
		return true
	}
	// Antrea's agents do not compress; nor does Sluice decompress.
	if enc := r.encoding; enc != "" && enc != "identity" {
		c.respondStatus(st, uint32(codes.Unimplemented), fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", enc))
		return true
	}
	return false
}

// export receives one exporter's stream and says how it ended.
func (e *exportService) export(sctx context.Context, c *h2Conn, st *h2Stream) error {
	s, o := e.s, &e.s.o
	exporter := c.peer
	s.hold(exporter)
	defer s.release(exporter)
	log := o.Log.With("transport", "grpc", "peer", exporter.String())
	// Exporters open a stream per export (every second or so): at info
	// level that would be two lines per exporter per second.
	log.Debug("gRPC export stream opened")
	end := e.receive(sctx, st, exporter, log)
	switch {
	case end.err == nil:
		if o.GRPC.ConfirmWritten {
			if err := e.awaitWritten(sctx); err != nil {
				log.Info("gRPC export stream ended before its records were written", "records", end.n, "err", err)
				return err
			}
		}
		log.Debug("gRPC export stream closed", "records", end.n, "invalid", end.bad)
		return nil
	case end.counted:
		return end.err
	}
	// A message that did not decode (Internal) or was too large
	// (ResourceExhausted): the exporter has let go of its records, so
	// count it. A client that went away is not an error of the stream's
	// content.
	if c := status.Code(end.err); c == codes.Internal || c == codes.ResourceExhausted {
		o.Metrics.DecodeErrors.WithLabelValues("grpc").Inc()
		log.Warn("gRPC export stream ended by an error", "records", end.n, "invalid", end.bad, "err", end.err)
		return end.err
	}
	log.Info("gRPC export stream ended", "records", end.n, "invalid", end.bad, "err", end.err)
	return end.err
}

// awaitWritten sends a mark behind the stream's records and waits until
// the sinks have written everything before it, the exporter goes away
// (sctx) or the collector stops.
func (e *exportService) awaitWritten(sctx context.Context) error {
	answer := make(chan func(context.Context) error, 1)
	if !send(e.ctx, e.s.o.Out, flow.Batch{Written: answer}) {
		return status.Error(codes.Unavailable, "the aggregator is shutting down")
	}
	var wait func(context.Context) error
	select {
	case wait = <-answer:
	case <-e.ctx.Done():
		return status.Error(codes.Unavailable, "the aggregator is shutting down")
	case <-sctx.Done():
		return status.FromContextError(sctx.Err()).Err()
	}
	wctx, cancel := context.WithCancel(sctx)
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)()
	waiting := e.s.o.Metrics.ConfirmsWaiting
	waiting.Inc()
	defer waiting.Dec()
	if err := wait(wctx); err != nil {
		if e.ctx.Err() != nil {
			return status.Error(codes.Unavailable, "the aggregator stopped before the records were written")
		}
		return status.FromContextError(err).Err()
	}
	return nil
}

// receive takes the stream's octets as the connection's reader leaves
// them, decodes their flows and hands them on, until the stream or the
// collector ends.
//
// The records of whole messages wait in pending (at most about
// grpcBatch) while the pipeline is busy, so that one-flow messages
// travel in batches; while pending is full the stream takes nothing
// more, its window is not credited, and the exporter stops (HTTP/2 flow
// control).
func (e *exportService) receive(sctx context.Context, st *h2Stream, exporter netip.Addr, log *slog.Logger) streamEnd {
	o := &e.s.o
	c := st.c
	addr := exporter.String()
	records := o.Metrics.Records.WithLabelValues("grpc", addr)
	skew := o.Metrics.SkewUnknown.WithLabelValues(addr)
	invalid := o.Metrics.Dropped.WithLabelValues("grpc", "invalid")
	tooMany := o.Metrics.Dropped.WithLabelValues("grpc", "too-many-flows")
	messages := o.Metrics.Messages.WithLabelValues("grpc")

	dec := flowproto.NewDecoder()
	var (
		spans        [][]byte
		pending      []*flow.Flow // decoded, not handed on; the next batch's own slice
		slab         []flow.Flow
		spare        *flow.Flow   // a zeroed record to decode into next: one refused, or forwarded
		free         []*flow.Flow // records taken from the pool, zeroed
		n, bad       uint64
		owed         int64 // octets taken, not yet credited to the stream
		ended, reset bool
	)
	body := bodyReader{pool: &c.h.chunks, max: o.GRPC.MaxMessageSize}
	defer body.release()
	// Messages and records are counted in sums, when the stream waits
	// and when it ends, rather than with two atomic additions a message
	// (an agent sends one flow a message).
	var unMessages, unRecords uint64
	flushCounts := func() {
		if unMessages > 0 {
			messages.Add(float64(unMessages))
			unMessages = 0
		}
		if unRecords > 0 {
			records.Add(float64(unRecords))
			unRecords = 0
		}
	}
	defer flushCounts()
	fwd := newStreamForwarder(o, &e.s.arenas)
	defer fwd.close()
	defer func() {
		if o.Records != nil {
			o.Records.PutAll(free) // the ones not used
		}
	}()
	// newRecord returns a zeroed record: the spare, one the mode gave
	// back, or one carved from a slab (one allocation per slabSize).
	newRecord := func() *flow.Flow {
		if f := spare; f != nil {
			spare = nil
			return f
		}
		if len(free) == 0 && o.Records != nil {
			free = o.Records.Take(free, 64)
		}
		if k := len(free); k > 0 {
			f := free[k-1]
			free = free[:k-1]
			return f
		}
		if len(slab) == 0 {
			slab = make([]flow.Flow, slabSize)
		}
		f := &slab[0]
		slab = slab[1:]
		return f
	}
	// queued is how many records (and encoding errors) wait to be
	// handed on: flow records, and export records the fast path wrote.
	queued := func() int { return len(pending) + fwd.queued() }
	// nextBatch is the next batch to hand on, of at most grpcBatch;
	// handed drops what it took from the queue once it is handed on.
	nextBatch := func() flow.Batch {
		b := flow.Batch{Pool: o.Records}
		k := min(len(pending), grpcBatch)
		if k > 0 {
			b.Flows = pending[:k:k] // the batch's own: pending moves past it
		}
		fwd.fill(&b, grpcBatch-k)
		return b
	}
	handed := func(b *flow.Batch) {
		if pending = pending[len(b.Flows):]; len(pending) == 0 {
			pending = nil
		}
		fwd.handed(b)
	}
	// handOn hands the queue on in batches of at most grpcBatch, waiting
	// for room if block (false: the collector stopped), else only while
	// there is room.
	handOn := func(block bool) bool {
		if block {
			flushCounts() // it may wait
		}
		for queued() > 0 {
			b := nextBatch()
			if block {
				if !send(e.ctx, o.Out, b) {
					handed(&b) // send discarded it: its records are released
					return false
				}
			} else {
				select {
				case o.Out <- b:
				default:
					return true
				}
			}
			handed(&b)
		}
		return true
	}
	take := func() int64 {
		var k int64
		k, ended, reset = st.take(&body)
		owed += k
		c.credit(st, &owed, k)
		return k
	}
	// decode decodes the whole messages in buf while pending has room.
	// A message is decoded whole before any of it is kept: one that
	// does not decode ends the stream with none of its records taken,
	// as when gRPC decoded it.
	decode := func() (err error, counted bool) {
		for queued() < grpcBatch {
			msg, err := body.next()
			if err != nil {
				return err, false
			}
			if msg == nil {
				return nil, false // the rest is on its way
			}
			unMessages++
			// Spans only up to the limit: a 4 MiB request of empty
			// Flows would otherwise cost 2 million spans (48 MiB).
			var count int
			spans, count, err = flowproto.RequestFlowsUpTo(msg, spans[:0], o.GRPC.MaxFlows)
			if err != nil {
				return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), false
			}
			if count > o.GRPC.MaxFlows {
				clear(spans)
				tooMany.Add(float64(count))
				log.Warn("ending gRPC export stream: too many flows in one request", "flows", count, "limit", o.GRPC.MaxFlows)
				return status.Errorf(codes.ResourceExhausted, "%d flows in one request, more than %d", count, o.GRPC.MaxFlows), true
			}
			mark := len(pending)
			var fm fwdMark
			if fwd != nil {
				fwd.room(len(spans))
				fm = fwd.mark()
			}
			var unknown, invalidHere, forwarded int
			var firstInvalid error
			for _, sp := range spans {
				f := newRecord()
				u, err := dec.Decode(sp, f)
				if errors.Is(err, flowproto.ErrMalformed) {
					// This message's records are dropped (the
					// garbage collector takes them back: rare).
					clear(pending[mark:])
					pending = pending[:mark]
					if fwd != nil {
						fwd.rollback(fm)
					}
					return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), false
				}
				if err == nil && !f.SourceIP.IsValid() && !f.DestinationIP.IsValid() {
					err = errNoAddress
				}
				if err != nil {
					*f = flow.Flow{}
					spare = f // for the next record
					if invalidHere++; firstInvalid == nil {
						firstInvalid = err
					}
					continue
				}
				unknown += u
				f.Origin.Exporter = exporter
				f.Origin.Transport = "grpc"
				if fwd != nil && fwd.forward(f) {
					spare = f // zeroed, for the next flow
					forwarded++
					continue
				}
				if pending == nil {
					pending = make([]*flow.Flow, 0, 16)
				}
				pending = append(pending, f)
			}
			clear(spans) // nor keep the message's buffer
			if fwd != nil {
				fwd.offer()
			}
			if k := len(pending) - mark + forwarded; k > 0 {
				n += uint64(k)
				unRecords += uint64(k)
			}
			if invalidHere > 0 {
				if bad == 0 {
					log.Warn("dropping gRPC records with invalid values (further ones on this stream are only counted)", "err", firstInvalid)
				}
				bad += uint64(invalidHere)
				invalid.Add(float64(invalidHere))
			}
			if unknown > 0 {
				skew.Add(float64(unknown))
			}
		}
		return nil, false
	}
	unavailable := streamEnd{err: status.Error(codes.Unavailable, "the aggregator is shutting down"), counted: true}
	// finish hands on the records of the whole messages received, then
	// says how the stream ended.
	finish := func(err error, counted bool) streamEnd {
		flushCounts()
		if !handOn(true) {
			unavailable.n, unavailable.bad = n, bad
			return unavailable
		}
		return streamEnd{err: err, counted: counted, n: n, bad: bad}
	}
	take() // a request without a body has ended already
	for {
		if err, counted := decode(); err != nil {
			return finish(err, counted)
		}
		handOn(false)
		room := queued() < grpcBatch
		if room && body.ready() {
			continue // pending was full; it has room again
		}
		if room && (ended || reset) {
			// Every frame is taken and every whole message decoded.
			switch {
			case reset:
				return finish(status.FromContextError(context.Canceled).Err(), false)
			case body.partial():
				return finish(status.Error(codes.Internal, io.ErrUnexpectedEOF.Error()), false)
			}
			return finish(nil, false)
		}
		var out chan<- flow.Batch
		var b flow.Batch
		if queued() > 0 {
			b, out = nextBatch(), o.Out
		}
		var wake <-chan struct{}
		if room {
			wake = st.wake
		}
		flushCounts()
		select {
		case out <- b:
			handed(&b)
		case <-wake:
			take()
		case <-sctx.Done():
			// The client reset the stream, went away or reached its
			// deadline: what it sent whole still goes on.
			// Only what the client's stream window lets in is drained:
			// the stream is no longer credited, so a client past its
			// deadline cannot keep it going.
			drain := func() int64 {
				var k int64
				k, ended, reset = st.take(&body)
				c.credit(nil, nil, k)
				return k
			}
			for {
				for {
					if err, counted := decode(); err != nil {
						return finish(err, counted)
					}
					if queued() < grpcBatch && !body.ready() {
						break
					}
					if !handOn(true) {
						unavailable.n, unavailable.bad = n, bad
						return unavailable
					}
				}
				if drain() == 0 {
					break
				}
			}
			return finish(status.FromContextError(sctx.Err()).Err(), false)
		case <-e.ctx.Done():
			unavailable.n, unavailable.bad = n, bad
			return unavailable
		}
	}
}

// errNoAddress refuses a flow that names no endpoint (an empty Flow, for
// one): nothing downstream can use it.
var errNoAddress = errors.New("a flow with neither a source nor a destination address")

// grpcBatch is the most records of one ExportRequest handed on as one
// Batch.
const grpcBatch = 1024
