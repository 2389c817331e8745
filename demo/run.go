package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/aggregator"
	"sluice/config"
	"sluice/enrich"
	"sluice/exporter"
	"sluice/exporter/source/synthetic"
)

// settleTimeout bounds each wait for counts to meet at shutdown (records
// in flight on loopback arrive in milliseconds).
const settleTimeout = 5 * time.Second

// runner is one run's parts.
type runner struct {
	o        Options
	m        *model
	agg      *aggregator.Aggregator
	down     *downstream
	table    *synthetic.Source
	nodes    []*node
	distinct bool
	reg      *prometheus.Registry
	stats    *stats
	release  context.CancelFunc
}

// Run runs the demo until o.Duration has passed (with o.UntilInterrupted,
// until ctx ends) or ctx ends, and returns
// what it measured. The view and the summary go to o.Stdout.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	objs, err := loadObjects(ctx, o.ClusterDir)
	if err != nil {
		return nil, err
	}
	m, warnings, err := buildModel(ctx, objs)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		o.Log.Warn("cluster", "problem", w)
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, fmt.Errorf("demo: --out: %w", err)
		}
	}
	work, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(work)
	r := &runner{o: o, m: m, reg: prometheus.NewRegistry()}
	if err := r.setup(work); err != nil {
		return nil, err
	}
	return r.run(ctx)
}

// setup builds every part, in the order their addresses are needed.
func (r *runner) setup(work string) error {
	o := &r.o
	inv, err := r.m.writeInventory(work)
	if err != nil {
		return err
	}
	store, err := enrich.NewInventory(inv, enrich.InventoryOptions{Logger: o.Log})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if r.table, err = synthetic.New(synthetic.Options{Rate: o.Rate, Routes: r.m.syntheticRoutes(), Seed: o.Seed}); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	r.stats = newStats(time.Now(), o.Mode == config.ModeAggregate)
	if r.down, err = newDownstream(o, r.stats); err != nil {
		return err
	}
	abandon := func() {
		r.down.ln.Close()
		_ = r.down.closeCapture()
	}
	cfg, err := aggregatorConfig(o, work, inv, r.down.ln.Addr().String())
	if err != nil {
		abandon()
		return err
	}
	agg, bundle, err := newAggregator(o, cfg, r.m.objs)
	if err != nil {
		abandon()
		return err
	}
	r.agg = agg
	hold, release := context.WithCancel(context.Background())
	r.release = release
	if r.nodes, r.distinct, err = newExporters(o, r.m.tf, r.table, store, agg.Addrs().IPFIX, bundle, hold, r.reg); err != nil {
		release()
		stopped, cancel := context.WithCancel(context.Background())
		cancel()
		_ = agg.Run(stopped) // a run that stops at once closes the listeners
		abandon()
		return err
	}
	return nil
}

// run starts everything, shows the view until the time is up, then stops
// in the direction of the data, measuring at each step.
func (r *runner) run(ctx context.Context) (*Summary, error) {
	o := &r.o
	start := time.Now()
	r.stats.start = start
	downCtx, stopDown := context.WithCancel(context.Background())
	defer stopDown()
	downErr := make(chan error, 1)
	go func() { downErr <- r.down.serve(downCtx) }()
	aggCtx, stopAgg := context.WithCancel(context.Background())
	defer stopAgg()
	aggDone := make(chan error, 1)
	go func() { aggDone <- r.agg.Run(aggCtx) }()

	expCtx, stopExp := context.WithTimeout(ctx, o.Duration)
	if o.UntilInterrupted {
		expCtx, stopExp = context.WithCancel(ctx)
	}
	defer stopExp()
	var exps sync.WaitGroup
	for _, n := range r.nodes {
		exps.Add(1)
		go func(e *exporter.Exporter) { defer exps.Done(); _ = e.Run(expCtx) }(n.exp)
	}
	if u := r.agg.UIURL(); u != "" {
		fmt.Fprintf(o.Stdout, "web UI: %s\n", u)
	}
	r.header()
	r.watch(expCtx, start)

	// The exporters stop polling and drain; their connections stay up.
	sum := &Summary{Mode: o.Mode, Routes: len(r.m.routes), Denied: r.m.denied, PerExporter: r.distinct}
	var errs []error
	for _, n := range r.nodes {
		select {
		case <-n.held.stopped:
		case <-time.After(exporter.DrainTimeout + settleTimeout):
			errs = append(errs, fmt.Errorf("demo: the exporter of %s did not stop", n.name))
		}
	}
	f, settled := r.settle(func(f figures) bool { return f.received >= f.sent })
	if !settled {
		o.Log.Warn("the aggregator did not receive every record sent", "sent", f.sent, "received", f.received)
	}
	sum.Exporters, sum.Sent, sum.Received = f.nodes, f.sent, f.received
	if f.sent > f.received {
		sum.Lost = f.sent - f.received
	}
	r.release()
	exps.Wait()
	_ = r.table.Close()

	// The aggregator exports what it holds, then the collector gets the rest.
	stopAgg()
	if err := <-aggDone; err != nil {
		errs = append(errs, fmt.Errorf("demo: aggregator: %w", err))
	}
	f, settled = r.settle(func(f figures) bool { return f.stats.out >= f.sink[config.SinkFlowCollector] })
	if !settled {
		o.Log.Warn("the collector did not receive every record the aggregator exported",
			"exported", f.sink[config.SinkFlowCollector], "received", f.stats.out)
	}
	stopDown()
	if err := <-downErr; err != nil {
		errs = append(errs, fmt.Errorf("demo: collector: %w", err))
	}
	if err := r.down.closeCapture(); err != nil {
		errs = append(errs, err)
	}
	sum.Elapsed = time.Since(start)
	final := r.stats.view(time.Now(), 5)
	sum.SinkExported, sum.CollectorReceived = f.sink, final.out
	sum.BothPods, sum.Correlated, sum.PassedThrough, sum.Top = final.bothPods, final.correlated, final.passedThrough, final.top
	sum.DeniedRecords, sum.RecentDenied, sum.Egresses = final.denied, final.recentDenied, final.egress
	if o.Out != "" {
		sum.Capture = filepath.Join(o.Out, "aggregator-export.ipfix")
		if o.Mode == config.ModeAggregate {
			sum.FlowLog = filepath.Join(o.Out, "flows.log")
		}
	}

	tf, err := r.m.trace(context.WithoutCancel(ctx), r.m.egressRoute())
	if err != nil {
		errs = append(errs, fmt.Errorf("demo: traceflow: %w", err))
	}
	sum.Trace = tf
	if err := r.printSummary(sum, r.m.egressRoute()); err != nil {
		errs = append(errs, err)
	}
	return sum, errors.Join(errs...)
}

// settle polls the figures until done says they met, or settleTimeout.
func (r *runner) settle(done func(figures) bool) (figures, bool) {
	deadline := time.Now().Add(settleTimeout)
	for {
		f := r.figures(time.Now())
		if done(f) {
			return f, true
		}
		if time.Now().After(deadline) {
			return f, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// figures are the counts at one moment.
type figures struct {
	at             time.Time
	nodes          []ExporterFigures
	sent, received uint64
	unknown        uint64
	missing        uint64
	sink           map[string]uint64
	stats          statsView
}

func (r *runner) figures(now time.Time) figures {
	f := figures{at: now, stats: r.stats.view(now, 5)}
	// Sent before received: the other way round, records sent between the
	// two reads would look lost.
	sent, _ := counters(r.reg, "node", metricSent)
	agg, err := counters(r.agg.Registry(), "exporter", metricReceived, metricSkewUnknown, metricSkewMissing)
	if err != nil {
		r.o.Log.Warn("cannot read the aggregator's metrics", "err", err)
		return f
	}
	sinks, _ := counters(r.agg.Registry(), "sink", metricSinkOut)
	f.sink = sinks[metricSinkOut]
	f.received = sum(agg[metricReceived])
	f.unknown, f.missing = sum(agg[metricSkewUnknown]), sum(agg[metricSkewMissing])
	for _, n := range r.nodes {
		e := ExporterFigures{Node: n.name, Profile: n.profile.label, Address: n.from.String(), Sent: sent[metricSent][n.name]}
		if r.distinct {
			a := n.from.String()
			e.Received, e.SkewUnknown, e.SkewMissing = agg[metricReceived][a], agg[metricSkewUnknown][a], agg[metricSkewMissing][a]
		}
		f.sent += e.Sent
		f.nodes = append(f.nodes, e)
	}
	return f
}
