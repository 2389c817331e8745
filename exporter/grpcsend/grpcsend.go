// Package grpcsend is the exporter's gRPC transport: it sends the records
// of a queue.Queue to an aggregator over Antrea's FlowExportService.Export
// (client streams, one after the other on a connection), always with
// mutual TLS. It batches the records waiting in the queue into
// ExportRequests and reconnects with capped exponential backoff.
//
// Export's only acknowledgement is its response, which the aggregator
// sends when the client ends the stream, once it has read (and handed on)
// everything sent on it. So a stream is ended after AckRecords records or
// AckInterval, and its records are acknowledged in the queue only when
// that response comes; a stream that breaks first leaves them in the
// queue, and they are sent again on the next one. Nothing the aggregator
// did not confirm is lost (short of the queue dropping its oldest records
// for room, which it counts); what it read but could not confirm before
// the break arrives twice, at most the Resent count.
package grpcsend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
)

// Defaults of Options.
const (
	DefaultBatchSize   = 100
	DefaultAckRecords  = 5000
	DefaultAckInterval = time.Second
	DefaultMinBackoff  = time.Second
	DefaultMaxBackoff  = 30 * time.Second
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
	// AckRecords and AckInterval bound what one Export stream carries:
	// the stream is ended once it carried AckRecords records or
	// AckInterval after its first, and its records are released from the
	// queue only when the aggregator's response confirms them. Defaults
	// 5000 and 1 s. See docs/exporter.md, "Delivery over gRPC".
	AckRecords  int
	AckInterval time.Duration
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
	// dials counts the TCP connections made (gRPC makes them, also again
	// under a ClientConn that lost one); seenDial is the last one a stream
	// was counted on.
	dials    atomic.Uint64
	seenDial uint64
	// sentUpTo is one past the highest queue sequence number sent, to
	// count what is sent again.
	sentUpTo uint64
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
	if o.AckRecords <= 0 {
		o.AckRecords = DefaultAckRecords
	}
	if o.AckInterval <= 0 {
		o.AckInterval = DefaultAckInterval
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

// session connects and runs Export streams one after the other on the
// connection, feeding them from q, until one breaks or ctx ends.
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
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err == nil {
				s.dials.Add(1)
			}
			return c, err
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	if err != nil {
		return sessionResult{err: err}
	}
	defer conn.Close()
	r := sessionResult{}
	for {
		more := s.stream(ctx, conn, addr, q, batch, &r)
		if !more || ctx.Err() != nil {
			if r.opened {
				setGauge(o.Metrics.Connected, 0)
			}
			return r
		}
	}
}

// stream opens one Export stream and sends on it what q holds past what
// the aggregator confirmed, until ackRecords were sent or ackInterval
// passed since the first send; it then ends the stream and, once the
// aggregator's response confirms it read everything, acknowledges those
// records in q. It reports whether the connection may carry another
// stream.
func (s *Sender) stream(ctx context.Context, conn *grpc.ClientConn, addr string, q *queue.Queue, batch *[]flow.Flow, r *sessionResult) bool {
	o := &s.o
	// The stream outlives ctx by up to closeGrace, so that a clean close
	// can hand the last messages over.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopOpen := context.AfterFunc(ctx, cancel)
	openTimer := time.AfterFunc(connectTimeout, cancel)
	// The requests are encoded by flowproto.AppendExportRequest, without
	// building Protobuf objects (see wireCodec).
	st, err := conn.NewStream(sctx, &flowpb.FlowExportService_ServiceDesc.Streams[0],
		flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodecV2(wireCodec{}))
	openTimer.Stop()
	if !stopOpen() || err != nil {
		if err == nil {
			err = ctx.Err()
		}
		r.err = err
		return false
	}
	defer context.AfterFunc(ctx, func() { time.AfterFunc(closeGrace, cancel) })()

	// The aggregator writes only to end the stream: a receiver tells when
	// it did, even while nothing is being sent. Its response (nil error)
	// means it has read, and handed on, everything sent on the stream.
	ended := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		err := st.RecvMsg(new(flowpb.ExportResponse))
		ended <- err
		wcancel()
	}()

	// A stream on a connection no stream used before: the first, or one
	// gRPC made again after the aggregator restarted.
	r.opened = true
	if d := s.dials.Load(); d != s.seenDial {
		s.seenDial = d
		s.connects++
		if s.connects > 1 {
			inc(o.Metrics.Reconnects, 1)
		}
		setGauge(o.Metrics.Connected, 1)
		o.Log.Info("connected to the flow aggregator", "address", addr, "proto", "grpc")
	}

	// Whatever the aggregator did not confirm goes (again) on this stream.
	next := q.Head()
	sent := 0
	var commitAt time.Time
	for {
		wait, stopWait := wctx, context.CancelFunc(func() {})
		if sent > 0 {
			wait, stopWait = context.WithDeadline(wctx, commitAt)
		}
		ok := ctx.Err() == nil && q.Wait(wait, next)
		stopWait()
		if !ok {
			break
		}
		var first uint64
		// No more than the stream has room for: a stream carries exactly
		// ackRecords records when they keep coming, so that one of a
		// burst that arrives in runs is not left a few records short,
		// waiting AckInterval for its confirmation.
		first, *batch = q.PeekFlows(next, (*batch)[:0], min(o.BatchSize, s.ackRecords(q)-sent))
		req, n := s.request(*batch, time.Now())
		end := first + uint64(len(*batch))
		if n == 0 {
			req.buf.Free()
		} else {
			// gRPC takes the buffer over and returns it to the pool
			// once it is written.
			if err := st.SendMsg(req); err != nil {
				// The reason is in the status the receiver gets.
				r.err = err
				if rerr := <-ended; rerr != nil {
					r.err = rerr
				}
				return false
			}
			r.worked = true
			inc(o.Metrics.Sent, n)
			if first < s.sentUpTo {
				inc(o.Metrics.Resent, int(min(end, s.sentUpTo)-first))
			}
			s.sentUpTo = max(s.sentUpTo, end)
		}
		if sent == 0 {
			commitAt = time.Now().Add(o.AckInterval)
		}
		sent += len(*batch)
		next = end
		if sent >= s.ackRecords(q) {
			break
		}
	}
	if wctx.Err() != nil && ctx.Err() == nil { // the aggregator ended the stream
		r.err = <-ended
		if r.err == nil {
			r.err = errors.New("the aggregator ended the stream")
		}
		return false
	}
	// Half-close, and wait for the aggregator's response, which comes once
	// it has read everything sent (or closeGrace cancels when stopping).
	if err := st.CloseSend(); err != nil {
		r.err = err
		return false
	}
	if err := <-ended; err != nil {
		r.err = err
		return false
	}
	q.Ack(next)
	return true
}

// ackRecords is how many records a stream carries before it is ended for
// the aggregator to confirm them: Options.AckRecords, but at most half the
// queue, so that records waiting for confirmation are not the ones the
// queue drops for room.
func (s *Sender) ackRecords(q *queue.Queue) int {
	return max(1, min(s.o.AckRecords, q.Cap()/2))
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
	// The buffer comes from gRPC's pool, and goes back to it once gRPC
	// has written the message (reference-counted: gRPC may still read a
	// sent message after SendMsg returns).
	pool := mem.DefaultBufferPool()
	bp := pool.Get(600 * len(recs))
	b := flowproto.AppendExportRequest((*bp)[:0], recs, func(_ *flow.Flow, err error) {
		n--
		inc(s.o.Metrics.EncodeErrors, 1)
		s.o.Log.Error("cannot encode a flow record; dropped", "err", err)
	})
	if cap(b) != cap(*bp) {
		// It outgrew the pooled buffer: that one goes back now, the
		// grown one travels unpooled.
		pool.Put(bp)
		return encodedRequest{buf: mem.SliceBuffer(b)}, n
	}
	*bp = b
	return encodedRequest{buf: mem.NewBuffer(bp, pool)}, n
}

// encodedRequest is an ExportRequest already in its wire form, in a
// buffer whose one reference the codec hands to gRPC.
type encodedRequest struct{ buf mem.Buffer }

// wireCodec is gRPC's Protobuf codec that also sends encodedRequests as
// they are. Its name is "proto", so the content type is unchanged.
type wireCodec struct{}

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case encodedRequest:
		return mem.BufferSlice{m.buf}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		return mem.BufferSlice{mem.SliceBuffer(b)}, err
	}
	return nil, fmt.Errorf("grpcsend: cannot marshal %T", v)
}

func (wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("grpcsend: cannot unmarshal into %T", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

func (wireCodec) Name() string { return "proto" }
