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
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
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
	log              *slog.Logger
}

func (c *countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.handshakeRefused.Inc()
		c.log.Warn("refusing gRPC connection: TLS handshake failed", "peer", raw.RemoteAddr().String(), "err", err)
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

// Export receives one exporter's stream. Receiving runs in its own
// goroutine so that the handler can end the stream when the collector
// stops, even while the exporter is idle.
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
	addr := exporter.String()
	records := o.Metrics.Records.WithLabelValues("grpc", addr)
	skew := o.Metrics.SkewUnknown.WithLabelValues(addr)
	invalid := o.Metrics.Dropped.WithLabelValues("grpc", "invalid")
	tooMany := o.Metrics.Dropped.WithLabelValues("grpc", "too-many-flows")
	decodeErrors := o.Metrics.DecodeErrors.WithLabelValues("grpc")
	messages := o.Metrics.Messages.WithLabelValues("grpc")

	reqs := make(chan *flowpb.ExportRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-sctx.Done():
				recvErr <- sctx.Err()
				return
			}
		}
	}()
	log.Info("gRPC export stream opened")
	var slab []flow.Flow
	var n, bad uint64
	for {
		var req *flowpb.ExportRequest
		select {
		case req = <-reqs:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				log.Info("gRPC export stream closed", "records", n, "invalid", bad)
				return stream.SendAndClose(&flowpb.ExportResponse{})
			}
			// A message that did not decode (gRPC says Internal) or was
			// too large (ResourceExhausted): the exporter has let go of
			// its records, so count it. A client that went away is not
			// an error of the stream's content.
			if c := status.Code(err); c == codes.Internal || c == codes.ResourceExhausted {
				decodeErrors.Inc()
				log.Warn("gRPC export stream ended by an error", "records", n, "invalid", bad, "err", err)
				return err
			}
			log.Info("gRPC export stream ended", "records", n, "invalid", bad, "err", err)
			return err
		case <-e.ctx.Done():
			return status.Error(codes.Unavailable, "the aggregator is shutting down")
		}
		messages.Inc()
		flows := req.GetFlows()
		if len(flows) > o.GRPC.MaxFlows {
			tooMany.Add(float64(len(flows)))
			log.Warn("ending gRPC export stream: too many flows in one request", "flows", len(flows), "limit", o.GRPC.MaxFlows)
			return status.Errorf(codes.ResourceExhausted, "%d flows in one request, more than %d", len(flows), o.GRPC.MaxFlows)
		}
		// Converted and handed on in batches of at most grpcBatch, so that
		// a large request is never held converted all at once.
		for len(flows) > 0 {
			k := min(len(flows), grpcBatch)
			b := flow.Batch{Flows: make([]*flow.Flow, 0, k)}
			unknown := 0
			for _, p := range flows[:k] {
				if len(slab) == 0 {
					slab = make([]flow.Flow, slabSize)
				}
				f := &slab[0]
				u, err := flowproto.ToFlow(p, f)
				if err == nil && !f.SourceIP.IsValid() && !f.DestinationIP.IsValid() {
					err = errNoAddress
				}
				if err != nil {
					*f = flow.Flow{} // reused for the next record
					if bad++; bad == 1 {
						log.Warn("dropping gRPC records with invalid values (further ones on this stream are only counted)", "err", err)
					}
					invalid.Inc()
					continue
				}
				slab = slab[1:]
				unknown += u
				f.Origin.Exporter = exporter
				f.Origin.Transport = "grpc"
				b.Flows = append(b.Flows, f)
			}
			flows = flows[k:]
			n += uint64(len(b.Flows))
			records.Add(float64(len(b.Flows)))
			if unknown > 0 {
				skew.Add(float64(unknown))
			}
			if len(b.Flows) > 0 && !send(e.ctx, o.Out, b) {
				return status.Error(codes.Unavailable, "the aggregator is shutting down")
			}
		}
	}
}

// errNoAddress refuses a flow that names no endpoint (an empty Flow, for
// one): nothing downstream can use it.
var errNoAddress = errors.New("a flow with neither a source nor a destination address")

// grpcBatch is the most records of one ExportRequest handed on as one
// Batch.
const grpcBatch = 1024
