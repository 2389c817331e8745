package certs

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A Reloader keeps a [Bundle] current with the files it was read from:
// certificates renewed on disk (by an operator, cert-manager, or a
// Kubernetes Secret volume, whose files kubelet swaps) are picked up
// without a restart. The tls.Config values it returns read the current
// bundle at every handshake, so new connections use the new material and
// established ones carry on.
//
// Files are compared by content, every interval. A change that does not
// load (a pair half-written, a key that does not match) keeps the old
// bundle and is reported; the next change is tried again.
type Reloader struct {
	load     func() (*Bundle, error)
	files    []string
	interval time.Duration
	notify   func(*Bundle, error)
	cur      atomic.Pointer[Bundle]
	sum      [sha256.Size]byte

	mu         sync.Mutex
	onCAChange []func(*x509.CertPool)
}

// ReloadOptions configure a [Reloader].
type ReloadOptions struct {
	// Load reads the bundle again (Load, LoadClient, or a wrapper).
	Load func() (*Bundle, error)
	// Files are the files whose content Load depends on.
	Files []string
	// Interval between checks; 0 means 10 s.
	Interval time.Duration
	// Notify, if set, hears of every reload: the new bundle, or the error
	// that kept the old one.
	Notify func(*Bundle, error)
}

// NewReloader starts from b, the bundle already loaded from o.Files.
func NewReloader(b *Bundle, o ReloadOptions) (*Reloader, error) {
	if b == nil || o.Load == nil {
		return nil, errors.New("certs: a reloader needs a bundle and a way to load it again")
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	r := &Reloader{load: o.Load, files: o.Files, interval: o.Interval, notify: o.Notify}
	r.cur.Store(b)
	r.sum, _ = r.checksum()
	return r, nil
}

// Bundle is the current bundle.
func (r *Reloader) Bundle() *Bundle { return r.cur.Load() }

// OnCAChange has f called with the new CA pool after every reload whose
// CAs differ from the previous bundle's (not after one that only renews
// certificates), in the goroutine that called Check, after Notify. TLS
// checks a peer's certificate only at the handshake: f is where
// connections accepted under the old CAs are checked again.
func (r *Reloader) OnCAChange(f func(*x509.CertPool)) {
	r.mu.Lock()
	r.onCAChange = append(r.onCAChange, f)
	r.mu.Unlock()
}

// Run checks the files every interval until ctx ends.
func (r *Reloader) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Check()
		}
	}
}

// Check reloads the bundle if the files changed since the last load (or
// the last failed attempt), and reports whether it did.
func (r *Reloader) Check() bool {
	sum, err := r.checksum()
	if err != nil {
		// A file missing for a moment (being replaced): try next time.
		return false
	}
	if sum == r.sum {
		return false
	}
	r.sum = sum
	b, err := r.load()
	if err != nil {
		if r.notify != nil {
			r.notify(nil, err)
		}
		return false
	}
	old := r.cur.Swap(b)
	if r.notify != nil {
		r.notify(b, nil)
	}
	if !old.CAPool.Equal(b.CAPool) {
		r.mu.Lock()
		fs := slices.Clone(r.onCAChange)
		r.mu.Unlock()
		for _, f := range fs {
			f(b.CAPool)
		}
	}
	return true
}

func (r *Reloader) checksum() ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, f := range r.files {
		data, err := os.ReadFile(f)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		h.Write(data)
		h.Write([]byte{0})
	}
	var s [sha256.Size]byte
	h.Sum(s[:0])
	return s, nil
}

// ServerTLS is Bundle.ServerTLS of the current bundle at each handshake.
// nextProtos are the ALPN protocols the server offers (gRPC needs "h2").
func (r *Reloader) ServerTLS(requireClientCert bool, nextProtos ...string) *tls.Config {
	base := r.Bundle().ServerTLS(requireClientCert)
	base.NextProtos = nextProtos
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := r.Bundle().ServerTLS(requireClientCert)
		c.NextProtos = nextProtos
		return c, nil
	}
	return base
}

// ClientTLS is Bundle.ClientTLS of the current bundle at each handshake:
// the client certificate it presents and the CAs it verifies the server
// against. serverName is the name the server's certificate must hold (a
// DNS name or an IP address); it is required, because the verification
// is done here, against the current CAs, rather than by crypto/tls
// against a pool fixed when the configuration was made.
func (r *Reloader) ClientTLS(serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, errors.New("certs: a reloading client configuration needs the server's name")
	}
	cfg := r.Bundle().ClientTLS(serverName)
	cfg.Certificates = nil
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c := r.Bundle().Client; c != nil {
			return c, nil
		}
		return &tls.Certificate{}, nil // none: the server decides
	}
	// crypto/tls would verify against the RootCAs of this configuration,
	// fixed now; VerifyConnection does the same verification (chain to
	// the current CAs, server usage, the name) at every handshake instead.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("certs: the server presented no certificate")
		}
		opts := x509.VerifyOptions{
			Roots:         r.Bundle().CAPool,
			DNSName:       serverName,
			Intermediates: x509.NewCertPool(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
		}
		return nil
	}
	return cfg, nil
}

// RefusalReason names why a TLS handshake refused a peer's certificate,
// for logs and metrics: "cert-expired", "cert-not-yet-valid",
// "cert-unknown-authority", "cert-missing", "cert-invalid" (any other
// verification failure), or "" when err is not about the peer's
// certificate. detail describes the certificate (subject, validity).
func RefusalReason(err error, now time.Time) (reason, detail string) {
	var verr *tls.CertificateVerificationError
	if errors.As(err, &verr) {
		var leaf *x509.Certificate
		if len(verr.UnverifiedCertificates) > 0 {
			leaf = verr.UnverifiedCertificates[0]
			detail = fmt.Sprintf("subject %q serial %s valid %s to %s", leaf.Subject.String(), leaf.SerialNumber,
				leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		var inv x509.CertificateInvalidError
		var ua x509.UnknownAuthorityError
		switch {
		case errors.As(verr.Err, &inv) && inv.Reason == x509.Expired:
			if leaf != nil && now.Before(leaf.NotBefore) {
				return "cert-not-yet-valid", detail
			}
			return "cert-expired", detail
		case errors.As(verr.Err, &ua):
			return "cert-unknown-authority", detail
		}
		return "cert-invalid", detail
	}
	if err != nil && strings.Contains(err.Error(), "didn't provide a certificate") {
		return "cert-missing", ""
	}
	return "", ""
}
