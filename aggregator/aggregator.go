// Package aggregator wires the aggregator's stages together from a
// configuration: collectors → mode (Aggregate or Proxy, see package mode) →
// broadcast buffer → sinks (see package sink and Sinks), plus the HTTP API.
// It owns start-up and the ordered shutdown: stop the collectors, drain the
// mode, drain and flush the sinks.
package aggregator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"

	"sluice/api"
	"sluice/certs"
	"sluice/clusterid"
	"sluice/collector"
	"sluice/config"
	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/kafkain"
	"sluice/kubeinformers"
	"sluice/mode"
	"sluice/ring"
	"sluice/sink"
	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/controller"
	"sluice/ui"
)

// DrainTimeout is the default of sluice.drainTimeout: how long sinks may
// take to send what they hold at shutdown.
const DrainTimeout = 10 * time.Second

// Aggregator is a configured, not yet running, aggregator. New binds every
// listener, so that port conflicts and bad certificates fail at start-up
// with the key that names them. Run it once, or Close it.
type Aggregator struct {
	cfg   *config.Aggregator
	log   *slog.Logger
	reg   *prometheus.Registry
	table *ipfixmap.Table
	api   *api.Server
	apiLn net.Listener

	coll    *collector.Server
	tcpLn   net.Listener
	tlsConf *tls.Config
	udpConn *net.UDPConn
	// grpcLn serves FlowExportService (mutual TLS with grpcTLS); nil when
	// sluice.grpcAddress is empty.
	grpcLn  net.Listener
	grpcTLS *tls.Config
	certs   *certs.Bundle
	// certReloader keeps certs current with their files; nil when
	// sluice.tls.reloadInterval is 0.
	certReloader *certs.Reloader

	// meta is the Kubernetes metadata source, nil when there is none.
	meta enrich.Source
	// informers is the process's informer factory (the metadata source's,
	// which the Traceflow watch joins); nil without a live cluster.
	informers *kubeinformers.Shared
	// cluster is the cluster's identity; its UUID is zero when unknown
	// (an inventory file, no Kubernetes, or the look-up failed).
	cluster clusterid.Identity
	// traceflow answers Traceflow objects; nil unless
	// sluice.traceflow.enable.
	traceflow *controller.Controller
	// clusterWatch caches the cluster's objects for the Traceflow
	// controller's and the UI's traces; nil unless sluice.traceflow.enable.
	clusterWatch *kube.Watcher
	batches      chan flow.Batch
	buf          *ring.Buffer[*flow.Flow]
	mode         mode.Mode
	sinks        []namedSink
	sinkMetrics  *sink.Metrics
	// encoded is Proxy mode's fast path when it applies (see setupFastPath):
	// the mode then writes encoded records into encBuf, which the only
	// sink reads.
	encoded mode.Encoded
	// sample takes the UI's sample of what the fast path forwards; nil
	// without the UI or the fast path.
	sample     flow.Sampler
	encBuf     *ring.Buffer[ipfix.EncodedRecord]
	encodeErrs prometheus.Counter

	// ui is the web UI and uiLn its listener; nil when
	// sluice.ui.address is empty.
	ui   *ui.Server
	uiLn net.Listener
	// liveObjects reads the live cluster's objects (for the UI's traces)
	// when the Traceflow controller gave the aggregator Kubernetes
	// access; nil otherwise.
	liveObjects func(context.Context) ([]cluster.Object, error)
	// kin reads records from Kafka (sluice.kafkaInput); nil when off.
	kin *kafkain.Input
}

// namedSink is a sink and the key of its configuration section.
type namedSink struct {
	key string
	s   sink.Sink
}

// Addrs are the addresses the aggregator listens on, as bound (useful
// when the configuration asked for port 0).
type Addrs struct {
	IPFIX      string // TCP or TLS
	UDP        string
	API        string
	GRPC       string
	FlowStream string // empty when the flow stream service is off
	UI         string // empty when the web UI is off
}

// New prepares an aggregator from cfg, which it validates again with the
// sinks this build runs.
func New(cfg *config.Aggregator, log *slog.Logger) (*Aggregator, error) {
	return NewWith(cfg, log, Options{})
}

// NewWith is New with options.
func NewWith(cfg *config.Aggregator, log *slog.Logger, o Options) (*Aggregator, error) {
	if err := cfg.Validate(ValidateOptions()); err != nil {
		return nil, err
	}
	a := &Aggregator{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	if err := a.init(o); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *Aggregator) init(o Options) error {
	cfg := a.cfg
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if a.table, err = ipfixmap.NewTable(ipfix.DefaultRegistry()); err != nil {
		return err
	}
	if err := a.setupMetadata(); err != nil {
		return err
	}
	if err := a.setupTraceflow(); err != nil {
		return err
	}
	if a.mode, err = a.newMode(); err != nil {
		return err
	}
	a.batches = make(chan flow.Batch, 64)
	a.buf = ring.New[*flow.Flow](cfg.RecordBufferSize)
	if err := a.setupSinks(); err != nil {
		return err
	}
	if err := a.setupFastPath(); err != nil {
		return err
	}
	a.setupBackPressure()
	if err := a.setupUI(o); err != nil {
		return err
	}
	if err := a.setupCollectors(); err != nil {
		return err
	}
	if err := a.setupKafkaInput(); err != nil {
		return err
	}
	a.recheckOnCAChange()
	a.api = api.New(a.reg, a.log)
	a.setupAPI()
	if a.apiLn, err = net.Listen("tcp", cfg.Sluice.APIAddress); err != nil {
		return cfg.KeyError("sluice.apiAddress", err)
	}
	return nil
}

// setupMetadata opens the Kubernetes metadata source the configuration
// names: sluice.inventory, or sluice.kubeconfig or the Pod's own cluster.
func (a *Aggregator) setupMetadata() error {
	s := a.cfg.Sluice
	// The Traceflow watch joins the metadata source's informers (one set
	// of watches; see package kubeinformers).
	src, err := enrich.OpenSource(enrich.SourceOptions{Inventory: s.Inventory, Kubeconfig: s.Kubeconfig,
		InCluster: enrich.InClusterEnv(), CheckAccess: true, ShareInformers: true, Logger: a.log})
	if err != nil {
		key := "sluice.kubeconfig"
		if s.Inventory != "" {
			key = "sluice.inventory"
		}
		return a.cfg.KeyError(key, err)
	}
	if src == nil {
		a.log.Info("no Pod metadata source (sluice.inventory or sluice.kubeconfig): records keep the Pod metadata exporters sent, and nothing is added")
	}
	a.meta = src
	if k, ok := src.(*enrich.Kube); ok {
		a.informers = k.Informers()
		a.setupClusterID(k.Client())
	}
	return nil
}

// setupClusterID reads the cluster's identity (see package clusterid):
// the clusterId of records when clusterID is not configured, and the
// observation domain of exported messages when
// flowCollector.observationDomainID is not. Where the reference exits,
// after its ten seconds, Sluice starts without it (clusterId empty unless
// configured), as it starts when the API server cannot be asked about
// permissions: the failure is logged with what to fix.
func (a *Aggregator) setupClusterID(client kubernetes.Interface) {
	id, err := clusterid.Get(context.Background(), client, clusterid.Options{Log: a.log})
	switch {
	case errors.Is(err, clusterid.ErrForbidden):
		a.log.Warn("cluster identity: the credentials " + err.Error() + "; records get no clusterId unless clusterID is set " +
			"(grant get on them, see docs/kubernetes.md#permissions-rbac)")
		return
	case err != nil:
		a.log.Error("cluster identity not read; records get no clusterId unless clusterID is set", "err", err)
		return
	}
	a.cluster = id
	a.log.Info("cluster identity", "uuid", id.String(), "source", id.Source, "clusterID", a.clusterID())
}

// clusterID is what records carry in clusterId: clusterID when configured,
// else the cluster's UUID, else nothing.
func (a *Aggregator) clusterID() string {
	switch {
	case a.cfg.ClusterID != "":
		return a.cfg.ClusterID
	case a.cluster.UUID != flow.UID{}:
		return a.cluster.String()
	}
	return ""
}

// Addrs returns the bound addresses.
func (a *Aggregator) Addrs() Addrs {
	var out Addrs
	if a.tcpLn != nil {
		out.IPFIX = a.tcpLn.Addr().String()
	}
	if a.udpConn != nil {
		out.UDP = a.udpConn.LocalAddr().String()
	}
	out.API = a.apiLn.Addr().String()
	if a.grpcLn != nil {
		out.GRPC = a.grpcLn.Addr().String()
	}
	if a.uiLn != nil {
		out.UI = a.uiLn.Addr().String()
	}
	for _, s := range a.sinks {
		if l, ok := s.s.(sink.Listener); ok && s.key == config.SinkFlowStreamService {
			out.FlowStream = l.Addr()
		}
	}
	return out
}

// Registry is the aggregator's metrics registry.
func (a *Aggregator) Registry() *prometheus.Registry { return a.reg }

// Close releases what New bound (listeners, and what sinks hold) for an
// aggregator that will not Run. Run releases them itself.
func (a *Aggregator) Close() {
	for _, ln := range []net.Listener{a.tcpLn, a.apiLn, a.grpcLn, a.uiLn} {
		if ln != nil {
			ln.Close()
		}
	}
	if a.udpConn != nil {
		a.udpConn.Close()
	}
	for _, s := range a.sinks {
		if c, ok := s.s.(sink.Closer); ok {
			c.Close()
		}
	}
	a.closeKafkaInput()
}

// Run serves until ctx ends, then shuts down in order and returns.
func (a *Aggregator) Run(ctx context.Context) error {
	errs := make(chan error, 8)
	// runCtx ends the whole run: the caller's ctx, or a listener or sink
	// failing.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if m, ok := a.mode.(aggregateMode); ok {
		// Until Run returns: the table stays mapped while the sinks drain.
		memCtx, stopMem := context.WithCancel(context.Background())
		memDone := make(chan struct{})
		go func() {
			defer close(memDone)
			keepMemoryLimit(memCtx, a.log, func() int64 { return int64(m.Stats().TableBytes) }, memoryLimitInterval)
		}()
		defer func() { stopMem(); <-memDone }()
	}
	var stages sync.WaitGroup
	running := a.startSinks(&stages, errs)
	modeDone := make(chan struct{})
	stages.Go(func() {
		defer close(modeDone)
		a.runMode() // ends when batches closes
	})
	if a.certReloader != nil {
		stages.Go(func() { a.certReloader.Run(runCtx) })
	}
	if a.meta != nil {
		// A source that fails (while setting up, say) closes Ready too:
		// without this the aggregator would serve on without enrichment
		// and without a word. It ends the run like a failed listener.
		stages.Go(func() {
			if err := a.meta.Run(runCtx); err != nil && runCtx.Err() == nil {
				select {
				case errs <- fmt.Errorf("the Pod metadata source failed: %w", err):
				default:
				}
			}
		})
		// Like the reference, wait (bounded by the source's own sync
		// timeout) for the cluster's objects before taking records, so
		// that early records are enriched too.
		select {
		case <-a.meta.Ready():
		case <-runCtx.Done():
		}
	}
	if a.clusterWatch != nil {
		stages.Go(func() {
			if err := a.clusterWatch.Run(runCtx); err != nil && runCtx.Err() == nil {
				a.log.Error("the watch of the cluster for Traceflow stopped", "err", err)
			}
		})
	}
	if a.traceflow != nil {
		stages.Go(func() {
			if err := a.traceflow.Run(runCtx); err != nil && runCtx.Err() == nil {
				a.log.Error("the Traceflow controller stopped", "err", err)
			}
		})
	}
	collCtx, stopColl := context.WithCancel(runCtx)
	defer stopColl()
	colls := a.startCollectors(collCtx, errs)
	apiDone := make(chan error, 1)
	go func() { apiDone <- a.api.Serve(runCtx, a.apiLn) }()
	uiDone := a.runUI(runCtx)
	a.api.SetReady(true)
	addrs := a.Addrs()
	a.log.Info("aggregator running", "mode", a.cfg.Mode, "transport", a.cfg.AggregatorTransportProtocol,
		"ipfix", addrs.IPFIX+addrs.UDP, "grpc", addrs.GRPC, "flowStream", addrs.FlowStream,
		"api", addrs.API, "ui", addrs.UI, "sinks", len(a.sinks), "proxyFastPath", a.encoded != nil && a.cfg.Mode == config.ModeProxy,
		"aggregateFastPath", a.encoded != nil && a.cfg.Mode != config.ModeProxy)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		a.log.Error("a listener or sink failed; shutting down", "err", runErr)
	}
	a.api.SetReady(false)
	// Stop taking records, let the mode hand on what it has, then give the
	// sinks a bounded time to send it.
	stopColl()
	colls.Wait()
	// From here on, what the mode hands on waits for the sinks instead of
	// lapping a slow one (bounded by the drain timeout).
	a.buf.Flushing()
	if a.encBuf != nil {
		a.encBuf.Flushing()
	}
	close(a.batches)
	stopRun() // the metadata source and the API end with the run
	a.drain(&stages, modeDone, running)
	a.closeKafkaInput()
	if a.informers != nil {
		a.informers.Shutdown() // their users have stopped
	}
	uiDone()
	if err := <-apiDone; err != nil && runErr == nil {
		runErr = err
	}
	// A sink that failed while draining (the flow stream service's
	// server, say) is reported too.
	select {
	case err := <-errs:
		if runErr == nil {
			runErr = err
		}
	default:
	}
	a.countShutdownLoss(running)
	a.logSinkTotals()
	handed := a.buf.Produced()
	if a.encBuf != nil {
		handed += a.encBuf.Produced()
	}
	a.log.Info("aggregator stopped", "records_to_sinks", handed)
	return runErr
}

// runMode runs the mode until the batches end, then closes the buffer
// the sinks read.
func (a *Aggregator) runMode() {
	if a.encoded != nil {
		a.encoded.Run(context.Background(), a.batches, a.encBuf, a.encodeErr)
		a.encBuf.Close()
	} else {
		a.mode.Run(context.Background(), a.batches, a.buf)
	}
	a.buf.Close()
}

// runningSink is a started sink: how to stop it, and how much its
// consumer has left unread (see ring.Consumer.Unread).
type runningSink struct {
	stop   context.CancelFunc
	unread func() uint64
	// behind is how far behind the final flush sees the sink: past what
	// it released, not only what it read (ring.Consumer.Behind).
	behind func() uint64
	done   chan struct{} // closed when the sink's Run returned
}

// startSinks runs each sink on its own consumer of the buffer (of encoded
// records, on the fast path), each with a context of its own so that the
// drain can stop one sink and not the others. A sink's failure stops the
// aggregator.
func (a *Aggregator) startSinks(stages *sync.WaitGroup, errs chan<- error) []runningSink {
	running := make([]runningSink, len(a.sinks))
	stallTimeout := a.cfg.Sluice.SinkStallTimeout.Duration.String()
	encKeys := map[*ring.Consumer[ipfix.EncodedRecord]]string{}
	keys := map[*ring.Consumer[*flow.Flow]]string{}
	stalled := func(key string) {
		a.log.Warn("a sink a whole buffer behind sent nothing for sluice.sinkStallTimeout: the pipeline no longer waits for it, and what it misses is dropped and counted until it sends again",
			"sink", key, "timeout", stallTimeout)
	}
	defer func() {
		// Set before the mode produces (it starts after the sinks).
		if a.encBuf != nil {
			a.encBuf.OnStall(func(c *ring.Consumer[ipfix.EncodedRecord]) { stalled(encKeys[c]) })
		}
		a.buf.OnStall(func(c *ring.Consumer[*flow.Flow]) { stalled(keys[c]) })
	}()
	for i, ns := range a.sinks {
		ctx, stop := context.WithCancel(context.Background())
		fail := func(err error) {
			if err != nil && ctx.Err() == nil {
				select {
				case errs <- err:
				default:
				}
			}
		}
		if a.encoded != nil {
			es := ns.s.(sink.EncodedSink) // setupFastPath checked it
			c := a.encBuf.Consumer()
			encKeys[c] = ns.key
			running[i] = runningSink{stop: stop, unread: c.Unread, behind: c.Behind, done: make(chan struct{})}
			done := running[i].done
			stages.Go(func() {
				defer close(done)
				defer c.Close() // a stopped sink no longer holds back the final flush
				fail(es.RunEncoded(ctx, c))
			})
			continue
		}
		c := a.buf.Consumer()
		keys[c] = ns.key
		if _, ok := ns.s.(sink.BestEffort); ok {
			c.BestEffort() // gRPC confirmations do not wait for live views
		}
		running[i] = runningSink{stop: stop, unread: c.Unread, behind: c.Behind, done: make(chan struct{})}
		done := running[i].done
		stages.Go(func() {
			defer close(done)
			defer c.Close()
			fail(ns.s.Run(ctx, c))
		})
	}
	return running
}

// drain waits for the mode and the sinks to finish, at most the drain
// timeout. Then, if the mode's final flush is still waiting (for sinks
// a whole buffer behind: a collector that is down, say), it stops those
// sinks only, so that the flush reaches the others, and waits for them
// at most the drain timeout again; what still runs after that is stopped.
func (a *Aggregator) drain(stages *sync.WaitGroup, modeDone <-chan struct{}, running []runningSink) {
	timeout := a.cfg.Sluice.DrainTimeout.Duration
	drained := make(chan struct{})
	go func() { stages.Wait(); close(drained) }()
	defer func() {
		for _, r := range running {
			r.stop()
		}
		<-drained
	}()
	select {
	case <-drained:
		return
	case <-time.After(timeout):
	}
	select {
	case <-modeDone:
		a.log.Warn("sinks did not drain in time; what they still hold is lost and counted", "timeout", timeout.String())
		return
	default:
	}
	capacity := uint64(a.buf.Cap())
	if a.encBuf != nil {
		capacity = uint64(a.encBuf.Cap())
	}
	// Which sinks are a whole buffer behind is read for all of them
	// before any is stopped: once one stops, the flush moves on and fills
	// the buffer again, and a sink that keeps up would look behind for a
	// moment.
	var laggards []int
	for i, r := range running {
		select {
		case <-r.done:
			continue // finished (or never read: the flow stream's observers)
		default:
		}
		if _, ok := a.sinks[i].s.(sink.BestEffort); ok {
			continue
		}
		// Behind, not Unread: a sink that read everything but holds
		// records unreleased (the IPFIX sink's pending ones when its
		// collector went away) holds back the flush all the same.
		if r.behind() >= capacity {
			laggards = append(laggards, i)
		}
	}
	for _, i := range laggards {
		a.log.Warn("a sink held back the final flush past the drain timeout; stopping it so the others get the rest",
			"sink", a.sinks[i].key, "timeout", timeout.String())
		running[i].stop()
	}
	select {
	case <-drained:
	case <-time.After(timeout):
		a.log.Warn("sinks did not drain in time; what they still hold is lost and counted", "timeout", timeout.String())
	}
}

// countShutdownLoss counts, once every stage has ended, the records each
// sink will never see: those it had not read when it stopped (the drain
// timeout, or its own failure) and those produced after. A sink that
// promises no delivery (sink.BestEffort) is left out.
func (a *Aggregator) countShutdownLoss(running []runningSink) {
	for i, ns := range a.sinks {
		if _, ok := ns.s.(sink.BestEffort); ok {
			continue
		}
		if n := running[i].unread(); n > 0 {
			a.sinkMetrics.Dropped.WithLabelValues(ns.key, sink.ReasonShutdown).Add(float64(n))
			a.log.Warn("records lost at shutdown: the sink stopped before sending them", "sink", ns.key, "records", n)
		}
	}
}

// logSinkTotals logs what each sink sent and lost over the run: the
// process's metrics end with it, this line stays.
func (a *Aggregator) logSinkTotals() {
	for _, ns := range a.sinks {
		if _, ok := ns.s.(sink.BestEffort); ok {
			continue
		}
		exported, dropped := a.sinkMetrics.Totals(ns.key)
		args := []any{"sink", ns.key, "exported", exported}
		for _, reason := range sink.Reasons() {
			args = append(args, "dropped_"+reason, dropped[reason])
		}
		a.log.Info("sink totals", args...)
	}
}
