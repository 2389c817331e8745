package collector

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"time"
)

// certConn is an open connection accepted with a verified client
// certificate.
type certConn struct {
	transport string
	log       *slog.Logger
	peer      []*x509.Certificate // as the client sent them, leaf first
	expiry    time.Time           // of the chain verified at the handshake
	raw       net.Conn            // under the TLS connection
}

// watchClientCert watches the client certificate tc was accepted with:
// it closes tc when the certificate expires (closeAtExpiry), and keeps
// the connection among those CloseUntrusted checks. raw is the connection
// under tc. The returned func stops both; call it when the connection
// ends, so that the set holds open connections only.
func (s *Server) watchClientCert(tc *tls.Conn, raw net.Conn, transport string, log *slog.Logger) (stop func()) {
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 {
		return func() {}
	}
	stopExpiry := closeAtExpiry(s.o.Metrics, tc, log, transport)
	c := &certConn{transport: transport, log: log, peer: st.PeerCertificates, expiry: chainExpiry(st), raw: raw}
	s.certMu.Lock()
	s.certConns[c] = struct{}{}
	s.certMu.Unlock()
	return func() {
		stopExpiry()
		s.certMu.Lock()
		delete(s.certConns, c)
		s.certMu.Unlock()
	}
}

// CloseUntrusted verifies again, against roots (the CAs trusted now), the
// client certificate of every open connection accepted with one (IPFIX
// over TLS and gRPC), as a new handshake would, and closes the
// connections whose certificate no longer verifies. TLS checks a
// certificate only at the handshake, and a CA is replaced because it must
// no longer be trusted: without this, a connection accepted under the old
// CA would stream on for as long as the exporter keeps it. Each closing is
// logged and counted (Metrics.CertsUntrustedClosed); the records the
// connection delivered before are already in the pipeline. A certificate
// past its expiry is left to the expiry watch, which closes its
// connection at that moment. Nil roots trust no client, as in the
// handshake. It returns how many connections it checked and closed.
func (s *Server) CloseUntrusted(roots *x509.CertPool) (checked, closed int) {
	if roots == nil {
		roots = x509.NewCertPool()
	}
	s.certMu.Lock()
	conns := make([]*certConn, 0, len(s.certConns))
	for c := range s.certConns {
		conns = append(conns, c)
	}
	s.certMu.Unlock()
	now := time.Now()
	// Exporters often share one certificate (Antrea's agents do): each
	// distinct chain is verified once.
	verdicts := map[[sha256.Size]byte]error{}
	h := sha256.New()
	var key [sha256.Size]byte
	for _, c := range conns {
		if !now.Before(c.expiry) {
			continue
		}
		h.Reset()
		for _, p := range c.peer {
			h.Write(p.Raw) // DER delimits itself
		}
		h.Sum(key[:0])
		err, seen := verdicts[key]
		if !seen {
			err = verifyClient(c.peer, roots, now)
			verdicts[key] = err
		}
		checked++
		if err == nil {
			continue
		}
		closed++
		s.o.Metrics.CertsUntrustedClosed.WithLabelValues(c.transport).Inc()
		leaf := c.peer[0]
		c.log.Warn("closing connection: the client certificate it was accepted with no longer chains to a trusted CA",
			"certificate", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "issuer", leaf.Issuer.String(), "err", err)
		// The raw connection, without a TLS alert: closing the TLS one
		// could wait on a peer that does not read, and an untrusted peer
		// is owed no goodbye. Its reader ends, and so does the session.
		c.raw.Close()
	}
	return checked, closed
}

// verifyClient verifies a client's chain (leaf first) as crypto/tls does
// for a server that requires and verifies client certificates.
func verifyClient(chain []*x509.Certificate, roots *x509.CertPool, now time.Time) error {
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(opts)
	return err
}
