// Package flowstream serves FlowStreamService.GetFlows: users and UIs read
// the records the aggregator hands to its sinks, filtered, starting with
// the history the aggregator's buffer still holds and, with follow, going
// on live. Each stream reads the buffer as an observer of its own: a slow
// reader never holds back the pipeline or the sinks; it loses records and
// is told how many (dropped_count, cumulative). It also has the client
// `sluice get flows` uses.
package flowstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/grpcserve"
	"sluice/ring"
)

// Options configures a Server.
type Options struct {
	Buffer *ring.Buffer[*flow.Flow]
	// TLS is the server's TLS configuration (no client certificate is
	// asked for). Required.
	TLS *tls.Config
	// MaxStreams bounds concurrent GetFlows streams; default 64.
	MaxStreams int
	// MaxConnections bounds the open connections, default 256: clients
	// need no certificate, so idle connections must not pile up. Past it,
	// new connections wait to be accepted.
	MaxConnections int
	// BatchSize is the most flows in one response; default 100.
	BatchSize int
	// StopTimeout bounds the graceful stop; default 5 s.
	StopTimeout time.Duration
	Log         *slog.Logger
	Metrics     *Metrics
}

// Metrics are the service's Prometheus series.
type Metrics struct {
	Streams  prometheus.Gauge
	Refused  prometheus.Counter
	Sent     prometheus.Counter
	Dropped  prometheus.Counter
	Invalid  prometheus.Counter
	Requests *prometheus.CounterVec // result: ok, invalid-argument
}

// NewMetrics creates the series and registers them with reg when it is not
// nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_flowstream_streams_open",
			Help: "Open GetFlows streams."}),
		Refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_flowstream_streams_refused_total",
			Help: "GetFlows streams refused because MaxStreams were open."}),
		Sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_flowstream_flows_sent_total",
			Help: "Flows sent on GetFlows streams."}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_flowstream_flows_dropped_total",
			Help: "Flows GetFlows streams lost because they read too slowly (the buffer overwrote them)."}),
		Invalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_flowstream_flows_invalid_total",
			Help: "Flows not sent because they have no Protobuf form (labels that are not a JSON object)."}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_flowstream_requests_total",
			Help: "GetFlows requests, by result."}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.Streams, m.Refused, m.Sent, m.Dropped, m.Invalid, m.Requests)
	}
	return m
}

// Server is FlowStreamService.
type Server struct {
	flowpb.UnimplementedFlowStreamServiceServer
	o     Options
	slots chan struct{}
	// stop ends every stream when Serve's context ends.
	stop context.Context
}

// New checks o.
func New(o Options) (*Server, error) {
	if o.Buffer == nil || o.TLS == nil {
		return nil, errors.New("flowstream: Options.Buffer and Options.TLS are required")
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = 64
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = 256
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 100
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	return &Server{o: o, slots: make(chan struct{}, o.MaxStreams)}, nil
}

// Serve serves on ln until ctx ends; streams also end, after sending what
// they hold, when the buffer closes.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// Unauthenticated clients may connect: bound how long a connection
	// may take to set up, as well as the streams (MaxStreams).
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(s.o.TLS)), grpc.MaxRecvMsgSize(64<<10), grpc.WaitForHandlers(true),
		grpc.ConnectionTimeout(10*time.Second), grpc.ForceServerCodecV2(wireCodec{proto: encoding.GetCodecV2(grpcproto.Name)}))
	s.stop = ctx
	ln = netutil.LimitListener(ln, s.o.MaxConnections)
	flowpb.RegisterFlowStreamServiceServer(srv, s)
	if err := grpcserve.Serve(ctx, srv, ln, s.o.StopTimeout, nil); err != nil {
		return fmt.Errorf("flowstream: %w", err)
	}
	return nil
}

// GetFlows sends the retained history that passes the filter, then, with
// follow, new flows as they come, until the client goes, the buffer
// closes, max_count flows were sent or the server stops.
func (s *Server) GetFlows(req *flowpb.GetFlowsRequest, st flowpb.FlowStreamService_GetFlowsServer) error {
	m := s.o.Metrics
	filter, err := Compile(req.GetFilter())
	if err != nil {
		m.Requests.WithLabelValues("invalid-argument").Inc()
		return status.Errorf(codes.InvalidArgument, "filter: %v", err)
	}
	var since time.Time
	if ts := req.GetSince(); ts != nil {
		if err := ts.CheckValid(); err != nil {
			m.Requests.WithLabelValues("invalid-argument").Inc()
			return status.Errorf(codes.InvalidArgument, "since: %v", err)
		}
		since = ts.AsTime()
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		m.Refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "%d flow streams are open already", s.o.MaxStreams)
	}
	m.Requests.WithLabelValues("ok").Inc()
	m.Streams.Inc()
	defer m.Streams.Dec()

	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	if s.stop != nil {
		defer context.AfterFunc(s.stop, cancel)()
	}
	buf := s.o.Buffer
	c := buf.Observer()
	defer c.Close()
	// Without follow, read what the buffer held when the stream began.
	end := buf.Produced()
	start := uint64(0)
	if n := uint64(buf.Cap()); end > n {
		start = end - n
	}
	remaining := end - start
	maxCount := uint64(req.GetMaxCount())
	var sent, lost, reported uint64
	var batch []*flow.Flow
	// Each response is written straight to its wire form, reusing one
	// buffer: building Protobuf objects cost about 15 allocations a flow.
	resp := &encodedResponse{}
	for req.GetFollow() || remaining > 0 {
		var ok bool
		batch, ok = c.Next(ctx, batch[:0], s.o.BatchSize)
		if !ok {
			break
		}
		if d := c.Lost - lost; d > 0 {
			m.Dropped.Add(float64(d))
			remaining -= min(remaining, d)
			lost = c.Lost
		}
		remaining -= min(remaining, uint64(len(batch)))
		resp.reset()
		n := 0
		for _, f := range batch {
			if maxCount > 0 && sent+uint64(n) >= maxCount {
				break
			}
			if !since.IsZero() && before(f, since) || !filter.Match(f) {
				continue
			}
			var err error
			if resp.b, err = flowproto.AppendFlowField(resp.b, 1, f); err != nil {
				m.Invalid.Inc()
				continue
			}
			n++
		}
		// resp holds copies: the records can be reused.
		c.Release(0)
		if n == 0 && c.Lost == reported {
			continue
		}
		resp.b = appendVarintField(resp.b, 2, c.Lost) // dropped_count
		reported = c.Lost
		if err := st.SendMsg(resp); err != nil {
			return err
		}
		sent += uint64(n)
		m.Sent.Add(float64(n))
		if maxCount > 0 && sent >= maxCount {
			break
		}
	}
	if err := ctx.Err(); err != nil && st.Context().Err() == nil {
		return status.Error(codes.Unavailable, "the aggregator is shutting down")
	}
	return nil
}

// before reports whether f ended before t: by its end time, or when it has
// none by the time it was exported.
func before(f *flow.Flow, t time.Time) bool {
	if f.Present.Has(flow.EndTime) {
		return f.EndTime.Before(t)
	}
	if !f.Origin.ExportTime.IsZero() {
		return f.Origin.ExportTime.Before(t)
	}
	return false
}

// encodedResponse is a GetFlowsResponse in its wire form, built by the
// stream and reused for each response.
type encodedResponse struct{ b []byte }

// maxKeptResponse bounds the buffer a stream keeps between responses
// (a batch of records with very long labels may need more, once).
const maxKeptResponse = 1 << 20

func (r *encodedResponse) reset() {
	if cap(r.b) > maxKeptResponse {
		r.b = nil
	}
	r.b = r.b[:0]
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b // proto3 leaves out zero values
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// wireCodec is gRPC's Protobuf codec (named "proto", so the content type
// is unchanged), which also sends encodedResponses as they are.
type wireCodec struct{ proto encoding.CodecV2 }

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*encodedResponse); ok {
		// Copied into a buffer of gRPC's pool: gRPC may write the message
		// after SendMsg returns, and frees the copy then, while the
		// stream reuses r at once.
		return mem.BufferSlice{mem.Copy(r.b, mem.DefaultBufferPool())}, nil
	}
	return c.proto.Marshal(v)
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c wireCodec) Name() string { return c.proto.Name() }
