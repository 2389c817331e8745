// Package demo runs a whole cluster's flow pipeline in one process, for
// `sluice demo`: from a cluster's objects (the bundled example by
// default) it makes traffic between the Pods as their annotations ask and
// the policies allow, runs one exporter per Node on loopback with real
// sockets (mixed agent element sets, to show version skew), an aggregator,
// and an IPFIX collector for what the aggregator exports; it shows what
// flows while it runs, counts what was sent against what arrived, and
// ends with a Traceflow of one Pod through its Egress.
//
// Files, one job each: cluster.go (objects, model, traffic), nodeview.go
// (a Node's share of the traffic), setup.go (starting the parts), run.go
// (the run and the ordered stop), stats.go (what the collector received),
// view.go (the live view), summary.go (the figures and the final report).
package demo

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"sluice/config"
	"sluice/traceflow/crd"
)

// Defaults of Options.
const (
	DefaultDuration = 30 * time.Second
	DefaultRate     = 100
	// DefaultUIAddress is where `sluice demo` serves the web UI.
	DefaultUIAddress = "127.0.0.1:10351"
)

// Options configures a run.
type Options struct {
	// Mode is config.ModeAggregate (default) or config.ModeProxy.
	Mode string
	// Duration is how long traffic flows; DefaultDuration if 0, unless
	// UntilInterrupted.
	Duration time.Duration
	// UntilInterrupted makes traffic flow until ctx ends (Ctrl-C), so that
	// a person can explore the web UI; Duration is then ignored.
	UntilInterrupted bool
	// UIAddress is where the aggregator serves the web UI (its
	// sluice.ui.address); empty turns it off. Its URL is the first line
	// the demo prints.
	UIAddress string
	// Rate is new connections per second in the whole cluster;
	// DefaultRate if 0.
	Rate float64
	// ClusterDir is a directory (or file) of cluster objects; empty runs
	// the bundled example cluster.
	ClusterDir string
	// Out, when set, is a directory that receives the flow log (Aggregate
	// mode) and a capture of the IPFIX stream the aggregator exported.
	Out string
	// Stdout receives the view and the summary.
	Stdout io.Writer
	// Terminal redraws one screen in place; otherwise plain lines are
	// printed every Refresh.
	Terminal bool
	// Refresh is the view's period; default 1 s on a terminal, 5 s
	// otherwise.
	Refresh time.Duration
	// Log receives the components' logs; nil discards them.
	Log *slog.Logger
	// Seed makes the traffic repeatable.
	Seed uint64
	// ClickHouseURL, when set, is a ClickHouse server (clickHouse.databaseURL)
	// the aggregator also writes its records to, creating the flows table
	// and views if they are missing; credentials from CH_USERNAME and
	// CH_PASSWORD.
	ClickHouseURL string
}

func (o *Options) defaults() error {
	switch o.Mode {
	case "":
		o.Mode = config.ModeAggregate
	case config.ModeAggregate, config.ModeProxy:
	default:
		return fmt.Errorf("demo: mode %q is neither %s nor %s", o.Mode, config.ModeAggregate, config.ModeProxy)
	}
	if o.Duration == 0 && !o.UntilInterrupted {
		o.Duration = DefaultDuration
	}
	if o.Duration < 0 || o.Rate < 0 {
		return fmt.Errorf("demo: the duration (%v) and the rate (%v) must not be negative", o.Duration, o.Rate)
	}
	if o.Rate == 0 {
		o.Rate = DefaultRate
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Refresh <= 0 {
		o.Refresh = 5 * time.Second
		if o.Terminal {
			o.Refresh = time.Second
		}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Summary is what a run measured.
type Summary struct {
	Mode    string
	Elapsed time.Duration
	// Exporters are the Nodes' exporters, in Node order.
	Exporters []ExporterFigures
	// Sent is what the exporters wrote to the aggregator, Received what
	// its collector decoded, counted before the connections closed; Lost
	// is the difference (never negative).
	Sent, Received, Lost uint64
	// PerExporter is false when every exporter had to use the same
	// source address (the aggregator then counts them together).
	PerExporter bool
	// SinkExported is what the aggregator's sinks wrote, by sink name.
	SinkExported map[string]uint64
	// CollectorReceived is what the demo's IPFIX collector decoded of the
	// aggregator's export.
	CollectorReceived uint64
	// BothPods counts exported records naming the Pods at both ends;
	// Correlated the inter-Node ones both Nodes reported (Aggregate mode).
	BothPods, Correlated uint64
	// PassedThrough counts exported records that carried elements the
	// aggregator does not know (Proxy mode passes them on).
	PassedThrough uint64
	// Routes is how many kinds of connection the traffic was drawn from;
	// Denied lists those a policy drops, left out.
	Routes int
	Denied []Denied
	// DeniedRecords counts the records of denied connections the
	// collector received; RecentDenied describes the latest.
	DeniedRecords uint64
	RecentDenied  []string
	// Egresses are the records that name each Egress.
	Egresses []EgressFigures
	// Top are the busiest Pod pairs.
	Top []Talker
	// Trace is the final Traceflow, with its status.
	Trace *crd.Traceflow
	// FlowLog and Capture are the files written under Options.Out.
	FlowLog, Capture string
}

// ExporterFigures are one exporter's counts.
type ExporterFigures struct {
	Node, Profile string
	// Address is the source address it connected from.
	Address string
	Sent    uint64
	// Received, SkewUnknown and SkewMissing are the aggregator's counts
	// for this exporter's address: records, and elements it did not know
	// or missed, summed over records.
	Received, SkewUnknown, SkewMissing uint64
}

// Talker is a pair of endpoints and their traffic.
type Talker struct {
	From, To string
	// Octets in both directions; BitsPerSecond averaged over the run.
	Octets        uint64
	BitsPerSecond float64
}

// TraceDelivered reports whether the final trace succeeded.
func (s *Summary) TraceDelivered() bool {
	return s.Trace != nil && s.Trace.Status.Phase == crd.PhaseSucceeded
}
