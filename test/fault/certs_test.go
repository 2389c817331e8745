package fault

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sluice/certs"
	"sluice/flow/flowpb"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testcerts"
)

// presenting is a client configuration that presents cert whatever CAs
// the server asks for, trusting the CA of dir.
func presenting(t *testing.T, cert tls.Certificate, dir string) *tls.Config {
	t.Helper()
	b, err := certs.LoadClient("", "", filepath.Join(dir, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{ServerName: "localhost", RootCAs: b.CAPool, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
}

// tryIPFIX makes one TLS connection to the IPFIX collector and reports
// whether the aggregator kept it (the handshake and a read that sees no
// refusal within the deadline).
func tryIPFIX(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	// Under TLS 1.3 the server's verdict on the client certificate comes
	// after the client's handshake: a read returns it (or times out when
	// the server kept the session, as a collector never writes).
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return nil
	}
	return err
}

// tryGRPC opens a gRPC connection to the collector and waits until it is
// ready or failed.
func tryGRPC(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A stream call makes the connection and reports the handshake's fate.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := flowpb.NewFlowExportServiceClient(conn).Export(ctx)
	if err != nil {
		return err
	}
	_, err = st.CloseAndRecv()
	return err
}

// cutter is a TCP relay between the exporter and the aggregator whose
// connections the test can cut (a network fault), forcing new handshakes.
type cutter struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	cuts  int
}

func newCutter(t *testing.T, to string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, to: to}
	go c.serve()
	t.Cleanup(func() { ln.Close(); c.cut() })
	return c
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

func (c *cutter) serve() {
	for {
		in, err := c.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", c.to)
		if err != nil {
			in.Close()
			continue
		}
		c.mu.Lock()
		c.conns = append(c.conns, in, out)
		c.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); out.Close() }()
		go func() { _, _ = io.Copy(in, out); in.Close() }()
	}
}

// cut closes every relayed connection.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
	c.cuts++
}

// TestCertificates is scenario 7. Client certificates that are expired,
// not yet valid or signed by another CA are refused by both TLS
// collectors, each with a log line naming the reason and a count. Then the
// certificates of both the aggregator and a running exporter are rotated
// to a new CA by replacing their files (overlap first, as an operator or
// cert-manager does), with neither process restarted; removing the old CA
// closes the exporter's connection accepted under it, and the exporter
// connects again, as after a network cut, which only the new material
// allows; and no record is lost over gRPC.
func TestCertificates(t *testing.T) {
	p := newPipeline(t, "tls", "10s")
	// Reload within a second, so that the test does not wait 10 s.
	cfg, err := os.ReadFile(p.config)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p.config, regexp.MustCompile(`tls: \{certDir: ([^}]*)\}`).ReplaceAllString(string(cfg), "tls: {certDir: $1, reloadInterval: 200ms}"))
	agg := p.startAggregator()

	// 1. Refusals.
	now := time.Now()
	stranger := t.TempDir()
	if _, err := certs.Ensure(stranger, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	bad := map[string]tls.Certificate{
		"cert-expired":           testcerts.Client(t, p.certDir, now.Add(-48*time.Hour), now.Add(-24*time.Hour)),
		"cert-not-yet-valid":     testcerts.Client(t, p.certDir, now.Add(24*time.Hour), now.Add(48*time.Hour)),
		"cert-unknown-authority": testcerts.Client(t, stranger, now.Add(-time.Hour), now.Add(time.Hour)),
	}
	for reason, cert := range bad {
		if err := tryIPFIX(t, p.ipfix, presenting(t, cert, p.certDir)); err == nil {
			t.Errorf("IPFIX/TLS with a client certificate to refuse (%s): kept", reason)
		}
		if err := tryGRPC(t, p.grpc, presenting(t, cert, p.certDir)); err == nil {
			t.Errorf("gRPC with a client certificate to refuse (%s): accepted", reason)
		}
		for _, transport := range []string{"tls", "grpc"} {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^sluice_collector_client_certificates_refused_total\{reason="%s",transport="%s"\} (\S+)$`, reason, transport))
			testkit.WaitFor(t, fmt.Sprintf("%s over %s counted", reason, transport), func() bool { return metric(t, p.api, re) >= 1 })
			agg.waitLine(t, map[string]string{"tls": "refusing IPFIX session: client certificate refused",
				"grpc": "refusing gRPC connection: client certificate refused"}[transport], map[string]any{"reason": reason})
		}
	}
	good := testcerts.Client(t, p.certDir, now.Add(-time.Hour), now.Add(time.Hour))
	if err := tryIPFIX(t, p.ipfix, presenting(t, good, p.certDir)); err != nil {
		t.Fatalf("IPFIX/TLS with a good client certificate: %v", err)
	}

	// 2. Rotation under load, no restart.
	expDir := t.TempDir()
	for _, f := range []string{certs.CACertFile, certs.ClientCertFile, certs.ClientKeyFile} {
		copyInto(t, filepath.Join(p.certDir, f), filepath.Join(expDir, f))
	}
	relay := newCutter(t, p.grpc)
	const rate = 300
	exp := start(t, "node-1", "exporter", "--source", "synthetic", "--node", "node-1",
		"--pod-cidr", "10.244.1.0/24", "--rate", fmt.Sprint(rate),
		"--poll-interval", "1s", "--active-timeout", "2s", "--idle-timeout", "2s",
		"--collector", relay.addr()+":grpc", "--tls-cert-dir", expDir, "--tls-server-name", "localhost",
		"--tls-reload-interval", "200ms", "--metrics-address", p.exporterMetrics("node-1"))
	testkit.WaitFor(t, "records at the collector", func() bool { return p.coll.Len() >= 500 })

	next := t.TempDir()
	if _, err := certs.Ensure(next, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	reloaded := func(pr *proc) int {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		n := 0
		for _, l := range pr.log {
			if l["msg"] == "TLS certificates reloaded; new connections use them" {
				n++
			}
		}
		return n
	}
	waitReloads := func(pr *proc, n int) {
		testkit.WaitFor(t, fmt.Sprintf("%s to reload its certificates (%d)", pr.name, n), func() bool { return reloaded(pr) >= n })
	}
	// Step 1: both sides trust both CAs.
	both := append(readFile(t, filepath.Join(p.certDir, certs.CACertFile)), readFile(t, filepath.Join(next, certs.CACertFile))...)
	replaceFile(t, filepath.Join(p.certDir, certs.CACertFile), both)
	replaceFile(t, filepath.Join(expDir, certs.CACertFile), both)
	waitReloads(agg, 1)
	waitReloads(exp, 1)
	// Step 2: both present certificates of the new CA.
	for _, f := range []string{certs.ServerCertFile, certs.ServerKeyFile} {
		copyInto(t, filepath.Join(next, f), filepath.Join(p.certDir, f))
	}
	for _, f := range []string{certs.ClientCertFile, certs.ClientKeyFile} {
		copyInto(t, filepath.Join(next, f), filepath.Join(expDir, f))
	}
	waitReloads(agg, 2)
	waitReloads(exp, 2)
	// Step 3: the aggregator trusts only the new CA.
	refusedGRPC := regexp.MustCompile(`(?m)^sluice_collector_sessions_refused_total\{reason="tls-handshake",transport="grpc"\} (\S+)$`)
	refusedBefore := metric(t, p.api, refusedGRPC)
	copyInto(t, filepath.Join(next, certs.CACertFile), filepath.Join(p.certDir, certs.CACertFile))
	waitReloads(agg, 3)
	if err := tryIPFIX(t, p.ipfix, presenting(t, good, next)); err == nil {
		t.Error("after the rotation, a certificate of the old CA was accepted")
	}
	// The exporter's connection ran on its handshake with the old CA's
	// certificate: the aggregator closes it, and the exporter connects
	// again, presenting its new certificate (with its old one it would be
	// refused, counted below).
	untrusted := regexp.MustCompile(`(?m)^sluice_collector_connections_closed_certificate_untrusted_total\{transport="grpc"\} (\S+)$`)
	testkit.WaitFor(t, "the exporter's connection of the old CA closed", func() bool { return metric(t, p.api, untrusted) == 1 })
	agg.waitLine(t, "closing connection: the client certificate it was accepted with no longer chains to a trusted CA", map[string]any{"transport": "grpc"})
	atClose := p.coll.Len()
	testkit.WaitFor(t, "records after the exporter connected again", func() bool { return p.coll.Len() >= atClose+500 })

	// A network cut: it connects again, with the new certificate.
	atCut := p.coll.Len()
	relay.cut()
	testkit.WaitFor(t, "records after the exporter connected again", func() bool { return p.coll.Len() >= atCut+1000 })
	if n := metric(t, p.api, refusedGRPC); n != refusedBefore {
		t.Errorf("the exporter was refused %d time(s) after the rotation", n-refusedBefore)
	}

	exp.signal(t, syscall.SIGTERM)
	e := exp.line("exporter stopped", nil)
	if e == nil {
		t.Fatal("the exporter did not log its totals")
	}
	agg.signal(t, syscall.SIGTERM)
	produced, dropped := num(t, e, "records"), num(t, e, "dropped_buffer-full")+num(t, e, "dropped_encode-error")
	distinct, followed := map[recordKey]bool{}, 0
	testkit.WaitFor(t, "every record at the collector", func() bool {
		fs := p.coll.FlowsSince(followed)
		for i := range fs {
			distinct[keyOf(&fs[i])] = true
		}
		followed += len(fs)
		return len(distinct) >= produced-dropped
	})
	t.Logf("rotation: produced %d, delivered %d distinct (%d in all), exporter dropped %d, resent %d, unsent %d; connection cut %d time(s)",
		produced, len(distinct), p.coll.Len(), dropped, num(t, e, "resent"), num(t, e, "unsent"), relay.cuts)
	if dropped != 0 || num(t, e, "unsent") != 0 {
		t.Errorf("records lost at the exporter: dropped %d, unsent %d", dropped, num(t, e, "unsent"))
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// replaceFile writes data to a new file renamed over path, as kubelet and
// cert-manager replace certificate files.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func copyInto(t *testing.T, from, to string) { t.Helper(); replaceFile(t, to, readFile(t, from)) }
