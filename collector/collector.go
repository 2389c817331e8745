// Package collector receives IPFIX from exporters over TCP, TLS and UDP,
// decodes it with per-session template state, normalizes every record into
// a flow.Flow and hands them on in batches (one per message). A malformed
// message costs only its own session (TCP, TLS) or datagram (UDP); it is
// logged once per session and counted, never a panic.
package collector

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// Options configures every listener of a Collector.
type Options struct {
	Table *ipfixmap.Table
	// Out receives batches. TCP and TLS readers block on it (backpressure
	// to the exporter); the UDP reader never blocks and drops instead.
	Out chan<- flow.Batch
	Log *slog.Logger
	// UDPTemplateTTL defaults to ipfix.DefaultUDPTemplateTTL.
	UDPTemplateTTL time.Duration
	// MaxSessions bounds concurrent TCP/TLS sessions and gRPC connections
	// (together), and remembered UDP peers; default 10000.
	MaxSessions int
	// Forwarder, when set, makes the IPFIX sessions' Forwarder: records
	// it takes are handed on encoded (flow.Batch.Encoded); the others are
	// normalized as usual. A gRPC stream has one too when it is a
	// flow.FlowForwarder: the stream decodes each flow into a record as
	// always, and hands on encoded what the forwarder takes.
	Forwarder func() flow.Forwarder
	// Sample, with Forwarder, is offered the records forwarded encoded:
	// those it wants are given to it as flow records too.
	Sample flow.Sampler
	// Records, when set, is where records come from first, and every
	// batch carries it for the mode to give them back (flow.Batch.Release).
	Records *flow.Pool
	// GRPC tunes the gRPC collector.
	GRPC GRPCOptions
	// HandshakeTimeout bounds a TLS handshake; default 10 s.
	HandshakeTimeout time.Duration
	// SeriesGrace is how long an exporter's per-exporter series outlive
	// its last session; default 10 minutes. Long enough for a reconnect
	// to continue the same counters and for scrapes to see final values,
	// short enough that departed exporters do not pile up.
	SeriesGrace time.Duration
	Metrics     *Metrics
}

func (o *Options) defaults() {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.UDPTemplateTTL == 0 {
		o.UDPTemplateTTL = ipfix.DefaultUDPTemplateTTL
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 10000
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.SeriesGrace == 0 {
		o.SeriesGrace = 10 * time.Minute
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	o.GRPC.defaults()
}

// Metrics are the collector's Prometheus series.
type Metrics struct {
	Records        *prometheus.CounterVec // transport, exporter
	Messages       *prometheus.CounterVec // transport
	DecodeErrors   *prometheus.CounterVec // transport
	Sessions       *prometheus.GaugeVec   // transport
	Refused        *prometheus.CounterVec // transport, reason
	Dropped        *prometheus.CounterVec // transport, reason
	UnknownSets    *prometheus.CounterVec // transport
	SkewUnknown    *prometheus.CounterVec // exporter
	SkewMissing    *prometheus.CounterVec // exporter
	TemplatesTotal *prometheus.CounterVec // transport, event
	// UDPKernelDrops counts datagrams the kernel dropped on the UDP
	// socket for want of room in its receive buffer.
	UDPKernelDrops prometheus.Counter
	// CertsRefused counts handshakes refused for the peer's certificate,
	// by reason (certs.RefusalReason): expired, not yet valid, signed by
	// an unknown authority, missing, invalid.
	CertsRefused *prometheus.CounterVec // transport, reason
	// ConfirmsWaiting are the gRPC streams whose response waits for the
	// sinks to write their records (GRPCOptions.ConfirmWritten).
	ConfirmsWaiting prometheus.Gauge
	// CertsExpiredClosed counts connections closed because the client
	// certificate they were accepted with expired while they were open.
	CertsExpiredClosed *prometheus.CounterVec // transport
	// CertsUntrustedClosed counts connections closed because, after the
	// CAs changed, the client certificate they were accepted with no
	// longer chains to a trusted CA ([Server.CloseUntrusted]).
	CertsUntrustedClosed *prometheus.CounterVec // transport
}

// NewMetrics creates the collector's series and registers them with reg
// when it is not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_records_received_total",
			Help: "Flow records received, by transport and exporter address."}, []string{"transport", "exporter"}),
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_messages_total",
			Help: "IPFIX messages received."}, []string{"transport"}),
		DecodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_decode_errors_total",
			Help: "Malformed IPFIX messages; on TCP and TLS each closes its session."}, []string{"transport"}),
		Sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_collector_sessions_open",
			Help: "Open transport sessions (UDP: peers with live state)."}, []string{"transport"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_sessions_refused_total",
			Help: "Connections refused: failed TLS handshakes (no or bad client certificate) or too many sessions."}, []string{"transport", "reason"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_records_dropped_total",
			Help: "Records dropped by the collector: UDP records the pipeline had no room for (pipeline-full), gRPC records with values that cannot be represented (invalid)."}, []string{"transport", "reason"}),
		UnknownSets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_unknown_template_sets_total",
			Help: "Data sets skipped because their template was not announced in the session."}, []string{"transport"}),
		SkewUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_skew_unknown_elements_total",
			Help: "Elements received that the aggregator does not know (newer exporters), summed over records."}, []string{"exporter"}),
		SkewMissing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_skew_missing_elements_total",
			Help: "Elements of the newest Antrea agent set that records lacked (older exporters), summed over records."}, []string{"exporter"}),
		TemplatesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_templates_total",
			Help: "Template events: added, replaced, withdrawn, expired."}, []string{"transport", "event"}),
		UDPKernelDrops: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_collector_udp_datagrams_dropped_total",
			Help: "IPFIX datagrams the kernel dropped before the collector read them: its UDP receive buffer was full."}),
		CertsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_client_certificates_refused_total",
			Help: "TLS handshakes refused for the client's certificate: cert-expired, cert-not-yet-valid, cert-unknown-authority, cert-missing, cert-invalid."}, []string{"transport", "reason"}),
		ConfirmsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_collector_grpc_confirms_waiting",
			Help: "gRPC export streams whose confirmation waits for the sinks to write their records (Proxy mode)."}),
		CertsExpiredClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_connections_closed_certificate_expired_total",
			Help: "Connections closed because the client certificate they were accepted with expired while they were open."}, []string{"transport"}),
		CertsUntrustedClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_collector_connections_closed_certificate_untrusted_total",
			Help: "Connections closed because, after the CAs changed, the client certificate they were accepted with no longer chains to a trusted CA."}, []string{"transport"}),
	}
	if reg != nil {
		reg.MustRegister(m.Records, m.Messages, m.DecodeErrors, m.Sessions, m.Refused, m.Dropped,
			m.UnknownSets, m.SkewUnknown, m.SkewMissing, m.TemplatesTotal, m.UDPKernelDrops, m.CertsRefused, m.ConfirmsWaiting, m.CertsExpiredClosed,
			m.CertsUntrustedClosed)
	}
	return m
}

// closeAtExpiry closes tc when the client certificate it was accepted
// with expires (the earliest NotAfter of its verified chain): TLS checks
// certificates only at the handshake, and exporters keep their
// connections for days. The returned func cancels it; call it when the
// connection ends.
func closeAtExpiry(m *Metrics, tc *tls.Conn, log *slog.Logger, transport string) (stop func()) {
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 {
		return func() {}
	}
	expiry := chainExpiry(st)
	leaf := st.VerifiedChains[0][0]
	t := time.AfterFunc(time.Until(expiry), func() {
		m.CertsExpiredClosed.WithLabelValues(transport).Inc()
		log.Warn("closing connection: the client certificate it was accepted with has expired",
			"certificate", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", expiry.UTC().Format(time.RFC3339))
		tc.Close()
	})
	return func() { t.Stop() }
}

// chainExpiry is the earliest NotAfter of the chain a connection's client
// certificate was verified with; the zero time when it was not verified.
func chainExpiry(st tls.ConnectionState) time.Time {
	var expiry time.Time
	if len(st.VerifiedChains) == 0 {
		return expiry
	}
	for _, c := range st.VerifiedChains[0] {
		if expiry.IsZero() || c.NotAfter.Before(expiry) {
			expiry = c.NotAfter
		}
	}
	return expiry
}

// handshakeFailed counts and logs a refused TLS handshake, naming the
// client certificate's fault when that is why.
func handshakeFailed(m *Metrics, refused prometheus.Counter, log *slog.Logger, transport, what string, err error) {
	refused.Inc()
	reason, detail := certs.RefusalReason(err, time.Now())
	if reason == "" {
		log.Warn("refusing "+what+": TLS handshake failed", "err", err)
		return
	}
	m.CertsRefused.WithLabelValues(transport, reason).Inc()
	log.Warn("refusing "+what+": client certificate refused", "reason", reason, "certificate", detail, "err", err)
}

// session decodes the messages of one transport session.
type session struct {
	transport string
	exporter  netip.Addr
	ipfix     *ipfix.Session
	dec       *ipfix.Decoder
	norm      *ipfixmap.Normalizer
	fwd       flow.Forwarder
	sample    flow.Sampler
	arenas    *ipfix.ArenaPool
	m         *Metrics
	records   prometheus.Counter
	skewU     prometheus.Counter
	skewM     prometheus.Counter
	last      ipfix.SessionStats
	// slab holds fresh records not handed out yet, free records taken
	// from the pool (a few dozen at a time) not handed out yet: records
	// left in either when the session ends are collected with it.
	slab []flow.Flow
	free []*flow.Flow
	pool *flow.Pool
}

// slabSize is how many records one allocation holds. A slab stays in
// memory while any of its records is referenced (by the mode or the
// sinks' buffer), so it is kept small.
const slabSize = 64

// newRecord returns a zeroed record: one given back by the mode, or one
// carved from a slab (one allocation per slabSize records instead of one
// each, which the profile of Proxy forwarding showed to be the largest
// cost).
func (s *session) newRecord() *flow.Flow {
	if len(s.free) == 0 && s.pool != nil {
		s.free = s.pool.Take(s.free, slabSize)
	}
	if k := len(s.free); k > 0 {
		f := s.free[k-1]
		s.free[k-1] = nil
		s.free = s.free[:k-1]
		return f
	}
	if len(s.slab) == 0 {
		s.slab = make([]flow.Flow, slabSize)
	}
	f := &s.slab[0]
	s.slab = s.slab[1:]
	return f
}

func newSession(o *Options, transport string, exporter netip.Addr, ttl time.Duration) *session {
	s := &session{transport: transport, exporter: exporter, m: o.Metrics, pool: o.Records}
	s.ipfix = ipfix.NewSession(ipfix.SessionOptions{Registry: o.Table.Registry(), TemplateTTL: ttl})
	s.dec = ipfix.NewDecoder(s.ipfix)
	s.norm = ipfixmap.NewNormalizer(o.Table)
	if o.Forwarder != nil {
		s.fwd = o.Forwarder()
		s.sample = o.Sample
	}
	addr := exporter.String()
	s.records = o.Metrics.Records.WithLabelValues(transport, addr)
	s.skewU = o.Metrics.SkewUnknown.WithLabelValues(addr)
	s.skewM = o.Metrics.SkewMissing.WithLabelValues(addr)
	return s
}

// decode turns one message into a batch. On a malformed message the
// records before the defect are still returned, with the error.
func (s *session) decode(msg []byte, now time.Time) (flow.Batch, error) {
	s.m.Messages.WithLabelValues(s.transport).Inc()
	b := flow.Batch{Pool: s.pool}
	if err := s.dec.Reset(msg, now); err != nil {
		s.m.DecodeErrors.WithLabelValues(s.transport).Inc()
		return b, err
	}
	h := s.dec.Header()
	origin := flow.Origin{ExportTime: h.Time(), ObservationDomainID: h.ObservationDomainID, Exporter: s.exporter, Transport: s.transport}
	var skew ipfixmap.Skew
	var arena *ipfix.Arena
	for i := uint32(0); s.dec.Next(); i++ {
		r := s.dec.Record()
		if r.Template.IsOptions() {
			continue // exporter metadata (softflowd's meteringProcessId...), not a flow
		}
		if s.fwd != nil {
			if arena == nil {
				// Export records are longer than received ones by the
				// Proxy elements (and labels, when on); this is room for
				// most messages, and the arena grows for the others.
				arena = s.arenas.Get(len(msg) + len(msg)/4 + 256)
				if cap(arena.Recs) == 0 {
					// Room for as many records as 100-octet ones would make.
					arena.Recs = make([]ipfix.EncodedRecord, 0, len(msg)/100+1)
				}
				b.Encoded = arena.Recs
			}
			var ok bool
			if arena.Buf, b.Encoded, ok = s.fwd.Forward(r, &origin, arena.Buf, b.Encoded); ok {
				k := s.norm.Skew(r.Template)
				skew.Unknown += k.Unknown
				skew.Missing += k.Missing
				if s.sample != nil && s.sample.Want() {
					f := new(flow.Flow)
					f.Origin = origin
					f.Origin.SequenceNumber = h.SequenceNumber + i
					s.norm.Normalize(r, f)
					s.sample.Put(f)
				}
				continue
			}
		}
		f := s.newRecord()
		f.Origin = origin
		f.Origin.SequenceNumber = h.SequenceNumber + i
		k := s.norm.Normalize(r, f)
		skew.Unknown += k.Unknown
		skew.Missing += k.Missing
		b.Flows = append(b.Flows, f)
	}
	if arena != nil {
		for i := range b.Encoded {
			b.Encoded[i].Arena = arena
		}
		arena.Recs = b.Encoded[:0]
		if len(b.Encoded) == 0 {
			b.Encoded = nil // the arena goes back to the pool now
		}
		arena.Hold(len(b.Encoded)) // last: after it, the arena may be reused
	}
	s.records.Add(float64(b.Len()))
	if skew.Unknown > 0 {
		s.skewU.Add(float64(skew.Unknown))
	}
	if skew.Missing > 0 {
		s.skewM.Add(float64(skew.Missing))
	}
	s.countTemplates()
	err := s.dec.Err()
	if err != nil {
		s.m.DecodeErrors.WithLabelValues(s.transport).Inc()
	}
	return b, err
}

// countTemplates moves the session's template counters into metrics.
func (s *session) countTemplates() {
	st := s.ipfix.Stats
	add := func(event string, now, before uint64) {
		if now > before {
			s.m.TemplatesTotal.WithLabelValues(s.transport, event).Add(float64(now - before))
		}
	}
	add("added", st.TemplatesAdded, s.last.TemplatesAdded)
	add("replaced", st.TemplatesReplaced, s.last.TemplatesReplaced)
	add("withdrawn", st.TemplatesWithdrawn, s.last.TemplatesWithdrawn)
	add("expired", st.TemplatesExpired, s.last.TemplatesExpired)
	if st.UnknownTemplateSets > s.last.UnknownTemplateSets {
		s.m.UnknownSets.WithLabelValues(s.transport).Add(float64(st.UnknownTemplateSets - s.last.UnknownTemplateSets))
	}
	s.last = st
}

// send hands a batch on, blocking (TCP) until there is room or ctx ends.
func send(ctx context.Context, out chan<- flow.Batch, b flow.Batch) bool {
	if b.Len() == 0 && len(b.EncodeErrs) == 0 && b.Written == nil {
		return true
	}
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		b.Discard()
		return false
	}
}
