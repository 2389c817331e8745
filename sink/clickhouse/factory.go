package clickhouse

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"

	"sluice/config"
	"sluice/sink"
)

// Environment variables holding the credentials, as in the reference.
const (
	EnvUsername = "CH_USERNAME"
	EnvPassword = "CH_PASSWORD"
)

// Factory is the clickHouse sink. Unlike the reference's, it also runs in
// Proxy mode: one row per record, the correlation columns (per-node end
// times and throughputs) left at zero.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkClickHouse, Proxy: true, New: newFromConfig}
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	c := cfg.ClickHouse
	addr, proto, secure, err := ParseURL(c.DatabaseURL)
	if err != nil {
		return nil, cfg.KeyError("clickHouse.databaseURL", err)
	}
	var tlsConf *tls.Config
	if secure {
		tlsConf, err = TLSConfig(addr, c.TLS.InsecureSkipVerify, c.TLS.CACert, c.TLS.CAFile)
		if err != nil {
			return nil, cfg.KeyError("clickHouse.tls.caFile", err)
		}
	}
	s, err := New(Options{
		Addr: addr, Protocol: proto, TLS: tlsConf, Database: c.Database,
		Username: os.Getenv(EnvUsername), Password: os.Getenv(EnvPassword),
		Compress: c.Compress, Debug: c.Debug, CommitInterval: c.CommitInterval.Duration,
		QueueSize: c.QueueSize, CreateSchema: c.CreateSchema, TTL: c.TTL.Duration,
		Log: env.Log, Metrics: env.Metrics, Registry: env.Registry, Name: config.SinkClickHouse,
		ClusterUUID: env.ClusterUUIDText(),
	})
	if err != nil {
		return nil, cfg.KeyError("clickHouse", err)
	}
	return s, nil
}

// ParseURL reads clickHouse.databaseURL: the server's host:port, the
// protocol (tcp and tls are the native protocol, http and https HTTP) and
// whether TLS is used.
func ParseURL(s string) (addr, protocol string, secure bool, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", false, err
	}
	switch u.Scheme {
	case "tcp":
		protocol = Native
	case "tls":
		protocol, secure = Native, true
	case "http":
		protocol = HTTP
	case "https":
		protocol, secure = HTTP, true
	default:
		return "", "", false, fmt.Errorf("%q: scheme %q is not tcp, tls, http or https", s, u.Scheme)
	}
	if u.Host == "" {
		return "", "", false, fmt.Errorf("%q has no host", s)
	}
	addr = u.Host
	if u.Port() == "" {
		port := map[string]string{"tcp": "9000", "tls": "9440", "http": "8123", "https": "8443"}[u.Scheme]
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	return addr, protocol, secure, nil
}

// TLSConfig is the client's TLS: the server's certificate checked against
// the CA in caFile when caCert is set (the system's roots otherwise), or
// not at all with insecureSkipVerify.
func TLSConfig(addr string, insecureSkipVerify, caCert bool, caFile string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	c := &tls.Config{ServerName: host, InsecureSkipVerify: insecureSkipVerify, MinVersion: tls.VersionTLS12}
	if caCert {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("the ClickHouse CA (clickHouse.tls.caCert is true): %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the ClickHouse CA %s holds no PEM certificate", caFile)
		}
		c.RootCAs = pool
	}
	return c, nil
}
