package aggregator_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sluice/certs"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testagg"
)

// TestRenewedCertificatesServeEveryListener: with sluice.tls.reloadInterval,
// a renewed server certificate is presented on new connections by the
// collectors and by the flow stream service alike, without a restart.
func TestRenewedCertificatesServeEveryListener(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tls
flowStreamService: {enable: true}
sluice:
  ipfixAddress: "127.0.0.1:0"
  grpcAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  flowStreamAddress: "127.0.0.1:0"
  tls: {certDir: %s, reloadInterval: 100ms}
`, dir))
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Another CA's server certificate and key, put in place of the
	// files (the CA file too, so the new pair verifies).
	other, err := certs.Ensure(filepath.Join(t.TempDir(), "other"), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The client certificate of the CA in use, so that every handshake
	// completes.
	client := b.Client
	presented := func(addr string, protos ...string) []byte {
		cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: protos, Certificates: []tls.Certificate{*client}}
		c, err := tls.Dial("tcp", addr, cfg)
		if err != nil {
			t.Logf("dial %s: %v", addr, err)
			return nil
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	listeners := map[string][]string{
		"IPFIX/TLS":   {a.Addrs().IPFIX},
		"gRPC":        {a.Addrs().GRPC, "h2"},
		"flow stream": {a.Addrs().FlowStream, "h2"},
	}
	for name, l := range listeners {
		if got := presented(l[0], l[1:]...); !bytes.Equal(got, b.Server.Certificate[0]) {
			t.Fatalf("%s does not present the server certificate at start", name)
		}
	}
	for _, f := range []struct{ from, to string }{
		{other.Paths.ServerCert, b.Paths.ServerCert},
		{other.Paths.ServerKey, b.Paths.ServerKey},
		{other.Paths.CACert, b.Paths.CACert},
	} {
		data, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		tmp := f.to + ".new"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.to); err != nil {
			t.Fatal(err)
		}
	}
	client = other.Client
	for name, l := range listeners {
		testkit.WaitFor(t, name+" presents the renewed certificate", func() bool {
			return bytes.Equal(presented(l[0], l[1:]...), other.Server.Certificate[0])
		})
	}
}
