package collector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/grpcserve"
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
	creds := &countingCreds{
		TransportCredentials: credentials.NewTLS(tlsConfig),
		handshakeRefused:     o.Metrics.Refused.WithLabelValues("grpc", "tls-handshake"),
		metrics:              o.Metrics,
		log:                  log,
	}
	ln = &slotListener{Listener: ln, s: s, log: log,
		limitRefused: o.Metrics.Refused.WithLabelValues("grpc", "session-limit"),
		sessions:     o.Metrics.Sessions.WithLabelValues("grpc")}
	srv := grpc.NewServer(
		grpc.Creds(creds),
		grpc.MaxRecvMsgSize(o.GRPC.MaxMessageSize),
		grpc.MaxConcurrentStreams(o.GRPC.MaxStreams),
		grpc.ConnectionTimeout(o.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
		grpc.ForceServerCodecV2(rawCodec{proto: encoding.GetCodecV2(protoenc.Name)}),
	)
	flowpb.RegisterFlowExportServiceServer(srv, &exportService{s: s, ctx: ctx})
	// Handlers see ctx and return, so the graceful stop is quick; the
	// timeout is the bound.
	err := grpcserve.Serve(ctx, srv, ln, o.GRPC.StopTimeout, func() {
		o.Log.Warn("gRPC collector did not stop gracefully in time; closing its connections", "timeout", o.GRPC.StopTimeout.String())
	})
	if err != nil {
		return fmt.Errorf("collector: grpc: %w", err)
	}
	return nil
}

// countingCreds is the server's TLS with the collector's accounting of
// failed handshakes (no or bad client certificate), counted and logged.
type countingCreds struct {
	credentials.TransportCredentials
	handshakeRefused prometheus.Counter
	metrics          *Metrics
	log              *slog.Logger
}

func (c *countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		handshakeFailed(c.metrics, c.handshakeRefused, c.log.With("peer", raw.RemoteAddr().String()), "grpc", "gRPC connection", err)
		return nil, nil, err
	}
	return conn, info, nil
}

func (c *countingCreds) Clone() credentials.TransportCredentials {
	d := *c
	d.TransportCredentials = c.TransportCredentials.Clone()
	return &d
}

// slotListener gives each accepted connection a session slot, shared
// with the IPFIX TCP sessions, or closes it at once when none is free. The
// slot is taken on the raw connection, which gRPC closes on every path
// (a failed handshake, a failed transport setup, the end of the
// connection), so it always comes back.
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
	flowpb.UnimplementedFlowExportServiceServer
	s   *Server
	ctx context.Context // the collector's run
}

// rawRequest is an ExportRequest as it came off the wire: rawCodec hands
// its bytes over undecoded, and flowproto.Decoder reads the flows from
// them. One per stream, reused for each message.
type rawRequest struct{ b []byte }

// rawCodec is the collector server's codec: Protobuf, except that a
// rawRequest receives the message's bytes. It is forced on the
// collector's own server only (which serves FlowExportService alone).
type rawCodec struct{ proto encoding.CodecV2 }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rawRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	// Copied: gRPC frees data when Unmarshal returns.
	n := data.Len()
	r.b = slices.Grow(r.b[:0], n)[:n]
	data.CopyTo(r.b)
	return nil
}

func (rawCodec) Name() string { return "proto" }

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

// Export receives one exporter's stream. Receiving, decoding and handing
// on run in their own goroutine so that the handler can end the stream
// when the collector stops, even while the exporter is idle.
func (e *exportService) Export(stream flowpb.FlowExportService_ExportServer) error {
	s, o := e.s, &e.s.o
	sctx := stream.Context()
	var exporter netip.Addr
	if p, ok := peer.FromContext(sctx); ok && p.Addr != nil {
		exporter = addrOf(p.Addr)
	}
	s.hold(exporter)
	defer s.release(exporter)
	log := o.Log.With("transport", "grpc", "peer", exporter.String())
	done := make(chan streamEnd, 1)
	pending := make(chan []*flow.Flow, 1)
	go func() { done <- e.receive(stream, exporter, log, pending) }()
	log.Info("gRPC export stream opened")
	for {
		var end streamEnd
		select {
		case recs := <-pending:
			if !send(e.ctx, o.Out, flow.Batch{Flows: recs}) {
				return status.Error(codes.Unavailable, "the aggregator is shutting down")
			}
			continue
		case end = <-done:
		case <-e.ctx.Done():
			return status.Error(codes.Unavailable, "the aggregator is shutting down")
		}
		// The receiver's last records went into pending before it ended.
		select {
		case recs := <-pending:
			if !send(e.ctx, o.Out, flow.Batch{Flows: recs}) {
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
			log.Info("gRPC export stream closed", "records", end.n, "invalid", end.bad)
			return stream.SendAndClose(&flowpb.ExportResponse{})
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
func (e *exportService) receive(stream flowpb.FlowExportService_ExportServer, exporter netip.Addr, log *slog.Logger, pending chan []*flow.Flow) streamEnd {
	o := &e.s.o
	addr := exporter.String()
	records := o.Metrics.Records.WithLabelValues("grpc", addr)
	skew := o.Metrics.SkewUnknown.WithLabelValues(addr)
	invalid := o.Metrics.Dropped.WithLabelValues("grpc", "invalid")
	tooMany := o.Metrics.Dropped.WithLabelValues("grpc", "too-many-flows")
	messages := o.Metrics.Messages.WithLabelValues("grpc")

	dec := flowproto.NewDecoder()
	var (
		req     rawRequest
		spans   [][]byte
		decoded []*flow.Flow
		slab    []flow.Flow
		n, bad  uint64
	)
	for {
		if err := stream.RecvMsg(&req); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return streamEnd{err: err, n: n, bad: bad}
		}
		messages.Inc()
		var err error
		spans, err = flowproto.RequestFlows(req.b, spans[:0])
		if err != nil {
			return streamEnd{err: status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), n: n, bad: bad}
		}
		if len(spans) > o.GRPC.MaxFlows {
			tooMany.Add(float64(len(spans)))
			log.Warn("ending gRPC export stream: too many flows in one request", "flows", len(spans), "limit", o.GRPC.MaxFlows)
			return streamEnd{err: status.Errorf(codes.ResourceExhausted, "%d flows in one request, more than %d", len(spans), o.GRPC.MaxFlows), counted: true, n: n, bad: bad}
		}
		// The whole request is decoded before any of it is handed on:
		// a request that does not decode ends the stream with none of
		// its records taken, as when gRPC decoded it.
		decoded = decoded[:0]
		var unknown, invalidHere int
		var firstInvalid error
		for _, sp := range spans {
			if len(slab) == 0 {
				slab = make([]flow.Flow, slabSize)
			}
			f := &slab[0]
			u, err := dec.Decode(sp, f)
			if errors.Is(err, flowproto.ErrMalformed) {
				*f = flow.Flow{}
				return streamEnd{err: status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err), n: n, bad: bad}
			}
			if err == nil && !f.SourceIP.IsValid() && !f.DestinationIP.IsValid() {
				err = errNoAddress
			}
			if err != nil {
				*f = flow.Flow{} // reused for the next record
				if invalidHere++; firstInvalid == nil {
					firstInvalid = err
				}
				continue
			}
			slab = slab[1:]
			unknown += u
			f.Origin.Exporter = exporter
			f.Origin.Transport = "grpc"
			decoded = append(decoded, f)
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
		// Handed on in batches of at most grpcBatch records.
		for rest := decoded; len(rest) > 0; {
			k := min(len(rest), grpcBatch)
			n += uint64(k)
			records.Add(float64(k))
			if !handOn(e.ctx, pending, rest[:k]) {
				return streamEnd{err: status.Error(codes.Unavailable, "the aggregator is shutting down"), counted: true, n: n, bad: bad}
			}
			rest = rest[k:]
		}
		clear(decoded) // the pipeline owns the records now
		clear(spans)   // nor keep the message's buffer
		if cap(req.b) > maxKeptRequestBuffer {
			req.b = nil
		}
	}
}

// handOn adds recs (at most grpcBatch) to the batch waiting in pending,
// or puts them there as a new one, waiting while a full batch is there.
// Only the receiver puts into pending, so a put after a take never blocks.
func handOn(ctx context.Context, pending chan []*flow.Flow, recs []*flow.Flow) bool {
	select {
	case b := <-pending:
		if len(b)+len(recs) <= grpcBatch {
			pending <- append(b, recs...)
			return true
		}
		pending <- b
	default:
		pending <- slices.Clone(recs)
		return true
	}
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
