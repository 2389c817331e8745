// Package certs provides the TLS material of the aggregator's collectors
// (IPFIX over TLS and gRPC, both with mutual TLS) and of the exporters that
// connect to them.
//
// Material comes either from files the user supplies ([Load], [LoadClient])
// or from a directory in which Sluice keeps a CA of its own and a server and
// a client certificate issued by it ([Ensure]). Generated keys are ECDSA
// P-256. The directory layout and the renewal rules are described in
// docs/tls.md.
package certs

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Paths names the files a [Bundle] was read from. A field is empty when the
// bundle has no such file.
type Paths struct {
	Dir        string // the certificate directory ([Ensure] only)
	CACert     string
	CAKey      string // [Ensure] only
	ServerCert string
	ServerKey  string
	ClientCert string
	ClientKey  string
}

// Bundle is the TLS material of one process. It is not modified after it is
// returned; the tls.Config values built from it are fresh on every call.
type Bundle struct {
	// CAPool holds the CA certificates: the roots that client certificates
	// are verified against (server side) and that the server certificate is
	// verified against (client side). Nil when no CA file was given.
	CAPool *x509.CertPool
	// Server is the certificate the collectors present. Empty (no
	// Certificate bytes) for a bundle from [LoadClient].
	Server tls.Certificate
	// Client is the certificate exporters present; nil when the bundle has
	// none (a bundle from [Load], or from [LoadClient] without a key pair).
	Client *tls.Certificate
	// Paths are the files the material was read from or written to.
	Paths Paths
	// Issued lists the certificates [Ensure] (re)issued in this call, in
	// the order "ca", "server", "client"; empty when it reused everything.
	Issued []string
}

// ServerTLS returns a server configuration presenting the server
// certificate, with TLS 1.2 as the minimum version. With requireClientCert,
// a client must present a certificate that verifies against CAPool, or the
// handshake fails; when the bundle has no CA, no client certificate can
// verify, so every client is refused (never the system roots).
func (b *Bundle) ServerTLS(requireClientCert bool) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
	}
	if len(b.Server.Certificate) > 0 {
		cfg.Certificates = []tls.Certificate{b.Server}
	}
	if requireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = b.CAPool
		if cfg.ClientCAs == nil {
			cfg.ClientCAs = x509.NewCertPool()
		}
	}
	return cfg
}

// ClientTLS returns a client configuration that verifies the server against
// CAPool (the system roots when the bundle has no CA) under serverName, and
// presents the client certificate when the bundle has one. TLS 1.2 is the
// minimum version. An empty serverName leaves it to the dialer (tls.Dial
// takes it from the address).
func (b *Bundle) ClientTLS(serverName string) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    b.CAPool,
		ServerName: serverName,
	}
	if b.Client != nil {
		cfg.Certificates = []tls.Certificate{*b.Client}
	}
	return cfg
}

// Expiry returns the earliest NotAfter of the bundle's server and client
// certificates, the zero time when it has neither. A process that runs past
// it without calling [Ensure] again serves an expired certificate.
func (b *Bundle) Expiry() time.Time {
	var earliest time.Time
	for _, c := range []*tls.Certificate{&b.Server, b.Client} {
		if c == nil || c.Leaf == nil {
			continue
		}
		if earliest.IsZero() || c.Leaf.NotAfter.Before(earliest) {
			earliest = c.Leaf.NotAfter
		}
	}
	return earliest
}

// Load reads user-provided server material: certFile (PEM, the server
// certificate optionally followed by intermediates), keyFile (PEM private
// key) and caFile (PEM CA certificates that client certificates are
// verified against). caFile may be empty for a server that does not
// authenticate clients. The returned bundle has no client certificate.
func Load(certFile, keyFile, caFile string) (*Bundle, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("certs: a certificate file and a key file are both required")
	}
	pair, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	b := &Bundle{Server: pair, Paths: Paths{ServerCert: certFile, ServerKey: keyFile, CACert: caFile}}
	if caFile != "" {
		if b.CAPool, err = loadPool(caFile); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// LoadClient reads exporter-side material: caFile (PEM CA certificates that
// the server certificate is verified against; empty for the system roots)
// and an optional client key pair, certFile and keyFile, given together or
// not at all.
func LoadClient(certFile, keyFile, caFile string) (*Bundle, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("certs: a client certificate and its key must be given together")
	}
	b := &Bundle{Paths: Paths{ClientCert: certFile, ClientKey: keyFile, CACert: caFile}}
	if certFile != "" {
		pair, err := loadPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		b.Client = &pair
	}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		b.CAPool = pool
	}
	return b, nil
}

// PEM is TLS material held in memory (read from a Kubernetes Secret, say),
// with the name errors give it ("Secret ns/name key tls.crt").
type PEM struct {
	Data []byte
	Name string
}

// ParseClient is LoadClient for material in memory: ca verifies the
// server (no Data: the system roots), cert and key are the client pair
// (both or neither).
func ParseClient(cert, key, ca PEM) (*Bundle, error) {
	if (len(cert.Data) == 0) != (len(key.Data) == 0) {
		return nil, errors.New("certs: a client certificate and its key must be given together")
	}
	b := &Bundle{}
	if len(cert.Data) > 0 {
		pair, err := parsePair(cert, key)
		if err != nil {
			return nil, err
		}
		b.Client = &pair
	}
	if len(ca.Data) > 0 {
		pool, err := parsePool(ca)
		if err != nil {
			return nil, err
		}
		b.CAPool = pool
	}
	return b, nil
}

// loadPair reads and checks a certificate file and its key file, naming the
// faulty file in errors.
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: reading certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: reading key: %w", err)
	}
	return parsePair(PEM{certPEM, certFile}, PEM{keyPEM, keyFile})
}

// parsePair checks a certificate and its key, naming the faulty one in
// errors.
func parsePair(cert, key PEM) (tls.Certificate, error) {
	certs, err := parseCerts(cert.Data)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: %s: %w", cert.Name, err)
	}
	if _, err := parseKey(key.Data); err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: %s: %w", key.Name, err)
	}
	pair, err := tls.X509KeyPair(cert.Data, key.Data)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certs: %s with key %s: %w", cert.Name, key.Name, err)
	}
	if pair.Leaf == nil {
		pair.Leaf = certs[0]
	}
	return pair, nil
}

// loadPool reads a file of PEM CA certificates.
func loadPool(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("certs: reading CA: %w", err)
	}
	return parsePool(PEM{data, caFile})
}

// parsePool makes a pool of PEM CA certificates.
func parsePool(ca PEM) (*x509.CertPool, error) {
	certs, err := parseCerts(ca.Data)
	if err != nil {
		return nil, fmt.Errorf("certs: %s: %w", ca.Name, err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts returns every CERTIFICATE block of PEM data, failing on a
// block that does not parse or when there is none. Other block types are
// skipped.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

// parseKey returns the first private key of PEM data, in PKCS #8, SEC 1
// (EC) or PKCS #1 (RSA) form.
func parseKey(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no PEM private key block")
		}
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		var key any
		var err error
		switch block.Type {
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: key type %T cannot sign", block.Type, key)
		}
		return signer, nil
	}
}
