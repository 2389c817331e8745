package aggregator_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/certs"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
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

// counterSum is the sum of the series of the counter name whose labels
// include want.
func counterSum(t *testing.T, a *testagg.Aggregator, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestCARotationClosesOpenConnections: with sluice.tls.reloadInterval, a
// CA file replaced by another CA closes the IPFIX/TLS session and the gRPC
// stream accepted with a client certificate of the old CA, counted per
// transport and logged; the aggregator's wiring of the reloader to the
// collectors.
func TestCARotationClosesOpenConnections(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tls
sluice:
  ipfixAddress: "127.0.0.1:0"
  grpcAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  tls: {certDir: %s, reloadInterval: 100ms}
`, dir))
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	received := func(transport string) float64 {
		return counterSum(t, a, "sluice_collector_records_received_total", map[string]string{"transport": transport})
	}
	// An IPFIX/TLS session and a gRPC stream, each having delivered a
	// record (so their handshakes are done on the server's side too).
	tc, err := tls.Dial("tcp", a.Addrs().IPFIX, b.ClientTLS("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	tmpl, _ := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := tc.Write(m); return err })
	enc.AddTemplate(9, tmpl)
	if err := ipfixtest.WriteAntreaV27(enc, 9, tmpl, ipfixtest.SampleFlow(1)); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.Addrs().GRPC, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS("localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*testkit.WaitTimeout)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(e2eRawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), flowtest.Wire(flowtest.Full(1, false), nil, nil))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "a record from each connection", func() bool { return received("tls") == 1 && received("grpc") == 1 })

	// The CA file (and the server's pair) replaced by another CA's.
	other, err := certs.Ensure(filepath.Join(t.TempDir(), "other"), certs.Options{})
	if err != nil {
		t.Fatal(err)
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
		if err := os.WriteFile(f.to+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.to+".new", f.to); err != nil {
			t.Fatal(err)
		}
	}
	const closedName = "sluice_collector_connections_closed_certificate_untrusted_total"
	testkit.WaitFor(t, "both connections closed for an untrusted certificate", func() bool {
		return counterSum(t, a, closedName, map[string]string{"transport": "tls"}) == 1 &&
			counterSum(t, a, closedName, map[string]string{"transport": "grpc"}) == 1
	})
	tc.SetReadDeadline(time.Now().Add(testkit.WaitTimeout))
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Error("the IPFIX/TLS session read data")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("the IPFIX/TLS session is still open")
	}
	st.CloseSend()
	var resp []byte
	if err := st.RecvMsg(&resp); err == nil {
		t.Error("the gRPC stream ended well after its connection was closed")
	}
	for _, line := range []string{
		"no longer chains to a trusted CA",
		`msg="TLS CAs changed; open connections' client certificates checked again" checked=2 closed=2`,
	} {
		testkit.WaitFor(t, "the log line "+line, func() bool { return strings.Contains(a.Logs(), line) })
	}
}
