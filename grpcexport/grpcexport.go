// Package grpcexport sends flow records to an aggregator over gRPC
// (Antrea's FlowExportService.Export, one client stream per connection),
// always with mutual TLS. Records are queued in a bounded buffer that
// Send never blocks on; Run connects, streams the buffer in batches and,
// when the connection fails, reconnects with exponential backoff while the
// buffer keeps the newest records (the oldest are dropped, and counted,
// when it is full).
//
// Delivery is at most once: a batch the stream refused is sent again on
// the next connection, but batches sent just before a connection broke
// may be lost (the Export stream has no acknowledgements).
package grpcexport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
)

// Options configures a Sender.
type Options struct {
	// Address is the aggregator's host:port (its sluice.grpcAddress).
	Address string
	// TLS must hold a client certificate and the CA that signed the
	// aggregator's certificate (certs.Bundle.ClientTLS gives one).
	TLS *tls.Config
	// BatchSize is the most records in one ExportRequest; default 100.
	BatchSize int
	// BufferSize is the most records held while the aggregator is slow or
	// unreachable; default 65536.
	BufferSize int
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubling from one to the other; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// DrainTimeout bounds the time Run spends sending what is buffered
	// once its context ends; default 5 s.
	DrainTimeout time.Duration
	Log          *slog.Logger
	Metrics      *Metrics
}

// Metrics are the sender's Prometheus series.
type Metrics struct {
	Sent       prometheus.Counter
	Dropped    *prometheus.CounterVec // reason: buffer-full, invalid, shutdown
	Buffered   prometheus.Gauge
	Connected  prometheus.Gauge
	Reconnects prometheus.Counter
}

// NewMetrics creates the series and registers them with reg when it is not
// nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_grpcexport_records_sent_total",
			Help: "Records written to the aggregator's Export stream."}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_grpcexport_records_dropped_total",
			Help: "Records dropped before sending: buffer-full (oldest dropped), invalid (not representable in Protobuf), shutdown (still buffered when the drain timed out)."}, []string{"reason"}),
		Buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_grpcexport_records_buffered",
			Help: "Records waiting to be sent."}),
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_grpcexport_connected",
			Help: "1 while an Export stream is open."}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_grpcexport_connection_failures_total",
			Help: "Failed connection attempts and broken streams."}),
	}
	if reg != nil {
		reg.MustRegister(m.Sent, m.Dropped, m.Buffered, m.Connected, m.Reconnects)
	}
	return m
}

// Sender queues records and streams them to one aggregator.
type Sender struct {
	o Options

	mu    sync.Mutex
	buf   []*flow.Flow // ring
	head  int          // index of the oldest record
	n     int          // records in buf
	ready chan struct{}

	fullDrops, invalidDrops, shutdownDrops prometheus.Counter
}

// New checks o and returns a sender; nothing connects until Run.
func New(o Options) (*Sender, error) {
	if o.Address == "" {
		return nil, errors.New("grpcexport: Options.Address is required")
	}
	if o.TLS == nil || len(o.TLS.Certificates) == 0 && o.TLS.GetClientCertificate == nil {
		return nil, errors.New("grpcexport: Options.TLS with a client certificate is required (the aggregator only accepts mutual TLS)")
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 100
	}
	if o.BufferSize <= 0 {
		o.BufferSize = 65536
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(30*time.Second, o.MinBackoff)
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	return &Sender{o: o, buf: make([]*flow.Flow, o.BufferSize), ready: make(chan struct{}, 1),
		fullDrops:     o.Metrics.Dropped.WithLabelValues("buffer-full"),
		invalidDrops:  o.Metrics.Dropped.WithLabelValues("invalid"),
		shutdownDrops: o.Metrics.Dropped.WithLabelValues("shutdown"),
	}, nil
}

// Send queues records without blocking. When the buffer is full the
// oldest queued records make room (counted as buffer-full drops). The
// sender keeps the pointers: records must not be changed afterwards.
func (s *Sender) Send(flows ...*flow.Flow) {
	s.mu.Lock()
	dropped := 0
	for _, f := range flows {
		if s.n == len(s.buf) {
			s.buf[s.head] = nil
			s.head = (s.head + 1) % len(s.buf)
			s.n--
			dropped++
		}
		s.buf[(s.head+s.n)%len(s.buf)] = f
		s.n++
	}
	n := s.n
	s.mu.Unlock()
	if dropped > 0 {
		s.fullDrops.Add(float64(dropped))
	}
	s.o.Metrics.Buffered.Set(float64(n))
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// take removes up to max records from the buffer.
func (s *Sender) take(max int) []*flow.Flow {
	s.mu.Lock()
	k := min(max, s.n)
	out := make([]*flow.Flow, k)
	for i := range k {
		out[i] = s.buf[s.head]
		s.buf[s.head] = nil
		s.head = (s.head + 1) % len(s.buf)
	}
	s.n -= k
	n := s.n
	s.mu.Unlock()
	s.o.Metrics.Buffered.Set(float64(n))
	return out
}

// Buffered is the number of records waiting.
func (s *Sender) Buffered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Run connects and sends until ctx ends, then sends what is buffered
// (bounded by DrainTimeout), closes the stream and returns. It returns nil
// after a normal end; connection errors are logged and retried, never
// returned.
func (s *Sender) Run(ctx context.Context) error {
	o := &s.o
	backoff := o.MinBackoff
	var pending *flowpb.ExportRequest // a batch a broken stream did not take
	for {
		if ctx.Err() != nil {
			s.dropRest(pending)
			return nil
		}
		conn, err := grpc.NewClient(o.Address,
			grpc.WithTransportCredentials(credentials.NewTLS(o.TLS)),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		)
		if err != nil {
			return fmt.Errorf("grpcexport: %s: %w", o.Address, err)
		}
		r := s.stream(ctx, conn, pending)
		conn.Close()
		pending = r.pending
		if r.done {
			if r.err != nil {
				o.Log.Warn("gRPC export stream closed with an error", "address", o.Address, "err", r.err)
			}
			return nil
		}
		if r.worked {
			backoff = o.MinBackoff
		}
		o.Metrics.Reconnects.Inc()
		o.Log.Warn("gRPC export to the aggregator failed; reconnecting", "address", o.Address, "err", r.err, "retry_in", backoff.String(), "buffered", s.Buffered())
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, o.MaxBackoff)
	}
}

// streamResult is how one stream ended.
type streamResult struct {
	// pending is a batch the stream did not take.
	pending *flowpb.ExportRequest
	// done says that ctx ended and the stream was drained and closed;
	// otherwise it broke with err.
	done bool
	// worked says that the stream sent something, so that the next
	// attempt starts with the shortest backoff.
	worked bool
	err    error
}

// stream opens one Export stream on conn and feeds it.
func (s *Sender) stream(ctx context.Context, conn *grpc.ClientConn, pending *flowpb.ExportRequest) streamResult {
	o := &s.o
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	st, err := flowpb.NewFlowExportServiceClient(conn).Export(sctx)
	if err != nil {
		return streamResult{pending: pending, err: err}
	}
	o.Metrics.Connected.Set(1)
	defer o.Metrics.Connected.Set(0)
	sent := false
	send := func(req *flowpb.ExportRequest) error {
		if err := st.Send(req); err != nil {
			// The real reason is in the stream's status.
			if _, rerr := st.CloseAndRecv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				err = rerr
			}
			return err
		}
		sent = true
		o.Metrics.Sent.Add(float64(len(req.Flows)))
		return nil
	}
	if pending != nil {
		if err := send(pending); err != nil {
			return streamResult{pending: pending, err: err}
		}
		pending = nil
	}
	o.Log.Info("gRPC export stream open", "address", o.Address)
	for {
		if req := s.batch(); req != nil {
			if err := send(req); err != nil {
				return streamResult{pending: req, worked: sent, err: err}
			}
			continue
		}
		select {
		case <-s.ready:
		case <-st.Context().Done():
			_, err := st.CloseAndRecv()
			if err == nil {
				err = errors.New("the aggregator ended the stream")
			}
			return streamResult{worked: sent, err: err}
		case <-ctx.Done():
			return streamResult{done: true, worked: sent, err: s.drain(st, send)}
		}
	}
}

// drain sends what is buffered, within DrainTimeout, and closes the stream.
func (s *Sender) drain(st flowpb.FlowExportService_ExportClient, send func(*flowpb.ExportRequest) error) error {
	deadline := time.Now().Add(s.o.DrainTimeout)
	for time.Now().Before(deadline) {
		req := s.batch()
		if req == nil {
			break
		}
		if err := send(req); err != nil {
			s.dropRest(req)
			return err
		}
	}
	s.dropRest(nil)
	_, err := st.CloseAndRecv()
	return err
}

// batch converts up to BatchSize buffered records into a request; nil when
// the buffer is empty.
func (s *Sender) batch() *flowpb.ExportRequest {
	for {
		flows := s.take(s.o.BatchSize)
		if len(flows) == 0 {
			return nil
		}
		req := &flowpb.ExportRequest{Flows: make([]*flowpb.Flow, 0, len(flows))}
		for _, f := range flows {
			p, err := flowproto.FromFlow(f)
			if err != nil {
				s.invalidDrops.Inc()
				s.o.Log.Debug("dropping a record that has no Protobuf form", "err", err)
				continue
			}
			req.Flows = append(req.Flows, p)
		}
		if len(req.Flows) > 0 {
			return req
		}
	}
}

// dropRest counts what can no longer be sent at the end of Run.
func (s *Sender) dropRest(pending *flowpb.ExportRequest) {
	n := 0
	if pending != nil {
		n += len(pending.Flows)
	}
	n += len(s.take(s.o.BufferSize))
	if n > 0 {
		s.shutdownDrops.Add(float64(n))
		s.o.Log.Warn("records still buffered at shutdown were dropped", "records", n)
	}
}
