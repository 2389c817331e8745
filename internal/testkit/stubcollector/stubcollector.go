// Package stubcollector is a stub IPFIX collector for tests.
package stubcollector

import (
	"bytes"
	"fmt"
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
// the test ends.
type Collector struct {
	ln   net.Listener
	mu   sync.Mutex
	recs []Record
}

// Record is one data record a Collector received.
type Record struct {
	Flow flow.Flow
	// Raw are its values by element, "enterprise:id" → octets; ByName the
	// same by element name (unknown elements have none).
	Raw, ByName map[string][]byte
}

// New starts a Collector.
func New(tb testing.TB) *Collector {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Collector{ln: ln}
	tb.Cleanup(func() { ln.Close() })
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
	defer conn.Close()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	n := ipfixmap.NewNormalizer(table)
	mr := ipfix.NewMessageReader(conn)
	for {
		m, err := mr.Next()
		if err != nil || d.Reset(m, time.Now()) != nil {
			return
		}
		for d.Next() {
			r := d.Record()
			rec := Record{Raw: map[string][]byte{}, ByName: map[string][]byte{}}
			for i := 0; i < r.NumFields(); i++ {
				f := r.Field(i)
				v := bytes.Clone(r.Bytes(i))
				rec.Raw[fmt.Sprintf("%d:%d", f.EnterpriseID, f.ID)] = v
				if name := f.Name(); name != "" {
					rec.ByName[name] = v
				}
			}
			n.Normalize(r, &rec.Flow)
			c.mu.Lock()
			c.recs = append(c.recs, rec)
			c.mu.Unlock()
		}
	}
}

// Addr is the collector's address, host:port.
func (c *Collector) Addr() string { return c.ln.Addr().String() }

// Len is how many records have arrived.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// Records returns the records that have arrived, in order.
func (c *Collector) Records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.recs...)
}
