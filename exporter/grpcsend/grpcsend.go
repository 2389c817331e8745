// Package grpcsend is the exporter's gRPC transport: it sends the records
// of a queue.Queue to an aggregator over Antrea's FlowExportService.Export
// (one client stream per connection), always with mutual TLS. It batches
// the records waiting in the queue into ExportRequests, reconnects with
// capped exponential backoff, and acknowledges records in the queue only
// once the message holding them was handed to the stream, so records made
// while the aggregator is unreachable wait in the queue (the queue's bound
// and drop accounting apply) and a message the stream refused is sent again
// on the next one.
//
// Delivery is as on IPFIX over TCP: a message the stream accepted just
// before the connection broke may be lost, since Export acknowledges
// nothing until the stream ends.
package grpcsend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
)

// Defaults of Options.
const (
	DefaultBatchSize  = 100
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = 30 * time.Second
	// connectTimeout bounds one connection attempt (dial and handshake).
	connectTimeout = 10 * time.Second
	// closeGrace is how long a stream being closed at the end of Run may
	// take to hand its last messages over before it is cancelled.
	closeGrace = 2 * time.Second
)

// Options configures a Sender.
type Options struct {
	// Address is the aggregator's host:port (its sluice.grpcAddress).
	Address string
	// Resolve, if set, is called before each connection attempt and
	// returns the host:port to dial instead of Address (for addresses
	// that name a Kubernetes Service). Address is still what logs show.
	Resolve func(ctx context.Context) (string, error)
	// TLS must hold a client certificate and the CA that signed the
	// aggregator's certificate (certs.Bundle.ClientTLS gives one). Without
	// ServerName, the host dialled is checked.
	TLS *tls.Config
	// BatchSize is the most records in one ExportRequest; default 100.
	// Whatever is queued leaves at once, so batches fill up only under load.
	BatchSize int
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts, doubling from one to the other; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// ObservationDomainID, when not 0, is put with the export time in the
	// records that carry neither, as an IPFIX message header would give
	// them. 0 sends records as they are.
	ObservationDomainID uint32
	Log                 *slog.Logger
	Metrics             Metrics
}

// Metrics are the Sender's series, the same as ipfixsend's: Sent counts
// records handed to the Export stream, EncodeErrors records with no
// Protobuf form, Connected an open stream.
type Metrics = queue.SenderMetrics

// Sender is the gRPC transport. Run it once.
type Sender struct {
	o        Options
	creds    credentials.TransportCredentials
	connects int
}

// New checks o; nothing connects until Run.
func New(o Options) (*Sender, error) {
	if o.Address == "" {
		return nil, errors.New("grpcsend: Options.Address is required")
	}
	if o.Resolve == nil {
		if _, _, err := net.SplitHostPort(o.Address); err != nil {
			return nil, fmt.Errorf("grpcsend: aggregator address: %w", err)
		}
	}
	if o.TLS == nil || len(o.TLS.Certificates) == 0 && o.TLS.GetClientCertificate == nil {
		return nil, errors.New("grpcsend: a TLS configuration with a client certificate is required (the aggregator only accepts mutual TLS)")
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Sender{o: o, creds: credentials.NewTLS(o.TLS)}, nil
}

func inc(c prometheus.Counter, n int) {
	if c != nil && n > 0 {
		c.Add(float64(n))
	}
}

func setGauge(g prometheus.Gauge, v float64) {
	if g != nil {
		g.Set(v)
	}
}

// Run sends the records of q until ctx ends, then closes the stream
// cleanly so that what it accepted reaches the aggregator. Records not yet
// sent stay in q. Connection errors are logged and retried; Run returns nil.
func (s *Sender) Run(ctx context.Context, q *queue.Queue) error {
	o := &s.o
	backoff := o.MinBackoff
	batch := make([]flow.Flow, 0, o.BatchSize)
	for ctx.Err() == nil {
		r := s.session(ctx, q, &batch)
		if ctx.Err() != nil {
			if r.err != nil {
				o.Log.Warn("the gRPC export stream did not close cleanly", "address", o.Address, "err", r.err)
			}
			break
		}
		if !r.opened {
			inc(o.Metrics.ConnectFailures, 1)
			o.Log.Warn("cannot reach the flow aggregator over gRPC; records wait in the buffer", "address", o.Address,
				"retry_in", backoff.String(), "buffered", q.Len(), "err", r.err)
		} else {
			o.Log.Warn("lost the flow aggregator", "address", o.Address, "err", r.err)
		}
		if r.worked {
			// A stream that carried records: the aggregator was fine a
			// moment ago, so try again at once.
			backoff = o.MinBackoff
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, o.MaxBackoff)
	}
	return nil
}

// sessionResult is how one connection ended.
type sessionResult struct {
	// opened says an Export stream was open; worked that it took records.
	opened, worked bool
	err            error
}

// session connects, opens one Export stream and feeds it from q until the
// stream breaks or ctx ends.
func (s *Sender) session(ctx context.Context, q *queue.Queue, batch *[]flow.Flow) sessionResult {
	o := &s.o
	addr := o.Address
	if o.Resolve != nil {
		a, err := o.Resolve(ctx)
		if err != nil {
			return sessionResult{err: err}
		}
		addr = a
	}
	// passthrough: the address was resolved above (or is dialled as is),
	// as the IPFIX transport does, rather than by gRPC's DNS resolver.
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(s.creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	if err != nil {
		return sessionResult{err: err}
	}
	defer conn.Close()

	// The stream outlives ctx by up to closeGrace, so that a clean close
	// can hand the last messages over.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopOpen := context.AfterFunc(ctx, cancel)
	openTimer := time.AfterFunc(connectTimeout, cancel)
	// The requests are encoded by flowproto.AppendExportRequest, without
	// building Protobuf objects (see wireCodec).
	st, err := conn.NewStream(sctx, &flowpb.FlowExportService_ServiceDesc.Streams[0],
		flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(wireCodec{}))
	openTimer.Stop()
	if !stopOpen() || err != nil {
		if err == nil {
			err = ctx.Err()
		}
		return sessionResult{err: err}
	}
	defer context.AfterFunc(ctx, func() { time.AfterFunc(closeGrace, cancel) })()

	// The aggregator writes only to end the stream: a receiver tells when
	// it did, even while nothing is being sent.
	ended := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		err := st.RecvMsg(new(flowpb.ExportResponse))
		ended <- err
		wcancel()
	}()

	s.connects++
	if s.connects > 1 {
		inc(o.Metrics.Reconnects, 1)
	}
	setGauge(o.Metrics.Connected, 1)
	defer setGauge(o.Metrics.Connected, 0)
	o.Log.Info("connected to the flow aggregator", "address", addr, "proto", "grpc")

	r := sessionResult{opened: true}
	next := q.Head() // whatever was not acknowledged goes (again) on this stream
	for {
		if ctx.Err() != nil || !q.Wait(wctx, next) {
			break
		}
		var first uint64
		first, *batch = q.Peek(next, (*batch)[:0], o.BatchSize)
		req, n := s.request(*batch, time.Now())
		if n > 0 {
			if err := st.SendMsg(req); err != nil {
				// The reason is in the status the receiver gets.
				r.err = err
				if rerr := <-ended; rerr != nil {
					r.err = rerr
				}
				return r
			}
			r.worked = true
			inc(o.Metrics.Sent, n)
		}
		next = first + uint64(len(*batch))
		q.Ack(next)
	}
	if ctx.Err() == nil { // the aggregator ended the stream
		r.err = <-ended
		if r.err == nil {
			r.err = errors.New("the aggregator ended the stream")
		}
		return r
	}
	// Stopping: half-close, and wait for the aggregator's response, which
	// comes once it has read everything sent (or closeGrace cancels).
	if err := st.CloseSend(); err != nil {
		r.err = err
		return r
	}
	r.err = <-ended
	return r
}

// request encodes recs as one ExportRequest, stamping their origin, and
// returns it with the number of records it holds; records that have no
// Protobuf form are counted and left out.
func (s *Sender) request(recs []flow.Flow, now time.Time) (encodedRequest, int) {
	n := len(recs)
	for i := range recs {
		f := &recs[i] // a copy from the queue: stamping it changes nothing there
		if s.o.ObservationDomainID != 0 && f.Origin.ObservationDomainID == 0 && f.Origin.ExportTime.IsZero() {
			f.Origin.ObservationDomainID = s.o.ObservationDomainID
			f.Origin.ExportTime = now
		}
	}
	// A new buffer per request: gRPC may still read a sent message.
	b := flowproto.AppendExportRequest(make([]byte, 0, 600*len(recs)), recs, func(_ *flow.Flow, err error) {
		n--
		inc(s.o.Metrics.EncodeErrors, 1)
		s.o.Log.Error("cannot encode a flow record; dropped", "err", err)
	})
	return encodedRequest(b), n
}

// encodedRequest is an ExportRequest already in its wire form.
type encodedRequest []byte

// wireCodec is gRPC's Protobuf codec that also sends encodedRequests as
// they are. Its name is "proto", so the content type is unchanged.
type wireCodec struct{}

func (wireCodec) Marshal(v any) ([]byte, error) {
	switch m := v.(type) {
	case encodedRequest:
		return m, nil
	case proto.Message:
		return proto.Marshal(m)
	}
	return nil, fmt.Errorf("grpcsend: cannot marshal %T", v)
}

func (wireCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpcsend: cannot unmarshal into %T", v)
	}
	return proto.Unmarshal(data, m)
}

func (wireCodec) Name() string { return "proto" }
