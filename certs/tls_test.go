package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// handshake runs one TLS connection over real TCP on the loopback: the
// server handshakes and answers "pong" to "ping". It returns the error each
// side saw; the client writes and reads after its handshake, because under
// TLS 1.3 the server's verdict on the client certificate only reaches the
// client then.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, server)
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(tc, buf); err != nil {
			done <- err
			return
		}
		_, err = tc.Write([]byte("pong"))
		done <- err
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, client)
	clientErr = tc.Handshake()
	if clientErr == nil {
		if _, clientErr = tc.Write([]byte("ping")); clientErr == nil {
			buf := make([]byte, 4)
			if _, clientErr = io.ReadFull(tc, buf); clientErr == nil && string(buf) != "pong" {
				clientErr = errors.New("unexpected reply " + string(buf))
			}
		}
	}
	return <-done, clientErr
}

func mustEnsure(t *testing.T, dir string, o Options) *Bundle {
	t.Helper()
	b, err := Ensure(dir, o)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return b
}

func TestMutualTLS(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{ServerNames: []string{"aggregator.example", "192.0.2.7"}})
	for _, name := range []string{DefaultServerName, "localhost", "127.0.0.1", "::1", "aggregator.example", "192.0.2.7"} {
		for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			cc := b.ClientTLS(name)
			cc.MaxVersion = version
			serr, cerr := handshake(t, b.ServerTLS(true), cc)
			if serr != nil || cerr != nil {
				t.Errorf("%s, version %x: server error %v, client error %v", name, version, serr, cerr)
			}
		}
	}
}

func TestClientWithoutCertificateRefused(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	cc := b.ClientTLS(DefaultServerName)
	cc.Certificates = nil
	serr, cerr := handshake(t, b.ServerTLS(true), cc)
	if serr == nil || !strings.Contains(serr.Error(), "certificate") {
		t.Errorf("server error = %v, want a missing client certificate", serr)
	}
	if cerr == nil {
		t.Error("client without a certificate got through")
	}

	// Without client authentication the same client is served.
	if serr, cerr := handshake(t, b.ServerTLS(false), cc); serr != nil || cerr != nil {
		t.Errorf("no client auth: server error %v, client error %v", serr, cerr)
	}
}

func TestClientFromOtherCARefused(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	other := mustEnsure(t, t.TempDir(), Options{})
	// A Go client only offers a certificate whose issuer the server named
	// in its request, so by default it offers none here.
	cc := b.ClientTLS(DefaultServerName)
	cc.Certificates = []tls.Certificate{*other.Client}
	serr, cerr := handshake(t, b.ServerTLS(true), cc)
	if serr == nil || cerr == nil {
		t.Errorf("foreign client: server error %v, client error %v; want both", serr, cerr)
	}

	// Forced to present it, it is refused for its issuer.
	cc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return other.Client, nil }
	serr, cerr = handshake(t, b.ServerTLS(true), cc)
	var unknown x509.UnknownAuthorityError
	if !errors.As(serr, &unknown) {
		t.Errorf("server error = %v, want an unknown authority", serr)
	}
	if cerr == nil {
		t.Error("client with a foreign certificate got through")
	}
}

func TestServerFromOtherCARefused(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	other := mustEnsure(t, t.TempDir(), Options{})
	_, cerr := handshake(t, other.ServerTLS(true), b.ClientTLS(DefaultServerName))
	var unknown x509.UnknownAuthorityError
	if !errors.As(cerr, &unknown) {
		t.Errorf("client error = %v, want an unknown authority", cerr)
	}
}

func TestWrongServerNameRefused(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	_, cerr := handshake(t, b.ServerTLS(true), b.ClientTLS("not-the-aggregator.example"))
	var host x509.HostnameError
	if !errors.As(cerr, &host) {
		t.Errorf("client error = %v, want a host name mismatch", cerr)
	}
}

func TestClientCertificateIsNotAServerCertificate(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	sc := b.ServerTLS(true)
	sc.Certificates = []tls.Certificate{*b.Client}
	if _, cerr := handshake(t, sc, b.ClientTLS(DefaultServerName)); cerr == nil {
		t.Error("client accepted a server presenting the client certificate")
	}
}

func TestTLS11Refused(t *testing.T) {
	b := mustEnsure(t, t.TempDir(), Options{})
	cc := b.ClientTLS(DefaultServerName)
	cc.MinVersion = tls.VersionTLS10
	cc.MaxVersion = tls.VersionTLS11
	if serr, _ := handshake(t, b.ServerTLS(true), cc); serr == nil {
		t.Error("server accepted TLS 1.1")
	}
}

func TestLoadedFilesServeMutualTLS(t *testing.T) {
	dir := t.TempDir()
	gen := mustEnsure(t, dir, Options{})
	p := gen.Paths
	server, err := Load(p.ServerCert, p.ServerKey, p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	if server.Client != nil {
		t.Error("Load returned a client certificate")
	}
	client, err := LoadClient(p.ClientCert, p.ClientKey, p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	if serr, cerr := handshake(t, server.ServerTLS(true), client.ClientTLS(DefaultServerName)); serr != nil || cerr != nil {
		t.Fatalf("server error %v, client error %v", serr, cerr)
	}

	// A client with only the CA (no key pair) is refused under mTLS and
	// served without it.
	anon, err := LoadClient("", "", p.CACert)
	if err != nil {
		t.Fatal(err)
	}
	if serr, _ := handshake(t, server.ServerTLS(true), anon.ClientTLS(DefaultServerName)); serr == nil {
		t.Error("anonymous client accepted under mTLS")
	}
	if serr, cerr := handshake(t, server.ServerTLS(false), anon.ClientTLS(DefaultServerName)); serr != nil || cerr != nil {
		t.Errorf("server-only TLS: server error %v, client error %v", serr, cerr)
	}

	// Without a CA file, requiring client certificates refuses everyone
	// rather than falling back to the system roots.
	noCA, err := Load(p.ServerCert, p.ServerKey, "")
	if err != nil {
		t.Fatal(err)
	}
	if noCA.CAPool != nil {
		t.Error("CAPool set without a CA file")
	}
	if serr, _ := handshake(t, noCA.ServerTLS(true), client.ClientTLS(DefaultServerName)); serr == nil {
		t.Error("client accepted by a server with no CA")
	}
}
