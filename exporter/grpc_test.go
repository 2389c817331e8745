package exporter_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/aggregator"
	"sluice/certs"
	"sluice/enrich"
	"sluice/exporter"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/source"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testagg"
	"sluice/sink/flowstream"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// rounds is a connection table that returns rounds[i] at the i-th dump
// (the last one from then on).
type rounds struct {
	mu sync.Mutex
	r  [][]source.Conn
	n  int
}

func (t *rounds) Dump(_ context.Context, dst []source.Conn) ([]source.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := min(t.n, len(t.r)-1)
	t.n++
	return append(dst, t.r[i]...), nil
}

func (t *rounds) Close() error { return nil }

var (
	clientIP = netip.MustParseAddr("10.10.1.5")
	serverIP = netip.MustParseAddr("10.10.2.7")
	start    = time.Now().Add(-time.Minute).Truncate(time.Second)
)

// oneConnection is a TCP connection from the client Pod (node-1) to the
// server Pod (node-2), seen established, then in TIME_WAIT (so it is
// exported at once, with END_OF_FLOW), then gone. Both Nodes see it so.
func oneConnection(port uint16) *rounds {
	c := source.Conn{ID: 7, Proto: source.ProtoTCP, TCPState: source.TCPEstablished,
		OrigSrc: netip.AddrPortFrom(clientIP, port), OrigDst: netip.AddrPortFrom(serverIP, 8080),
		ReplySrc: netip.AddrPortFrom(serverIP, 8080), ReplyDst: netip.AddrPortFrom(clientIP, port),
		Packets: 4, Bytes: 400, ReversePackets: 3, ReverseBytes: 3000, Start: start}
	end := c
	end.TCPState = source.TCPTimeWait
	end.Packets, end.Bytes, end.ReversePackets, end.ReverseBytes = 10, 1234, 8, 56789
	return &rounds{r: [][]source.Conn{{c}, {end}, nil}}
}

func pods() enrich.Store {
	return enrich.NewStatic([]enrich.Pod{
		{Namespace: "shop", Name: "client", NodeName: "node-1", IPs: []netip.Addr{clientIP}},
		{Namespace: "shop", Name: "server", NodeName: "node-2", IPs: []netip.Addr{serverIP}},
	}, nil, nil)
}

// freeAddr is a loopback address nobody listens on (for now).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startAggregator runs an aggregator in mode whose gRPC collector listens
// on grpcAddr, with the certificates of certDir and the flow stream on.
func startAggregator(t *testing.T, mode, grpcAddr, certDir string) *aggregator.Aggregator {
	t.Helper()
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: none
activeFlowRecordTimeout: 1s
flowStreamService: {enable: true}
sluice:
  grpcAddress: %q
  apiAddress: "127.0.0.1:0"
  flowStreamAddress: "127.0.0.1:0"
  tls: {certDir: %q}
`, mode, grpcAddr, certDir))
	return a.Aggregator
}

// startExporter runs an exporter for node (its Pods in podCIDR) reading
// table, sending over gRPC to addr.
func startExporter(t *testing.T, node, podCIDR string, table source.Source, addr string, tlsConf *tls.Config) *exporter.Exporter {
	t.Helper()
	coll, err := collectoraddr.Parse(addr + ":grpc")
	if err != nil {
		t.Fatal(err)
	}
	e, err := exporter.New(exporter.Options{Node: node, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(podCIDR)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: table, Store: pods(),
		Collector: coll, TLS: tlsConf, PollInterval: time.Second, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	})
	return e
}

// readStream follows the aggregator's flow stream until n flows came.
func readStream(t *testing.T, a *aggregator.Aggregator, b *certs.Bundle, n int) []flow.Flow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []flow.Flow
	req := &flowpb.GetFlowsRequest{Follow: true, MaxCount: uint32(n)}
	err := flowstream.Get(ctx, a.Addrs().FlowStream, b.ClientTLS("localhost"), req, func(r *flowpb.GetFlowsResponse) error {
		for _, p := range r.Flows {
			var f flow.Flow
			if _, err := flowproto.ToFlow(p, &f); err != nil {
				return err
			}
			got = append(got, f)
		}
		return nil
	})
	if err != nil || len(got) != n {
		t.Fatalf("flow stream: %d flows, err %v", len(got), err)
	}
	return got
}

// counter is the value of a counter or gauge without labels in reg.
func counter(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			m := mf.Metric[0]
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// checkNode1Record checks the fields node-1's exporter put in the record of
// oneConnection(port).
func checkNode1Record(t *testing.T, f *flow.Flow, port uint16) {
	t.Helper()
	checks := []struct {
		what      string
		got, want any
	}{
		{"source", netip.AddrPortFrom(f.SourceIP, f.SourcePort), netip.AddrPortFrom(clientIP, port)},
		{"destination", netip.AddrPortFrom(f.DestinationIP, f.DestinationPort), netip.AddrPortFrom(serverIP, 8080)},
		{"protocol", f.Protocol, uint8(6)},
		{"source Pod", f.SourcePodNamespace + "/" + f.SourcePodName + "@" + f.SourceNodeName, "shop/client@node-1"},
		{"flow type", f.FlowType, flow.FlowTypeInterNode},
		{"end reason", f.EndReason, uint8(3)},
		{"TCP state", f.TCPState, "TIME_WAIT"},
		{"stats", f.Stats, flow.Stats{PacketTotalCount: 10, PacketDeltaCount: 10, OctetTotalCount: 1234, OctetDeltaCount: 1234}},
		{"reverse stats", f.ReverseStats, flow.Stats{PacketTotalCount: 8, PacketDeltaCount: 8, OctetTotalCount: 56789, OctetDeltaCount: 56789}},
		{"start", f.StartTime.Equal(start), true},
		{"end set", f.EndTime.IsZero(), false},
		{"observation domain", f.Origin.ObservationDomainID, exporter.ObservationDomain("node-1")},
		{"export time set", f.Origin.ExportTime.IsZero(), false},
		{"exporter", f.Origin.Exporter, netip.MustParseAddr("127.0.0.1")},
	}
	for _, c := range checks {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
}

// TestGRPCToProxy: an exporter sends a connection's record over gRPC with
// mutual TLS to an aggregator in Proxy mode; the record comes out with the
// fields the exporter set, and the exporter's series count it.
func TestGRPCToProxy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, "Proxy", "127.0.0.1:0", dir)
	e := startExporter(t, "node-1", "10.10.1.0/24", oneConnection(40001), a.Addrs().GRPC, b.ClientTLS("localhost"))
	got := readStream(t, a, b, 1)
	checkNode1Record(t, &got[0], 40001)
	if f := got[0]; f.DestinationPodName != "" || f.DestinationNodeName != "" {
		t.Errorf("node-1 named the remote Pod: %s on %s", f.DestinationPodName, f.DestinationNodeName)
	}
	testkit.WaitFor(t, "the exporter's count", func() bool { return counter(t, e.Registry(), "sluice_exporter_records_exported_total") == 1 })
	if n := counter(t, e.Registry(), "sluice_exporter_connected"); n != 1 {
		t.Errorf("connected %v", n)
	}
}

// TestGRPCToAggregate: the two Nodes' exporters send their halves of an
// inter-Node connection over gRPC; Aggregate mode joins them into one
// record with both Pods and both Nodes.
func TestGRPCToAggregate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, "Aggregate", "127.0.0.1:0", dir)
	startExporter(t, "node-1", "10.10.1.0/24", oneConnection(40002), a.Addrs().GRPC, b.ClientTLS("localhost"))
	startExporter(t, "node-2", "10.10.2.0/24", oneConnection(40002), a.Addrs().GRPC, b.ClientTLS("localhost"))
	got := readStream(t, a, b, 1)
	f := got[0]
	if f.SourcePodName != "client" || f.SourceNodeName != "node-1" || f.DestinationPodName != "server" ||
		f.DestinationPodNamespace != "shop" || f.DestinationNodeName != "node-2" {
		t.Errorf("not correlated: %s/%s on %q → %s/%s on %q", f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName,
			f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName)
	}
	if netip.AddrPortFrom(f.SourceIP, f.SourcePort) != netip.AddrPortFrom(clientIP, 40002) || f.FlowType != flow.FlowTypeInterNode ||
		f.Stats.OctetTotalCount != 1234 || f.ReverseStats.OctetTotalCount != 56789 || f.EndReason != 3 {
		t.Errorf("record %+v", f)
	}
}

// TestGRPCBuffersUntilAggregatorUp: records made while no aggregator
// listens wait in the exporter's buffer and are delivered once one does.
func TestGRPCBuffersUntilAggregatorUp(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	e := startExporter(t, "node-1", "10.10.1.0/24", oneConnection(40003), addr, b.ClientTLS("localhost"))
	testkit.WaitFor(t, "a record waiting while the aggregator is down", func() bool {
		return e.Queue().Len() == 1 && counter(t, e.Registry(), "sluice_exporter_connection_failures_total") >= 1
	})
	if n := counter(t, e.Registry(), "sluice_exporter_records_exported_total"); n != 0 {
		t.Fatalf("exported %v with no aggregator", n)
	}
	a := startAggregator(t, "Proxy", addr, dir)
	got := readStream(t, a, b, 1)
	checkNode1Record(t, &got[0], 40003)
	testkit.WaitFor(t, "the buffer to empty", func() bool { return e.Queue().Len() == 0 })
	if n := e.Queue().Dropped(); n != 0 {
		t.Errorf("dropped %v", n)
	}
}

// TestGRPCRefusesUntrustedExporter: an exporter needs a client
// certificate for gRPC, and one the aggregator's CA did not sign is
// refused in the handshake: nothing arrives, both sides count it.
func TestGRPCRefusesUntrustedExporter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := startAggregator(t, "Proxy", "127.0.0.1:0", dir)
	coll, _ := collectoraddr.Parse(a.Addrs().GRPC + ":grpc")
	noCert := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: b.CAPool, ServerName: "localhost"}
	if _, err := exporter.New(exporter.Options{Node: "n", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		Source: oneConnection(1), Collector: coll, TLS: noCert}); err == nil {
		t.Error("an exporter without a client certificate: accepted")
	}

	untrusted := b.ClientTLS("localhost")
	untrusted.Certificates = nil
	cert := other.ClientTLS("").Certificates[0]
	// Presented whatever CAs the aggregator names.
	untrusted.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	// No connections: a record would keep the stopping exporter waiting
	// for its drain timeout (grpcsend's tests check that records stay
	// queued).
	e := startExporter(t, "node-1", "10.10.1.0/24", &rounds{r: [][]source.Conn{nil}}, a.Addrs().GRPC, untrusted)
	testkit.WaitFor(t, "a refused connection", func() bool {
		return counter(t, e.Registry(), "sluice_exporter_connection_failures_total") >= 1
	})
	if n := counter(t, e.Registry(), "sluice_exporter_connected"); n != 0 {
		t.Errorf("connected %v", n)
	}
	refused := regexp.MustCompile(`sluice_collector_sessions_refused_total\{reason="tls-handshake",transport="grpc"\} (\d+)`)
	resp, err := http.Get("http://" + a.Addrs().API + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if m := refused.FindSubmatch(body); m == nil {
		t.Errorf("the aggregator has no refused-handshake series")
	} else if n, _ := strconv.Atoi(string(m[1])); n < 1 {
		t.Errorf("the aggregator counted %d refused handshakes", n)
	}
}
