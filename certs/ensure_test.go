package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const day = 24 * time.Hour

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

var allFiles = []string{CACertFile, CAKeyFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile}

// snapshot returns the content of every managed file in dir.
func snapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	for _, f := range allFiles {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		m[f] = data
	}
	return m
}

// changed lists the files whose content differs between two snapshots.
func changed(a, b map[string][]byte) []string {
	var out []string
	for _, f := range allFiles {
		if !bytes.Equal(a[f], b[f]) {
			out = append(out, f)
		}
	}
	return out
}

func caFingerprint(t *testing.T, dir string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	cas, err := parseCerts(data)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(cas[0].Raw)
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := parseCerts(data)
	if err != nil {
		t.Fatal(err)
	}
	return cs[0]
}

func TestEnsureGeneratesThenReuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	o := Options{Now: at(t0)}
	b := mustEnsure(t, dir, o)
	if want := []string{"ca", "server", "client"}; !slices.Equal(b.Issued, want) {
		t.Errorf("first Issued = %v, want %v", b.Issued, want)
	}
	first := snapshot(t, dir)
	fp := caFingerprint(t, dir)

	b2 := mustEnsure(t, dir, o)
	if len(b2.Issued) != 0 {
		t.Errorf("second Issued = %v, want nothing", b2.Issued)
	}
	if c := changed(first, snapshot(t, dir)); len(c) != 0 {
		t.Errorf("second Ensure rewrote %v", c)
	}
	if caFingerprint(t, dir) != fp {
		t.Error("CA fingerprint changed")
	}
	if !bytes.Equal(b.Server.Certificate[0], b2.Server.Certificate[0]) || !bytes.Equal(b.Client.Certificate[0], b2.Client.Certificate[0]) {
		t.Error("bundles differ")
	}

	// A valid directory is read without taking the lock.
	if err := os.Remove(filepath.Join(dir, LockFile)); err != nil {
		t.Fatal(err)
	}
	mustEnsure(t, dir, o)
	if _, err := os.Stat(filepath.Join(dir, LockFile)); !os.IsNotExist(err) {
		t.Errorf("lock file recreated on a read-only pass: %v", err)
	}

	wantPaths := Paths{
		Dir:        dir,
		CACert:     filepath.Join(dir, "ca.crt"),
		CAKey:      filepath.Join(dir, "ca.key"),
		ServerCert: filepath.Join(dir, "server.crt"),
		ServerKey:  filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"),
		ClientKey:  filepath.Join(dir, "client.key"),
	}
	if b.Paths != wantPaths {
		t.Errorf("Paths = %+v, want %+v", b.Paths, wantPaths)
	}
}

func TestEnsureFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	mustEnsure(t, dir, Options{})
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("directory mode %v, want no group/other access", fi.Mode().Perm())
	}
	for _, f := range []string{CAKeyFile, ServerKeyFile, ClientKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestGeneratedCertificates(t *testing.T) {
	dir := t.TempDir()
	b := mustEnsure(t, dir, Options{Now: at(t0), ServerNames: []string{" Aggregator.Example. ", "10.0.0.5", "fd00::5"}})
	ca := readCert(t, b.Paths.CACert)
	if !ca.IsCA || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA: IsCA %v, MaxPathLenZero %v, KeyUsage %v", ca.IsCA, ca.MaxPathLenZero, ca.KeyUsage)
	}
	if got, want := ca.NotAfter, t0.Add(DefaultCAValidity); !got.Equal(want) {
		t.Errorf("CA NotAfter %v, want %v", got, want)
	}
	for _, c := range []*x509.Certificate{ca, b.Server.Leaf, b.Client.Leaf} {
		pub, ok := c.PublicKey.(*ecdsa.PublicKey)
		if !ok || pub.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, want ECDSA P-256", c.Subject.CommonName, c.PublicKey)
		}
		if c != ca && !c.NotAfter.Equal(t0.Add(DefaultValidity)) {
			t.Errorf("%s: NotAfter %v, want %v", c.Subject.CommonName, c.NotAfter, t0.Add(DefaultValidity))
		}
		if !c.NotBefore.Before(t0) {
			t.Errorf("%s: NotBefore %v not backdated", c.Subject.CommonName, c.NotBefore)
		}
	}
	s := b.Server.Leaf
	if !slices.Equal(s.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("server ExtKeyUsage %v", s.ExtKeyUsage)
	}
	if !slices.Equal(b.Client.Leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("client ExtKeyUsage %v", b.Client.Leaf.ExtKeyUsage)
	}
	wantDNS := []string{"localhost", DefaultServerName, "aggregator.example"}
	if !slices.Equal(s.DNSNames, wantDNS) {
		t.Errorf("server DNS names %v, want %v", s.DNSNames, wantDNS)
	}
	var ips []string
	for _, ip := range s.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"127.0.0.1", "::1", "10.0.0.5", "fd00::5"}; !slices.Equal(ips, want) {
		t.Errorf("server IPs %v, want %v", ips, want)
	}
	if !b.Expiry().Equal(t0.Add(DefaultValidity)) {
		t.Errorf("Expiry %v", b.Expiry())
	}
}

func TestExpiringServerReissuedWithSameCA(t *testing.T) {
	dir := t.TempDir()
	o := Options{Now: at(t0)}
	mustEnsure(t, dir, o)
	before := snapshot(t, dir)

	// Replace the server certificate by one from the same CA that expires
	// in 10 days, inside the 30-day renewal window.
	want, _ := parseNames(nil)
	o10, _ := Options{Now: at(t0), Validity: 10 * day, RenewBefore: day}.withDefaults()
	st, err := inspect(dir, o10, want)
	if err != nil || st.ca == nil {
		t.Fatal("CA not reusable")
	}
	if _, err = issue(dir, ServerCertFile, ServerKeyFile, st, o10, "short", x509.ExtKeyUsageServerAuth, want); err != nil {
		t.Fatal(err)
	}
	if got := readCert(t, filepath.Join(dir, ServerCertFile)).NotAfter; !got.Equal(t0.Add(10 * day)) {
		t.Fatalf("planted server cert NotAfter %v", got)
	}

	b := mustEnsure(t, dir, o)
	if !slices.Equal(b.Issued, []string{"server"}) {
		t.Errorf("Issued = %v, want [server]", b.Issued)
	}
	if c := changed(before, snapshot(t, dir)); !slices.Equal(c, []string{ServerCertFile, ServerKeyFile}) {
		t.Errorf("changed files %v, want the server pair", c)
	}
	if !b.Server.Leaf.NotAfter.Equal(t0.Add(DefaultValidity)) {
		t.Errorf("new server NotAfter %v", b.Server.Leaf.NotAfter)
	}
	if _, err := b.Server.Leaf.Verify(x509.VerifyOptions{Roots: b.CAPool, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("new server certificate does not verify against the CA: %v", err)
	}
}

func TestRenewalOverTime(t *testing.T) {
	dir := t.TempDir()
	mustEnsure(t, dir, Options{Now: at(t0)})
	fp := caFingerprint(t, dir)

	// 10 days before nothing is due.
	if b := mustEnsure(t, dir, Options{Now: at(t0.Add(300 * day))}); len(b.Issued) != 0 {
		t.Errorf("day 300: Issued %v", b.Issued)
	}
	// 25 days before the leaves expire: both re-issued, CA kept.
	b := mustEnsure(t, dir, Options{Now: at(t0.Add(340 * day))})
	if !slices.Equal(b.Issued, []string{"server", "client"}) {
		t.Errorf("day 340: Issued %v, want [server client]", b.Issued)
	}
	if caFingerprint(t, dir) != fp {
		t.Error("day 340: CA changed")
	}
	// Near the end of the CA: everything new.
	b = mustEnsure(t, dir, Options{Now: at(t0.Add(DefaultCAValidity - 20*day))})
	if !slices.Equal(b.Issued, []string{"ca", "server", "client"}) {
		t.Errorf("CA end: Issued %v", b.Issued)
	}
	if caFingerprint(t, dir) == fp {
		t.Error("CA end: CA kept")
	}
}

func TestLeafNeverOutlivesCA(t *testing.T) {
	dir := t.TempDir()
	mustEnsure(t, dir, Options{Now: at(t0), CAValidity: 400 * day})
	b := mustEnsure(t, dir, Options{Now: at(t0.Add(340 * day)), CAValidity: 400 * day})
	if !slices.Equal(b.Issued, []string{"server", "client"}) {
		t.Fatalf("Issued %v", b.Issued)
	}
	caEnd := t0.Add(400 * day)
	if !b.Server.Leaf.NotAfter.Equal(caEnd) || !b.Client.Leaf.NotAfter.Equal(caEnd) {
		t.Errorf("leaf NotAfter %v / %v, want the CA's %v", b.Server.Leaf.NotAfter, b.Client.Leaf.NotAfter, caEnd)
	}
	// Stable: the clamped leaves are outside the renewal window.
	if b := mustEnsure(t, dir, Options{Now: at(t0.Add(340 * day)), CAValidity: 400 * day}); len(b.Issued) != 0 {
		t.Errorf("Issued %v on the next call", b.Issued)
	}
}

func TestMissingServerNameReissuesServerOnly(t *testing.T) {
	dir := t.TempDir()
	mustEnsure(t, dir, Options{Now: at(t0)})
	before := snapshot(t, dir)

	b := mustEnsure(t, dir, Options{Now: at(t0), ServerNames: []string{"aggregator.example", "10.0.0.5"}})
	if !slices.Equal(b.Issued, []string{"server"}) {
		t.Errorf("Issued %v, want [server]", b.Issued)
	}
	if c := changed(before, snapshot(t, dir)); !slices.Equal(c, []string{ServerCertFile, ServerKeyFile}) {
		t.Errorf("changed files %v", c)
	}
	for _, h := range []string{"aggregator.example", "10.0.0.5", DefaultServerName, "localhost", "::1"} {
		if err := b.Server.Leaf.VerifyHostname(h); err != nil {
			t.Errorf("after adding names: %v", err)
		}
	}

	// Another name: the earlier extra names are kept.
	b = mustEnsure(t, dir, Options{Now: at(t0), ServerNames: []string{"other.example"}})
	if !slices.Equal(b.Issued, []string{"server"}) {
		t.Errorf("Issued %v, want [server]", b.Issued)
	}
	for _, h := range []string{"aggregator.example", "10.0.0.5", "other.example"} {
		if err := b.Server.Leaf.VerifyHostname(h); err != nil {
			t.Errorf("after a second name: %v", err)
		}
	}
	// Asking for fewer names reuses the certificate; case and a trailing
	// dot do not matter.
	for _, names := range [][]string{nil, {"AGGREGATOR.example."}, {"10.0.0.5", "other.example"}} {
		if b := mustEnsure(t, dir, Options{Now: at(t0), ServerNames: names}); len(b.Issued) != 0 {
			t.Errorf("names %v: Issued %v", names, b.Issued)
		}
	}
}

func TestBrokenCARegeneratesEverything(t *testing.T) {
	other := t.TempDir()
	mustEnsure(t, other, Options{Now: at(t0)})
	otherKey, err := os.ReadFile(filepath.Join(other, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for name, breakIt := range map[string]func(dir string) error{
		"ca.crt missing":  func(dir string) error { return os.Remove(filepath.Join(dir, CACertFile)) },
		"ca.key missing":  func(dir string) error { return os.Remove(filepath.Join(dir, CAKeyFile)) },
		"ca.crt garbage":  func(dir string) error { return os.WriteFile(filepath.Join(dir, CACertFile), []byte("garbage"), 0o644) },
		"ca.key garbage":  func(dir string) error { return os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("garbage"), 0o600) },
		"key of other CA": func(dir string) error { return os.WriteFile(filepath.Join(dir, CAKeyFile), otherKey, 0o600) },
		"leaf as CA": func(dir string) error {
			for src, dst := range map[string]string{ServerCertFile: CACertFile, ServerKeyFile: CAKeyFile} {
				data, err := os.ReadFile(filepath.Join(dir, src))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, dst), data, 0o600); err != nil {
					return err
				}
			}
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mustEnsure(t, dir, Options{Now: at(t0)})
			before := snapshot(t, dir)
			if err := breakIt(dir); err != nil {
				t.Fatal(err)
			}
			b := mustEnsure(t, dir, Options{Now: at(t0)})
			if !slices.Equal(b.Issued, []string{"ca", "server", "client"}) {
				t.Errorf("Issued %v", b.Issued)
			}
			if c := changed(before, snapshot(t, dir)); len(c) != len(allFiles) {
				t.Errorf("changed %v, want all files", c)
			}
		})
	}
}

func TestBrokenLeafReissuedAlone(t *testing.T) {
	other := t.TempDir()
	mustEnsure(t, other, Options{Now: at(t0)})
	for name, tc := range map[string]struct {
		breakIt func(dir string) error
		want    string
	}{
		"client from other CA": {func(dir string) error {
			for _, f := range []string{ClientCertFile, ClientKeyFile} {
				data, err := os.ReadFile(filepath.Join(other, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
					return err
				}
			}
			return nil
		}, "client"},
		"server key missing": {func(dir string) error { return os.Remove(filepath.Join(dir, ServerKeyFile)) }, "server"},
		"server/client swapped": {func(dir string) error {
			// A client certificate is not valid for server authentication.
			for src, dst := range map[string]string{ClientCertFile: ServerCertFile, ClientKeyFile: ServerKeyFile} {
				data, err := os.ReadFile(filepath.Join(dir, src))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, dst), data, 0o600); err != nil {
					return err
				}
			}
			return nil
		}, "server"},
		"client key mismatch": {func(dir string) error {
			data, err := os.ReadFile(filepath.Join(dir, ServerKeyFile))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, ClientKeyFile), data, 0o600)
		}, "client"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mustEnsure(t, dir, Options{Now: at(t0)})
			fp := caFingerprint(t, dir)
			if err := tc.breakIt(dir); err != nil {
				t.Fatal(err)
			}
			b := mustEnsure(t, dir, Options{Now: at(t0)})
			if !slices.Equal(b.Issued, []string{tc.want}) {
				t.Errorf("Issued %v, want [%s]", b.Issued, tc.want)
			}
			if caFingerprint(t, dir) != fp {
				t.Error("CA changed")
			}
		})
	}
}

func TestConcurrentEnsureAgreesOnOneCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	const n = 8
	bundles := make([]*Bundle, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { bundles[i], errs[i] = Ensure(dir, Options{}) })
	}
	wg.Wait()
	generators := 0
	for i, b := range bundles {
		if errs[i] != nil {
			t.Fatalf("Ensure %d: %v", i, errs[i])
		}
		if len(b.Issued) > 0 {
			generators++
		}
		if !bytes.Equal(b.Server.Certificate[0], bundles[0].Server.Certificate[0]) ||
			!bytes.Equal(b.Client.Certificate[0], bundles[0].Client.Certificate[0]) {
			t.Errorf("Ensure %d returned different certificates", i)
		}
	}
	if generators != 1 {
		t.Errorf("%d calls generated material, want 1", generators)
	}
	if _, err := bundles[0].Server.Leaf.Verify(x509.VerifyOptions{Roots: bundles[n-1].CAPool}); err != nil {
		t.Error(err)
	}
}

func TestCAWrittenByAnotherWriterIsAdopted(t *testing.T) {
	theirs := t.TempDir()
	mustEnsure(t, theirs, Options{})
	dir := t.TempDir()
	calls := 0
	o := Options{beforeCACommit: func() {
		calls++
		if calls > 1 {
			return
		}
		for _, f := range []string{CAKeyFile, CACertFile} {
			data, err := os.ReadFile(filepath.Join(theirs, f))
			if err != nil {
				t.Error(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
				t.Error(err)
			}
		}
	}}
	b := mustEnsure(t, dir, o)
	if calls != 1 {
		t.Errorf("hook ran %d times", calls)
	}
	if !slices.Equal(b.Issued, []string{"server", "client"}) {
		t.Errorf("Issued %v, want [server client]", b.Issued)
	}
	if caFingerprint(t, dir) != caFingerprint(t, theirs) {
		t.Error("their CA was overwritten")
	}
}

func TestCAKeepsChangingFails(t *testing.T) {
	dir := t.TempDir()
	n := 0
	o := Options{beforeCACommit: func() {
		n++
		if err := os.WriteFile(filepath.Join(dir, CACertFile), []byte{byte(n)}, 0o644); err != nil {
			t.Error(err)
		}
	}}
	_, err := Ensure(dir, o)
	if err == nil || !strings.Contains(err.Error(), "replaced by another writer") {
		t.Errorf("error %v, want a CA race", err)
	}
}

func TestEnsureRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	for name, o := range map[string]Options{
		"renew >= validity":    {Validity: 10 * day, RenewBefore: 10 * day},
		"renew >= CA validity": {CAValidity: 20 * day},
		"negative":             {Validity: -day},
		"bad name":             {ServerNames: []string{"not a name"}},
		"empty name":           {ServerNames: []string{""}},
		"bracketed IP":         {ServerNames: []string{"[::1]"}},
	} {
		if _, err := Ensure(dir, o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Ensure("", Options{}); err == nil {
		t.Error("empty dir: no error")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad options wrote %d files", len(entries))
	}
}

func TestEnsureUnwritableDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Ensure(filepath.Join(file, "certs"), Options{})
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("error %v", err)
	}
}

func TestValidDNSName(t *testing.T) {
	for _, ok := range []string{"localhost", "a.b-c.example", "*.example", "x1"} {
		if !validDNSName(ok) {
			t.Errorf("%q rejected", ok)
		}
	}
	for _, bad := range []string{"", "a..b", "-a", "a-", "a b", "a_b", "*", "a.*.b", strings.Repeat("a", 64)} {
		if validDNSName(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
	if n, err := parseNames([]string{"127.0.0.1", "::ffff:127.0.0.1", "LOCALHOST"}); err != nil || len(n.ips) != 2 || len(n.dns) != 2 {
		t.Errorf("duplicates not merged: %+v %v", n, err)
	}
}

func TestUserCAInDirectoryIssuesLeaves(t *testing.T) {
	for name, pkcs1 := range map[string]bool{"RSA PKCS#1": true, "EC SEC 1": false} {
		t.Run(name, func(t *testing.T) {
			var signer crypto.Signer
			var keyPEM []byte
			if pkcs1 {
				k, err := rsa.GenerateKey(rand.Reader, 2048)
				if err != nil {
					t.Fatal(err)
				}
				signer = k
				keyPEM = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
			} else {
				k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
				if err != nil {
					t.Fatal(err)
				}
				der, err := x509.MarshalECPrivateKey(k)
				if err != nil {
					t.Fatal(err)
				}
				signer = k
				keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
			}
			tmpl := &x509.Certificate{
				SerialNumber:          big.NewInt(42),
				Subject:               pkix.Name{CommonName: "my intermediate"},
				NotBefore:             t0.Add(-day),
				NotAfter:              t0.Add(200 * day),
				KeyUsage:              x509.KeyUsageCertSign,
				BasicConstraintsValid: true,
				IsCA:                  true,
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, signer.Public(), signer)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
			if err := os.WriteFile(filepath.Join(dir, CACertFile), caPEM, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			b := mustEnsure(t, dir, Options{Now: at(t0)})
			if !slices.Equal(b.Issued, []string{"server", "client"}) {
				t.Errorf("Issued %v, want [server client]", b.Issued)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, CACertFile)); !bytes.Equal(got, caPEM) {
				t.Error("user CA replaced")
			}
			if b.Server.Leaf.Issuer.CommonName != "my intermediate" || !b.Client.Leaf.NotAfter.Equal(t0.Add(200*day)) {
				t.Errorf("issuer %q, client NotAfter %v", b.Server.Leaf.Issuer.CommonName, b.Client.Leaf.NotAfter)
			}
		})
	}
}

func TestUnreadableFileIsAnErrorNotARegeneration(t *testing.T) {
	for _, f := range []string{CAKeyFile, ServerCertFile, ClientKeyFile} {
		t.Run(f, func(t *testing.T) {
			dir := t.TempDir()
			mustEnsure(t, dir, Options{})
			fp := caFingerprint(t, dir)
			// A directory in place of the file: it exists but cannot be
			// read (a mode-0 file would be readable by root).
			if err := os.Remove(filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, f), 0o700); err != nil {
				t.Fatal(err)
			}
			_, err := Ensure(dir, Options{})
			if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, f)) {
				t.Errorf("error %v, want one naming %s", err, f)
			}
			if caFingerprint(t, dir) != fp {
				t.Error("CA replaced")
			}
		})
	}
}
