// Package ipfixconn is the transport of an IPFIX exporting process: one
// connection at a time to a collecting process over TCP, TLS or UDP. It
// dials with capped exponential backoff, notices when the collector closes
// a TCP or TLS connection (a collector never writes, so the end of a read
// means that), has the templates announced on every new connection and,
// over UDP, every template refresh interval, and writes whole messages.
//
// What goes into the messages (encoder, templates, records) stays with the
// caller; so do metrics and logs, through Hooks, so that each exporting
// process keeps its own series and wording. A Conn is used from one
// goroutine; the hooks run on it.
package ipfixconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"sluice/ipfix"
)

// Options configures a Conn.
type Options struct {
	// Address is host:port of the collector; Proto "tcp" or "udp".
	Address string
	Proto   string
	// Resolve, if set, is called before each connection attempt and
	// returns the host:port to dial instead of Address.
	Resolve func(ctx context.Context) (string, error)
	// TLS, when set, wraps TCP in TLS.
	TLS *tls.Config
	// TLSConfig, when set, wraps TCP in TLS with the configuration it
	// returns, asked for before each connection attempt: certificates
	// that changed (a renewed Secret) are used by the next connection. An
	// error fails the attempt, which is retried. It wins over TLS.
	TLSConfig func(ctx context.Context) (*tls.Config, error)
	// LocalAddr, when valid, is the address connections are made from.
	LocalAddr netip.Addr
	// TemplateRefresh is how often templates are announced again over
	// UDP; default 600 s.
	TemplateRefresh time.Duration
	// Backoff between connection attempts grows from MinBackoff to
	// MaxBackoff; defaults 1 s and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// WriteTimeout bounds Writes: a collector that stops reading would
	// otherwise block the writer (and its caller's shutdown) for ever.
	// Each Write has at least half of it; one that times out drops the
	// connection. Default 10 s.
	WriteTimeout time.Duration
	// StopWrites makes a Write blocked on a collector that reads slowly
	// fail at once (dropping the connection) when the context given to
	// the Connect that made the connection ends, so that a caller
	// stopped at shutdown is not held for up to WriteTimeout.
	StopWrites bool
	// Announce sends the templates (typically: add them to an encoder
	// whose output is Write, and flush). It is called on every new
	// connection and when a UDP refresh is due; an error drops the
	// connection.
	Announce func() error
	// PeerClosed is the error a connection the collector closed is
	// dropped with (what Hooks.Lost sees); default ErrPeerClosed.
	PeerClosed error
	Hooks      Hooks
}

// Hooks let the caller count and log the connection's life. Each may be
// nil.
type Hooks struct {
	// Attempt runs before each connection attempt.
	Attempt func()
	// Connected runs once a connection to addr (the address dialed) is
	// made, before the templates are announced on it.
	Connected func(addr string)
	// Failed runs after an attempt failed, before waiting retryIn.
	Failed func(err error, retryIn time.Duration)
	// Lost runs after the connection was closed: because of err, or, with
	// a nil err, by Close.
	Lost func(err error)
}

var (
	// ErrNotConnected is what Write returns with no connection.
	ErrNotConnected = errors.New("ipfixconn: not connected")
	// ErrPeerClosed is the default Options.PeerClosed.
	ErrPeerClosed = errors.New("ipfixconn: the collector closed the connection")
	// ErrWriteTimeout wraps the error of a Write that passed
	// Options.WriteTimeout.
	ErrWriteTimeout = errors.New("ipfixconn: write timed out")
)

// errWritesStopped is the error of a Write after the context of its
// connection ended (Options.StopWrites).
var errWritesStopped = errors.New("ipfixconn: stopped: the connection's context ended")

// DefaultWriteTimeout is Options.WriteTimeout's default.
const DefaultWriteTimeout = 10 * time.Second

// dialTimeout bounds one connection attempt (with the TLS handshake).
const dialTimeout = 10 * time.Second

// MessageSize is the default maximum message size for proto: the largest
// IPFIX message over TCP, one that fits an Ethernet frame over UDP.
func MessageSize(proto string) int {
	if proto == "udp" {
		return 1400
	}
	return ipfix.MaxMessageLen
}

// Conn is the connection of one exporting process; the zero Conn is not
// usable, New makes one. It starts unconnected.
type Conn struct {
	o  Options
	nc net.Conn
	// deadline is the write deadline set on nc; zero for a new one.
	deadline time.Time
	// gone is set when the collector ends a TCP/TLS connection; nil over
	// UDP. One per connection, so that the reader of a dropped one cannot
	// mark its successor; a flag rather than a channel keeps Alive, which
	// callers run per record, a few inlined loads.
	gone *atomic.Bool
	// lastAnnounce is when the templates were last announced.
	lastAnnounce time.Time
	// stopped is set, with StopWrites, when the Connect's context of the
	// connection ended; unwatch stops watching that context.
	stopped *atomic.Bool
	unwatch func() bool
}

// New checks o and returns an unconnected Conn.
func New(o Options) (*Conn, error) {
	if o.Proto != "tcp" && o.Proto != "udp" {
		return nil, fmt.Errorf("protocol %q is neither tcp nor udp", o.Proto)
	}
	if (o.TLS != nil || o.TLSConfig != nil) && o.Proto != "tcp" {
		return nil, errors.New("TLS needs the tcp protocol")
	}
	if o.Resolve == nil {
		if _, _, err := net.SplitHostPort(o.Address); err != nil {
			return nil, fmt.Errorf("address: %w", err)
		}
	}
	if o.TemplateRefresh <= 0 {
		o.TemplateRefresh = 600 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	if o.Announce == nil {
		o.Announce = func() error { return nil }
	}
	if o.PeerClosed == nil {
		o.PeerClosed = ErrPeerClosed
	}
	return &Conn{o: o}, nil
}

// Connected reports whether there is a connection, closed by the
// collector or not; Alive also looks at that.
func (c *Conn) Connected() bool { return c.nc != nil }

// Alive reports whether there is a connection the collector has not
// closed. It leaves one the collector closed in place, for the next Write
// or Connect to drop: it is cheap enough to ask per record.
func (c *Conn) Alive() bool {
	return c.nc != nil && (c.gone == nil || !c.gone.Load())
}

// dropHungUp drops the connection if the collector closed it.
func (c *Conn) dropHungUp() {
	if c.nc != nil && !c.Alive() {
		c.drop(c.o.PeerClosed)
	}
}

// Connect returns nil at once if Alive; otherwise it drops a connection
// the collector closed and tries to connect, waiting between attempts,
// until a connection is made and its templates are announced, or ctx ends
// (then it returns ctx's error).
func (c *Conn) Connect(ctx context.Context) error {
	if c.Alive() {
		return nil
	}
	c.dropHungUp()
	backoff := c.o.MinBackoff
	for {
		err := c.dial(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if h := c.o.Hooks.Failed; h != nil {
			h(err, backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, c.o.MaxBackoff)
	}
}

// dial makes one connection attempt and announces the templates on it.
func (c *Conn) dial(ctx context.Context) error {
	if h := c.o.Hooks.Attempt; h != nil {
		h()
	}
	addr := c.o.Address
	if c.o.Resolve != nil {
		a, err := c.o.Resolve(ctx)
		if err != nil {
			return err
		}
		addr = a
	}
	d := net.Dialer{Timeout: dialTimeout}
	if c.o.LocalAddr.IsValid() {
		if c.o.Proto == "udp" {
			d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.o.LocalAddr, 0))
		} else {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(c.o.LocalAddr, 0))
		}
	}
	var nc net.Conn
	var err error
	tlsConf := c.o.TLS
	if c.o.TLSConfig != nil {
		if tlsConf, err = c.o.TLSConfig(ctx); err != nil {
			return fmt.Errorf("TLS configuration: %w", err)
		}
	}
	if tlsConf != nil {
		td := tls.Dialer{NetDialer: &d, Config: tlsConf}
		nc, err = td.DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, c.o.Proto, addr)
	}
	if err != nil {
		return err
	}
	c.nc, c.deadline = nc, time.Time{}
	c.gone = nil
	if c.o.StopWrites {
		stopped := new(atomic.Bool)
		c.stopped = stopped
		c.unwatch = context.AfterFunc(ctx, func() {
			stopped.Store(true)
			_ = nc.SetWriteDeadline(time.Unix(1, 0)) // net.Conn's deadlines may be set from any goroutine
		})
	}
	if c.o.Proto == "tcp" {
		gone := new(atomic.Bool)
		c.gone = gone
		go func() {
			// Returns when the collector closes the connection, or when
			// it is dropped here (Close makes the read fail).
			var b [1]byte
			_, _ = nc.Read(b[:])
			gone.Store(true)
		}()
	}
	if h := c.o.Hooks.Connected; h != nil {
		h(addr)
	}
	return c.announce()
}

// announce has the templates sent; a failure drops the connection (a
// failed write has already).
func (c *Conn) announce() error {
	c.lastAnnounce = time.Now()
	if err := c.o.Announce(); err != nil {
		c.drop(err)
		return err
	}
	if c.nc == nil {
		return ErrNotConnected
	}
	return nil
}

// Refresh announces the templates again over UDP when the template
// refresh interval has passed since they last were; a failure drops the
// connection.
func (c *Conn) Refresh() {
	if c.nc != nil && c.o.Proto == "udp" && time.Since(c.lastAnnounce) >= c.o.TemplateRefresh {
		_ = c.announce()
	}
}

// Write sends one message. If the collector closed the connection or the
// write fails, the connection is dropped and Write fails; with no
// connection it returns ErrNotConnected.
func (c *Conn) Write(msg []byte) error {
	c.dropHungUp()
	if c.nc == nil {
		return ErrNotConnected
	}
	// A deadline per message, set only when the last one is half spent,
	// so that steady writing costs one SetWriteDeadline per interval,
	// not per message.
	if now := time.Now(); now.After(c.deadline.Add(-c.o.WriteTimeout / 2)) {
		c.deadline = now.Add(c.o.WriteTimeout)
		if err := c.nc.SetWriteDeadline(c.deadline); err != nil {
			c.drop(err)
			return err
		}
	}
	// Checked after the deadline is set, so that one set by a context
	// that ended meanwhile is not undone.
	if c.stopped != nil && c.stopped.Load() {
		c.drop(errWritesStopped)
		return errWritesStopped
	}
	if _, err := c.nc.Write(msg); err != nil {
		switch {
		case c.stopped != nil && c.stopped.Load():
			err = errWritesStopped
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("%w: the collector read nothing for %s", ErrWriteTimeout, c.o.WriteTimeout)
		}
		c.drop(err)
		return err
	}
	return nil
}

// Close closes the connection, if any, with a nil error for Hooks.Lost.
func (c *Conn) Close() { c.drop(nil) }

func (c *Conn) drop(err error) {
	if c.nc == nil {
		return
	}
	_ = c.nc.Close()
	c.nc = nil
	if c.unwatch != nil {
		c.unwatch()
		c.unwatch, c.stopped = nil, nil
	}
	if h := c.o.Hooks.Lost; h != nil {
		h(err)
	}
}
