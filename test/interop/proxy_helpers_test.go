package interop_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/ipfix"
)

// This file holds what the Proxy-mode end-to-end tests (proxy_*_test.go)
// share: an in-process aggregator, an IPFIX-over-TCP collector stub that
// can be stopped and restarted on its port, and a reader of the
// aggregator's /metrics.

// proxyMetrics fetches the aggregator's /metrics and returns every sample
// keyed as the text format prints it: `name{label="value",...}` (labels in
// the exposition's order, which is sorted), or just `name`.
func proxyMetrics(t testing.TB, api string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("metrics line %q has no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// proxyMetricSum adds up the samples of the metric name whose labels
// include every one of labels (each written `key="value"`).
func proxyMetricSum(m map[string]float64, name string, labels ...string) float64 {
	var sum float64
	for k, v := range m {
		n, rest, _ := strings.Cut(k, "{")
		if n != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(","+strings.TrimSuffix(rest, "}")+",", ","+l+",") {
				ok = false
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// proxyRecord is one data record received by a proxyCollector.
type proxyRecord struct {
	Domain     uint32 // observation domain of its message
	TemplateID uint16
	// Keys are the template's elements as "enterprise:id", in order.
	Keys []string
	// Raw holds each element's value as it was on the wire.
	Raw map[string][]byte
	// Lens holds each element's field length from the template
	// (ipfix.VariableLength for variable-length fields).
	Lens map[string]uint16
}

// proxyCollector is an external IPFIX collector over TCP: it decodes
// every message with package ipfix and keeps the raw values of every
// record. It can be stopped (listener and sessions closed) and restarted
// on the same address.
type proxyCollector struct {
	addr string

	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]bool
	recs     []proxyRecord
	errs     []error
	sessions int
	wg       sync.WaitGroup
}

// proxyStartCollector starts a collector on a free port of 127.0.0.1.
func proxyStartCollector(t *testing.T) *proxyCollector {
	t.Helper()
	c := &proxyCollector{addr: "127.0.0.1:0", conns: map[net.Conn]bool{}}
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	return c
}

// start listens on c.addr (the same port again after stop).
func (c *proxyCollector) start() error {
	var ln net.Listener
	var err error
	// The port was ours a moment ago; give the kernel a few tries.
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp4", c.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.ln = ln
	c.addr = ln.Addr().String()
	c.mu.Unlock()
	c.wg.Add(1)
	go c.accept(ln)
	return nil
}

func (c *proxyCollector) accept(ln net.Listener) {
	defer c.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.ln != ln { // stopped meanwhile
			c.mu.Unlock()
			conn.Close()
			return
		}
		c.conns[conn] = true
		c.sessions++
		c.mu.Unlock()
		c.wg.Add(1)
		go c.serve(conn)
	}
}

func (c *proxyCollector) serve(conn net.Conn) {
	defer c.wg.Done()
	defer func() {
		conn.Close()
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
	}()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	mr := ipfix.NewMessageReader(conn)
	for {
		msg, err := mr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.fail(fmt.Errorf("reading the stream: %w", err))
			}
			return
		}
		if err := d.Reset(msg, time.Now()); err != nil {
			c.fail(err)
			return
		}
		var recs []proxyRecord
		for d.Next() {
			recs = append(recs, proxyCopyRecord(d.Header().ObservationDomainID, d.Record()))
		}
		if err := d.Err(); err != nil {
			c.fail(err)
		}
		c.mu.Lock()
		c.recs = append(c.recs, recs...)
		c.mu.Unlock()
	}
}

// proxyCopyRecord copies what a record holds out of the decoder's buffer.
func proxyCopyRecord(domain uint32, r *ipfix.Record) proxyRecord {
	p := proxyRecord{Domain: domain, TemplateID: r.Template.ID, Raw: map[string][]byte{}, Lens: map[string]uint16{}}
	for i := 0; i < r.NumFields(); i++ {
		f := r.Field(i)
		k := fmt.Sprintf("%d:%d", f.EnterpriseID, f.ID)
		p.Keys = append(p.Keys, k)
		p.Raw[k] = bytes.Clone(r.Bytes(i))
		p.Lens[k] = f.Length
	}
	return p
}

func (c *proxyCollector) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

// stop closes the listener and every session, and waits for them.
func (c *proxyCollector) stop() {
	c.mu.Lock()
	ln := c.ln
	c.ln = nil
	for conn := range c.conns {
		conn.Close()
	}
	c.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	c.wg.Wait()
}

func (c *proxyCollector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

func (c *proxyCollector) records() []proxyRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]proxyRecord(nil), c.recs...)
}

func (c *proxyCollector) errList() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

func (c *proxyCollector) sessionCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions
}

// proxyKey is the "enterprise:id" key of an element of the registry.
func proxyKey(t testing.TB, name string) string {
	t.Helper()
	ie, ok := ipfix.DefaultRegistry().ByName(name)
	if !ok {
		t.Fatalf("the registry has no element %s", name)
	}
	return fmt.Sprintf("%d:%d", ie.EnterpriseID, ie.ID)
}

// proxyWait polls cond every 20 ms until it holds or timeout passes.
func proxyWait(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := poll(ctx, what, cond); err != nil {
		t.Fatal(err)
	}
}
