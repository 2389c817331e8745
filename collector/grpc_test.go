package collector_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/certs"
	"sluice/collector"
	"sluice/exporter/grpcsend"
	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
)

func bundle(t testing.TB) *certs.Bundle {
	t.Helper()
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// grpcServer starts the gRPC collector with b's certificates; cancel stops
// it and waits.
func (h *harness) grpcServer(t testing.TB, b *certs.Bundle) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.ServeGRPC(ctx, ln, b.ServerTLS(true)) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ServeGRPC: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("ServeGRPC did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// queued feeds a grpcsend.Sender through a queue of its own.
type queued struct{ q *queue.Queue }

// Send queues copies of flows for the sender.
func (s queued) Send(flows ...*flow.Flow) {
	for _, f := range flows {
		s.q.Push([]flow.Flow{*f})
	}
}

func sender(t testing.TB, addr string, b *certs.Bundle, o grpcsend.Options) queued {
	t.Helper()
	o.Address = addr
	o.TLS = b.ClientTLS("localhost")
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = 20 * time.Millisecond
	}
	s, err := grpcsend.New(o)
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(1024)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, q) }()
	t.Cleanup(func() { cancel(); <-done })
	return queued{q}
}

// asReceived is what the collector makes of f.
func asReceived(f *flow.Flow) *flow.Flow {
	g := *f
	g.ClusterID = ""
	g.Present.Clear(flow.ClusterID)
	g.Origin.Exporter = netip.MustParseAddr("127.0.0.1")
	g.Origin.Transport = "grpc"
	return &g
}

func TestGRPCRoundTripEveryField(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	s := sender(t, addr, b, grpcsend.Options{BatchSize: 7})
	var want []*flow.Flow
	for i := range 50 {
		f := flowtest.Full(i, i%2 == 0)
		f.Origin.Exporter = netip.MustParseAddr("192.0.2.200") // replaced by the peer's address
		s.Send(f)
		want = append(want, asReceived(f))
	}
	got := h.collect(t, len(want))
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("record %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	// Counted by the collector's goroutine, maybe after the batch left.
	testkit.WaitFor(t, "50 records counted, one session open", func() bool {
		return testutil.ToFloat64(h.m.Records.WithLabelValues("grpc", "127.0.0.1")) == 50 &&
			testutil.ToFloat64(h.m.Sessions.WithLabelValues("grpc")) == 1
	})
}

func TestGRPCRefusesClientWithoutCertificate(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	other := bundle(t) // another CA
	for name, conf := range map[string]*tls.Config{
		"no certificate":      {RootCAs: b.CAPool, ServerName: "localhost", MinVersion: tls.VersionTLS12},
		"another CA's client": {RootCAs: b.CAPool, ServerName: "localhost", MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*other.Client}},
	} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := flowpb.NewFlowExportServiceClient(conn).Export(ctx)
		if err == nil {
			err = st.Send(&flowpb.ExportRequest{Flows: []*flowpb.Flow{{Id: "x"}}})
			if err == nil {
				_, err = st.CloseAndRecv()
			}
		}
		cancel()
		conn.Close()
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// With TLS 1.3 the client can see the refusal before the server has
	// counted it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := testutil.ToFloat64(h.m.Refused.WithLabelValues("grpc", "tls-handshake"))
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused handshakes %v, want at least 2", n)
		}
	}
	select {
	case b := <-h.out:
		t.Errorf("a refused client delivered %d records", len(b.Flows))
	default:
	}
	// The refused connections gave their session slots back.
	testkit.WaitFor(t, "no gRPC session open after the refusals", func() bool {
		return testutil.ToFloat64(h.m.Sessions.WithLabelValues("grpc")) == 0
	})
}

// rawCodec sends bytes as they are, so that tests can put on the wire
// messages the generated code would not write.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// sendRaw sends ExportRequest messages, each made of the given encoded
// Flows, on one Export stream.
func sendRaw(t *testing.T, addr string, b *certs.Bundle, flows ...[]byte) {
	t.Helper()
	if err := sendRawErr(t, addr, b, flows...); err != nil {
		t.Fatalf("Export: %v", err)
	}
}

// sendRawErr is sendRaw returning the stream's final error.
func sendRawErr(t *testing.T, addr string, b *certs.Bundle, flows ...[]byte) error {
	t.Helper()
	return sendEach(t, addr, b, request(flows...))
}

// exportStream opens an Export stream to addr with b's client certificate,
// sending messages as they are (rawCodec); its context ends within 10 s,
// and the test's end closes it.
func exportStream(t *testing.T, addr string, b *certs.Bundle) (grpc.ClientStream, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS("localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/antrea_io.antrea.pkg.apis.flow.v1alpha1.FlowExportService/Export", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	return st, ctx
}

// TestGRPCWireCompatibility sends Flows encoded by hand with the
// reference's field numbers (not the generated code), in their full shape,
// an older one (fields removed) and a newer one (fields added).
func TestGRPCWireCompatibility(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	// Per-exporter series live while the exporter has a session: this one
	// keeps them for the checks below.
	keep := sender(t, addr, b, grpcsend.Options{})
	keep.Send(flowtest.Full(100, false))
	h.collect(t, 1)

	full := flowtest.Full(4, true)
	full.Origin.ExportTime = time.Unix(1_790_000_000, 0).UTC()
	full.Origin.SequenceNumber = 3
	full.Origin.ObservationDomainID = 11
	full.Origin.Exporter = netip.MustParseAddr("192.0.2.4")
	src, dst := flowtest.FullLabels()
	wire := flowtest.Wire(full, src, dst)

	// Older: an exporter without k8s (8), aggregation (13), app (11),
	// proxy SNAT (14, 15) and flow direction (12).
	old := *full
	var older []byte
	for b := wire; len(b) > 0; {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			t.Fatal("bad hand encoding")
		}
		switch num {
		case 8, 11, 12, 13, 14, 15:
		default:
			older = append(older, b[:n]...)
		}
		b = b[n:]
	}
	// Newer: fields 40 (top level) and 90 (in k8s) this version lacks.
	newer := protowire.AppendTag(append([]byte(nil), wire...), 40, protowire.BytesType)
	newer = protowire.AppendString(newer, "from the future")
	newer = protowire.AppendTag(newer, 8, protowire.BytesType)
	newer = protowire.AppendBytes(newer, protowire.AppendVarint(protowire.AppendTag(nil, 90, protowire.VarintType), 1))

	sendRaw(t, addr, b, wire, older, newer)
	got := h.collect(t, 3)

	want := asReceived(full)
	want.Origin.ExportTime = full.Origin.ExportTime
	if !reflect.DeepEqual(got[0], want) {
		t.Errorf("full shape:\n got %+v\nwant %+v", got[0], want)
	}
	for fl := flow.FlowType; fl <= flow.EgressUID; fl++ {
		old.Present.Clear(fl)
	}
	for _, fl := range []flow.Field{flow.DestinationServiceIP, flow.AppProtocolName, flow.HTTPVals, flow.FlowDirection, flow.ProxySnatIP, flow.ProxySnatPort} {
		old.Present.Clear(fl)
	}
	if g := got[1]; g.SourceIP != full.SourceIP || g.Stats != full.Stats || g.Aggregation != nil || g.Present != asReceived(&old).Present {
		t.Errorf("older shape: %+v", g)
	}
	if g := got[2]; g.SourcePodName != full.SourcePodName || len(g.ProtoUnknown) == 0 {
		t.Errorf("newer shape: %+v", g)
	}
	testkit.WaitFor(t, "2 skewed fields counted", func() bool {
		return testutil.ToFloat64(h.m.SkewUnknown.WithLabelValues("127.0.0.1")) == 2
	})
}

// TestGRPCStreamLogQuiet: a normal export stream (opened, records sent,
// closed by the exporter) writes nothing at info level or above, since
// exporters open one per export; its opening and closing are at debug
// level. The log is captured at debug level so that the test sees the
// lines it expects to be quiet.
func TestGRPCStreamLogQuiet(t *testing.T) {
	var logs testkit.LogBuffer
	h := newHarnessWith(t, 16, collector.Options{Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	sendRaw(t, addr, b, flowtest.Wire(flowtest.Full(1, false), nil, nil))
	h.collect(t, 1)
	// The handler logs the closing before it answers the exporter, and
	// sendRaw returns with the answer.
	var info, debug []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(rec.Level)); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if lvl >= slog.LevelInfo {
			info = append(info, line)
		} else if strings.Contains(rec.Msg, "stream") {
			debug = append(debug, rec.Msg)
		}
	}
	if len(info) > 0 {
		t.Errorf("a normal export stream logged at info level or above:\n%s", strings.Join(info, "\n"))
	}
	if want := []string{"gRPC export stream opened", "gRPC export stream closed"}; !slices.Equal(debug, want) {
		t.Errorf("debug lines about the stream %q, want %q", debug, want)
	}
}

func TestGRPCInvalidRecordsAreCounted(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	good := flowtest.Wire(flowtest.Full(1, false), nil, nil)
	bad := protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte{1, 2, 3}))
	sendRaw(t, addr, b, bad, good, bad)
	if got := h.collect(t, 1); got[0].SourcePodName != "client-1" {
		t.Errorf("got %+v", got[0])
	}
	// The second bad record comes after the good one: counted maybe
	// after the good one was collected.
	testkit.WaitFor(t, "2 invalid drops", func() bool {
		return testutil.ToFloat64(h.m.Dropped.WithLabelValues("grpc", "invalid")) == 2
	})
}

func TestGRPCMessageSizeLimit(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS("localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := flowpb.NewFlowExportServiceClient(conn).Export(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	huge := &flowpb.ExportRequest{Flows: []*flowpb.Flow{{Id: strings.Repeat("x", 5<<20)}}}
	_ = st.Send(huge)
	if _, err := st.CloseAndRecv(); err == nil || !strings.Contains(err.Error(), "ResourceExhausted") {
		t.Errorf("a 5 MiB message: %v", err)
	}
	testkit.WaitFor(t, "one decode error", func() bool {
		return testutil.ToFloat64(h.m.DecodeErrors.WithLabelValues("grpc")) == 1
	})
}

// TestGRPCFlowCountLimit: bytes alone do not bound memory (an empty Flow
// is 2 octets on the wire), so a request of more flows than MaxFlows is
// refused and counted; empty flows in an allowed one are invalid.
func TestGRPCFlowCountLimit(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	empty := make([][]byte, 16385)
	err := sendRawErr(t, addr, b, empty...)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("16385 flows in one request: %v, want ResourceExhausted", err)
	}
	testkit.WaitFor(t, "16385 too-many-flows drops", func() bool {
		return testutil.ToFloat64(h.m.Dropped.WithLabelValues("grpc", "too-many-flows")) == 16385
	})
	good := flowtest.Wire(flowtest.Full(1, false), nil, nil)
	sendRaw(t, addr, b, nil, good, nil, nil)
	if got := h.collect(t, 1); got[0].SourcePodName != "client-1" {
		t.Errorf("got %+v", got[0])
	}
	testkit.WaitFor(t, "3 invalid drops (flows without addresses)", func() bool {
		return testutil.ToFloat64(h.m.Dropped.WithLabelValues("grpc", "invalid")) == 3
	})
}

func TestGRPCStopsWithOpenStreams(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, stop := h.grpcServer(t, b)
	s := sender(t, addr, b, grpcsend.Options{})
	s.Send(flowtest.Full(1, false))
	h.collect(t, 1)
	start := time.Now()
	stop() // the sender's stream is open and idle
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopping took %v", d)
	}
	if n := testutil.ToFloat64(h.m.Sessions.WithLabelValues("grpc")); n != 0 {
		t.Errorf("sessions open after stop: %v", n)
	}
}

func TestGRPCNeedsMutualTLS(t *testing.T) {
	h := newHarness(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = h.srv.ServeGRPC(context.Background(), ln, bundle(t).ServerTLS(false))
	if err == nil || !strings.Contains(err.Error(), "client certificates") {
		t.Errorf("err %v", err)
	}
}

// TestGRPCMalformedMessageIsCounted: a request that is not valid Protobuf
// ends its stream and counts as a decode error; the collector goes on.
func TestGRPCMalformedMessageIsCounted(t *testing.T) {
	h := newHarness(t, 16)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	err := sendRawErr(t, addr, b, []byte{0xff, 0xff, 0xff})
	if status.Code(err) != codes.Internal {
		t.Errorf("a malformed request: %v, want Internal", err)
	}
	// The server counts after the client has seen the stream end.
	testkit.WaitFor(t, "one decode error", func() bool {
		return testutil.ToFloat64(h.m.DecodeErrors.WithLabelValues("grpc")) == 1
	})
	sendRaw(t, addr, b, flowtest.Wire(flowtest.Full(1, false), nil, nil))
	if got := h.collect(t, 1); got[0].SourcePodName != "client-1" {
		t.Errorf("got %+v", got[0])
	}
}
