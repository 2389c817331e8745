package collector

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !handlers.enter() {
				writeStatus(w, status.New(codes.Unavailable, "the aggregator is shutting down"))
				return
			}
			defer handlers.leave()
			svc.serve(w, r)
		}),
		// HTTP/2's own complaints (a bad preface, a reset) are the
		// client's business; kept for debugging.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: int(o.GRPC.MaxStreams),
			// What a connection may have sent and the collector not
			// read yet (the pipeline is full): bounded per connection.
			MaxReceiveBufferPerConnection: grpcConnWindow,
			MaxReceiveBufferPerStream:     grpcStreamWindow,
			// Keeps a dead peer from holding its streams forever, as
			// grpc-go's keepalive would.
			SendPingTimeout: 2 * time.Hour,
			PingTimeout:     20 * time.Second,
		},
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(hl) }()
	var err error
	select {
	case err = <-served:
		srv.Close()
	case <-ctx.Done():
		// Handlers see ctx and return, so the graceful stop is quick;
		// the timeout is the bound.
		sctx, cancel := context.WithTimeout(context.Background(), o.GRPC.StopTimeout)
		if srv.Shutdown(sctx) != nil {
			o.Log.Warn("gRPC collector did not stop gracefully in time; closing its connections", "timeout", o.GRPC.StopTimeout.String())
			srv.Close()
		}
		cancel()
		<-served
	}
	hl.Close()
	handlers.closeAndWait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("collector: grpc: %w", err)
	}
	return nil
}

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

// maxKeptRequestBuffer is the largest message buffer a stream keeps
// between messages; a larger one (a rare large request) is let go.
const maxKeptRequestBuffer = 256 << 10

// streamEnd is how a stream's receiving ended: err is the error to
// return (nil for the exporter's end of stream); counted says the ending
// was already counted and logged.
type streamEnd struct {
	err     error
	counted bool
	n, bad  uint64
}

// serve answers one HTTP/2 request: an Export call or a refusal.
func (e *exportService) serve(w http.ResponseWriter, r *http.Request) {
	if grpcRequestError(w, r, flowpb.FlowExportService_Export_FullMethodName) {
		return
	}
	sctx := r.Context()
	if v := r.Header.Get("Grpc-Timeout"); v != "" {
		if d, ok := grpcTimeout(v); ok {
			var cancel context.CancelFunc
			sctx, cancel = context.WithTimeout(sctx, d)
			defer cancel()
		}
	}
	if err := e.export(sctx, r); err != nil {
		writeStatus(w, status.Convert(err))
		return
	}
	// An ExportResponse has no fields: its encoding is empty.
	writeResponse(w, nil)
}

// export receives one exporter's stream. Receiving, decoding and handing
// on run in their own goroutine so that the handler can end the stream
// when the collector stops, even while the exporter is idle.
func (e *exportService) export(sctx context.Context, r *http.Request) error {
	s, o := e.s, &e.s.o
	var exporter netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		exporter = ap.Addr().Unmap()
	}
	s.hold(exporter)
	defer s.release(exporter)
	log := o.Log.With("transport", "grpc", "peer", exporter.String())
	done := make(chan streamEnd, 1)
	pending := make(chan []*flow.Flow, 1)
	// queued counts the batches put in pending that the handler has not
	// handed on yet: while there are none, the receiver hands its records
	// on itself when the pipeline has room (no hand-off through this
	// goroutine), without overtaking any.
	var queued atomic.Int32
	go func() { done <- e.receive(sctx, r.Body, exporter, log, pending, &queued) }()
	// A read waits for the client; the call's end (a reset, its
	// deadline) ends the read.
	defer context.AfterFunc(sctx, func() { r.Body.Close() })()
	received := false
	defer func() {
		if !received {
			// Unblocks the receiver's read; it ends at once.
			r.Body.Close()
			<-done
		}
	}()
	// Exporters open a stream per export (every second or so): at info
	// level that would be two lines per exporter per second.
	log.Debug("gRPC export stream opened")
	for {
		var end streamEnd
		select {
		case recs := <-pending:
			if !send(e.ctx, o.Out, flow.Batch{Flows: recs, Pool: o.Records}) {
				return status.Error(codes.Unavailable, "the aggregator is shutting down")
			}
			queued.Add(-1)
			continue
		case end = <-done:
			received = true
		case <-e.ctx.Done():
			return status.Error(codes.Unavailable, "the aggregator is shutting down")
		}
		// The receiver's last records went into pending before it ended.
		select {
		case recs := <-pending:
			if !send(e.ctx, o.Out, flow.Batch{Flows: recs, Pool: o.Records}) {
				return status.Error(codes.Unavailable, "the aggregator is shutting down")
			}
		default:
		}
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
		// (ResourceExhausted): the exporter has let go of its records,
		// so count it. A client that went away is not an error of the
		// stream's content.
		if c := status.Code(end.err); c == codes.Internal || c == codes.ResourceExhausted {
			o.Metrics.DecodeErrors.WithLabelValues("grpc").Inc()
			log.Warn("gRPC export stream ended by an error", "records", end.n, "invalid", end.bad, "err", end.err)
			return end.err
		}
		log.Info("gRPC export stream ended", "records", end.n, "invalid", end.bad, "err", end.err)
		return end.err
	}
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

// receive reads the stream's requests, decodes their flows straight from
// the wire and hands them on, until the stream or the collector ends.
//
// Records go to pending, which holds at most one batch; the handler
// takes it from there into the pipeline. While the pipeline is busy, the
// records of the messages that arrive meanwhile join the waiting batch
// (up to grpcBatch), so that one-flow messages travel in batches.
func (e *exportService) receive(sctx context.Context, body io.Reader, exporter netip.Addr, log *slog.Logger, pending chan []*flow.Flow, queued *atomic.Int32) streamEnd {
	o := &e.s.o
	addr := exporter.String()
	records := o.Metrics.Records.WithLabelValues("grpc", addr)
	skew := o.Metrics.SkewUnknown.WithLabelValues(addr)
	invalid := o.Metrics.Dropped.WithLabelValues("grpc", "invalid")
	tooMany := o.Metrics.Dropped.WithLabelValues("grpc", "too-many-flows")
	messages := o.Metrics.Messages.WithLabelValues("grpc")

	dec := flowproto.NewDecoder()
	br, _ := e.s.readers.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(body, grpcReadBuffer)
	} else {
		br.Reset(body)
	}
	defer func() { br.Reset(nil); e.s.readers.Put(br) }()
	mr := messageReader{br: br, max: o.GRPC.MaxMessageSize}
	var (
		spans   [][]byte
		decoded []*flow.Flow // the records of whole messages, not handed on yet
		slab    []flow.Flow
		spare   *flow.Flow // a record taken for one that was refused, zeroed
		n, bad  uint64
	)
	// newRecord returns a zeroed record: the spare, one the mode gave
	// back, or one carved from a slab (one allocation per slabSize).
	newRecord := func() *flow.Flow {
		if f := spare; f != nil {
			spare = nil
			return f
		}
		if o.Records != nil {
			if f := o.Records.Get(); f != nil {
				return f
			}
		}
		if len(slab) == 0 {
			slab = make([]flow.Flow, slabSize)
		}
		f := &slab[0]
		slab = slab[1:]
		return f
	}
	// flush hands on what decoded holds, in batches of at most grpcBatch
	// records.
	flush := func() bool {
		for rest := decoded; len(rest) > 0; {
			k := min(len(rest), grpcBatch)
			n += uint64(k)
			records.Add(float64(k))
			if !e.handOn(pending, queued, rest[:k]) {
				return false
			}
			rest = rest[k:]
		}
		clear(decoded) // the pipeline owns the records now
		decoded = decoded[:0]
		return true
	}
	// end hands on the records of the messages before the one that ended
	// the stream, then says how it ended.
	end := func(err error, counted bool) streamEnd {
		if !flush() {
			return streamEnd{err: status.Error(codes.Unavailable, "the aggregator is shutting down"), counted: true, n: n, bad: bad}
		}
		return streamEnd{err: err, counted: counted, n: n, bad: bad}
	}
	for {
		msg, err := mr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			} else if _, ok := status.FromError(err); !ok {
				// The client reset the stream or went away.
				err = status.FromContextError(context.Canceled).Err()
				if sctx.Err() != nil {
					err = status.FromContextError(sctx.Err()).Err()
				}
			}
			return end(err, false)
		}
		messages.Inc()
		spans, err = flowproto.RequestFlows(msg, spans[:0])
		if err != nil {
			return end(status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), false)
		}
		if len(spans) > o.GRPC.MaxFlows {
			tooMany.Add(float64(len(spans)))
			log.Warn("ending gRPC export stream: too many flows in one request", "flows", len(spans), "limit", o.GRPC.MaxFlows)
			return end(status.Errorf(codes.ResourceExhausted, "%d flows in one request, more than %d", len(spans), o.GRPC.MaxFlows), true)
		}
		// The whole request is decoded before any of it is handed on:
		// a request that does not decode ends the stream with none of
		// its records taken, as when gRPC decoded it.
		mark := len(decoded)
		var unknown, invalidHere int
		var firstInvalid error
		for _, sp := range spans {
			f := newRecord()
			u, err := dec.Decode(sp, f)
			if errors.Is(err, flowproto.ErrMalformed) {
				// This message's records are dropped (the garbage
				// collector takes them back: rare).
				clear(decoded[mark:])
				decoded = decoded[:mark]
				return end(status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), false)
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
			decoded = append(decoded, f)
		}
		clear(spans) // nor keep the message's buffer
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
		if cap(mr.buf) > maxKeptRequestBuffer {
			mr.buf = nil
		}
		// While the next message is already read whole, the records
		// wait for it: one-Flow messages travel together, with one
		// hand-off.
		if len(decoded) < grpcBatch && mr.buffered() {
			continue
		}
		if !flush() {
			return streamEnd{err: status.Error(codes.Unavailable, "the aggregator is shutting down"), counted: true, n: n, bad: bad}
		}
	}
}

// handOn hands recs (at most grpcBatch) on: straight into the pipeline
// when no batch of the stream is queued before them and the pipeline has
// room; else it adds them to the batch waiting in pending, or puts them
// there as a new one, waiting while a full batch is there. Only the
// receiver puts into pending, so a put after a take never blocks.
func (e *exportService) handOn(pending chan []*flow.Flow, queued *atomic.Int32, recs []*flow.Flow) bool {
	ctx, o := e.ctx, &e.s.o
	if queued.Load() == 0 {
		select {
		case o.Out <- flow.Batch{Flows: slices.Clone(recs), Pool: o.Records}:
			return true
		default:
		}
	}
	select {
	case b := <-pending:
		if len(b)+len(recs) <= grpcBatch {
			pending <- append(b, recs...)
			return true
		}
		pending <- b
	default:
		queued.Add(1)
		pending <- slices.Clone(recs)
		return true
	}
	queued.Add(1)
	select {
	case pending <- slices.Clone(recs):
		return true
	case <-ctx.Done():
		return false
	}
}

// errNoAddress refuses a flow that names no endpoint (an empty Flow, for
// one): nothing downstream can use it.
var errNoAddress = errors.New("a flow with neither a source nor a destination address")

// grpcBatch is the most records of one ExportRequest handed on as one
// Batch.
const grpcBatch = 1024
