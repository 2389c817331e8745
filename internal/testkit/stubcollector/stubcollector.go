// Package stubcollector is a stub IPFIX collector for tests.
package stubcollector

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// Collector is a stub IPFIX collector over TCP on loopback: it decodes
// every record it is sent and keeps it, normalized and raw. It stops when
// the test ends. Receiving is kept cheap (a copy of the record and its
// flow; Record's maps are built when Records asks), so that the stub
// keeps up with a sender even on a busy machine under -race.
type Collector struct {
	ln   net.Listener
	mu   sync.Mutex
	recs []Record
	raw  []*ipfix.Record // raw[i] is recs[i]'s, until Records builds its maps
	errs []error
	// conns are the open connections, closed by Close.
	conns  map[net.Conn]bool
	closed bool
	// countOnly keeps no record, only their number in counted (a soak
	// test's hours of records would not fit).
	countOnly bool
	counted   int
	// pause is how long it waits after reading each message (a collector
	// slower than its exporters; see NewSlow).
	pause time.Duration
}

// Close stops the collector: its listener and every connection close, as
// when a collector goes down. What it received stays readable.
func (c *Collector) Close() {
	c.ln.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for conn := range c.conns {
		conn.Close()
	}
}

// Record is one data record a Collector received.
type Record struct {
	Flow flow.Flow
	// Raw are its values by element, "enterprise:id" → octets; ByName the
	// same by element name (unknown elements have none).
	Raw, ByName map[string][]byte
}

// New starts a Collector.
func New(tb testing.TB) *Collector { return NewAt(tb, "127.0.0.1:0") }

// NewCounting starts a Collector that decodes every record and keeps
// none: Len counts them; Records and FlowsSince return nothing.
func NewCounting(tb testing.TB) *Collector { return start(tb, "127.0.0.1:0", true) }

// NewAt starts a Collector listening on addr (a collector coming back
// where one was stopped, say).
func NewAt(tb testing.TB, addr string) *Collector { return start(tb, addr, false) }

// NewSlow starts a Collector that waits pause after reading each message:
// a live collector that reads slower than it is sent to. Its connections'
// receive buffers are fixed at slowReadBuffer: left to the kernel's
// autotuning (up to tcp_rmem's maximum, 32 MB on the build machines), one
// socket could take a test's whole flood, and whether the sender ever has
// to wait would depend on how far the buffer grew.
func NewSlow(tb testing.TB, pause time.Duration) *Collector {
	c := start(tb, "127.0.0.1:0", false)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pause = pause
	return c
}

// slowReadBuffer is a slow collector's receive buffer (the kernel doubles
// it for its bookkeeping).
const slowReadBuffer = 64 << 10

func start(tb testing.TB, addr string, countOnly bool) *Collector {
	tb.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	c := &Collector{ln: ln, conns: map[net.Conn]bool{}, countOnly: countOnly}
	tb.Cleanup(c.Close)
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go c.serve(conn, table)
		}
	}()
	return c
}

// serve decodes one connection until it ends or sends what cannot be
// decoded.
func (c *Collector) serve(conn net.Conn, table *ipfixmap.Table) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return
	}
	c.conns[conn] = true
	pause := c.pause
	c.mu.Unlock()
	if tc, ok := conn.(*net.TCPConn); ok && pause > 0 {
		_ = tc.SetReadBuffer(slowReadBuffer)
	}
	defer func() {
		conn.Close()
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
	}()
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	d := ipfix.NewDecoder(sess)
	var unknownSeen uint64
	n := ipfixmap.NewNormalizer(table)
	mr := ipfix.NewMessageReader(conn)
	fail := func(err error) {
		c.mu.Lock()
		c.errs = append(c.errs, fmt.Errorf("connection from %s: %w", conn.RemoteAddr(), err))
		c.mu.Unlock()
	}
	for {
		m, err := mr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fail(err)
			}
			return
		}
		if pause > 0 {
			time.Sleep(pause) // the collector's slowness
		}
		if err := d.Reset(m, time.Now()); err != nil {
			fail(err)
			return
		}
		if c.countOnly {
			n := 0
			for d.Next() {
				n++
			}
			c.mu.Lock()
			c.counted += n
			c.mu.Unlock()
		}
		for d.Next() {
			r := d.Record()
			var rec Record
			n.Normalize(r, &rec.Flow)
			c.mu.Lock()
			c.recs = append(c.recs, rec)
			c.raw = append(c.raw, r.Clone())
			c.mu.Unlock()
		}
		if err := d.Err(); err != nil {
			fail(err)
			return
		}
		if u := sess.Stats.UnknownTemplateSets; u > unknownSeen {
			fail(fmt.Errorf("%d data sets of unknown templates skipped", u-unknownSeen))
			unknownSeen = u
		}
	}
}

// Errors are the decoding errors that ended connections (a peer closing
// its connection is not one), and the data sets skipped for want of their
// template.
func (c *Collector) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// Open is how many connections are being read. It is 0 once every
// sender closed its connection and all it sent was read: a snapshot taken
// then holds everything that will ever arrive. A connection just accepted
// is counted only once its reading starts, so ask after records arrived
// through it.
func (c *Collector) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Addr is the collector's address, host:port.
func (c *Collector) Addr() string { return c.ln.Addr().String() }

// Len is how many records have arrived.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.countOnly {
		return c.counted
	}
	return len(c.recs)
}

// Records returns the records that have arrived, in order.
func (c *Collector) Records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.raw {
		if r == nil {
			continue
		}
		rec := &c.recs[i]
		rec.Raw, rec.ByName = map[string][]byte{}, map[string][]byte{}
		for j := 0; j < r.NumFields(); j++ {
			f := r.Field(j)
			v := bytes.Clone(r.Bytes(j))
			rec.Raw[fmt.Sprintf("%d:%d", f.EnterpriseID, f.ID)] = v
			if name := f.Name(); name != "" {
				rec.ByName[name] = v
			}
		}
		c.raw[i] = nil
	}
	return append([]Record(nil), c.recs...)
}

// FlowsSince returns the normalized flows of the records that arrived
// after the first i, in order: a cheap way to follow arrivals.
func (c *Collector) FlowsSince(i int) []flow.Flow {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= len(c.recs) {
		return nil
	}
	out := make([]flow.Flow, 0, len(c.recs)-i)
	for _, r := range c.recs[i:] {
		out = append(out, r.Flow)
	}
	return out
}
