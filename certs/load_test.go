package certs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	gen := mustEnsure(t, dir, Options{})
	p := gen.Paths
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("this is not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badDER := filepath.Join(dir, "bad-der.pem")
	if err := os.WriteFile(badDER, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		name             string
		cert, key, ca    string
		client           bool
		wantIn1, wantIn2 string
	}{
		{"garbage certificate", garbage, p.ServerKey, p.CACert, false, garbage, "CERTIFICATE"},
		{"bad DER", badDER, p.ServerKey, p.CACert, false, badDER, "block 1"},
		{"garbage key", p.ServerCert, garbage, p.CACert, false, garbage, "private key"},
		{"certificate as key", p.ServerCert, p.ServerCert, p.CACert, false, p.ServerCert, "private key"},
		{"garbage CA", p.ServerCert, p.ServerKey, garbage, false, garbage, "CERTIFICATE"},
		{"missing certificate", missing, p.ServerKey, p.CACert, false, missing, "no such file"},
		{"missing key", p.ServerCert, missing, p.CACert, false, missing, "no such file"},
		{"missing CA", p.ServerCert, p.ServerKey, missing, false, missing, "no such file"},
		{"mismatched pair", p.ServerCert, p.ClientKey, p.CACert, false, p.ServerCert, p.ClientKey},
		{"client garbage certificate", garbage, p.ClientKey, p.CACert, true, garbage, "CERTIFICATE"},
		{"client garbage CA", p.ClientCert, p.ClientKey, garbage, true, garbage, "CERTIFICATE"},
		{"client missing CA", "", "", missing, true, missing, "no such file"},
		{"client cert without key", p.ClientCert, "", p.CACert, true, "together", "together"},
		{"server without key", p.ServerCert, "", p.CACert, false, "required", "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.client {
				_, err = LoadClient(tc.cert, tc.key, tc.ca)
			} else {
				_, err = Load(tc.cert, tc.key, tc.ca)
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range []string{tc.wantIn1, tc.wantIn2} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestLoadKeyFormats(t *testing.T) {
	// A CA bundle with several certificates and other blocks, a chain in
	// the certificate file: all accepted.
	dir := t.TempDir()
	a := mustEnsure(t, filepath.Join(dir, "a"), Options{})
	b := mustEnsure(t, filepath.Join(dir, "b"), Options{})
	caA, _ := os.ReadFile(a.Paths.CACert)
	caB, _ := os.ReadFile(b.Paths.CACert)
	keyA, _ := os.ReadFile(a.Paths.CAKey)
	both := filepath.Join(dir, "both.pem")
	if err := os.WriteFile(both, append(append(append([]byte("comment\n"), caA...), keyA...), caB...), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := Load(a.Paths.ServerCert, a.Paths.ServerKey, both)
	if err != nil {
		t.Fatal(err)
	}
	// Clients of either CA are accepted.
	for _, c := range []*Bundle{a, b} {
		cl, err := LoadClient(c.Paths.ClientCert, c.Paths.ClientKey, a.Paths.CACert)
		if err != nil {
			t.Fatal(err)
		}
		if serr, cerr := handshake(t, srv.ServerTLS(true), cl.ClientTLS("localhost")); serr != nil || cerr != nil {
			t.Errorf("server error %v, client error %v", serr, cerr)
		}
	}
	if srv.Expiry().IsZero() || srv.Expiry().Before(time.Now()) {
		t.Errorf("Expiry %v", srv.Expiry())
	}
	if (&Bundle{}).Expiry() != (time.Time{}) {
		t.Error("empty bundle has an expiry")
	}
}
