// Package ipfixsend is the exporter's IPFIX transport: it sends the records
// of a queue.Queue to the aggregator over TCP, TLS or UDP with the element
// set and order of a chosen Antrea agent version. It announces its
// templates on every connection (over UDP, also every template refresh
// interval), reconnects with capped exponential backoff, and acknowledges
// records in the queue only once the message holding them was written, so
// that what a broken connection lost is sent again on the next.
package ipfixsend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/exporter/queue"
	"sluice/exporter/record"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ipfix/ipfixconn"
)

// Template IDs of the two element sets, as an agent numbers them.
const (
	TemplateIDv4 uint16 = 256
	TemplateIDv6 uint16 = 257
)

// Options configures a Sender.
type Options struct {
	// Address is host:port of the aggregator; Proto "tcp" or "udp".
	Address string
	Proto   string
	// Resolve, if set, is called before each connection attempt and
	// returns the host:port to dial instead of Address (for addresses
	// that name a Kubernetes Service).
	Resolve func(ctx context.Context) (string, error)
	// TLS, when set, wraps TCP in TLS.
	TLS *tls.Config
	// Profile is the Antrea agent version whose elements are sent; default
	// ipfixmap.NewestAgent.
	Profile             string
	ObservationDomainID uint32
	// MaxMessageSize defaults to 65535 over TCP and 1400 over UDP.
	MaxMessageSize int
	// TemplateRefresh re-announces the templates over UDP; default 600 s.
	TemplateRefresh time.Duration
	// Backoff between connection attempts grows from MinBackoff to
	// MaxBackoff; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// Extra are elements appended to both templates after the profile's,
	// each sent with its Value in every record: they make the sender look
	// like an agent newer than the aggregator (elements it does not know),
	// to reproduce version skew. Lengths are those of the values (1 to
	// 65534 octets).
	Extra []flow.Element
	// LocalAddr, when valid, is the address connections are made from, so
	// that several exporters on one host are told apart by the collector.
	LocalAddr netip.Addr
	// Batch is how many records are taken from the queue at a time;
	// default 512.
	Batch   int
	Log     *slog.Logger
	Metrics Metrics
}

// Metrics are the Sender's series (shared with grpcsend).
type Metrics = queue.SenderMetrics

// Sender is the IPFIX transport.
type Sender struct {
	o    Options
	els  [2][]*ipfixmap.Element
	tmpl [2]*ipfix.Template
	// plan is how each template is written from a record.Record (nil:
	// through a flow.Flow, in scratch).
	plan [2][]fieldOp
	meta [2]*metaCache
	// blocks, when set, writes a record without SNAT in blocks.
	blocks  [2]*blockPlan
	scratch flow.Flow
	enc     *ipfix.Encoder
	conn    *ipfixconn.Conn
	q       *queue.Queue
	// committed is the sequence number after the last record fully
	// encoded; a message that leaves acknowledges up to it.
	committed uint64
	connects  int
	// Over TCP and TLS, finished messages are gathered into one write of
	// up to coalesceBytes (a cycle of 50,000 records is then about 50
	// writes, not 190); out holds them, outRecords their records, and
	// outAck the sequence number their write acknowledges up to.
	out        []byte
	outRecords int
	outAck     uint64
}

// coalesceBytes is how many octets of messages a stream write gathers.
const coalesceBytes = 256 << 10

// New checks o and prepares the templates.
func New(o Options) (*Sender, error) {
	if o.Resolve == nil {
		if _, _, err := net.SplitHostPort(o.Address); err != nil {
			return nil, fmt.Errorf("ipfixsend: aggregator address: %w", err)
		}
	}
	if o.Profile == "" {
		o.Profile = ipfixmap.NewestAgent
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = ipfixconn.MessageSize(o.Proto)
	}
	if o.Batch <= 0 {
		o.Batch = 512
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		return nil, err
	}
	s := &Sender{o: o}
	if s.conn, err = ipfixconn.New(ipfixconn.Options{Address: o.Address, Proto: o.Proto, Resolve: o.Resolve, TLS: o.TLS,
		LocalAddr: o.LocalAddr, TemplateRefresh: o.TemplateRefresh, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff,
		Announce: s.announce, PeerClosed: errPeerClosed, Hooks: ipfixconn.Hooks{Connected: s.onConnect, Failed: s.onFail,
			Lost: s.onLost}}); err != nil {
		return nil, fmt.Errorf("ipfixsend: %w", err)
	}
	for i, fam := range []int{4, 6} {
		names, err := ipfixmap.AgentElements(o.Profile, fam)
		if err != nil {
			return nil, fmt.Errorf("ipfixsend: %w", err)
		}
		if s.els[i], err = table.Elements(names); err != nil {
			return nil, fmt.Errorf("ipfixsend: %w", err)
		}
		if s.tmpl[i], err = template([]uint16{TemplateIDv4, TemplateIDv6}[i], s.els[i], o.Extra); err != nil {
			return nil, fmt.Errorf("ipfixsend: %w", err)
		}
		if s.plan[i], s.meta[i], s.blocks[i], err = recordPlan(s.els[i], s.tmpl[i], fam == 6); err != nil {
			return nil, fmt.Errorf("ipfixsend: %w", err)
		}
	}
	// One set per message: collectors built on go-ipfix (the reference
	// aggregator among them) read only the first set of each message.
	if s.enc, err = ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: o.MaxMessageSize, OneSetPerMessage: true}, s.emit); err != nil {
		return nil, fmt.Errorf("ipfixsend: %w", err)
	}
	return s, nil
}

// template builds the template of the profile's elements followed by the
// extra ones, which are octet arrays of their values' length.
func template(id uint16, els []*ipfixmap.Element, extra []flow.Element) (*ipfix.Template, error) {
	fields := make([]ipfix.Field, 0, len(els)+len(extra))
	for _, el := range els {
		fields = append(fields, ipfix.Field{IE: el.IE})
	}
	for _, x := range extra {
		n := len(x.Value)
		if n == 0 || n >= int(ipfix.VariableLength) {
			return nil, fmt.Errorf("extra element %d:%d: a value of %d octets", x.EnterpriseID, x.ID, n)
		}
		ie := &ipfix.InfoElement{Name: fmt.Sprintf("%d:%d", x.EnterpriseID, x.ID), EnterpriseID: x.EnterpriseID,
			ID: x.ID, Type: ipfix.OctetArray, Length: uint16(n)}
		fields = append(fields, ipfix.Field{IE: ie, Length: uint16(n)})
	}
	return ipfix.NewTemplate(id, fields)
}

// Templates returns the IPv4 and IPv6 templates.
func (s *Sender) Templates() [2]*ipfix.Template { return s.tmpl }

func inc(c prometheus.Counter, n int) {
	if c != nil && n > 0 {
		c.Add(float64(n))
	}
}

// Run sends the records of q until ctx ends. Records not yet written then
// stay in q.
func (s *Sender) Run(ctx context.Context, q *queue.Queue) error {
	s.q = q
	defer s.conn.Close()
	var next uint64
	batch := make([]record.Record, 0, s.o.Batch)
	for ctx.Err() == nil {
		if !s.conn.Alive() {
			if s.conn.Connect(ctx) != nil {
				break
			}
			next = s.committed // the queue's head when it connected
		}
		if !s.wait(ctx, next) {
			continue
		}
		var first uint64
		first, batch = q.Peek(next, batch[:0], s.o.Batch)
		if first > s.committed {
			s.committed = first // the queue dropped records meanwhile
		}
		for i := range batch {
			if err := s.writeRecord(&batch[i]); err != nil {
				// A connection breaks only while a message leaves, and
				// the record being written then fails too.
				if !s.conn.Connected() {
					break
				}
				inc(s.o.Metrics.EncodeErrors, 1)
				s.o.Log.Error("cannot encode a flow record; dropped", "err", err)
			}
			s.committed = first + uint64(i) + 1
			next = s.committed
		}
		if s.conn.Connected() {
			if s.enc.Flush() == nil {
				_ = s.writeOut()
			}
		}
	}
	return nil
}

// wait blocks until records from next on are queued, or a second passed
// (then it checks the connection and the template refresh), or ctx ends.
func (s *Sender) wait(ctx context.Context, next uint64) bool {
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	ok := s.q.Wait(wctx, next)
	cancel()
	if !s.conn.Alive() {
		return false
	}
	s.conn.Refresh()
	return ok && s.conn.Connected()
}

func (s *Sender) write(f *flow.Flow) error {
	i := 0
	if f.IsIPv6() {
		i = 1
	}
	b := ipfixmap.PutValues(s.enc.Begin(s.o.ObservationDomainID, s.tmpl[i]), s.els[i], f)
	for _, x := range s.o.Extra {
		b = b.Bytes(x.Value)
	}
	return b.End()
}

var errPeerClosed = errors.New("ipfixsend: the aggregator closed the connection")

// emit is the encoder's output: one finished message. Over UDP it is a
// datagram of its own; over a stream it joins the next write (writeOut),
// which leaves when it is big enough or when the sender has encoded all
// that is queued.
func (s *Sender) emit(msg []byte) error {
	n := s.enc.PendingRecords()
	if s.o.Proto == "udp" {
		if err := s.conn.Write(msg); err != nil {
			return err
		}
		inc(s.o.Metrics.Sent, n)
		s.q.Ack(s.committed)
		return nil
	}
	s.out = append(s.out, msg...)
	s.outRecords += n
	s.outAck = s.committed
	if len(s.out) >= coalesceBytes {
		return s.writeOut()
	}
	return nil
}

// writeOut writes the gathered messages and acknowledges their records.
// On failure the connection is dropped (onLost forgets them) and the
// records are sent again on the next one.
func (s *Sender) writeOut() error {
	if len(s.out) == 0 {
		return nil
	}
	buf, n, ack := s.out, s.outRecords, s.outAck
	s.out, s.outRecords = s.out[:0], 0
	if err := s.conn.Write(buf); err != nil {
		return err
	}
	inc(s.o.Metrics.Sent, n)
	s.q.Ack(ack)
	return nil
}

// onConnect counts and logs a new connection. Whatever was not
// acknowledged goes (again) on it: committed is reset before the
// templates leave, as their message acknowledges up to it.
func (s *Sender) onConnect(addr string) {
	s.committed = s.q.Head()
	s.connects++
	if s.connects > 1 {
		inc(s.o.Metrics.Reconnects, 1)
	}
	if s.o.Metrics.Connected != nil {
		s.o.Metrics.Connected.Set(1)
	}
	s.o.Log.Info("connected to the flow aggregator", "address", addr, "proto", s.o.Proto, "tls", s.o.TLS != nil,
		"profile", s.o.Profile)
}

func (s *Sender) onFail(err error, retryIn time.Duration) {
	inc(s.o.Metrics.ConnectFailures, 1)
	s.o.Log.Warn("cannot reach the flow aggregator; records wait in the buffer", "address", s.o.Address,
		"retry_in", retryIn.String(), "buffered", s.q.Len(), "err", err)
}

func (s *Sender) announce() error {
	for _, t := range s.tmpl {
		if err := s.enc.AddTemplate(s.o.ObservationDomainID, t); err != nil {
			return err
		}
	}
	if err := s.enc.Flush(); err != nil {
		return err
	}
	return s.writeOut()
}

// onLost follows the connection's close; records of the message being
// built were not acknowledged and are sent again on the next connection.
func (s *Sender) onLost(err error) {
	if err != nil {
		s.o.Log.Warn("lost the flow aggregator", "address", s.o.Address, "err", err)
	}
	s.enc.Discard()
	s.out, s.outRecords = s.out[:0], 0 // not acknowledged: sent again
	if s.o.Metrics.Connected != nil {
		s.o.Metrics.Connected.Set(0)
	}
}
