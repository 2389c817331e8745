// Package exporter is the per-Node flow exporter: it polls a connection
// source, keeps the connections in a connstore.Store, names local Pods and
// the flow type (podmeta), and hands the records to a Transport through a
// bounded queue. It also serves /metrics, /healthz and /readyz.
package exporter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"sluice/api"
	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/connstore"
	"sluice/exporter/grpcsend"
	"sluice/exporter/ipfixsend"
	"sluice/exporter/podmeta"
	"sluice/exporter/queue"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow/ipfixmap"
)

// Defaults of Options; the timeouts are the reference agent's.
const (
	DefaultPollInterval = 5 * time.Second
	MinPollInterval     = time.Second
	DefaultBufferSize   = 65_536
	// DrainTimeout bounds how long a stopping exporter keeps sending what
	// it has buffered.
	DrainTimeout = 5 * time.Second
	// CatchUpWait bounds, by default, how long a poll waits for the
	// policy model to take in cluster changes it has not loaded yet (see
	// attribution.Attributor.CatchUp); past it, the poll goes on with the
	// model it has, and sluice_exporter_attribution_catch_up_timeouts_total
	// counts it.
	CatchUpWait = time.Second
)

// Transport sends the queued records to the aggregator, acknowledging them
// in the queue as they leave: ipfixsend.Sender (IPFIX over TCP, TLS or
// UDP) or grpcsend.Sender (gRPC).
type Transport interface {
	Run(ctx context.Context, q *queue.Queue) error
}

// Options configures an Exporter.
type Options struct {
	// Node is this Node's name; PodCIDRs its Pod CIDRs (required);
	// ClusterCIDRs every Node's (optional, see podmeta.Options).
	Node         string
	PodCIDRs     []netip.Prefix
	ClusterCIDRs []netip.Prefix
	// Source is polled every PollInterval; the Exporter closes it.
	Source source.Source
	// Store names Pods (and resolves a Service collector address); nil
	// names none.
	Store enrich.Store
	// Attributor, if set, names the policy rules and the Egress acting on
	// each connection, and makes denied connections of unanswered ones
	// the model denies. DeniedRate and DeniedBurst bound the denied
	// records queued (DefaultDeniedRate, DefaultDeniedBurst if 0).
	Attributor              *attribution.Attributor
	DeniedRate, DeniedBurst float64
	// CatchUpWait bounds each wait for the Attributor's model to take in
	// cluster changes it has not loaded yet (CatchUpWait if 0).
	CatchUpWait time.Duration
	// LateNaming bounds, from a connection's start, how long a local end
	// the metadata source cannot name yet (a Pod whose IP the kubelet
	// has not posted yet) is looked up again, at each poll that sees the
	// connection, and how long the connection's final record is held
	// back for it: DefaultLateNaming and at least two poll intervals if
	// 0, never if negative. MaxHeld bounds the final records held
	// (DefaultMaxHeld if 0); past it they are written unnamed at once.
	LateNaming time.Duration
	MaxHeld    int
	// Collector is the aggregator's address; Profile the agent element
	// set sent over IPFIX (gRPC sends every field it has); TLS the client
	// configuration for the tls protocol, and for grpc, where it must hold
	// a client certificate.
	Collector collectoraddr.Collector
	Profile   string
	TLS       *tls.Config
	// Transport, if set, replaces the transport built from Collector,
	// Profile and TLS.
	Transport Transport

	PollInterval, ActiveTimeout, IdleTimeout time.Duration
	// MaxConnections bounds the connection store; BufferSize the records
	// waiting for the aggregator.
	MaxConnections, BufferSize int
	// MetricsAddress is where /metrics, /healthz and /readyz are served;
	// empty serves none. API, if set, replaces it: a server its caller
	// already serves (from before the exporter could be built, so that
	// probes answer during the set-up), of Registry's metrics; the
	// exporter only makes it ready.
	MetricsAddress string
	API            *api.Server
	// Registry, if set, receives the exporter's metrics; otherwise New
	// makes one, with the Go and process collectors.
	Registry *prometheus.Registry
	Log      *slog.Logger
}

// Exporter is a configured exporter.
type Exporter struct {
	o         Options
	reg       *prometheus.Registry
	m         *metrics
	pm        *podmeta.Resolver
	store     *connstore.Store[connMeta]
	denied    tokenBucket
	q         *queue.Queue
	transport Transport
	api       *api.Server
	apiLn     net.Listener
	// pollTime is the time of the poll in progress.
	pollTime time.Time
	// lateCatchUp: the poll in progress has caught the model up once
	// already for a connection it judged (fillVerdict) or named late
	// (rename).
	lateCatchUp bool
	// lateNaming is Options.LateNaming in nanoseconds, 0 for never; held
	// the final records waiting for a Pod name, holes how many of the
	// run the store is writing went there (latename.go); releasing is
	// releaseHeld's scratch.
	lateNaming int64
	held       []heldRecord
	holes      int
	releasing  []record.Record
	// attributing is 1 with an Attributor: fill tests it with unnamed in
	// one go.
	attributing uint8
	// reserved is the run of the queue's ring the store is writing in
	// (UpdateEmit), nil when it writes in scratch instead (the queue is
	// full, or nearly).
	reserved []record.Record
	scratch  []record.Record
}

// ObservationDomain is the observation domain ID an agent uses: the
// 32-bit FNV-1 hash of its Node name.
func ObservationDomain(node string) uint32 {
	h := fnv.New32()
	h.Write([]byte(node))
	return h.Sum32()
}

// New checks o, builds the stages and binds the metrics address.
func New(o Options) (*Exporter, error) {
	if o.Source == nil {
		return nil, errors.New("exporter: no connection source")
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.CatchUpWait <= 0 {
		o.CatchUpWait = CatchUpWait
	}
	if o.PollInterval < MinPollInterval {
		return nil, fmt.Errorf("exporter: the poll interval %v is under the minimum %v", o.PollInterval, MinPollInterval)
	}
	if o.BufferSize == 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.BufferSize < 0 || o.MaxConnections < 0 || o.MaxHeld < 0 {
		return nil, errors.New("exporter: the buffer size and the connection and held-record caps must not be negative")
	}
	if o.LateNaming == 0 {
		o.LateNaming = max(DefaultLateNaming, 2*o.PollInterval)
	}
	if o.MaxHeld == 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Profile == "" {
		o.Profile = ipfixmap.NewestAgent
	}
	pm, err := podmeta.New(podmeta.Options{Node: o.Node, PodCIDRs: o.PodCIDRs, ClusterCIDRs: o.ClusterCIDRs, Store: o.Store})
	if err != nil {
		return nil, fmt.Errorf("exporter: %w", err)
	}
	if o.DeniedRate == 0 {
		o.DeniedRate = DefaultDeniedRate
	}
	if o.DeniedBurst == 0 {
		o.DeniedBurst = DefaultDeniedBurst
	}
	if o.DeniedRate < 0 || o.DeniedBurst < 0 {
		return nil, errors.New("exporter: the denied-connection rate and burst must not be negative")
	}
	e := &Exporter{o: o, reg: o.Registry, q: queue.New(o.BufferSize), pm: pm,
		denied: tokenBucket{rate: o.DeniedRate, burst: o.DeniedBurst}, lateNaming: max(0, int64(o.LateNaming))}
	if o.Attributor != nil {
		e.attributing = 1
	}
	if e.reg == nil {
		e.reg = prometheus.NewRegistry()
		e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	e.m = newMetrics(e.reg, e.q, o.Attributor)
	e.store, err = connstore.New(connstore.Options[connMeta]{
		ActiveTimeout: o.ActiveTimeout, IdleTimeout: o.IdleTimeout, MaxConnections: o.MaxConnections,
		Keep: pm.Keep, Describe: e.describe, Redescribe: e.redescribe, Fill: e.fill, Emit: e.emit, Buffer: e.buffer,
	})
	if err != nil {
		return nil, fmt.Errorf("exporter: %w", err)
	}
	e.transport = o.Transport
	if e.transport == nil {
		if e.transport, err = e.newTransport(); err != nil {
			return nil, fmt.Errorf("exporter: %w", err)
		}
	}
	if o.API != nil {
		e.api = o.API
	} else if o.MetricsAddress != "" {
		e.api = api.New(e.reg, o.Log)
		if e.apiLn, err = net.Listen("tcp", o.MetricsAddress); err != nil {
			return nil, fmt.Errorf("exporter: metrics address: %w", err)
		}
	}
	return e, nil
}

// newTransport builds the transport of o.Collector's protocol.
func (e *Exporter) newTransport() (Transport, error) {
	o := &e.o
	c := o.Collector
	switch c.Proto {
	case "":
		return nil, errors.New("no collector address")
	case "grpc":
		tlsConf := o.TLS
		if ns, name, ok := c.ServiceRef(); ok && tlsConf != nil && tlsConf.ServerName == "" {
			// The dialled address is the Service's ClusterIP; the
			// aggregator's certificate names the Service (Antrea agents
			// check flow-aggregator.flow-aggregator.svc).
			tlsConf = tlsConf.Clone()
			tlsConf.ServerName = name + "." + ns + ".svc"
		}
		return grpcsend.New(grpcsend.Options{
			Address: c.String(), Resolve: resolver(c, o.Store), TLS: tlsConf,
			ObservationDomainID: ObservationDomain(o.Node), Log: o.Log, Metrics: e.m.transport,
		})
	}
	proto := c.Proto
	tlsConf := o.TLS
	if proto == "tls" {
		proto = "tcp"
		if tlsConf == nil {
			tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	} else {
		tlsConf = nil
	}
	return ipfixsend.New(ipfixsend.Options{
		Address: c.String(), Proto: proto, Resolve: resolver(c, o.Store), TLS: tlsConf, Profile: o.Profile,
		ObservationDomainID: ObservationDomain(o.Node), Log: o.Log, Metrics: e.m.transport,
	})
}

// Registry is the exporter's metrics registry.
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// MetricsAddr is the bound metrics address, "" when none is served.
func (e *Exporter) MetricsAddr() string {
	if e.apiLn == nil {
		return ""
	}
	return e.apiLn.Addr().String()
}

// Run polls and exports until ctx ends, then gives the transport up to
// DrainTimeout to send what is buffered, and closes the source.
func (e *Exporter) Run(ctx context.Context) error {
	defer e.o.Source.Close()
	tctx, stopTransport := context.WithCancel(context.Background())
	defer stopTransport()
	tdone := make(chan struct{})
	go func() { defer close(tdone); _ = e.transport.Run(tctx, e.q) }()
	apiDone := make(chan error, 1)
	if e.apiLn != nil {
		go func() { apiDone <- e.api.Serve(ctx, e.apiLn) }()
	} else {
		apiDone <- nil
	}
	profile := e.o.Profile
	if e.o.Collector.Proto == "grpc" {
		profile = "" // IPFIX only
	}
	e.o.Log.Info("exporter running", "node", e.o.Node, "pod_cidrs", e.o.PodCIDRs, "collector", e.o.Collector.String(),
		"profile", profile, "poll_interval", e.o.PollInterval.String(), "metrics", e.MetricsAddr())

	var conns []source.Conn
	t := time.NewTicker(e.o.PollInterval)
	defer t.Stop()
	for {
		conns = e.poll(ctx, time.Now(), conns[:0], nil)
		select {
		case <-ctx.Done():
		case <-t.C:
			continue
		}
		break
	}
	e.flush(nil)
	e.drain(tdone)
	stopTransport()
	<-tdone
	err := <-apiDone
	e.o.Log.Info("exporter stopped", append([]any{"unsent", e.q.Len()}, e.m.totals()...)...)
	return err
}

// drain waits, bounded, for the transport to empty the queue.
func (e *Exporter) drain(tdone <-chan struct{}) {
	deadline := time.After(DrainTimeout)
	for e.q.Len() > 0 {
		select {
		case <-tdone:
			return
		case <-deadline:
			e.o.Log.Warn("the aggregator did not take every buffered record before shutdown", "unsent", e.q.Len())
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Poll runs one cycle at now: dump the source, update the store, queue the
// records due. It returns the slices for reuse, the records queued
// appended to batch.
func (e *Exporter) Poll(ctx context.Context, now time.Time, conns []source.Conn, batch []record.Record) ([]source.Conn, []record.Record) {
	conns = e.poll(ctx, now, conns, &batch)
	return conns, batch
}

// poll is Poll; with batch nil (Run's), the store writes the records
// straight into the queue's ring and none is kept.
func (e *Exporter) poll(ctx context.Context, now time.Time, conns []source.Conn, batch *[]record.Record) []source.Conn {
	start := time.Now()
	e.m.polls.Inc()
	conns, err := e.o.Source.Dump(ctx, conns)
	if err != nil {
		if ctx.Err() == nil {
			e.m.pollErrors.Inc()
			e.o.Log.Error("cannot read the connection table; skipping this poll", "err", err)
			// Held final records do not wait on the connection table:
			// those named by now, or past their wait, still go.
			e.pollTime, e.lateCatchUp = now, false
			e.releaseHeld(batch, false)
			e.m.held.Set(float64(len(e.held)))
		}
		return conns
	}
	e.pollTime, e.lateCatchUp = now, false
	if a := e.o.Attributor; a != nil {
		// The model must hold the cluster state the Pod metadata is
		// about to be read from: a new Pod's first connections may be
		// gone by the next poll, with the verdict given now.
		a.CatchUp(ctx, e.o.CatchUpWait)
	}
	e.releaseHeld(batch, false)
	if batch != nil {
		*batch = e.store.Update(now, conns, *batch)
	} else {
		e.store.UpdateEmit(now, conns)
	}
	st := e.store.Stats()
	e.m.observe(st)
	e.m.held.Set(float64(len(e.held)))
	e.m.pollSeconds.Observe(time.Since(start).Seconds())
	if e.api != nil {
		e.api.SetReady(true)
	}
	return conns
}

// minReserved is the shortest run of the queue's ring the store writes
// in directly; with less room (the queue full or nearly), it writes in
// scratch, and pushing the run drops the oldest records.
const minReserved = 64

// buffer gives the store the space for its next run of at most n records
// (UpdateEmit): the queue's free slots, or scratch.
func (e *Exporter) buffer(n int) []record.Record {
	if r := e.q.Reserve(n); len(r) >= min(n, minReserved) {
		e.reserved = r
		return r
	}
	e.reserved = nil
	if cap(e.scratch) < n {
		e.scratch = make([]record.Record, n)
	}
	return e.scratch[:n]
}

// emit queues a run of the records the store makes (the transport sends
// them while the store goes on), denied ones over the rate limit and
// those held for a Pod name (hold) left out.
func (e *Exporter) emit(recs []record.Record) []record.Record {
	if e.holes > 0 {
		recs, e.holes = dropHoles(recs), 0
	}
	recs = e.limitDenied(e.pollTime, recs)
	if e.reserved != nil && len(recs) > 0 && &recs[0] == &e.reserved[0] {
		// Written in the ring already: kept ones, moved to the front by
		// limitDenied, are committed.
		e.q.Commit(len(recs))
		e.reserved = nil
		return recs
	}
	e.reserved = nil
	if d := e.q.PushRecords(recs); d > 0 {
		e.m.bufferDrops.Add(float64(d))
	}
	return recs
}

// Queue is the buffer between the store and the transport.
func (e *Exporter) Queue() *queue.Queue { return e.q }
