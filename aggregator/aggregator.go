// Package aggregator wires the aggregator's stages together from a
// configuration: collectors → mode (Proxy today) → broadcast buffer →
// sinks, plus the HTTP API. It owns start-up and the ordered shutdown:
// stop collectors, drain the mode, drain and flush the sinks.
package aggregator

import (
	"context"
	"crypto/tls"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/kubernetes"

	"sluice/aggregate"
	"sluice/api"
	"sluice/certs"
	"sluice/collector"
	"sluice/config"
	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/flowstream"
	"sluice/ipfix"
	"sluice/proxy"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/flowlog"
	"sluice/sink/ipfixout"
)

// DrainTimeout bounds how long sinks may take to send what they hold at
// shutdown.
const DrainTimeout = 10 * time.Second

// Aggregator is a configured, not yet running, aggregator. New binds every
// listener, so that port conflicts and bad certificates fail at start-up
// with the key that names them.
type Aggregator struct {
	cfg   *config.Aggregator
	log   *slog.Logger
	reg   *prometheus.Registry
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
	// stream serves FlowStreamService on streamLn when enabled.
	stream   *flowstream.Server
	streamLn net.Listener
	certs    *certs.Bundle
	batches  chan collector.Batch
	buf      *ring.Buffer[*flow.Flow]
	// mode turns batches from the collectors into records for the sinks
	// until the batch channel closes: Proxy or Aggregate.
	mode  func(in <-chan collector.Batch, out *ring.Buffer[*flow.Flow])
	sinks []sink.Sink
	// Proxy mode's fast path (see proxy.Forwarding), when it applies:
	// the collectors' forwarders, the buffer of encoded records, and the
	// flowCollector sink, which then reads that buffer instead of buf.
	forwarder func() collector.Forwarder
	encBuf    *ring.Buffer[ipfix.EncodedRecord]
	encSink   *ipfixout.Sink
	// fcSink and fcExporter are the flowCollector sink and its exporter.
	fcSink      *ipfixout.Sink
	fcExporter  *ipfixmap.Exporter
	sinkMetrics *sink.Metrics
	// store is Aggregate mode's flow store (nil in Proxy mode), for the
	// flow-record API.
	store *aggregate.Store
	inv   *enrich.Inventory
	kube  *enrich.Kube
}

// Addrs are the addresses the aggregator listens on, as bound (useful
// when the configuration asked for port 0).
type Addrs struct {
	IPFIX      string // TCP or TLS
	UDP        string
	API        string
	GRPC       string
	FlowStream string // empty when the flow stream service is off
}

// New prepares an aggregator from cfg.
func New(cfg *config.Aggregator, log *slog.Logger) (*Aggregator, error) {
	a := &Aggregator{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	if err := a.init(); err != nil {
		a.closeListeners()
		return nil, err
	}
	return a, nil
}

func (a *Aggregator) init() error {
	cfg, log := a.cfg, a.log
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		return err
	}

	var store enrich.Store
	switch {
	case cfg.Sluice.Inventory != "":
		a.inv, err = enrich.NewInventory(cfg.Sluice.Inventory, enrich.InventoryOptions{Logger: log})
		if err != nil {
			return cfg.KeyError("sluice.inventory", err)
		}
		store = a.inv
	case cfg.Sluice.Kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		// A kubeconfig, or running in a Pod: follow the cluster itself.
		rc, err := enrich.KubeConfig(cfg.Sluice.Kubeconfig)
		if err != nil {
			return cfg.KeyError("sluice.kubeconfig", err)
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return cfg.KeyError("sluice.kubeconfig", err)
		}
		if err := checkKubeAccess(client, log); err != nil {
			return cfg.KeyError("sluice.kubeconfig", err)
		}
		a.kube = enrich.NewKube(client, enrich.KubeOptions{Logger: log})
		store = a.kube
	default:
		log.Info("no Pod metadata source (sluice.inventory or sluice.kubeconfig): records keep the Pod metadata exporters sent, and nothing is added")
	}
	var px *proxy.Proxy
	if cfg.Mode == config.ModeProxy {
		p := proxy.New(proxy.Options{Store: store, PodLabels: cfg.RecordContents.PodLabels,
			UIDs: cfg.FlowCollector.IncludeK8sUIDs, ClusterID: cfg.ClusterID, Metrics: proxy.NewMetrics(a.reg)})
		px = p
		a.mode = func(in <-chan collector.Batch, out *ring.Buffer[*flow.Flow]) { p.Run(context.Background(), in, out) }
	} else {
		st := aggregate.New(aggregate.Options{
			ActiveTimeout: cfg.ActiveFlowRecordTimeout.Duration, InactiveTimeout: cfg.InactiveFlowRecordTimeout.Duration,
			MaxFlows: cfg.Sluice.Aggregate.MaxFlows, ExportOneSided: cfg.Sluice.Aggregate.ExportOneSided,
			Enrich: store, PodLabels: cfg.RecordContents.PodLabels, UIDs: cfg.FlowCollector.IncludeK8sUIDs, ClusterID: cfg.ClusterID,
		})
		a.store = st
		// Closing the channel makes Run export every tracked flow.
		a.mode = func(in <-chan collector.Batch, out *ring.Buffer[*flow.Flow]) {
			st.Run(context.Background(), in, out, aggregate.DefaultTick)
		}
	}
	a.batches = make(chan collector.Batch, 64)
	a.buf = ring.New[*flow.Flow](cfg.RecordBufferSize)

	if err := a.setupSinks(table); err != nil {
		return err
	}
	if px != nil {
		if err := a.setupFastPath(px, table); err != nil {
			return err
		}
	}
	if err := a.setupCollectors(table); err != nil {
		return err
	}
	if err := a.setupFlowStream(); err != nil {
		return err
	}
	a.api = api.New(a.reg, log)
	a.setupAPI(table)
	if a.apiLn, err = net.Listen("tcp", cfg.Sluice.APIAddress); err != nil {
		return cfg.KeyError("sluice.apiAddress", err)
	}
	return nil
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
	if a.streamLn != nil {
		out.FlowStream = a.streamLn.Addr().String()
	}
	return out
}

// Registry is the aggregator's metrics registry.
func (a *Aggregator) Registry() *prometheus.Registry { return a.reg }

func (a *Aggregator) setupCollectors(table *ipfixmap.Table) error {
	cfg := a.cfg
	m := collector.NewMetrics(a.reg)
	var err error
	a.coll, err = collector.New(collector.Options{Table: table, Out: a.batches, Log: a.log, Metrics: m, Forwarder: a.forwarder})
	if err != nil {
		return err
	}
	// The gRPC collector runs, with mutual TLS, beside the IPFIX one
	// unless sluice.grpcAddress is set empty.
	if cfg.Sluice.GRPCAddress != "" {
		bundle, err := a.serverCerts()
		if err != nil {
			return err
		}
		a.grpcTLS = bundle.ServerTLS(true)
		if a.grpcLn, err = net.Listen("tcp", cfg.Sluice.GRPCAddress); err != nil {
			return cfg.KeyError("sluice.grpcAddress", err)
		}
	}
	switch cfg.AggregatorTransportProtocol {
	case config.TransportNone:
		return nil
	case config.TransportUDP:
		ua, err := net.ResolveUDPAddr("udp", cfg.Sluice.IPFIXAddress)
		if err != nil {
			return cfg.KeyError("sluice.ipfixAddress", err)
		}
		if a.udpConn, err = net.ListenUDP("udp", ua); err != nil {
			return cfg.KeyError("sluice.ipfixAddress", err)
		}
		return nil
	case config.TransportTLS:
		bundle, err := a.serverCerts()
		if err != nil {
			return err
		}
		a.tlsConf = bundle.ServerTLS(true)
	}
	if a.tcpLn, err = net.Listen("tcp", cfg.Sluice.IPFIXAddress); err != nil {
		return cfg.KeyError("sluice.ipfixAddress", err)
	}
	return nil
}

// serverCerts loads the collectors' certificates from files, or makes
// (once) and reuses a CA and certificates in the certificate directory.
func (a *Aggregator) serverCerts() (*certs.Bundle, error) {
	if a.certs != nil {
		return a.certs, nil
	}
	b, err := a.loadServerCerts()
	a.certs = b
	return b, err
}

func (a *Aggregator) loadServerCerts() (*certs.Bundle, error) {
	t := a.cfg.Sluice.TLS
	if !t.Generated() {
		b, err := certs.Load(t.CertFile, t.KeyFile, t.CAFile)
		if err != nil {
			return nil, a.cfg.KeyError("sluice.tls.certFile", err)
		}
		return b, nil
	}
	dir, err := t.CertDirectory()
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	var names []string
	if a.cfg.FlowAggregatorAddress != "" {
		names = append(names, a.cfg.FlowAggregatorAddress)
	}
	publish, err := a.restoreClusterCerts(dir)
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	b, err := certs.Ensure(dir, certs.Options{ServerNames: names})
	if err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	if err := publish(); err != nil {
		return nil, a.cfg.KeyError("sluice.tls.certDir", err)
	}
	if len(b.Issued) > 0 {
		a.log.Info("issued TLS certificates; point exporters at the CA", "dir", dir, "issued", b.Issued, "ca", b.Paths.CACert)
	}
	return b, nil
}

// setupFastPath switches Proxy mode to its fast path when flowCollector,
// sending IPFIX, is the only consumer of records: the collectors then
// forward what they can as encoded records, and the sink copies them.
func (a *Aggregator) setupFastPath(p *proxy.Proxy, table *ipfixmap.Table) error {
	cfg := a.cfg
	if !cfg.Sluice.Proxy.FastPath || a.fcSink == nil || len(a.sinks) != 1 ||
		cfg.FlowCollector.RecordFormat == config.FormatJSON || cfg.FlowStreamService.Enable {
		return nil
	}
	fw, err := proxy.NewForwarding(p, table, a.fcExporter)
	if err != nil || fw == nil {
		return err
	}
	ex := a.fcExporter
	dropped := a.sinkMetrics.Dropped.WithLabelValues(config.SinkFlowCollector, sink.ReasonEncodeError)
	encodeErr := func(err error) {
		dropped.Inc()
		a.log.Error("cannot encode a record", "sink", config.SinkFlowCollector, "err", err)
	}
	a.forwarder = fw.NewForwarder
	a.encBuf = ring.New[ipfix.EncodedRecord](cfg.RecordBufferSize)
	a.encSink, a.sinks = a.fcSink, nil
	a.mode = func(in <-chan collector.Batch, _ *ring.Buffer[*flow.Flow]) {
		p.RunEncoded(context.Background(), in, a.encBuf, ex, encodeErr)
		a.encBuf.Close()
	}
	return nil
}

func (a *Aggregator) setupSinks(table *ipfixmap.Table) error {
	cfg := a.cfg
	m := sink.NewMetrics(a.reg)
	a.sinkMetrics = m
	if cfg.FlowCollector.Enable {
		s, err := a.flowCollectorSink(table, m)
		if err != nil {
			return err
		}
		a.sinks = append(a.sinks, s)
	}
	if cfg.FlowLogger.Enable {
		s, err := a.flowLoggerSink(m)
		if err != nil {
			return err
		}
		a.sinks = append(a.sinks, s)
	}
	if len(a.sinks) == 0 {
		a.log.Info("no sink is enabled: records are received and counted, then dropped")
	}
	return nil
}

func (a *Aggregator) flowCollectorSink(table *ipfixmap.Table, m *sink.Metrics) (sink.Sink, error) {
	cfg := a.cfg
	fc := cfg.FlowCollector
	hostport, proto, err := fc.Target()
	if err != nil {
		return nil, cfg.KeyError("flowCollector.address", err)
	}
	ex, err := a.exporter(table)
	if err != nil {
		return nil, err
	}
	var tlsConf *tls.Config
	if fc.TLS.Enable {
		ct := cfg.Sluice.CollectorTLS
		b, err := certs.LoadClient(ct.CertFile, ct.KeyFile, ct.CAFile)
		if err != nil {
			return nil, cfg.KeyError("sluice.collectorTLS", err)
		}
		tlsConf = b.ClientTLS(fc.TLS.ServerName)
		if fc.TLS.MinVersion == "VersionTLS13" {
			tlsConf.MinVersion = tls.VersionTLS13
		}
	}
	s, err := ipfixout.New(ipfixout.Options{
		Address: hostport, Proto: proto, TLS: tlsConf, JSON: fc.RecordFormat == config.FormatJSON,
		ObservationDomainID: observationDomain(cfg), MaxMessageSize: fc.MaxIPFIXMsgSize, TemplateRefresh: fc.TemplateRefreshTimeout.Duration,
		Exporter: ex, Log: a.log, Metrics: m, Name: config.SinkFlowCollector,
	})
	if err != nil {
		return nil, cfg.KeyError("flowCollector", err)
	}
	a.fcSink, a.fcExporter = s, ex
	return s, nil
}

// exporter maps records to the export templates of the configured mode
// and content (names, UIDs, pass-through).
func (a *Aggregator) exporter(table *ipfixmap.Table) (*ipfixmap.Exporter, error) {
	cfg := a.cfg
	fc := cfg.FlowCollector
	return ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: fc.IncludeK8sNames, UIDs: fc.IncludeK8sUIDs,
		Proxy: cfg.Mode == config.ModeProxy, Aggregate: cfg.Mode == config.ModeAggregate},
		cfg.Mode == config.ModeProxy && cfg.Sluice.Proxy.PassThroughUnknown, ipfix.MinDataSetID)
}

func (a *Aggregator) flowLoggerSink(m *sink.Metrics) (sink.Sink, error) {
	cfg := a.cfg
	l := cfg.FlowLogger
	filters := make([]flowlog.Filter, 0, len(l.Filters))
	for i, f := range l.Filters {
		var x flowlog.Filter
		for _, list := range []struct {
			key   string
			names []string
			dst   *[]uint8
		}{
			{"ingressNetworkPolicyRuleActions", f.IngressNetworkPolicyRuleActions, &x.IngressActions},
			{"egressNetworkPolicyRuleActions", f.EgressNetworkPolicyRuleActions, &x.EgressActions},
		} {
			for _, name := range list.names {
				act, err := flowlog.ParseAction(name)
				if err != nil {
					return nil, cfg.KeyError(fmt.Sprintf("flowLogger.filters[%d].%s", i, list.key), err)
				}
				*list.dst = append(*list.dst, act)
			}
		}
		filters = append(filters, x)
	}
	s, err := flowlog.New(flowlog.Options{Path: l.Path, MaxSizeMB: l.MaxSize, MaxBackups: l.MaxBackups,
		MaxAgeDays: l.MaxAge, Compress: l.Compress, PrettyPrint: l.PrettyPrint, Filters: filters,
		Log: a.log, Metrics: m, Name: config.SinkFlowLogger})
	if err != nil {
		return nil, cfg.KeyError("flowLogger.path", err)
	}
	return s, nil
}

// observationDomain is flowCollector.observationDomainID, or an FNV-1 hash
// of the cluster ID so that the domain is stable across restarts.
func observationDomain(cfg *config.Aggregator) uint32 {
	if id := cfg.FlowCollector.ObservationDomainID; id != nil {
		return *id
	}
	h := fnv.New32()
	h.Write([]byte(cfg.ClusterID))
	return h.Sum32()
}

// Run serves until ctx ends, then shuts down in order and returns.
func (a *Aggregator) Run(ctx context.Context) error {
	var stages, colls sync.WaitGroup
	errs := make(chan error, 8)
	// runCtx ends the whole run: the caller's ctx, or a collector failing.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	collCtx, stopColl := context.WithCancel(runCtx)
	defer stopColl()
	sinkCtx, stopSinks := context.WithCancel(context.Background())
	defer stopSinks()

	for _, s := range a.sinks {
		c := a.buf.Consumer()
		stages.Add(1)
		go func() {
			defer stages.Done()
			defer c.Close() // a stopped sink no longer holds back the final flush
			_ = s.Run(sinkCtx, c)
		}()
	}
	if a.encSink != nil {
		c := a.encBuf.Consumer()
		stages.Add(1)
		go func() {
			defer stages.Done()
			defer c.Close()
			_ = a.encSink.RunEncoded(sinkCtx, c)
		}()
	}
	stages.Add(1)
	go func() {
		defer stages.Done()
		a.mode(a.batches, a.buf) // ends when batches closes
		a.buf.Close()
	}()
	if a.inv != nil {
		stages.Add(1)
		go func() { defer stages.Done(); _ = a.inv.Run(runCtx) }()
	}
	if a.kube != nil {
		stages.Add(1)
		go func() { defer stages.Done(); _ = a.kube.Run(runCtx) }()
		// Like the reference, wait (bounded by the sync timeout) for the
		// cluster's objects before taking records, so that early records
		// are enriched too.
		select {
		case <-a.kube.Ready():
		case <-runCtx.Done():
		}
	}
	start := func(f func() error) {
		colls.Add(1)
		go func() {
			defer colls.Done()
			if err := f(); err != nil {
				errs <- err
			}
		}()
	}
	if a.tcpLn != nil {
		start(func() error { return a.coll.ServeTCP(collCtx, a.tcpLn, a.tlsConf) })
	}
	if a.udpConn != nil {
		start(func() error { return a.coll.ServeUDP(collCtx, a.udpConn) })
	}
	if a.grpcLn != nil {
		start(func() error { return a.coll.ServeGRPC(collCtx, a.grpcLn, a.grpcTLS) })
	}
	streamDone := make(chan error, 1)
	if a.stream != nil {
		// It reads the buffer after the sinks' drain too: it stops when the
		// buffer closes, or when the run's end stops it.
		// Its failure stops the aggregator, as a collector's does, rather
		// than leave it running (and ready) without the service.
		go func() {
			err := a.stream.Serve(sinkCtx, a.streamLn)
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
			streamDone <- err
		}()
	} else {
		streamDone <- nil
	}
	apiDone := make(chan error, 1)
	go func() { apiDone <- a.api.Serve(runCtx, a.apiLn) }()
	a.api.SetReady(true)
	a.log.Info("aggregator running", "mode", a.cfg.Mode, "transport", a.cfg.AggregatorTransportProtocol,
		"ipfix", a.Addrs().IPFIX+a.Addrs().UDP, "grpc", a.Addrs().GRPC, "flowStream", a.Addrs().FlowStream,
		"api", a.Addrs().API, "sinks", a.numSinks(), "proxyFastPath", a.encSink != nil)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
		a.log.Error("a listener failed; shutting down", "err", runErr)
	}
	a.api.SetReady(false)
	// Stop taking records, let the mode hand on what it has, then give the
	// sinks a bounded time to send it.
	stopColl()
	colls.Wait()
	close(a.batches)
	stopRun() // metadata sources and the API end with the run
	drained := make(chan struct{})
	go func() { stages.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(DrainTimeout):
		a.log.Warn("sinks did not drain in time; records still buffered are lost", "timeout", DrainTimeout.String())
		stopSinks()
		<-drained
	}
	stopSinks() // and the flow stream service
	if err := <-streamDone; err != nil && runErr == nil {
		runErr = err
	}
	if err := <-apiDone; err != nil && runErr == nil {
		runErr = err
	}
	a.log.Info("aggregator stopped")
	return runErr
}

// numSinks counts the sinks, the fast path's included.
func (a *Aggregator) numSinks() int {
	if a.encSink != nil {
		return len(a.sinks) + 1
	}
	return len(a.sinks)
}

func (a *Aggregator) closeListeners() {
	if a.tcpLn != nil {
		a.tcpLn.Close()
	}
	if a.udpConn != nil {
		a.udpConn.Close()
	}
	if a.apiLn != nil {
		a.apiLn.Close()
	}
	if a.grpcLn != nil {
		a.grpcLn.Close()
	}
	if a.streamLn != nil {
		a.streamLn.Close()
	}
}

// setupFlowStream binds FlowStreamService when flowStreamService.enable is
// set: server TLS with the collectors' certificate, no client certificate.
func (a *Aggregator) setupFlowStream() error {
	cfg := a.cfg
	if !cfg.FlowStreamService.Enable {
		return nil
	}
	bundle, err := a.serverCerts()
	if err != nil {
		return err
	}
	a.stream, err = flowstream.New(flowstream.Options{Buffer: a.buf, TLS: bundle.ServerTLS(false), Log: a.log,
		Metrics: flowstream.NewMetrics(a.reg)})
	if err != nil {
		return cfg.KeyError("flowStreamService.enable", err)
	}
	if a.streamLn, err = net.Listen("tcp", cfg.Sluice.FlowStreamAddress); err != nil {
		return cfg.KeyError("sluice.flowStreamAddress", err)
	}
	return nil
}
