// Package synthetic is an exporter source that makes up connections at a
// given rate: local Pods talking to Pods on the same Node, on other Nodes,
// to Services and to the outside, over TCP and UDP, with lifetimes from
// milliseconds to minutes and counters that grow between polls. Given
// Routes, it draws the connections from them instead: who talks to whom is
// then the caller's (a modelled cluster's). It is for load tests and demos;
// the same seed gives the same connections.
package synthetic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"sluice/exporter/source"
)

// Options configures a Source.
type Options struct {
	// Rate is the number of new connections per second.
	Rate float64
	// PodCIDRs are this Node's Pod CIDRs; client Pods are taken from the
	// first. Required unless Routes are given.
	PodCIDRs []netip.Prefix
	// PeerCIDRs are other Nodes' Pod CIDRs, for inter-Node traffic; without
	// them all Pod-to-Pod traffic stays on the Node.
	PeerCIDRs []netip.Prefix
	// Routes, when set, are the only connections made: each new
	// connection follows one of them, picked at random; PodCIDRs and
	// PeerCIDRs are then not used.
	Routes []Route
	// MaxLive bounds the connections alive at once; default 100,000.
	MaxLive int
	Seed    uint64
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Route is one kind of connection: a client, what it dials, and who
// answers.
type Route struct {
	Client netip.Addr
	Proto  uint8
	// Dst is what the client dials: a Pod, a Service's ClusterIP and
	// port, or an outside address.
	Dst netip.AddrPort
	// Endpoints are the translations of a Dst that is load-balanced
	// (DNAT): one is picked per connection and answers in Dst's place, as
	// conntrack shows it in the reply tuple. Empty: Dst answers itself.
	Endpoints []netip.AddrPort
	// Denied connections are never answered: the client sends a few
	// packets (a TCP SYN and its retransmissions, SYN_SENT) and no reply
	// comes, until the entry times out.
	Denied bool
}

// Source is a synthetic connection table.
type Source struct {
	mu     sync.Mutex
	o      Options
	rng    *rand.Rand
	live   []conn
	last   time.Time
	carry  float64
	nextID uint32
	closed bool
}

type conn struct {
	c source.Conn
	// rates in octets per second; ends when the connection stops sending,
	// gone when it leaves the table.
	rate, revRate float64
	sent, revSent float64
	ends, gone    time.Time
	// denied: unanswered; start is when it was made.
	denied bool
	start  time.Time
}

var _ source.Source = (*Source)(nil)

// New checks o and returns a source.
func New(o Options) (*Source, error) {
	if o.Rate <= 0 {
		return nil, errors.New("synthetic: the rate must be positive")
	}
	if len(o.PodCIDRs) == 0 && len(o.Routes) == 0 {
		return nil, errors.New("synthetic: at least one Pod CIDR or route is needed")
	}
	for i, r := range o.Routes {
		if !r.Client.IsValid() || !r.Dst.IsValid() {
			return nil, fmt.Errorf("synthetic: route %d: the client and the destination must be addresses", i)
		}
		if r.Proto != source.ProtoTCP && r.Proto != source.ProtoUDP && r.Proto != source.ProtoSCTP {
			return nil, fmt.Errorf("synthetic: route %d: protocol %d is not TCP, UDP or SCTP", i, r.Proto)
		}
	}
	if o.MaxLive <= 0 {
		o.MaxLive = 100_000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Source{o: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x5eed)), nextID: 1}, nil
}

// Dump implements source.Source: it advances the table to now, then
// appends it.
func (s *Source) Dump(ctx context.Context, dst []source.Conn) ([]source.Conn, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return dst, errors.New("synthetic: source closed")
	}
	now := s.o.Now()
	s.advance(now)
	for i := range s.live {
		dst = append(dst, s.live[i].c)
	}
	return dst, nil
}

func (s *Source) advance(now time.Time) {
	if s.last.IsZero() {
		s.last = now
		s.carry = 1 // one connection right away, so a first poll is not empty
	}
	dt := now.Sub(s.last).Seconds()
	if dt < 0 {
		dt = 0
	}
	s.last = now
	// Existing connections: grow counters, close, remove.
	kept := s.live[:0]
	for _, c := range s.live {
		if !now.Before(c.gone) {
			continue
		}
		active := dt
		if end := c.ends; now.After(end) {
			active = max(0, dt-now.Sub(end).Seconds())
		}
		if c.denied {
			// One more attempt per second, none answered.
			c.c.Packets = 1 + uint64(now.Sub(c.start)/time.Second)
			c.c.Bytes = 60 * c.c.Packets
			if !now.Before(c.ends) && c.c.Proto != source.ProtoTCP {
				c.c.Dying = true
			}
			kept = append(kept, c)
			continue
		}
		c.sent += c.rate * active
		c.revSent += c.revRate * active
		c.c.Bytes = uint64(c.sent)
		c.c.ReverseBytes = uint64(c.revSent)
		c.c.Packets = c.c.Bytes/1400 + 3
		c.c.ReversePackets = c.c.ReverseBytes/1400 + 2
		if !now.Before(c.ends) {
			if c.c.Proto == source.ProtoTCP {
				c.c.TCPState = source.TCPTimeWait
			} else {
				c.c.Dying = true
			}
		}
		kept = append(kept, c)
	}
	s.live = kept
	s.carry += s.o.Rate * dt
	for ; s.carry >= 1; s.carry-- {
		if len(s.live) >= s.o.MaxLive {
			s.carry = 0
			break
		}
		s.live = append(s.live, s.newConn(now))
	}
}

var (
	externalNet = netip.MustParsePrefix("203.0.113.0/24") // TEST-NET-3
	serviceNet  = netip.MustParsePrefix("10.96.0.0/24")
	tcpPorts    = []uint16{80, 443, 8080, 5432, 6379, 9090}
)

func (s *Source) host(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr()
	if free := a.BitLen() - p.Bits(); free < 16 {
		n = max(1, min(n, 1<<free-3))
	}
	b := a.AsSlice()
	// Hosts 2..n+1 of the prefix (skipping the network and gateway).
	v := 2 + s.rng.IntN(n)
	b[len(b)-1] += byte(v)
	out, _ := netip.AddrFromSlice(b)
	return out
}

func (s *Source) newConn(now time.Time) conn {
	var c source.Conn
	denied := false
	if len(s.o.Routes) > 0 {
		c, denied = s.routed()
	} else {
		c = s.madeUp()
	}
	c.ID, c.Start = s.nextID, now
	s.nextID++
	if denied {
		c.Packets, c.Bytes = 1, 60
		if c.Proto == source.ProtoTCP {
			c.TCPState = source.TCPSynSent
		}
		// The client gives up after a few attempts; the entry stays until
		// its (shortened) timeout.
		return conn{c: c, denied: true, start: now, ends: now.Add(3 * time.Second), gone: now.Add(5 * time.Second)}
	}
	proto := c.Proto
	if proto == source.ProtoTCP {
		c.TCPState = source.TCPEstablished
	}
	var life time.Duration
	switch x := s.rng.Float64(); {
	case x < 0.7:
		life = time.Duration(100+s.rng.IntN(1900)) * time.Millisecond
	case x < 0.95:
		life = time.Duration(2+s.rng.IntN(28)) * time.Second
	default:
		life = time.Duration(30+s.rng.IntN(270)) * time.Second
	}
	// TCP lingers in TIME_WAIT after the close, as in the kernel (shortened).
	linger := 2 * time.Second
	if proto != source.ProtoTCP {
		linger = time.Second
	}
	rate, revRate := float64(1_000+s.rng.IntN(1_000_000)), float64(500+s.rng.IntN(4_000_000))
	if proto == source.ProtoUDP {
		// UDP here is DNS-like: small questions and answers.
		rate, revRate = rate/1000, revRate/1000
	}
	return conn{c: c, rate: rate, revRate: revRate, ends: now.Add(life), gone: now.Add(life + linger)}
}

// madeUp makes up a connection's tuple from the Pod CIDRs.
func (s *Source) madeUp() source.Conn {
	local := s.o.PodCIDRs[0]
	src := s.host(local, 20)
	var dst netip.Addr
	r := s.rng.Float64()
	switch {
	case r < 0.4 && len(s.o.PeerCIDRs) > 0:
		dst = s.host(s.o.PeerCIDRs[s.rng.IntN(len(s.o.PeerCIDRs))], 20)
	case r < 0.8:
		dst = s.host(local, 20)
	default:
		dst = s.host(externalNet, 200)
	}
	proto := source.ProtoTCP
	port := tcpPorts[s.rng.IntN(len(tcpPorts))]
	if s.rng.IntN(5) == 0 {
		proto, port = source.ProtoUDP, 53
	}
	sport := s.ephemeralPort()
	c := source.Conn{Proto: proto,
		OrigSrc: netip.AddrPortFrom(src, sport), OrigDst: netip.AddrPortFrom(dst, port),
		ReplySrc: netip.AddrPortFrom(dst, port), ReplyDst: netip.AddrPortFrom(src, sport)}
	if dst != src && s.rng.IntN(10) == 0 {
		// Through a Service: the client dialled a ClusterIP; the reply
		// comes from the endpoint.
		c.OrigDst = netip.AddrPortFrom(s.host(serviceNet, 100), port)
	}
	return c
}

// routed draws a connection's tuple from the routes.
func (s *Source) routed() (source.Conn, bool) {
	r := &s.o.Routes[s.rng.IntN(len(s.o.Routes))]
	sport := s.ephemeralPort()
	answer := r.Dst
	if len(r.Endpoints) > 0 {
		answer = r.Endpoints[s.rng.IntN(len(r.Endpoints))]
	}
	return source.Conn{Proto: r.Proto,
		OrigSrc: netip.AddrPortFrom(r.Client, sport), OrigDst: r.Dst,
		ReplySrc: answer, ReplyDst: netip.AddrPortFrom(r.Client, sport)}, r.Denied
}

func (s *Source) ephemeralPort() uint16 { return uint16(32768 + s.rng.IntN(28232)) }

// Close implements source.Source.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.live = nil
	return nil
}
