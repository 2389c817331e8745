package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// File names inside the directory managed by [Ensure].
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
	ClientCertFile = "client.crt"
	ClientKeyFile  = "client.key"
	// LockFile serialises Ensure calls on one directory, within a process
	// and across processes sharing the directory.
	LockFile = ".sluice-certs.lock"
)

// DefaultServerName is the name Antrea Agents expect the Flow Aggregator's
// certificate to carry (the in-cluster Service name); it is always among
// the server certificate's names.
const DefaultServerName = "flow-aggregator.flow-aggregator.svc"

// Defaults of [Options].
const (
	DefaultValidity    = 365 * 24 * time.Hour
	DefaultCAValidity  = 10 * 365 * 24 * time.Hour
	DefaultRenewBefore = 30 * 24 * time.Hour
	DefaultLockTimeout = 30 * time.Second
)

// backdate is how far before "now" generated certificates start, so that
// peers whose clocks lag a little accept them.
const backdate = time.Hour

// maxCARaces bounds how often Ensure starts over because another writer
// replaced ca.crt while it was generating a CA.
const maxCARaces = 3

// Options tune [Ensure]. The zero value is usable.
type Options struct {
	// ServerNames are extra DNS names and IP addresses for the server
	// certificate. "localhost", 127.0.0.1, ::1 and [DefaultServerName] are
	// always included.
	ServerNames []string
	// Validity of issued server and client certificates (default
	// [DefaultValidity]); never beyond the CA's own expiry.
	Validity time.Duration
	// CAValidity of a generated CA (default [DefaultCAValidity]).
	CAValidity time.Duration
	// RenewBefore: a certificate expiring within this window is re-issued
	// (default [DefaultRenewBefore]). Must be shorter than both validities.
	RenewBefore time.Duration
	// LockTimeout bounds the wait for another Ensure working on the same
	// directory (default [DefaultLockTimeout]).
	LockTimeout time.Duration
	// Now returns the current time (default time.Now); for tests.
	Now func() time.Time

	// beforeCACommit, when set, runs after a new CA is generated and
	// before it is written; tests use it to simulate a concurrent writer.
	beforeCACommit func()
}

func (o Options) withDefaults() (Options, error) {
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.CAValidity == 0 {
		o.CAValidity = DefaultCAValidity
	}
	if o.RenewBefore == 0 {
		o.RenewBefore = DefaultRenewBefore
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	switch {
	case o.Validity < 0, o.CAValidity < 0, o.RenewBefore < 0, o.LockTimeout < 0:
		return o, errors.New("certs: durations in Options must not be negative")
	case o.RenewBefore >= o.Validity:
		return o, fmt.Errorf("certs: RenewBefore (%v) must be shorter than Validity (%v)", o.RenewBefore, o.Validity)
	case o.RenewBefore >= o.CAValidity:
		return o, fmt.Errorf("certs: RenewBefore (%v) must be shorter than CAValidity (%v)", o.RenewBefore, o.CAValidity)
	}
	return o, nil
}

// names is the set of names a server certificate must carry.
type names struct {
	dns []string // lower case, no trailing dot
	ips []net.IP
}

func parseNames(extra []string) (names, error) {
	var n names
	all := append([]string{"localhost", "127.0.0.1", "::1", DefaultServerName}, extra...)
	for _, s := range all {
		s = strings.TrimSpace(s)
		if ip := net.ParseIP(s); ip != nil {
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			n.addIP(ip)
			continue
		}
		d := strings.TrimSuffix(strings.ToLower(s), ".")
		if !validDNSName(d) {
			return names{}, fmt.Errorf("certs: server name %q is neither an IP address nor a DNS name", s)
		}
		n.addDNS(d)
	}
	return n, nil
}

func (n *names) addDNS(d string) {
	if !slices.Contains(n.dns, d) {
		n.dns = append(n.dns, d)
	}
}

func (n *names) addIP(ip net.IP) {
	if !slices.ContainsFunc(n.ips, ip.Equal) {
		n.ips = append(n.ips, ip)
	}
}

// validDNSName accepts host names made of letters, digits and hyphens, with
// an optional leading "*." wildcard label.
func validDNSName(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	d = strings.TrimPrefix(d, "*.")
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// coveredBy reports whether every name of n is among the certificate's.
func (n names) coveredBy(c *x509.Certificate) bool {
	for _, d := range n.dns {
		if !slices.ContainsFunc(c.DNSNames, func(have string) bool {
			return strings.EqualFold(strings.TrimSuffix(have, "."), d)
		}) {
			return false
		}
	}
	for _, ip := range n.ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// Ensure returns the material kept in dir, generating what is missing,
// invalid or due for renewal:
//
//   - a CA (ca.crt, ca.key); when it is missing, does not parse, is not a CA, its
//     key does not match, or it expires within RenewBefore, a new one is
//     generated and the server and client certificates are re-issued too;
//   - a server certificate (server.crt, server.key) signed by the CA for
//     server authentication; it is re-issued alone when it is invalid or
//     expires within RenewBefore, or when it lacks one of the requested
//     names (the new one then keeps the old one's names as well);
//   - a client certificate (client.crt, client.key) signed by the CA for
//     client authentication, shared by all exporters; re-issued alone under
//     the same rules.
//
// Everything valid is reused untouched, so exporters configured with ca.crt
// keep working across restarts. dir is created with mode 0700 when missing;
// files are replaced atomically (temporary file and rename); keys are
// written with mode 0600. Calls on one directory, from one process or
// several, are serialised by a lock file ([LockFile]); a reader that finds
// everything valid does not take the lock, so a read-only directory of
// valid material works. A file that exists but cannot be read (permissions,
// I/O) is an error, never a reason to overwrite it.
func Ensure(dir string, opts Options) (*Bundle, error) {
	if dir == "" {
		return nil, errors.New("certs: no certificate directory given")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	want, err := parseNames(o.ServerNames)
	if err != nil {
		return nil, err
	}
	st, err := inspect(dir, o, want)
	if err != nil {
		return nil, err
	}
	if st.complete() {
		return st.bundle(dir), nil
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("certs: creating certificate directory: %w", err)
	}
	unlock, err := lockDir(filepath.Join(dir, LockFile), o.LockTimeout)
	if err != nil {
		return nil, fmt.Errorf("certs: locking %s: %w", dir, err)
	}
	defer unlock()

	for range maxCARaces {
		b, err := ensureLocked(dir, o, want)
		if errors.Is(err, errCAChanged) {
			continue
		}
		return b, err
	}
	return nil, fmt.Errorf("certs: %s: %w %d times in a row", filepath.Join(dir, CACertFile), errCAChanged, maxCARaces)
}

// errCAChanged reports that ca.crt changed between reading and replacing it.
var errCAChanged = errors.New("replaced by another writer")

// state is what inspect found in a directory. A nil certificate means the
// file must be (re)issued.
type state struct {
	now time.Time

	caPEM  []byte // ca.crt as read, nil when absent or unreadable
	ca     *x509.Certificate
	caKey  crypto.Signer
	caPool *x509.CertPool

	server      *tls.Certificate
	serverNames bool // the server certificate carries every wanted name
	client      *tls.Certificate
}

func (st *state) complete() bool {
	return st.ca != nil && st.server != nil && st.serverNames && st.client != nil
}

func (st *state) bundle(dir string) *Bundle {
	return &Bundle{
		CAPool: st.caPool,
		Server: *st.server,
		Client: st.client,
		Paths: Paths{
			Dir:        dir,
			CACert:     filepath.Join(dir, CACertFile),
			CAKey:      filepath.Join(dir, CAKeyFile),
			ServerCert: filepath.Join(dir, ServerCertFile),
			ServerKey:  filepath.Join(dir, ServerKeyFile),
			ClientCert: filepath.Join(dir, ClientCertFile),
			ClientKey:  filepath.Join(dir, ClientKeyFile),
		},
	}
}

// fresh reports whether c is valid at now and beyond the renewal window.
func fresh(c *x509.Certificate, now time.Time, renewBefore time.Duration) bool {
	return !now.Before(c.NotBefore) && now.Add(renewBefore).Before(c.NotAfter)
}

// readIfExists returns the content of path, or nil when it does not exist.
// Any other failure is an error: a file that exists but cannot be read
// must not be taken as missing and overwritten.
func readIfExists(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	return data, nil
}

// inspect reads dir and keeps what can be reused. Missing, damaged or
// stale material only means "regenerate"; the error reports files that
// exist but cannot be read.
func inspect(dir string, o Options, want names) (*state, error) {
	st := &state{now: o.Now()}
	caPEM, err := readIfExists(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := readIfExists(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, err
	}
	st.caPEM = caPEM
	cas, err := parseCerts(caPEM)
	if err != nil {
		return st, nil
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return st, nil
	}
	ca := cas[0]
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	switch {
	case !ok || !pub.Equal(ca.PublicKey),
		!ca.IsCA || !ca.BasicConstraintsValid,
		ca.KeyUsage != 0 && ca.KeyUsage&x509.KeyUsageCertSign == 0,
		!fresh(ca, st.now, o.RenewBefore):
		return st, nil
	}
	st.ca, st.caKey = ca, key
	st.caPool = x509.NewCertPool()
	for _, c := range cas {
		st.caPool.AddCert(c)
	}

	if st.server, err = reusableLeaf(dir, ServerCertFile, ServerKeyFile, x509.ExtKeyUsageServerAuth, st, o); err != nil {
		return nil, err
	}
	st.serverNames = st.server != nil && want.coveredBy(st.server.Leaf)
	if st.client, err = reusableLeaf(dir, ClientCertFile, ClientKeyFile, x509.ExtKeyUsageClientAuth, st, o); err != nil {
		return nil, err
	}
	return st, nil
}

// reusableLeaf returns the key pair in certName/keyName when it verifies
// against the CA for usage at st.now and is not due for renewal, nil when
// it must be re-issued.
func reusableLeaf(dir, certName, keyName string, usage x509.ExtKeyUsage, st *state, o Options) (*tls.Certificate, error) {
	certPEM, err := readIfExists(filepath.Join(dir, certName))
	if err != nil {
		return nil, err
	}
	keyPEM, err := readIfExists(filepath.Join(dir, keyName))
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	_, err = pair.Leaf.Verify(x509.VerifyOptions{
		Roots:         st.caPool,
		Intermediates: inter,
		CurrentTime:   st.now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	if err != nil || !fresh(pair.Leaf, st.now, o.RenewBefore) {
		return nil, nil
	}
	return &pair, nil
}

// ensureLocked does the work of Ensure under the directory lock.
func ensureLocked(dir string, o Options, want names) (*Bundle, error) {
	st, err := inspect(dir, o, want)
	if err != nil {
		return nil, err
	}
	var issued []string
	if st.ca == nil {
		certPEM, keyPEM, err := newCA(st.now, o.CAValidity)
		if err != nil {
			return nil, err
		}
		if o.beforeCACommit != nil {
			o.beforeCACommit()
		}
		// Only a writer that ignores the lock can get here, but a CA
		// that exporters already trust must never be overwritten by one
		// generated from a stale view: start over if ca.crt moved.
		onDisk, err := os.ReadFile(filepath.Join(dir, CACertFile))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("certs: re-reading CA: %w", err)
		}
		if !bytes.Equal(onDisk, st.caPEM) {
			return nil, errCAChanged
		}
		if err := writePair(dir, CACertFile, CAKeyFile, certPEM, keyPEM); err != nil {
			return nil, err
		}
		cas, _ := parseCerts(certPEM)
		st.ca, st.caPEM = cas[0], certPEM
		if st.caKey, err = parseKey(keyPEM); err != nil {
			return nil, fmt.Errorf("certs: generated CA key: %w", err)
		}
		st.caPool = x509.NewCertPool()
		st.caPool.AddCert(st.ca)
		st.server, st.client = nil, nil
		issued = append(issued, "ca")
	}

	if st.server == nil || !st.serverNames {
		sans := names{dns: slices.Clone(want.dns), ips: slices.Clone(want.ips)}
		if st.server != nil {
			// Only names are missing: keep the old ones too, so that
			// processes sharing the directory with different names
			// converge instead of re-issuing in turn.
			for _, d := range st.server.Leaf.DNSNames {
				sans.addDNS(strings.TrimSuffix(strings.ToLower(d), "."))
			}
			for _, ip := range st.server.Leaf.IPAddresses {
				sans.addIP(ip)
			}
		}
		pair, err := issue(dir, ServerCertFile, ServerKeyFile, st, o, "sluice-flow-aggregator", x509.ExtKeyUsageServerAuth, sans)
		if err != nil {
			return nil, err
		}
		st.server = pair
		issued = append(issued, "server")
	}
	if st.client == nil {
		pair, err := issue(dir, ClientCertFile, ClientKeyFile, st, o, "sluice-flow-exporter", x509.ExtKeyUsageClientAuth, names{})
		if err != nil {
			return nil, err
		}
		st.client = pair
		issued = append(issued, "client")
	}
	syncDir(dir)
	b := st.bundle(dir)
	b.Issued = issued
	return b, nil
}

// newCA generates a self-signed CA certificate and key, PEM-encoded.
func newCA(now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: generating CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"Sluice"},
			// The random part keeps the subjects of CAs generated in the
			// same second apart: TLS clients choose their certificate by
			// the issuer names a server asks for.
			CommonName: fmt.Sprintf("sluice-flow-aggregator-ca@%d-%.8x", now.Unix(), serial.Bytes()),
		},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: creating CA certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// issue creates a leaf certificate signed by the CA of st, writes it to
// dir and returns it.
func issue(dir, certName, keyName string, st *state, o Options, cn string, usage x509.ExtKeyUsage, sans names) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generating %s key: %w", certName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := st.now.Add(o.Validity)
	if notAfter.After(st.ca.NotAfter) {
		notAfter = st.ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Sluice"}, CommonName: cn},
		NotBefore:             st.now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage},
		BasicConstraintsValid: true,
		DNSNames:              sans.dns,
		IPAddresses:           sans.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, st.ca, key.Public(), st.caKey)
	if err != nil {
		return nil, fmt.Errorf("certs: signing %s: %w", certName, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := writePair(dir, certName, keyName, certPEM, keyPEM); err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: issued %s: %w", certName, err)
	}
	return &pair, nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certs: generating serial number: %w", err)
	}
	return serial.Add(serial, big.NewInt(1)), nil // never zero
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writePair writes a key and then its certificate. A crash in between
// leaves a pair that does not match, which the next Ensure replaces.
func writePair(dir, certName, keyName string, certPEM, keyPEM []byte) error {
	if err := writeAtomic(filepath.Join(dir, keyName), keyPEM, 0o600); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, certName), certPEM, 0o644)
}

// writeAtomic replaces path with data through a temporary file in the same
// directory, so readers see the old content or the new, never a part.
func writeAtomic(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("certs: writing %s: %w", path, err)
	}
	return nil
}

// syncDir makes the renames in dir durable where the platform allows it;
// failure only weakens durability, not correctness, so it is ignored.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

// DefaultDir is where generated certificates live when no directory is
// configured: $XDG_STATE_HOME/sluice/certs, else
// ~/.local/state/sluice/certs. The aggregator writes there; an exporter or
// `sluice get flows` on the same machine reads from there.
func DefaultDir() (string, error) {
	if s := os.Getenv("XDG_STATE_HOME"); s != "" && filepath.IsAbs(s) {
		return filepath.Join(s, "sluice", "certs"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".local", "state", "sluice", "certs"), nil
}
