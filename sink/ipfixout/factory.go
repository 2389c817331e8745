package ipfixout

import (
	"crypto/tls"
	"hash/fnv"

	"sluice/certs"
	"sluice/config"
	"sluice/flow/ipfixmap"
	"sluice/sink"
)

// Factory is the flowCollector sink: IPFIX (or JSON lines) to one
// collector.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkFlowCollector, Proxy: true, New: newFromConfig}
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	fc := cfg.FlowCollector
	hostport, proto, err := fc.Target()
	if err != nil {
		return nil, cfg.KeyError("flowCollector.address", err)
	}
	ex, err := sink.NewExporter(cfg, env.Table)
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
	s, err := New(Options{
		Address: hostport, Proto: proto, TLS: tlsConf, JSON: fc.RecordFormat == config.FormatJSON,
		ObservationDomainID: observationDomain(cfg), MaxMessageSize: fc.MaxIPFIXMsgSize, TemplateRefresh: fc.TemplateRefreshTimeout.Duration,
		Exporter: ex, Log: env.Log, Metrics: env.Metrics, Name: config.SinkFlowCollector,
	})
	if err != nil {
		return nil, cfg.KeyError("flowCollector", err)
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

// EncodedExporter is the exporter encoded records must be written with
// (sink.EncodedSink); nil for a JSON collector, which renders flow records.
func (s *Sink) EncodedExporter() *ipfixmap.Exporter {
	if s.o.JSON {
		return nil
	}
	return s.o.Exporter
}
