package sink

import (
	"context"
	"crypto/tls"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"sluice/config"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ring"
)

// Factory makes one kind of sink. Each sink package has one; the
// aggregator keeps the list of them (one line a sink) and runs the sinks
// whose section the configuration enables.
type Factory struct {
	// Key is the sink's section of the configuration file, which also
	// names it in metrics (config.SinkFlowCollector and so on).
	Key string
	// Proxy says whether the sink may run in Proxy mode.
	Proxy bool
	// New makes the sink from a configuration that enables it; it may
	// bind sockets or open files, which Close releases when the sink never
	// runs. Errors name the key at fault (config.KeyError).
	New func(Env) (Sink, error)
}

// Env is what a sink is made from.
type Env struct {
	Config *config.Aggregator
	Log    *slog.Logger
	// Metrics are the series every sink reports under its own name;
	// Registry takes series a sink has on its own.
	Metrics  *Metrics
	Registry prometheus.Registerer
	// Table maps IPFIX elements to flow fields (NewExporter).
	Table *ipfixmap.Table
	// Buffer is the broadcast buffer Run's consumer reads, for sinks that
	// serve observers of their own (the flow stream service).
	Buffer *ring.Buffer[*flow.Flow]
	// ServerTLS returns a server configuration with the aggregator's
	// server certificates (made or loaded once, shared with the
	// collectors) that follows their renewal (sluice.tls.reloadInterval):
	// it reads the current ones at each handshake. nextProtos are the
	// ALPN protocols offered.
	ServerTLS func(requireClientCert bool, nextProtos ...string) (*tls.Config, error)
	// Kube returns a client of the aggregator's cluster and the namespace
	// it runs in, where the Secrets the configuration names are read; an
	// error when the aggregator has no Kubernetes API (no
	// sluice.kubeconfig, not in a Pod). Nil is the same as always failing.
	Kube func() (kubernetes.Interface, string, error)
	// ClusterUUID is the cluster's UUID (see package clusterid); zero
	// when it is not known (an inventory file, no Kubernetes).
	ClusterUUID flow.UID
}

// ClusterUUIDText is ClusterUUID in its canonical text form, "" when it
// is not known.
func (e Env) ClusterUUIDText() string {
	if e.ClusterUUID == (flow.UID{}) {
		return ""
	}
	const hex = "0123456789abcdef"
	b := make([]byte, 0, 36)
	for i, c := range e.ClusterUUID {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0xf])
	}
	return string(b)
}

// Closer is a sink that holds what New took (a listener, a file) until Run
// ends; Close releases it when Run never runs.
type Closer interface {
	Close() error
}

// Listener is a sink that serves clients on an address of its own.
type Listener interface {
	Addr() string
}

// EncodedSink is a sink that can take export records already encoded with
// its templates instead of flow records: the end of Proxy mode's fast
// path (see package mode), used when it is the aggregator's only sink.
type EncodedSink interface {
	Sink
	// EncodedExporter is the exporter whose templates encoded records must
	// use, or nil when this sink cannot take them as it is configured
	// (a JSON collector).
	EncodedExporter() *ipfixmap.Exporter
	// RunEncoded is Run for encoded records.
	RunEncoded(ctx context.Context, c *ring.Consumer[ipfix.EncodedRecord]) error
}

// NewExporter maps records to the export templates of the configured mode
// and contents (names, UIDs, pass-through of unknown elements): what an
// IPFIX or JSON sink sends and what the flow-record API shows.
func NewExporter(cfg *config.Aggregator, table *ipfixmap.Table) (*ipfixmap.Exporter, error) {
	fc := cfg.FlowCollector
	return ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: fc.IncludeK8sNames, UIDs: fc.IncludeK8sUIDs,
		Proxy: cfg.Mode == config.ModeProxy, Aggregate: cfg.Mode == config.ModeAggregate},
		cfg.Mode == config.ModeProxy && cfg.Sluice.Proxy.PassThroughUnknown, ipfix.MinDataSetID)
}
