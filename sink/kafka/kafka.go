// Package kafka is the kafka sink: it writes every record to a Kafka
// topic, keyed by a symmetric flow key (package flow/flowkey), the value
// the reference's Flow Protobuf message (the schema of its gRPC service,
// package flow/flowpb) or, with kafka.format json, that message in
// Protobuf's JSON mapping.
//
// The producer is idempotent with acks=all. A record counts as written
// (ring.Consumer.Commit) only once the brokers acknowledged it, so that
// Proxy mode's gRPC confirmation, which waits for the sinks to write a
// stream's records, waits for Kafka. While the brokers are away, records
// wait in the client, up to kafka.maxBufferedRecords; then the sink stops
// reading and the aggregator's buffer (recordBufferSize) fills; the
// aggregator waits for it up to sluice.sinkStallTimeout (back-pressure),
// and past that the oldest records are dropped and counted (reason
// buffer-full).
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowproto"
	"sluice/kafkaclient"
	"sluice/ring"
	"sluice/sink"
)

// Options configures a Sink.
type Options struct {
	// Client are the client options: brokers, TLS, SASL
	// (kafkaclient.Options).
	Client []kgo.Opt
	Topic  string
	// JSON writes the Flow message in Protobuf's JSON mapping.
	JSON bool
	// MaxBuffered bounds the records waiting for an acknowledgement.
	MaxBuffered int
	// FlushInterval is the longest a record read waits before the sink
	// asks the client to send what it holds; default 100ms.
	FlushInterval time.Duration
	Log           *slog.Logger
	Metrics       *sink.Metrics
	// Registry takes the sink's own series; nil registers none.
	Registry prometheus.Registerer
	Name     string // in metrics; default "kafka"
}

// Sink writes records to Kafka.
type Sink struct {
	o    Options
	cl   *kgo.Client
	json flowproto.JSONEncoder // kafka.format json

	exported, sendErrs, encodeErrs, lost, shutdownLost prometheus.Counter
	connected                                          prometheus.Gauge
	buffered                                           prometheus.GaugeFunc

	mu sync.Mutex
	// acks tracks, in read order, which records are settled (acknowledged
	// or failed and counted): base is the sequence number of acks[0].
	// Everything before base is settled, which is what Commit reports.
	acks []bool
	base uint64
	read uint64

	// free are the outgoing records the client is done with (taken by
	// send, given back by the client's promises).
	freeMu sync.Mutex
	free   []*outgoing
}

// New makes a sink; the client connects lazily, so New does not need the
// brokers to be up.
func New(o Options) (*Sink, error) {
	if o.Topic == "" {
		return nil, errors.New("kafka: no topic")
	}
	if o.MaxBuffered <= 0 {
		o.MaxBuffered = 100000
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 100 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = sink.NewMetrics(nil)
	}
	if o.Name == "" {
		o.Name = "kafka"
	}
	opts := append([]kgo.Opt{
		kgo.DefaultProduceTopic(o.Topic),
		// Idempotence needs acks=all; it is franz-go's default, spelled out.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// The client lets one more record in than its bound: the one a
		// blocked Produce holds.
		kgo.MaxBufferedRecords(max(o.MaxBuffered-1, 1)),
		// murmur2 of the key, as the Java client: any producer of the
		// same keys picks the same partitions.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(5 * time.Millisecond),
	}, o.Client...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s := &Sink{o: o, cl: cl}
	m := o.Metrics
	s.exported = m.Exported.WithLabelValues(o.Name)
	s.sendErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonSendError)
	s.encodeErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonEncodeError)
	s.lost = m.Dropped.WithLabelValues(o.Name, sink.ReasonBufferFull)
	s.shutdownLost = m.Dropped.WithLabelValues(o.Name, sink.ReasonShutdown)
	s.connected = m.Connected.WithLabelValues(o.Name)
	s.buffered = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_kafka_sink_buffered_records",
		Help: "Records the kafka sink handed to the Kafka client and that are not acknowledged yet (bounded by kafka.maxBufferedRecords)."},
		func() float64 { return float64(cl.BufferedProduceRecords()) })
	if o.Registry != nil {
		if err := o.Registry.Register(s.buffered); err != nil {
			cl.Close()
			return nil, fmt.Errorf("kafka: %w", err)
		}
	}
	return s, nil
}

// Close releases the client of a sink that never runs.
func (s *Sink) Close() error {
	s.cl.Close()
	return nil
}

// Run writes what c yields until the buffer closes and is drained (then
// it waits for the acknowledgements of what it sent) or ctx ends (what is
// not acknowledged then is counted lost, reason shutdown).
func (s *Sink) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	defer s.cl.Close()
	c.CommitOnWrite()
	var buf []*flow.Flow
	var lost uint64
	for {
		wctx, cancel := context.WithTimeout(ctx, s.o.FlushInterval)
		var ok bool
		buf, ok = c.Next(wctx, buf[:0], 512)
		waited := wctx.Err() != nil
		cancel()
		if c.Lost > lost {
			s.lost.Add(float64(c.Lost - lost))
			lost = c.Lost
		}
		if !ok && (ctx.Err() != nil || !waited) {
			// Stopped, or the buffer is closed and drained: what was sent
			// gets its acknowledgement, or the end of ctx.
			if ctx.Err() == nil {
				_ = s.cl.Flush(ctx)
			}
			c.Commit(s.held())
			return nil
		}
		for _, f := range buf {
			s.send(ctx, f)
		}
		// The client holds the sink's own key and value octets, not the
		// records: the buffer may reuse them.
		c.Release(0)
		clear(buf)
		if len(buf) == 0 && c.CommitWanted() {
			// A gRPC stream waits for what is in flight: send it now and
			// wait for the acknowledgements (or the end of ctx), rather
			// than have Next return at once again.
			_ = s.cl.Flush(ctx)
		}
		c.Commit(s.held())
	}
}

// send hands one record to the client. Produce blocks while the client
// holds MaxBuffered records: the sink then stops reading, and the ring
// buffer takes the overflow (and counts what it drops).
func (s *Sink) send(ctx context.Context, f *flow.Flow) {
	seq := s.next()
	o := s.take()
	o.seq = seq
	val, err := s.encode(o.val[:0], f)
	if err != nil {
		s.encodeErrs.Inc()
		s.o.Log.Error("cannot encode a record for Kafka", "sink", s.o.Name, "err", err)
		s.settle(seq)
		s.give(o)
		return
	}
	o.val = val
	o.r = kgo.Record{Key: flowkey.Append(o.key[:0], f), Value: val}
	s.cl.Produce(ctx, &o.r, o.promise)
}

// done is the client's promise for the record o carries.
func (s *Sink) done(o *outgoing, err error) {
	switch {
	case err == nil:
		s.exported.Inc()
		s.connected.Set(1)
	case kafkaclient.IsShutdown(err):
		s.shutdownLost.Inc()
	default:
		s.sendErrs.Inc()
		s.connected.Set(0)
		s.o.Log.Warn("Kafka refused a record", "sink", s.o.Name, "topic", s.o.Topic, "err", err)
	}
	s.settle(o.seq)
	// The client does not touch a record after its promise: o can carry
	// another.
	s.give(o)
}

// outgoing is one record handed to the client, with its key and value
// octets: reused once the client called its promise, so that a record
// costs no allocation in steady state.
type outgoing struct {
	r       kgo.Record
	seq     uint64
	key     [flowkey.Size]byte
	val     []byte
	promise func(*kgo.Record, error) // s.done(o), made once
}

// Bounds of what the free list keeps: records in flight past maxFree are
// left to the garbage collector once acknowledged, as are values larger
// than maxKeptValue.
const (
	maxFree      = 4096
	maxKeptValue = 16 << 10
)

// take returns an outgoing from the free list, or a new one.
func (s *Sink) take() *outgoing {
	s.freeMu.Lock()
	if n := len(s.free); n > 0 {
		o := s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
		s.freeMu.Unlock()
		return o
	}
	s.freeMu.Unlock()
	o := &outgoing{}
	o.promise = func(_ *kgo.Record, err error) { s.done(o, err) }
	return o
}

// give puts o back on the free list.
func (s *Sink) give(o *outgoing) {
	o.r = kgo.Record{}
	if cap(o.val) > maxKeptValue {
		o.val = nil
	}
	s.freeMu.Lock()
	if len(s.free) < maxFree {
		s.free = append(s.free, o)
	}
	s.freeMu.Unlock()
}

// encode appends f's value to b. Called from Run's goroutine only (the
// JSON encoder's buffer is the sink's).
func (s *Sink) encode(b []byte, f *flow.Flow) ([]byte, error) {
	if !s.o.JSON {
		return flowproto.AppendFlow(b, f)
	}
	return s.json.Append(b, f)
}

// next numbers a record read.
func (s *Sink) next() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks = append(s.acks, false)
	seq := s.read
	s.read++
	return seq
}

// settle marks record seq acknowledged (or lost and counted) and moves
// base past the settled prefix: acknowledgements of different partitions
// come in any order.
func (s *Sink) settle(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acks[seq-s.base] = true
	n := 0
	for n < len(s.acks) && s.acks[n] {
		n++
	}
	if n > 0 {
		s.acks = s.acks[n:]
		s.base += uint64(n)
		if cap(s.acks) > 4096 && len(s.acks) < cap(s.acks)/4 {
			s.acks = append([]bool(nil), s.acks...)
		}
	}
}

// held is the number of records read and not settled yet.
func (s *Sink) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.read - s.base)
}
