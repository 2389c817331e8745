package exporter

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"sluice/certs"
)

// TestTLSForGRPC: gRPC takes its client certificate from
// --tls-cert-dir, or without any --tls-* flag from this machine's generated
// directory; tls keeps needing none.
func TestTLSForGRPC(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, _, err := (TLSFiles{}).config("grpc", "localhost", log); err == nil {
		t.Fatal("grpc without any certificate: accepted")
	}
	if c, _, err := (TLSFiles{}).config("tls", "localhost", log); err != nil || len(c.Certificates) != 0 {
		t.Fatalf("tls without flags: %v, %v", c, err)
	}
	dir := t.TempDir()
	if _, err := certs.Ensure(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	c, _, err := (TLSFiles{CertDir: dir, ServerName: "localhost"}).config("grpc", "localhost", log)
	if err != nil || len(c.Certificates) != 1 || c.RootCAs == nil || c.ServerName != "localhost" {
		t.Fatalf("--tls-cert-dir: %v, %v", c, err)
	}
	if _, err := certs.Ensure(filepath.Join(state, "sluice", "certs"), certs.Options{}); err != nil {
		t.Fatal(err)
	}
	if c, _, err := (TLSFiles{}).config("grpc", "localhost", log); err != nil || len(c.Certificates) != 1 || c.RootCAs == nil {
		t.Fatalf("generated directory: %v, %v", c, err)
	}
	// An explicit flag turns the fallback off: the CA alone is not enough.
	if _, _, err := (TLSFiles{CAFile: filepath.Join(dir, "ca.crt")}).config("grpc", "localhost", log); err == nil {
		t.Fatal("grpc with only --tls-ca-file: accepted")
	}
}
