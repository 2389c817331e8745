package aggregator

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/certs"
)

// reloadingServerCerts watches the collectors' certificate files when
// sluice.tls.reloadInterval is set, so that renewed certificates serve new
// connections without a restart. It returns nil when reloading is off.
func (a *Aggregator) reloadingServerCerts(b *certs.Bundle) (*certs.Reloader, error) {
	t := a.cfg.Sluice.TLS
	if t.ReloadInterval.Duration <= 0 {
		return nil, nil
	}
	p := b.Paths
	files := []string{p.ServerCert, p.ServerKey}
	if p.CACert != "" {
		files = append(files, p.CACert)
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_tls_reloads_total",
		Help: "Changes of the collectors' certificate files: loaded (ok) or kept the old ones (error)."}, []string{"result"})
	expiry := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_tls_server_certificate_expiry_timestamp_seconds",
		Help: "When the certificate the collectors present expires (Unix seconds)."})
	a.reg.MustRegister(reloads, expiry)
	setExpiry := func(b *certs.Bundle) {
		if leaf := b.Server.Leaf; leaf != nil {
			expiry.Set(float64(leaf.NotAfter.Unix()))
		}
	}
	setExpiry(b)
	return certs.NewReloader(b, certs.ReloadOptions{
		Load:     func() (*certs.Bundle, error) { return certs.Load(p.ServerCert, p.ServerKey, p.CACert) },
		Files:    files,
		Interval: t.ReloadInterval.Duration,
		Notify: func(nb *certs.Bundle, err error) {
			if err != nil {
				reloads.WithLabelValues("error").Inc()
				a.log.Warn("TLS certificate files changed but do not load; keeping the ones in use", "files", files, "err", err)
				return
			}
			reloads.WithLabelValues("ok").Inc()
			setExpiry(nb)
			attrs := []any{"files", files}
			if leaf := nb.Server.Leaf; leaf != nil {
				attrs = append(attrs, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			a.log.Info("TLS certificates reloaded; new connections use them", attrs...)
		},
	})
}

// collectorTLS is the collectors' server configuration: from the
// reloader when there is one (read at each handshake), else fixed.
// nextProtos are the ALPN protocols offered ("h2" for gRPC).
func (a *Aggregator) collectorTLS(b *certs.Bundle, nextProtos ...string) *tls.Config {
	if a.certReloader != nil {
		return a.certReloader.ServerTLS(true, nextProtos...)
	}
	cfg := b.ServerTLS(true)
	cfg.NextProtos = nextProtos
	return cfg
}

// serverTLS is sink.Env.ServerTLS: a configuration that follows the
// certificate reloader when there is one.
func (a *Aggregator) serverTLS(requireClientCert bool, nextProtos ...string) (*tls.Config, error) {
	b, err := a.serverCerts()
	if err != nil {
		return nil, err
	}
	if a.certReloader != nil {
		return a.certReloader.ServerTLS(requireClientCert, nextProtos...), nil
	}
	cfg := b.ServerTLS(requireClientCert)
	cfg.NextProtos = nextProtos
	return cfg, nil
}

// recheckOnCAChange has the collectors verify their open connections'
// client certificates again whenever a reload changes the CAs, closing
// those that no longer chain to one. The flow stream service asks no
// client certificate, so it has nothing to check.
func (a *Aggregator) recheckOnCAChange() {
	if a.certReloader == nil || a.coll == nil {
		return
	}
	a.certReloader.OnCAChange(func(pool *x509.CertPool) {
		checked, closed := a.coll.CloseUntrusted(pool)
		a.log.Info("TLS CAs changed; open connections' client certificates checked again", "checked", checked, "closed", closed)
	})
}
