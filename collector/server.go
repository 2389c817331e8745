package collector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/ipfix"
)

// Server runs the IPFIX listeners. Serve methods return when their
// context ends, after their sessions are closed.
type Server struct {
	o     Options
	slots chan struct{} // one per open TCP/TLS session

	// refs counts live sessions per exporter address, so that the
	// per-exporter metric series are deleted SeriesGrace after an
	// exporter's last session closes, and their number stays bounded by
	// the exporters seen within that time. gen tells a pending deletion
	// whether the exporter came back (and maybe left again) meanwhile.
	mu   sync.Mutex
	refs map[netip.Addr]int
	gen  map[netip.Addr]uint64
	// arenas hold the forwarded records of every session (Options.Forwarder).
	arenas ipfix.ArenaPool
	// certConns are the open connections accepted with a client
	// certificate (IPFIX/TLS and gRPC), to check again when the CAs
	// change; each is removed when its connection closes.
	certMu    sync.Mutex
	certConns map[*certConn]struct{}
}

// New returns a server with o (defaults filled in).
func New(o Options) (*Server, error) {
	if o.Table == nil || o.Out == nil {
		return nil, errors.New("collector: Options.Table and Options.Out are required")
	}
	o.defaults()
	return &Server{o: o, slots: make(chan struct{}, o.MaxSessions), refs: map[netip.Addr]int{}, gen: map[netip.Addr]uint64{},
		certConns: map[*certConn]struct{}{}}, nil
}

func (s *Server) openSession(transport string, exporter netip.Addr, ttl time.Duration) *session {
	s.hold(exporter)
	sess := newSession(&s.o, transport, exporter, ttl)
	sess.arenas = &s.arenas
	return sess
}

func (s *Server) closeSession(sess *session) { s.release(sess.exporter) }

// hold and release count the live sessions of an exporter address.
func (s *Server) hold(exporter netip.Addr) {
	s.mu.Lock()
	s.refs[exporter]++
	s.gen[exporter]++ // cancels a pending deletion
	s.mu.Unlock()
}

func (s *Server) release(exporter netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs[exporter]--; s.refs[exporter] > 0 {
		return
	}
	delete(s.refs, exporter)
	s.gen[exporter]++
	g := s.gen[exporter]
	time.AfterFunc(s.o.SeriesGrace, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.refs[exporter] != 0 || s.gen[exporter] != g {
			return // back since, or gone again with a later deletion due
		}
		delete(s.gen, exporter)
		series := prometheus.Labels{"exporter": exporter.String()}
		s.o.Metrics.Records.DeletePartialMatch(series)
		s.o.Metrics.SkewUnknown.DeletePartialMatch(series)
		s.o.Metrics.SkewMissing.DeletePartialMatch(series)
	})
}

// ServeTCP accepts IPFIX-over-TCP sessions on ln; with tlsConfig set they
// are TLS sessions (give it ClientAuth RequireAndVerifyClientCert for
// mutual TLS). Each session keeps its own templates for its lifetime.
func (s *Server) ServeTCP(ctx context.Context, ln net.Listener, tlsConfig *tls.Config) error {
	transport := "tcp"
	if tlsConfig != nil {
		transport = "tls"
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("collector: %s listener closed: %w", transport, err)
			}
			// Running out of file descriptors and the like pass: wait a
			// little, as net/http does, instead of giving up the port.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.o.Log.Warn("accepting an IPFIX session failed; retrying", "transport", transport, "err", err, "retry_in", delay.String())
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		select {
		case s.slots <- struct{}{}:
		default:
			s.o.Metrics.Refused.WithLabelValues(transport, "session-limit").Inc()
			s.o.Log.Warn("refusing IPFIX session: too many sessions", "transport", transport, "peer", c.RemoteAddr().String(), "limit", s.o.MaxSessions)
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.slots }()
			s.serveConn(ctx, c, transport, tlsConfig)
		}()
	}
}

func (s *Server) serveConn(ctx context.Context, c net.Conn, transport string, tlsConfig *tls.Config) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	peer := c.RemoteAddr().String()
	log := s.o.Log.With("transport", transport, "peer", peer)
	if tlsConfig != nil {
		tc := tls.Server(c, tlsConfig)
		hctx, cancel := context.WithTimeout(ctx, s.o.HandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			handshakeFailed(s.o.Metrics, s.o.Metrics.Refused.WithLabelValues(transport, "tls-handshake"), log, transport, "IPFIX session", err)
			return
		}
		defer s.watchClientCert(tc, c, transport, log)()
		c = tc
	}
	gauge := s.o.Metrics.Sessions.WithLabelValues(transport)
	gauge.Inc()
	defer gauge.Dec()
	log.Info("IPFIX session opened")
	sess := s.openSession(transport, addrOf(c.RemoteAddr()), 0)
	defer s.closeSession(sess)
	mr := ipfix.NewMessageReader(c)
	for {
		msg, err := mr.Next()
		if err != nil {
			switch {
			case errors.Is(err, io.EOF) || ctx.Err() != nil:
				log.Info("IPFIX session closed", "messages", sess.ipfix.Stats.Messages, "records", sess.ipfix.Stats.DataRecords)
			case errors.Is(err, ipfix.ErrMalformed):
				s.o.Metrics.DecodeErrors.WithLabelValues(transport).Inc()
				log.Warn("closing IPFIX session: malformed message", "err", err)
			case errors.Is(err, io.ErrUnexpectedEOF):
				// The peer went away inside a message: what it sent of it
				// is lost, and counted with the malformed ones.
				s.o.Metrics.DecodeErrors.WithLabelValues(transport).Inc()
				log.Warn("IPFIX session ended inside a message (truncated)", "err", err)
			default:
				log.Info("IPFIX session ended", "err", err)
			}
			return
		}
		b, derr := sess.decode(msg, time.Now())
		if !send(ctx, s.o.Out, b) {
			return
		}
		if derr != nil {
			log.Warn("closing IPFIX session: malformed message", "offset", mr.Offset, "err", derr)
			return
		}
	}
}

// UDPReadBuffer is the receive buffer ServeUDP asks for.
const UDPReadBuffer = 8 << 20

// ServeUDP reads IPFIX datagrams from conn. Templates are kept per source
// address and port and expire after UDPTemplateTTL; a peer silent that
// long is forgotten. When the pipeline is full, records are dropped and
// counted rather than blocking the socket.
func (s *Server) ServeUDP(ctx context.Context, conn *net.UDPConn) error {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	type peer struct {
		s      *session
		seen   time.Time
		logged bool
	}
	peers := map[netip.AddrPort]*peer{}
	defer func() {
		for _, p := range peers {
			s.closeSession(p.s)
		}
	}()
	gauge := s.o.Metrics.Sessions.WithLabelValues("udp")
	defer gauge.Set(0)
	dropped := s.o.Metrics.Dropped.WithLabelValues("udp", "pipeline-full")
	// A burst of datagrams (many exporters at once) must fit in the
	// socket until it is read; what the kernel still drops is counted.
	raiseReadBuffer(conn, UDPReadBuffer)
	if _, ok := kernelDrops(conn); ok {
		kernel := s.o.Metrics.UDPKernelDrops
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			var last uint64
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if n, ok := kernelDrops(conn); ok && n > last {
					kernel.Add(float64(n - last))
					last = n
				}
			}
		}()
	}
	buf := make([]byte, ipfix.MaxMessageLen)
	lastSweep := time.Now()
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("collector: read udp: %w", err)
		}
		now := time.Now()
		if now.Sub(lastSweep) > time.Minute {
			lastSweep = now
			for k, p := range peers {
				if now.Sub(p.seen) > s.o.UDPTemplateTTL {
					s.closeSession(p.s)
					delete(peers, k)
				} else {
					p.s.ipfix.Expire(now)
				}
			}
		}
		p := peers[from]
		if p == nil {
			if len(peers) >= s.o.MaxSessions {
				// Forget the longest-silent peer to make room.
				var oldest netip.AddrPort
				var t time.Time
				for k, q := range peers {
					if t.IsZero() || q.seen.Before(t) {
						oldest, t = k, q.seen
					}
				}
				s.closeSession(peers[oldest].s)
				delete(peers, oldest)
			}
			p = &peer{s: s.openSession("udp", from.Addr().Unmap(), s.o.UDPTemplateTTL)}
			peers[from] = p
		}
		p.seen = now
		gauge.Set(float64(len(peers)))
		b, derr := p.s.decode(buf[:n], now)
		if derr != nil && !p.logged {
			p.logged = true // once per peer: a broken exporter sends many
			s.o.Log.Warn("malformed IPFIX datagram: the records before the defect are kept, the rest is dropped (further ones from this peer are only counted)", "transport", "udp", "peer", from.String(), "err", derr)
		}
		if b.Len() == 0 {
			continue
		}
		select {
		case s.o.Out <- b:
		default:
			dropped.Add(float64(b.Len()))
			b.Discard()
		}
	}
}

func addrOf(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
