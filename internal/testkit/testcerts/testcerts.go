// Package testcerts issues certificates for tests from the CA of a
// certificate directory (certs.Ensure's layout).
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sluice/certs"
)

// Client issues a client certificate valid from notBefore to
// notAfter, signed by the CA of dir (ca.crt, ca.key).
func Client(t testing.TB, dir string, notBefore, notAfter time.Time) tls.Certificate {
	t.Helper()
	read := func(name string) *pem.Block {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(data)
		if b == nil {
			t.Fatalf("%s: no PEM block", name)
		}
		return b
	}
	ca, err := x509.ParseCertificate(read(certs.CACertFile).Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(read(certs.CAKeyFile).Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "test-exporter"},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
