package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// handshakeStates runs one TLS handshake over loopback TCP and returns both
// ends' states and errors.
func handshakeStates(t *testing.T, server, client *tls.Config) (srv, cli tls.ConnectionState, srvErr, cliErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		st  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		err = tc.Handshake()
		if err == nil {
			// Under TLS 1.3 the client's certificate is checked after the
			// client's handshake returns: read to let a refusal reach it.
			_, err = tc.Write([]byte{1})
		}
		done <- result{tc.ConnectionState(), err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, client)
	cliErr = tc.Handshake()
	if cliErr == nil {
		_, cliErr = tc.Read(make([]byte, 1))
	}
	r := <-done
	return r.st, tc.ConnectionState(), r.err, cliErr
}

// presenting is a client configuration that presents cert whatever CAs
// the server asks for (crypto/tls would otherwise send no certificate
// that chains to none of them), trusting roots.
func presenting(cert *tls.Certificate, roots *x509.CertPool) *tls.Config {
	return &tls.Config{ServerName: "localhost", RootCAs: roots, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert == nil {
				return &tls.Certificate{}, nil
			}
			return cert, nil
		}}
}

func ensure(t *testing.T, o Options) *Bundle {
	t.Helper()
	b, err := Ensure(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Replaced as a Secret volume or cert-manager does: a new file renamed over.
	tmp := to + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// TestReloaderRotatesBothSides: a server and a client whose certificate
// files are replaced (a new CA and new certificates) use the new ones for
// the next handshake without being rebuilt; a client still holding the old
// material is then refused as signed by an unknown authority; files that
// do not load keep the material in use.
func TestReloaderRotatesBothSides(t *testing.T) {
	old := ensure(t, Options{})
	dir := t.TempDir()
	p := Paths{CACert: filepath.Join(dir, "ca.crt"), ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key")}
	for from, to := range map[string]string{old.Paths.CACert: p.CACert, old.Paths.ServerCert: p.ServerCert, old.Paths.ServerKey: p.ServerKey,
		old.Paths.ClientCert: p.ClientCert, old.Paths.ClientKey: p.ClientKey} {
		copyFile(t, from, to)
	}
	var errs []error
	notify := func(_ *Bundle, err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	sb, err := Load(p.ServerCert, p.ServerKey, p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := NewReloader(sb, ReloadOptions{Load: func() (*Bundle, error) { return Load(p.ServerCert, p.ServerKey, p.CACert) },
		Files: []string{p.ServerCert, p.ServerKey, p.CACert}, Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := LoadClient(p.ClientCert, p.ClientKey, p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	cr, err := NewReloader(cb, ReloadOptions{Load: func() (*Bundle, error) { return LoadClient(p.ClientCert, p.ClientKey, p.CACert) },
		Files: []string{p.ClientCert, p.ClientKey, p.CACert}, Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	serverCfg := sr.ServerTLS(true)
	clientCfg, err := cr.ClientTLS("localhost")
	if err != nil {
		t.Fatal(err)
	}
	srv, cli, se, ce := handshakeStates(t, serverCfg, clientCfg)
	if se != nil || ce != nil {
		t.Fatalf("first handshake: server %v, client %v", se, ce)
	}
	if cli.PeerCertificates[0].SerialNumber.Cmp(old.Server.Leaf.SerialNumber) != 0 ||
		srv.PeerCertificates[0].SerialNumber.Cmp(old.Client.Leaf.SerialNumber) != 0 {
		t.Fatal("first handshake: not the original certificates")
	}
	if sr.Check() || cr.Check() {
		t.Fatal("Check reloaded unchanged files")
	}

	// A half-written pair does not load: the old material stays.
	if err := os.WriteFile(p.ServerCert, []byte("-----BEGIN CERTIFICATE-----\nnot yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if sr.Check() || len(errs) != 1 {
		t.Fatalf("a broken certificate file: reloaded, or not reported (%v)", errs)
	}
	if _, _, se, ce := handshakeStates(t, serverCfg, clientCfg); se != nil || ce != nil {
		t.Fatalf("after a broken file: server %v, client %v", se, ce)
	}

	// Rotation to a new CA on both sides.
	next := ensure(t, Options{})
	for from, to := range map[string]string{next.Paths.CACert: p.CACert, next.Paths.ServerCert: p.ServerCert, next.Paths.ServerKey: p.ServerKey,
		next.Paths.ClientCert: p.ClientCert, next.Paths.ClientKey: p.ClientKey} {
		copyFile(t, from, to)
	}
	if !sr.Check() || !cr.Check() {
		t.Fatal("Check did not reload replaced files")
	}
	srv, cli, se, ce = handshakeStates(t, serverCfg, clientCfg)
	if se != nil || ce != nil {
		t.Fatalf("after rotation: server %v, client %v", se, ce)
	}
	if cli.PeerCertificates[0].SerialNumber.Cmp(next.Server.Leaf.SerialNumber) != 0 ||
		srv.PeerCertificates[0].SerialNumber.Cmp(next.Client.Leaf.SerialNumber) != 0 {
		t.Fatal("after rotation: the old certificates are still presented")
	}
	// A client that did not reload presents a certificate of the old CA.
	_, _, se, _ = handshakeStates(t, serverCfg, presenting(old.Client, next.CAPool))
	if r, _ := RefusalReason(se, time.Now()); r != "cert-unknown-authority" {
		t.Fatalf("old client: reason %q (err %v), want cert-unknown-authority", r, se)
	}
	// And a reloading client verifies the server against the current CA:
	// a server still on the old material is refused.
	_, _, _, ce = handshakeStates(t, old.ServerTLS(false), clientCfg)
	var verr *tls.CertificateVerificationError
	if !errors.As(ce, &verr) {
		t.Fatalf("client against the old server: %v, want a verification error", ce)
	}
	// The name is checked too.
	other, err := cr.ClientTLS("not-the-server.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, ce = handshakeStates(t, serverCfg, other); ce == nil {
		t.Fatal("a server certificate without the expected name was accepted")
	}
}

// TestRefusalReasons: the reasons a server gives for client certificates
// that are expired, not yet valid, from another CA, or missing.
func TestRefusalReasons(t *testing.T) {
	srv := ensure(t, Options{})
	now := time.Now()
	expired := ensure(t, Options{Now: func() time.Time { return now.Add(-48 * time.Hour) }, Validity: 2 * time.Hour, RenewBefore: time.Hour})
	future := ensure(t, Options{Now: func() time.Time { return now.Add(48 * time.Hour) }, Validity: 2 * time.Hour, RenewBefore: time.Hour})
	stranger := ensure(t, Options{})
	// The server trusts the CAs of srv, expired and future.
	pool := srv.CAPool.Clone()
	for _, b := range []*Bundle{expired, future} {
		data, err := os.ReadFile(b.Paths.CACert)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(data)
	}
	serverCfg := srv.ServerTLS(true)
	serverCfg.ClientCAs = pool
	for name, tc := range map[string]struct {
		client *Bundle
		want   string
	}{
		"expired":            {expired, "cert-expired"},
		"not yet valid":      {future, "cert-not-yet-valid"},
		"unknown authority":  {stranger, "cert-unknown-authority"},
		"no client cert":     {&Bundle{CAPool: srv.CAPool}, "cert-missing"},
		"valid (no refusal)": {srv, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, se, _ := handshakeStates(t, serverCfg, presenting(tc.client.Client, srv.CAPool))
			got, detail := RefusalReason(se, time.Now())
			if got != tc.want {
				t.Fatalf("reason %q (%s), want %q; err %v", got, detail, tc.want, se)
			}
			if tc.want != "" && tc.want != "cert-missing" && detail == "" {
				t.Error("no certificate described")
			}
		})
	}
}

// TestReloaderReportsCAChanges: OnCAChange hears of a reload that changes
// the CAs, with the new pool, after Notify; not of one that renews only
// the server certificate, nor of one whose CA file has the same
// certificates in other bytes.
func TestReloaderReportsCAChanges(t *testing.T) {
	old := ensure(t, Options{})
	dir := t.TempDir()
	p := Paths{CACert: filepath.Join(dir, "ca.crt"), ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key")}
	for from, to := range map[string]string{old.Paths.CACert: p.CACert, old.Paths.ServerCert: p.ServerCert, old.Paths.ServerKey: p.ServerKey} {
		copyFile(t, from, to)
	}
	load := func() (*Bundle, error) { return Load(p.ServerCert, p.ServerKey, p.CACert) }
	b, err := load()
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	var pools []*x509.CertPool
	r, err := NewReloader(b, ReloadOptions{Load: load, Files: []string{p.ServerCert, p.ServerKey, p.CACert},
		Notify: func(*Bundle, error) { events = append(events, "notify") }})
	if err != nil {
		t.Fatal(err)
	}
	r.OnCAChange(func(pool *x509.CertPool) {
		events = append(events, "ca")
		pools = append(pools, pool)
	})
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	read := func(path string) []byte {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	// A renewed server certificate of the same CA.
	renewed := ensure(t, Options{})
	write(p.ServerCert, read(renewed.Paths.ServerCert))
	write(p.ServerKey, read(renewed.Paths.ServerKey))
	if !r.Check() || len(pools) != 0 {
		t.Fatalf("a server certificate renewal: reloaded and CA change reported %d times, want once and none", len(pools))
	}
	// The same CA, the bytes changed (a comment before the block).
	write(p.CACert, append([]byte("# the same CA\n"), read(old.Paths.CACert)...))
	if !r.Check() || len(pools) != 0 {
		t.Fatal("a CA file with the same certificate reported as a CA change")
	}
	// Both CAs, then the new one alone: two changes.
	next := ensure(t, Options{})
	write(p.CACert, append(read(old.Paths.CACert), read(next.Paths.CACert)...))
	if !r.Check() {
		t.Fatal("a CA file with two CAs did not load")
	}
	write(p.CACert, read(next.Paths.CACert))
	if !r.Check() {
		t.Fatal("a CA file with the new CA did not load")
	}
	if len(pools) != 2 {
		t.Fatalf("%d CA changes reported, want 2", len(pools))
	}
	pool := func(pemData ...[]byte) *x509.CertPool {
		t.Helper()
		p := x509.NewCertPool()
		for _, d := range pemData {
			cs, err := parseCerts(d)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				p.AddCert(c)
			}
		}
		return p
	}
	if !pools[0].Equal(pool(read(old.Paths.CACert), read(next.Paths.CACert))) || !pools[1].Equal(pool(read(next.Paths.CACert))) {
		t.Error("OnCAChange was not given the new CAs")
	}
	if want := "notify notify notify ca notify ca"; strings.Join(events, " ") != want {
		t.Errorf("events %q, want %q (the CA change after Notify)", strings.Join(events, " "), want)
	}
}
