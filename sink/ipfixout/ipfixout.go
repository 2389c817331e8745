// Package ipfixout sends flow records to an external collector as IPFIX
// (TCP, TLS or UDP) or as newline-delimited JSON. It reconnects with capped
// exponential backoff and announces its templates on every connection
// (and, over UDP, every template refresh interval). While the collector is
// unreachable, records wait in the pipeline's bounded broadcast buffer;
// what that buffer cannot hold is counted as dropped.
package ipfixout

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/flow/flowjson"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ipfix/ipfixconn"
	"sluice/ring"
	"sluice/sink"
)

// Options configures a Sink.
type Options struct {
	// Address is host:port of the collector; Proto "tcp" or "udp".
	Address string
	Proto   string
	// TLS, when set, wraps TCP in TLS (with a client certificate in it
	// for mutual TLS).
	TLS *tls.Config
	// TLSConfig, when set, is asked for the TLS configuration before each
	// connection attempt instead (see ipfixconn.Options.TLSConfig).
	TLSConfig func(ctx context.Context) (*tls.Config, error)
	// JSON sends newline-delimited JSON objects instead of IPFIX.
	JSON                bool
	ObservationDomainID uint32
	// MaxMessageSize defaults to 65535 over TCP and 1400 over UDP.
	MaxMessageSize int
	// TemplateRefresh re-announces templates over UDP; default 600 s.
	TemplateRefresh time.Duration
	// FlushInterval bounds how long a record waits in a partly filled
	// message; default 1 s.
	FlushInterval time.Duration
	// Backoff between connection attempts grows from MinBackoff to
	// MaxBackoff; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	Exporter               *ipfixmap.Exporter
	Log                    *slog.Logger
	Metrics                *Metrics
	// Name labels this sink's metrics; default "ipfix".
	Name string
}

// Metrics are the sinks' shared series (see package sink).
type Metrics = sink.Metrics

// NewMetrics creates the sinks' series; see sink.NewMetrics.
func NewMetrics(reg prometheus.Registerer) *Metrics { return sink.NewMetrics(reg) }

// Sink is one external collector.
type Sink struct {
	o    Options
	conn *ipfixconn.Conn
	enc  *ipfix.Encoder
	// lastFlush is when the message being built was last sent out.
	lastFlush time.Time
	// announced holds the templates sent on the current connection.
	announced map[*ipfix.Template]bool
	// known are the templates to announce on a new connection when
	// records come encoded (RunEncoded): the Exporter's, as New found
	// them, and those records have brought since. The Exporter itself is
	// then the producer's, not the sink's to read.
	known    []*ipfix.Template
	knownSet map[*ipfix.Template]bool
	encoded  bool
	// arena and arenaUsed are the Arena of the last encoded records
	// copied and how many of them are not released yet: released in sums,
	// when the next record is of another Arena or the sink goes idle.
	arena     *ipfix.Arena
	arenaUsed int
	jsonBuf   []byte
	// for JSON: records are rendered from their IPFIX form, so the two
	// formats always carry the same elements and values.
	json *flowjson.Renderer
	// stall, set while run runs, marks its consumer stalled (see run).
	stall        func()
	exported     prometheus.Counter
	sendErrs     prometheus.Counter
	encodeErrs   prometheus.Counter
	lost         prometheus.Counter
	shutdownLost prometheus.Counter
	connected    prometheus.Gauge
	attempts     prometheus.Counter
}

// New checks o and returns a sink; Run starts it.
func New(o Options) (*Sink, error) {
	if o.Exporter == nil {
		return nil, errors.New("ipfixout: Options.Exporter is required")
	}
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		return nil, fmt.Errorf("ipfixout: collector address: %w", err)
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = ipfixconn.MessageSize(o.Proto)
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Name == "" {
		o.Name = "ipfix"
	}
	s := &Sink{o: o}
	var err error
	if s.conn, err = ipfixconn.New(ipfixconn.Options{Address: o.Address, Proto: o.Proto, TLS: o.TLS, TLSConfig: o.TLSConfig,
		TemplateRefresh: o.TemplateRefresh, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Announce: s.announce, StopWrites: true,
		PeerClosed: errPeerClosed, Hooks: ipfixconn.Hooks{Attempt: s.onAttempt, Connected: s.onConnect, Failed: s.onFail,
			Lost: s.onLost}}); err != nil {
		return nil, fmt.Errorf("ipfixout: %w", err)
	}
	// One set per message: collectors built on go-ipfix (Antrea's own
	// test collector among them) read only the first set of a message.
	if s.enc, err = ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: o.MaxMessageSize, OneSetPerMessage: true}, s.write); err != nil {
		return nil, err
	}
	if o.JSON {
		s.json = flowjson.New(o.Exporter)
	}
	s.known = append(s.known, o.Exporter.Templates()...)
	s.knownSet = map[*ipfix.Template]bool{}
	for _, t := range s.known {
		s.knownSet[t] = true
	}
	m := o.Metrics
	s.exported = m.Exported.WithLabelValues(o.Name)
	s.sendErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonSendError)
	s.encodeErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonEncodeError)
	s.lost = m.Dropped.WithLabelValues(o.Name, sink.ReasonBufferFull)
	s.shutdownLost = m.Dropped.WithLabelValues(o.Name, sink.ReasonShutdown)
	s.connected = m.Connected.WithLabelValues(o.Name)
	s.attempts = m.Reconnects.WithLabelValues(o.Name)
	return s, nil
}

// write is the encoder's emit function: one finished message.
func (s *Sink) write(msg []byte) error {
	n := s.enc.PendingRecords()
	if err := s.conn.Write(msg); err != nil {
		if errors.Is(err, ipfixconn.ErrNotConnected) {
			s.sendErrs.Add(float64(s.enc.PendingRecords()))
		}
		return err // a failed write counted the message's records as lost
	}
	s.exported.Add(float64(n))
	return nil
}

var errPeerClosed = errors.New("ipfixout: the collector closed the connection")

func (s *Sink) onAttempt() { s.attempts.Inc() }

func (s *Sink) onConnect(string) {
	s.connected.Set(1)
	s.o.Log.Info("connected to the flow collector", "sink", s.o.Name, "address", s.o.Address, "proto", s.o.Proto, "tls", s.o.TLS != nil || s.o.TLSConfig != nil, "json", s.o.JSON)
}

func (s *Sink) onFail(err error, retryIn time.Duration) {
	if s.stall != nil {
		s.stall()
	}
	s.o.Log.Warn("cannot reach the flow collector; records wait in the buffer", "sink", s.o.Name,
		"address", s.o.Address, "retry_in", retryIn.String(), "err", err)
}

// onLost follows the connection's close: the records of the message being
// built are lost.
func (s *Sink) onLost(err error) {
	if err != nil {
		s.o.Log.Warn("lost the flow collector", "sink", s.o.Name, "address", s.o.Address, "err", err)
	}
	s.connected.Set(0)
	s.sendErrs.Add(float64(s.enc.Discard()))
}

func (s *Sink) announce() error {
	if s.o.JSON {
		return nil
	}
	clear(s.announced)
	templates := s.known
	if !s.encoded {
		templates = s.o.Exporter.Templates()
	}
	for _, t := range templates {
		s.announceOne(t)
	}
	return s.enc.Flush()
}

// Run sends what c yields until ctx ends or the buffer closes, then
// flushes what it holds.
func (s *Sink) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	return run(ctx, s, c, s.send, nil)
}

// RunEncoded is Run for records that come already encoded for the
// Exporter's templates (Proxy mode's fast path, see proxy.Forwarding):
// they are copied into messages as they are. Not with JSON.
func (s *Sink) RunEncoded(ctx context.Context, c *ring.Consumer[ipfix.EncodedRecord]) error {
	if s.o.JSON {
		return errors.New("ipfixout: encoded records cannot be sent as JSON")
	}
	s.encoded = true
	return run(ctx, s, c, s.sendEncoded, s.releaseArena)
}

// run is the loop of Run and RunEncoded: connect (with backoff), take
// what c yields, send each item with send, flush on the clock. idle, when
// set, runs before waiting for more items.
func run[T any](ctx context.Context, s *Sink, c *ring.Consumer[T], send func(T), idle func()) error {
	// pending are the items of buf not sent yet; buf is reused for every
	// Next, so that taking items allocates nothing.
	var buf, pending []T
	var lost uint64
	// What was sent and flushed (or lost and counted) is committed, so
	// that a gRPC stream waiting for it (ring.Buffer.WaitWritten) is
	// confirmed; a waiting stream also makes the sink flush at once.
	c.CommitOnWrite()
	flush := func() {
		s.flush()
		c.Commit(len(pending))
	}
	defer func() {
		flush()
		s.conn.Close()
	}()
	// While the collector is down (a connection attempt failed) the sink
	// cannot write: gRPC confirmations do not wait for it
	// (ring.Consumer.Stalled) until it is connected again.
	stalled := false
	s.stall = func() {
		if !stalled {
			stalled = true
			c.Stalled(true)
		}
	}
	defer func() { s.stall = nil }()
	for {
		if s.conn.Connect(ctx) != nil {
			// ctx ended (the drain timeout) with no connection: what was
			// taken from the buffer and not sent is lost, and counted.
			s.shutdownLost.Add(float64(len(pending)))
			return nil
		}
		if stalled {
			stalled = false
			c.Stalled(false)
		}
		if len(pending) == 0 {
			if idle != nil {
				idle()
			}
			wctx, cancel := context.WithTimeout(ctx, s.o.FlushInterval)
			var ok bool
			buf, ok = c.Next(wctx, buf[:0], 512)
			pending = buf
			waited := wctx.Err() != nil
			cancel()
			if c.Lost > lost {
				s.lost.Add(float64(c.Lost - lost))
				lost = c.Lost
			}
			if !ok {
				if ctx.Err() != nil || !waited { // stopped, or the buffer closed and is drained
					return nil
				}
				flush()
				s.conn.Refresh()
				continue
			}
		}
		for len(pending) > 0 && s.conn.Alive() && ctx.Err() == nil {
			send(pending[0])
			pending = pending[1:]
		}
		// What was sent is encoded in the message (or dropped and
		// counted): only what waits for the collector is still needed.
		c.Release(len(pending))
		if ctx.Err() != nil {
			// Stopped (the drain timeout) while a slow collector held
			// back its writes: what was taken and not sent is lost, and
			// counted, rather than sent at the collector's pace.
			s.shutdownLost.Add(float64(len(pending)))
			return nil
		}
		// A steady trickle never leaves Next idle for a whole interval:
		// flush on the clock too, so no record waits longer than that.
		if time.Since(s.lastFlush) >= s.o.FlushInterval || c.CommitWanted() {
			flush()
		}
		s.conn.Refresh()
	}
}

func (s *Sink) flush() {
	s.lastFlush = time.Now()
	if !s.conn.Connected() {
		return
	}
	if s.o.JSON {
		return // JSON lines are written as they come
	}
	_ = s.enc.Flush()
}

func (s *Sink) send(f *flow.Flow) {
	t, _, err := s.o.Exporter.Template(f) // each connection tracks what it announced
	if err != nil {
		s.encodeErrs.Inc()
		s.o.Log.Error("cannot build an export template", "sink", s.o.Name, "err", err)
		return
	}
	if s.o.JSON {
		s.sendJSON(f)
		return
	}
	if !s.announced[t] && !s.announceOne(t) {
		s.encodeErrs.Inc() // a template that cannot be sent: its records cannot either
		return
	}
	if err := s.o.Exporter.Write(s.enc.Begin(s.o.ObservationDomainID, t), t, f); err != nil {
		if !s.conn.Connected() {
			// The connection failed while a full message went out; this
			// record was waiting for the next message.
			s.sendErrs.Inc()
			return
		}
		s.encodeErrs.Inc()
		s.o.Log.Error("cannot encode a record", "sink", s.o.Name, "err", err)
	}
}

func (s *Sink) sendEncoded(r ipfix.EncodedRecord) {
	// The record is copied (or dropped) below either way.
	if r.Arena != s.arena {
		s.releaseArena()
		s.arena = r.Arena
	}
	s.arenaUsed++
	t := r.Template
	if !s.announced[t] {
		if !s.knownSet[t] {
			s.knownSet[t] = true
			s.known = append(s.known, t)
		}
		if !s.announceOne(t) {
			s.encodeErrs.Inc()
			return
		}
	}
	if err := s.enc.AddEncoded(s.o.ObservationDomainID, t, r.Data); err != nil {
		if !s.conn.Connected() {
			s.sendErrs.Inc() // as in send
			return
		}
		s.encodeErrs.Inc()
		s.o.Log.Error("cannot send an encoded record", "sink", s.o.Name, "err", err)
	}
}

// releaseArena releases the encoded records copied since the last call.
func (s *Sink) releaseArena() {
	if s.arena != nil && s.arenaUsed > 0 {
		s.arena.Release(s.arenaUsed)
	}
	s.arena, s.arenaUsed = nil, 0
}

// announceOne adds t to the message being built, once per connection. A
// template that cannot be encoded (too large for the message size) is
// logged and reported false.
func (s *Sink) announceOne(t *ipfix.Template) bool {
	if s.announced[t] {
		return true
	}
	if err := s.enc.AddTemplate(s.o.ObservationDomainID, t); err != nil {
		s.o.Log.Error("cannot announce an export template; its records are dropped", "sink", s.o.Name,
			"template", t.ID, "fields", len(t.Fields), "err", err)
		return false
	}
	if s.announced == nil {
		s.announced = map[*ipfix.Template]bool{}
	}
	s.announced[t] = true
	return true
}

// sendJSON writes one {"ipfix":{...},"@timestamp":...} line.
func (s *Sink) sendJSON(f *flow.Flow) {
	b := append(s.jsonBuf[:0], `{"ipfix":{`...)
	b, err := s.json.AppendFields(b, f)
	if err != nil {
		s.encodeErrs.Inc()
		return
	}
	b = append(b, `},"@timestamp":"`...)
	b = time.Now().UTC().AppendFormat(b, time.RFC3339)
	b = append(b, "\"}\n"...)
	s.jsonBuf = b
	if s.conn.Write(b) != nil { // a write that fails drops the connection
		s.sendErrs.Inc()
		return
	}
	s.exported.Inc()
}
