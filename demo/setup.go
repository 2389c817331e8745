package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/aggregator"
	"sluice/certs"
	"sluice/config"
	"sluice/enrich"
	"sluice/exporter"
	"sluice/exporter/attribution"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/ipfixsend"
	"sluice/exporter/queue"
	"sluice/exporter/source/synthetic"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/traceflow/cluster"
	"sluice/traceflow/pipeline"
)

// Timeouts short enough that records flow within seconds of a connection.
const (
	pollInterval    = time.Second
	exportActive    = 3 * time.Second
	exportIdle      = 6 * time.Second
	aggregateActive = 3 * time.Second
	aggregateIdle   = 6 * time.Second
)

// profile is the element set one exporter sends.
type profile struct {
	label, version string
	// future adds elements no aggregator knows yet.
	future bool
}

// profiles are handed to the Nodes in turn: an old agent, the newest, and
// one newer than the aggregator.
func profiles() []profile {
	return []profile{
		{label: "v1.13 (old)", version: "v1.13"},
		{label: "v2.7 (newest)", version: ipfixmap.NewestAgent},
		{label: "future (v2.7 + 2 new IEs)", version: ipfixmap.NewestAgent, future: true},
	}
}

// futureElements are what the "future" exporter adds: Antrea-enterprise
// IDs the registry does not have.
func futureElements() []flow.Element {
	return []flow.Element{
		{EnterpriseID: ipfix.EnterpriseAntrea, ID: 240, Value: []byte{0, 0, 0, 42}},
		{EnterpriseID: ipfix.EnterpriseAntrea, ID: 241, Value: []byte("v9.0")},
	}
}

// node is one Node's exporter.
type node struct {
	name    string
	profile profile
	from    netip.Addr
	exp     *exporter.Exporter
	sent    prometheus.Counter
	held    *heldTransport
}

// heldTransport keeps an exporter's connection open after the exporter
// stops, until the demo has compared what was sent with what arrived:
// the aggregator forgets an exporter's counts when its session closes.
// stopped closes when the exporter has stopped polling and drained its
// buffer (it cancels the transport's context then).
type heldTransport struct {
	s       *ipfixsend.Sender
	hold    context.Context
	stopped chan struct{}
}

func (t *heldTransport) Run(ctx context.Context, q *queue.Queue) error {
	done := make(chan error, 1)
	go func() { done <- t.s.Run(t.hold, q) }()
	select {
	case <-ctx.Done():
	case err := <-done:
		close(t.stopped)
		return err
	}
	close(t.stopped)
	return <-done
}

// sourceAddrs are loopback addresses the exporters connect from, one
// each when the host has them (Linux routes all of 127/8 to lo; macOS
// only 127.0.0.1, and then the aggregator counts them together).
func sourceAddrs(n int) ([]netip.Addr, bool) {
	out := make([]netip.Addr, n)
	distinct := true
	for i := range out {
		a := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)})
		if ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String()); err == nil {
			ln.Close()
		} else {
			a, distinct = netip.MustParseAddr("127.0.0.1"), false
		}
		out[i] = a
	}
	if !distinct {
		for i := range out {
			out[i] = netip.MustParseAddr("127.0.0.1")
		}
	}
	return out, distinct
}

// newExporters builds one exporter per Node, all reading their share of
// one cluster-wide synthetic table and sending to the aggregator.
func newExporters(o *Options, tf *pipeline.Model, table *synthetic.Source, store enrich.Store,
	aggAddr string, tlsBundle *certs.Bundle, hold context.Context, reg *prometheus.Registry) ([]*node, bool, error) {
	nodes := tf.State.Nodes
	// Every exporter attributes policies and Egresses with the demo's own
	// Traceflow model: the model that decided which routes are denied.
	attr := attribution.New(attribution.Options{Log: o.Log})
	attr.SetModel(tf)
	var clusterCIDRs []netip.Prefix
	for _, n := range nodes {
		clusterCIDRs = append(clusterCIDRs, n.PodCIDRs...)
	}
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_demo_records_sent_total",
		Help: "Records the demo's exporters wrote to the aggregator."}, []string{"node"})
	reg.MustRegister(sent)
	addrs, distinct := sourceAddrs(len(nodes))
	coll, err := collectoraddr.Parse(aggAddr + ":tls")
	if err != nil {
		return nil, false, fmt.Errorf("demo: %w", err)
	}
	ps := profiles()
	var out []*node
	for i, n := range nodes {
		nd := &node{name: n.Name, profile: ps[i%len(ps)], from: addrs[i], sent: sent.WithLabelValues(n.Name)}
		so := ipfixsend.Options{Address: aggAddr, Proto: "tcp", TLS: tlsBundle.ClientTLS(""), Profile: nd.profile.version,
			ObservationDomainID: exporter.ObservationDomain(n.Name), LocalAddr: nd.from, Log: o.Log,
			MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Metrics: ipfixsend.Metrics{Sent: nd.sent}}
		if nd.profile.future {
			so.Extra = futureElements()
		}
		sender, err := ipfixsend.New(so)
		if err != nil {
			return nil, false, fmt.Errorf("demo: Node %s: %w", n.Name, err)
		}
		nd.held = &heldTransport{s: sender, hold: hold, stopped: make(chan struct{})}
		nd.exp, err = exporter.New(exporter.Options{
			Node: n.Name, PodCIDRs: n.PodCIDRs, ClusterCIDRs: clusterCIDRs,
			Source: &nodeView{cluster: table, local: n.PodCIDRs}, Store: store, Attributor: attr,
			Collector: coll, Profile: nd.profile.version, Transport: nd.held,
			PollInterval: pollInterval, ActiveTimeout: exportActive, IdleTimeout: exportIdle, Log: o.Log,
		})
		if err != nil {
			return nil, false, fmt.Errorf("demo: Node %s: %w", n.Name, err)
		}
		out = append(out, nd)
	}
	return out, distinct, nil
}

// aggregatorConfig is the aggregator's configuration: every listener on
// a free loopback port, the flowCollector sink to the demo's collector,
// the flow log under out (Aggregate mode only has one).
func aggregatorConfig(o *Options, work, inventory, collectorAddr string) (*config.Aggregator, error) {
	cfg := config.Default()
	cfg.Mode = o.Mode
	cfg.ClusterID = "sluice-demo"
	cfg.ActiveFlowRecordTimeout = config.Duration{Duration: aggregateActive}
	cfg.InactiveFlowRecordTimeout = config.Duration{Duration: aggregateIdle}
	cfg.AggregatorTransportProtocol = config.TransportTLS
	cfg.RecordContents.PodLabels = true
	cfg.FlowCollector.Enable = true
	cfg.FlowCollector.Address = collectorAddr + ":tcp"
	cfg.FlowCollector.RecordFormat = config.FormatIPFIX
	if o.Out != "" && o.Mode == config.ModeAggregate {
		cfg.FlowLogger.Enable = true
		cfg.FlowLogger.Path = filepath.Join(o.Out, "flows.log")
		cfg.FlowLogger.Compress = false
	}
	if o.ClickHouseURL != "" {
		cfg.ClickHouse.Enable = true
		cfg.ClickHouse.DatabaseURL = o.ClickHouseURL
		cfg.ClickHouse.CreateSchema = true
		cfg.ClickHouse.CommitInterval = config.Duration{Duration: time.Second}
	}
	loopback := "127.0.0.1:0"
	cfg.Sluice.IPFIXAddress, cfg.Sluice.GRPCAddress, cfg.Sluice.FlowStreamAddress, cfg.Sluice.APIAddress =
		loopback, loopback, loopback, loopback
	cfg.Sluice.Inventory = inventory
	cfg.Sluice.UI.Address = o.UIAddress
	cfg.Sluice.TLS.CertDir = filepath.Join(work, "certs")
	if err := cfg.Validate(config.ValidateOptions{}); err != nil {
		return nil, fmt.Errorf("demo: aggregator configuration: %w", err)
	}
	return cfg, nil
}

// newAggregator builds the aggregator (its web UI tracing on objs) and the
// client certificate the exporters present (from the CA it generated).
func newAggregator(o *Options, cfg *config.Aggregator, objs []cluster.Object) (*aggregator.Aggregator, *certs.Bundle, error) {
	// The web UI traces on the demo's cluster.
	a, err := aggregator.NewWith(cfg, o.Log, aggregator.Options{
		Cluster: func(context.Context) ([]cluster.Object, error) { return objs, nil }})
	if err != nil {
		return nil, nil, fmt.Errorf("demo: aggregator: %w", err)
	}
	b, err := certs.Ensure(cfg.Sluice.TLS.CertDir, certs.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("demo: certificates: %w", err)
	}
	return a, b, nil
}

// downstream is the IPFIX collector the aggregator exports to: it decodes
// the stream for the view and, with a capture file, keeps a raw copy. It
// decodes by itself rather than through the collector package because it
// reads the per-Node elements of Aggregate mode, which records into
// flow.Flow do not carry.
type downstream struct {
	ln      net.Listener
	table   *ipfixmap.Table
	stats   *stats
	log     *slog.Logger
	capture *os.File
	tee     *teeListener
}

func newDownstream(o *Options, st *stats) (*downstream, error) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		return nil, err
	}
	d := &downstream{table: table, stats: st, log: o.Log}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: collector: %w", err)
	}
	d.ln = ln
	if o.Out != "" {
		if d.capture, err = os.Create(filepath.Join(o.Out, "aggregator-export.ipfix")); err != nil {
			ln.Close()
			return nil, fmt.Errorf("demo: capture: %w", err)
		}
		d.tee = &teeListener{Listener: ln, w: d.capture}
		d.ln = d.tee
	}
	return d, nil
}

// serve takes the aggregator's connections until ctx ends.
func (d *downstream) serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { d.ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("demo: collector: %w", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); d.read(ctx, c) }()
	}
}

// read decodes one connection's messages until it ends.
func (d *downstream) read(ctx context.Context, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{Registry: d.table.Registry()}))
	norm := ipfixmap.NewNormalizer(d.table)
	mr := ipfix.NewMessageReader(c)
	for {
		msg, err := mr.Next()
		if err != nil {
			return
		}
		if err := dec.Reset(msg, time.Now()); err != nil {
			d.log.Warn("the demo's collector cannot read a message from the aggregator", "err", err)
			return
		}
		for dec.Next() {
			r := dec.Record()
			var f flow.Flow
			norm.Normalize(r, &f)
			d.stats.add(&f, bothNodes(r))
		}
		if err := dec.Err(); err != nil {
			d.log.Warn("the demo's collector cannot read a message from the aggregator", "err", err)
			return
		}
	}
}

// bothNodes reports whether an Aggregate-mode record carries both Nodes'
// end times: the aggregator sets each only once that Node reported.
func bothNodes(r *ipfix.Record) bool {
	n := 0
	for i := range r.NumFields() {
		ie := r.Field(i).IE
		if ie == nil || (ie.Name != "flowEndSecondsFromSourceNode" && ie.Name != "flowEndSecondsFromDestinationNode") {
			continue
		}
		if t, err := r.Time(i); err == nil && t.Unix() > 0 {
			n++
		}
	}
	return n == 2
}

func (d *downstream) closeCapture() error {
	if d.capture == nil {
		return nil
	}
	err := d.capture.Close()
	d.tee.mu.Lock()
	defer d.tee.mu.Unlock()
	if d.tee.err != nil {
		err = d.tee.err
	}
	if err != nil {
		return fmt.Errorf("demo: capture: %w", err)
	}
	return nil
}

// teeListener copies every byte its connections read to w: the raw IPFIX
// stream, which `sluice ipfix decode` reads back.
type teeListener struct {
	net.Listener
	mu sync.Mutex
	w  io.Writer
	// err is the first write error; the capture stops there, the
	// collector goes on.
	err error
}

func (l *teeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &teeConn{Conn: c, l: l}, nil
}

type teeConn struct {
	net.Conn
	l *teeListener
}

func (c *teeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.l.mu.Lock()
		if c.l.err == nil {
			_, c.l.err = c.l.w.Write(p[:n])
		}
		c.l.mu.Unlock()
	}
	return n, err
}
