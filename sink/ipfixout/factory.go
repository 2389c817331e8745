package ipfixout

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"sluice/certs"
	"sluice/certs/kubecerts"
	"sluice/config"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/sink"
)

// Factory is the flowCollector sink: IPFIX (or JSON lines) to one
// collector.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkFlowCollector, Proxy: true, New: newFromConfig}
}

// secretTimeout bounds the reading of flowCollector.tls's Secrets, at
// start-up and before each connection attempt.
const secretTimeout = 30 * time.Second

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
	var tlsLoad func(context.Context) (*tls.Config, error)
	switch {
	case fc.TLS.Enable && (fc.TLS.CASecretName != "" || fc.TLS.ClientSecretName != ""):
		if tlsLoad, err = secretTLS(env); err != nil {
			return nil, err
		}
	case fc.TLS.Enable:
		ct := cfg.Sluice.CollectorTLS
		b, err := certs.LoadClient(ct.CertFile, ct.KeyFile, ct.CAFile)
		if err != nil {
			return nil, cfg.KeyError("sluice.collectorTLS", err)
		}
		tlsConf = clientTLS(b, fc.TLS)
	}
	s, err := New(Options{
		Address: hostport, Proto: proto, TLS: tlsConf, TLSConfig: tlsLoad, JSON: fc.RecordFormat == config.FormatJSON,
		ObservationDomainID: observationDomain(cfg, env.ClusterUUID), MaxMessageSize: fc.MaxIPFIXMsgSize, TemplateRefresh: fc.TemplateRefreshTimeout.Duration,
		Exporter: ex, Log: env.Log, Metrics: env.Metrics, Name: config.SinkFlowCollector,
	})
	if err != nil {
		return nil, cfg.KeyError("flowCollector", err)
	}
	return s, nil
}

// clientTLS is the configuration of a connection to the collector.
func clientTLS(b *certs.Bundle, t config.CollectorTLS) *tls.Config {
	c := b.ClientTLS(t.ServerName)
	if t.MinVersion == "VersionTLS13" {
		c.MinVersion = tls.VersionTLS13
	}
	return c
}

// secretTLS reads the CA and the client pair from the Secrets that
// flowCollector.tls names (and what it does not name from the files of
// sluice.collectorTLS), through the aggregator's Kubernetes API, in its
// namespace. It reads them once now, so that a missing Secret, a missing
// permission or bad material stops the start-up with the key at fault,
// and returns the function that reads them again before each connection
// attempt: as the reference re-reads them when its exporter starts
// again, a renewed certificate is used by the next connection.
func secretTLS(env sink.Env) (func(context.Context) (*tls.Config, error), error) {
	cfg := env.Config
	t := cfg.FlowCollector.TLS
	key := "flowCollector.tls.caSecretName"
	if t.CASecretName == "" {
		key = "flowCollector.tls.clientSecretName"
	}
	if env.Kube == nil {
		return nil, cfg.KeyError(key, errors.New("names a Secret, but the aggregator has no Kubernetes API"))
	}
	client, ns, err := env.Kube()
	if err != nil {
		return nil, cfg.KeyError(key, fmt.Errorf("names a Secret, but the aggregator has no Kubernetes API (set sluice.kubeconfig, run in a Pod, or give files in sluice.collectorTLS): %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), secretTimeout)
	defer cancel()
	// One Secret at a time, so that the error names the key of the one at
	// fault.
	for _, s := range []struct{ key, ca, client string }{
		{"flowCollector.tls.caSecretName", t.CASecretName, ""},
		{"flowCollector.tls.clientSecretName", "", t.ClientSecretName},
	} {
		if s.ca == "" && s.client == "" {
			continue
		}
		if _, err := kubecerts.ReadCollectorSecrets(ctx, client, ns, s.ca, s.client); err != nil {
			return nil, cfg.KeyError(s.key, err)
		}
	}
	// Errors in the material name the Secret's key (or the file).
	if _, err := loadSecretTLS(ctx, client, ns, t.CASecretName, t.ClientSecretName, cfg.Sluice.CollectorTLS); err != nil {
		return nil, cfg.KeyError("flowCollector.tls", err)
	}
	load := func(ctx context.Context) (*tls.Config, error) {
		ctx, cancel := context.WithTimeout(ctx, secretTimeout)
		defer cancel()
		b, err := loadSecretTLS(ctx, client, ns, t.CASecretName, t.ClientSecretName, cfg.Sluice.CollectorTLS)
		if err != nil {
			return nil, err
		}
		return clientTLS(b, t), nil
	}
	if env.Log != nil {
		env.Log.Info("TLS to the flow collector from Secrets, read before each connection", "namespace", ns,
			"caSecret", t.CASecretName, "clientSecret", t.ClientSecretName)
	}
	return load, nil
}

// loadSecretTLS reads the named Secrets and, for the parts without one,
// the files of sluice.collectorTLS (validation lets a part come from one
// place only).
func loadSecretTLS(ctx context.Context, client kubernetes.Interface, ns, caSecret, clientSecret string, files config.FileTLS) (*certs.Bundle, error) {
	p, err := kubecerts.ReadCollectorSecrets(ctx, client, ns, caSecret, clientSecret)
	if err != nil {
		return nil, err
	}
	read := func(path string) (certs.PEM, error) {
		if path == "" {
			return certs.PEM{}, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return certs.PEM{}, fmt.Errorf("certs: %w", err)
		}
		return certs.PEM{Data: b, Name: path}, nil
	}
	if caSecret == "" {
		if p.CA, err = read(files.CAFile); err != nil {
			return nil, err
		}
	}
	if clientSecret == "" {
		if p.Cert, err = read(files.CertFile); err != nil {
			return nil, err
		}
		if p.Key, err = read(files.KeyFile); err != nil {
			return nil, err
		}
	}
	return certs.ParseClient(p.Cert, p.Key, p.CA)
}

// observationDomain is flowCollector.observationDomainID, or, as the
// reference derives it, the FNV-1 (32-bit) hash of the cluster UUID's 16
// octets, so that the domain is stable across restarts and differs from
// cluster to cluster. Without a cluster UUID (an inventory file, no
// Kubernetes), the hash of the clusterID text (empty when not set).
func observationDomain(cfg *config.Aggregator, clusterUUID flow.UID) uint32 {
	if id := cfg.FlowCollector.ObservationDomainID; id != nil {
		return *id
	}
	h := fnv.New32()
	if clusterUUID != (flow.UID{}) {
		h.Write(clusterUUID[:])
	} else {
		h.Write([]byte(cfg.ClusterID))
	}
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
