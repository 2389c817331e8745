package aggregator

import (
	"github.com/prometheus/client_golang/prometheus"

	"sluice/config"
	"sluice/ipfix"
	"sluice/mode"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/clickhouse"
	"sluice/sink/flowlog"
	"sluice/sink/flowstream"
	"sluice/sink/ipfixout"
	"sluice/sink/kafka"
	"sluice/sink/s3"
)

// Sinks are the sinks this build can run, one line a sink: adding one is
// writing its package (with a sink.Factory) and listing it here.
func Sinks() []sink.Factory {
	return []sink.Factory{
		ipfixout.Factory(),
		flowlog.Factory(),
		flowstream.Factory(),
		s3.Factory(),
		clickhouse.Factory(),
		kafka.Factory(),
	}
}

// ValidateOptions are the configuration checks that depend on the sinks
// this build runs.
func ValidateOptions() config.ValidateOptions {
	o := config.ValidateOptions{Sinks: map[string]config.SinkSupport{}}
	for _, f := range Sinks() {
		o.Sinks[f.Key] = config.SinkSupport{Proxy: f.Proxy}
	}
	return o
}

// LoadConfig reads and validates the configuration file at path, refusing
// sinks this build cannot run.
func LoadConfig(path string) (*config.Aggregator, error) {
	return config.LoadWith(path, ValidateOptions())
}

// setupSinks makes each sink the configuration enables.
func (a *Aggregator) setupSinks() error {
	a.sinkMetrics = sink.NewMetrics(a.reg)
	env := sink.Env{Config: a.cfg, Log: a.log, Metrics: a.sinkMetrics, Registry: a.reg,
		Table: a.table, Buffer: a.buf, ServerTLS: a.serverTLS, Kube: a.kubeAccess, ClusterUUID: a.cluster.UUID}
	for _, f := range Sinks() {
		if !a.cfg.SinkEnabled(f.Key) {
			continue
		}
		s, err := f.New(env)
		if err != nil {
			return err
		}
		a.sinks = append(a.sinks, namedSink{key: f.Key, s: s})
	}
	if len(a.sinks) == 0 {
		a.log.Info("no sink is enabled: records are received and counted, then dropped")
	}
	return nil
}

// setupFastPath lets the mode hand records on already encoded when it can
// (mode.Encoder) and the only sink can take them (sink.EncodedSink):
// flowCollector sending IPFIX and nothing else, in Proxy mode
// (sluice.proxy.fastPath) or Aggregate mode (sluice.aggregate.fastPath).
func (a *Aggregator) setupFastPath() error {
	on := a.cfg.Sluice.Proxy.FastPath
	if _, ok := a.mode.(aggregateMode); ok {
		on = a.cfg.Sluice.Aggregate.FastPath
	}
	if !on || len(a.sinks) != 1 {
		return nil
	}
	if a.cfg.Sluice.KafkaInput.Enable && a.cfg.Mode == config.ModeAggregate {
		return nil // the Kafka input follows exports as flow records
	}
	if a.cfg.Mode == config.ModeProxy && !a.cfg.Sluice.Proxy.FillPods {
		return nil // the fast path always fills Pods
	}
	m, ok := a.mode.(mode.Encoder)
	if !ok {
		return nil
	}
	s, ok := a.sinks[0].s.(sink.EncodedSink)
	if !ok || s.EncodedExporter() == nil {
		return nil
	}
	enc, err := m.Encoded(a.table, s.EncodedExporter())
	if err != nil || enc == nil {
		return err
	}
	a.encoded = enc
	a.encBuf = ring.New[ipfix.EncodedRecord](a.cfg.RecordBufferSize)
	a.encodeErrs = a.sinkMetrics.Dropped.WithLabelValues(a.sinks[0].key, sink.ReasonEncodeError)
	return nil
}

// encodeErr counts a record the fast path's mode could not encode.
func (a *Aggregator) encodeErr(err error) {
	a.encodeErrs.Inc()
	a.log.Error("cannot encode a record", "sink", a.sinks[0].key, "err", err)
}

// setupBackPressure makes the buffers the sinks read wait for a sink that
// is behind while it keeps sending (sluice.sinkOverflow "block"), so that
// a slow destination slows the collectors, and over TCP and TLS the
// exporters, rather than lose records; a sink that sends nothing for
// sluice.sinkStallTimeout, or whose destination is down, is lapped as
// with "drop", and so are the live views (flow stream, UI), which are
// never waited for.
func (a *Aggregator) setupBackPressure() {
	if s := a.cfg.Sluice; s.SinkOverflow == config.SinkOverflowBlock {
		a.buf.BackPressure(s.SinkStallTimeout.Duration)
		if a.encBuf != nil {
			a.encBuf.BackPressure(s.SinkStallTimeout.Duration)
		}
	}
	a.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_pipeline_backpressure_seconds_total",
		Help: "Time the pipeline spent waiting for sinks that were a whole recordBufferSize behind (sluice.sinkOverflow block, or the final flush)."},
		func() float64 {
			w := a.buf.Waited()
			if a.encBuf != nil {
				w += a.encBuf.Waited()
			}
			return w.Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_pipeline_backpressure_waiting",
			Help: "1 while the pipeline waits for a sink that is a whole recordBufferSize behind, else 0."},
			func() float64 {
				n := a.buf.Waiting()
				if a.encBuf != nil {
					n += a.encBuf.Waiting()
				}
				return float64(min(n, 1))
			}))
}
