package collector_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // a client that compresses
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/certs"
	"sluice/collector"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testcerts"
	"sluice/ipfix"
)

// dialCollector is a gRPC client of the collector at addr, closed with
// the test.
func dialCollector(t *testing.T, addr string, b *certs.Bundle) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS("localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestGRPCWireRefusals: what the collector's gRPC endpoint refuses, it
// refuses as grpc-go's server would, and the next call still works.
func TestGRPCWireRefusals(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	conn := dialCollector(t, addr, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	one := flowtest.Wire(flowtest.Full(1, false), nil, nil)
	req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), one)

	call := func(method string, opts ...grpc.CallOption) error {
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, method, append(opts, grpc.ForceCodec(rawCodec{}))...)
		if err != nil {
			return err
		}
		if err := st.SendMsg(req); err != nil && err != io.EOF {
			return err
		}
		st.CloseSend()
		var resp []byte
		return st.RecvMsg(&resp)
	}
	if err := call("/antrea_io.antrea.pkg.apis.flow.v1alpha1.FlowExportService/Other"); status.Code(err) != codes.Unimplemented {
		t.Errorf("another method: %v, want Unimplemented", err)
	}
	if err := call(flowpb.FlowExportService_Export_FullMethodName, grpc.UseCompressor("gzip")); status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "gzip") {
		t.Errorf("a compressed stream: %v, want Unimplemented naming gzip", err)
	}
	select {
	case bt := <-h.out:
		t.Errorf("a refused call delivered %d records", len(bt.Flows))
	default:
	}
	if err := call(flowpb.FlowExportService_Export_FullMethodName); err != nil {
		t.Fatalf("Export after the refusals: %v", err)
	}
	if got := h.collect(t, 1); got[0].SourcePodName != "client-1" {
		t.Errorf("got %+v", got[0])
	}
}

// TestGRPCWireNotGRPC: HTTP/2 requests that are not gRPC get HTTP
// errors, and a client that does not offer HTTP/2 is refused at the
// handshake (and counted).
func TestGRPCWireNotGRPC(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	cfg := b.ClientTLS("localhost")
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	resp, err := cl.Get("https://" + addr + flowpb.FlowExportService_Export_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET over HTTP/%d: %s, want 405 over HTTP/2", resp.ProtoMajor, resp.Status)
	}
	resp, err = cl.Post("https://"+addr+flowpb.FlowExportService_Export_FullMethodName, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("POST of JSON: %s, want 415", resp.Status)
	}
	h1 := cfg.Clone()
	h1.NextProtos = []string{"http/1.1"}
	c, err := tls.Dial("tcp", addr, h1)
	if err == nil {
		// TLS 1.3: the client may finish before the server refuses.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil {
		t.Error("a client offering only HTTP/1.1 was served")
	}
	testkit.WaitFor(t, "the HTTP/1.1 client counted as a refused handshake", func() bool {
		return testutil.ToFloat64(h.m.Refused.WithLabelValues("grpc", "tls-handshake")) >= 1
	})
}

// TestGRPCWireClientGoesAway: an exporter that cancels its stream keeps
// what it had sent, and the stream's handler ends (its session is given
// back).
func TestGRPCWireClientGoesAway(t *testing.T) {
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{out: make(chan flow.Batch, 16), m: collector.NewMetrics(prometheus.NewRegistry())}
	h.srv, err = collector.New(collector.Options{Table: tb, Out: h.out, Metrics: h.m, SeriesGrace: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.wg.Wait)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	conn := dialCollector(t, addr, b)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		one := flowtest.Wire(flowtest.Full(i+1, false), nil, nil)
		if err := st.SendMsg(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), one)); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.collect(t, 3); len(got) != 3 {
		t.Fatalf("%d records", len(got))
	}
	// The exporter's series go SeriesGrace after its last stream ends:
	// only once the stream's handler has returned.
	cancel()
	testkit.WaitFor(t, "the exporter's series deleted after its stream ended", func() bool {
		return testutil.CollectAndCount(h.m.Records) == 0
	})
	// A deadline the client gave (grpc-timeout) is the server's too:
	// the stream ends although the client neither sends nor closes.
	pr, pw := io.Pipe()
	defer pw.Close()
	r, err := http.NewRequest(http.MethodPost, "https://"+addr+flowpb.FlowExportService_Export_FullMethodName, pr)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/grpc")
	r.Header.Set("Grpc-Timeout", "200m")
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: b.ClientTLS("localhost"), ForceAttemptHTTP2: true}, Timeout: 20 * time.Second}
	resp, err := cl.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Grpc-Status"); got != strconv.Itoa(int(codes.DeadlineExceeded)) {
		t.Errorf("an idle stream past its grpc-timeout: grpc-status %q, want %d", got, codes.DeadlineExceeded)
	}
}

// FuzzGRPCMessages feeds arbitrary request bodies to the collector's gRPC
// endpoint through a real connection: it must answer every body with a
// status and never stop serving (the seeds hold valid, compressed,
// truncated and oversized framings).
func FuzzGRPCMessages(f *testing.F) {
	one := flowtest.Wire(flowtest.Full(1, false), nil, nil)
	req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), one)
	frame := func(flag byte, msg []byte) []byte {
		var p [5]byte
		p[0] = flag
		binary.BigEndian.PutUint32(p[1:], uint32(len(msg)))
		return append(p[:], msg...)
	}
	f.Add(frame(0, req))
	f.Add(append(frame(0, req), frame(0, req)...))
	f.Add(frame(1, req))
	f.Add(frame(0, req)[:7])
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	h := newHarness(f, 1<<14)
	b := bundle(f)
	addr, _ := h.grpcServer(f, b)
	cfg := b.ClientTLS("localhost")
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 20 * time.Second}
	go func() {
		for range h.out {
		}
	}()
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := http.NewRequest(http.MethodPost, "https://"+addr+flowpb.FlowExportService_Export_FullMethodName, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/grpc")
		r.Header.Set("Te", "trailers")
		resp, err := cl.Do(r)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		st := resp.Header.Get("Grpc-Status")
		if st == "" {
			st = resp.Trailer.Get("Grpc-Status")
		}
		if resp.StatusCode != http.StatusOK || st == "" {
			t.Fatalf("answer %s, grpc-status %q", resp.Status, st)
		}
	})
}

// TestExpiredClientCertificateClosesConnection: a connection accepted
// with a client certificate is closed when that certificate expires, over
// gRPC and IPFIX/TLS alike, and counted; TLS alone would check it again
// only at the next handshake.
func TestExpiredClientCertificateClosesConnection(t *testing.T) {
	h := newHarness(t, 64)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.wg.Add(1)
	go func() { defer h.wg.Done(); h.srv.ServeTCP(ctx, ln, b.ServerTLS(true)) }()

	now := time.Now()
	short := testcerts.Client(t, b.Paths.Dir, now.Add(-time.Minute), now.Add(3*time.Second))
	cfg := b.ClientTLS("localhost")
	cfg.Certificates = []tls.Certificate{short}

	// gRPC: a stream opened with the certificate works until it expires.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	one := flowtest.Wire(flowtest.Full(1, false), nil, nil)
	if err := st.SendMsg(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), one)); err != nil {
		t.Fatal(err)
	}
	// IPFIX over TLS: a session opened with it delivers too.
	tc, err := tls.Dial("tcp", ln.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for _, m := range antrea(t, 1, 0, 1400) {
		if _, err := tc.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	h.collect(t, 2)

	testkit.WaitFor(t, "both connections closed at the certificate's expiry", func() bool {
		return testutil.ToFloat64(h.m.CertsExpiredClosed.WithLabelValues("grpc")) == 1 &&
			testutil.ToFloat64(h.m.CertsExpiredClosed.WithLabelValues("tls")) == 1
	})
	leaf, err := x509.ParseCertificate(short.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(leaf.NotAfter) { // whole seconds, as certificates have them
		t.Errorf("closed before the certificate expired at %v", leaf.NotAfter)
	}
	// The closed session's reader sees the end.
	tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Error("the IPFIX/TLS connection is still open")
	}
	var resp []byte
	st.CloseSend()
	if err := st.RecvMsg(&resp); err == nil {
		t.Error("the gRPC stream ended well after its connection was closed")
	}
}
