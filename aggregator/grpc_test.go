package aggregator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/aggregator"
	"sluice/certs"
	"sluice/config"
	"sluice/exporter/grpcsend"
	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/sink/flowstream"
)

// grpcAggregator starts an aggregator in mode with the flow stream service
// on, and a sender to its gRPC collector.
func grpcAggregator(t *testing.T, mode string) (queued, string, *certs.Bundle) {
	dir := t.TempDir()
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: none
activeFlowRecordTimeout: 1s
flowStreamService: {enable: true}
sluice:
  apiAddress: "127.0.0.1:0"
  flowStreamAddress: "127.0.0.1:0"
  tls: {certDir: %s}
`, mode, filepath.Join(dir, "certs")))
	q, b := startSender(t, a.Addrs().GRPC, filepath.Join(dir, "certs"), 1024)
	return q, a.Addrs().FlowStream, b
}

// startSender runs a gRPC sender to addr, with a client certificate from
// the aggregator's certDir and a queue of size records, until the test
// ends.
func startSender(t *testing.T, addr, certDir string, size int) (queued, *certs.Bundle) {
	t.Helper()
	b, err := certs.Ensure(certDir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := grpcsend.New(grpcsend.Options{Address: addr, TLS: b.ClientTLS("localhost"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(size)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, q) }()
	t.Cleanup(func() { cancel(); <-done })
	return queued{q}, b
}

// queued feeds a grpcsend.Sender through a queue of its own.
type queued struct{ q *queue.Queue }

// Send queues copies of flows for the sender.
func (s queued) Send(flows ...*flow.Flow) {
	for _, f := range flows {
		s.q.Push([]flow.Flow{*f})
	}
}

// readStream follows the flow stream until n flows came.
func readStream(t *testing.T, addr string, b *certs.Bundle, req *flowpb.GetFlowsRequest, n int) []*flowpb.Flow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got []*flowpb.Flow
	req.Follow = true
	req.MaxCount = uint32(n)
	err := flowstream.Get(ctx, addr, b.ClientTLS("localhost"), req, func(r *flowpb.GetFlowsResponse) error {
		got = append(got, r.Flows...)
		return nil
	})
	if err != nil || len(got) != n {
		t.Fatalf("flow stream: %d flows, err %v", len(got), err)
	}
	return got
}

// TestGRPCProxyEveryField: records with every field set go from the sender
// through the gRPC collector and Proxy mode to the flow stream unchanged,
// but for what Proxy mode sets (direction) and the exporter address.
func TestGRPCProxyEveryField(t *testing.T) {
	s, stream, b := grpcAggregator(t, "Proxy")
	var sent []*flow.Flow
	for i := range 20 {
		f := flowtest.Full(i, false)
		sent = append(sent, f)
		s.Send(f)
	}
	got := readStream(t, stream, b, &flowpb.GetFlowsRequest{}, len(sent))
	for i, p := range got {
		var g flow.Flow
		if _, err := flowproto.ToFlow(p, &g); err != nil {
			t.Fatal(err)
		}
		want := *sent[i]
		want.ClusterID = ""
		want.Present.Clear(flow.ClusterID)
		want.FlowDirection = flow.DirectionUnknown // both Pods named: Proxy mode cannot tell
		want.Origin.Exporter = netip.MustParseAddr("127.0.0.1")
		if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", want) {
			t.Fatalf("record %d:\n got %+v\nwant %+v", i, g, want)
		}
	}
}

// TestGRPCProxyKeepsUnknownFields: fields of a newer exporter reach the
// flow stream in Proxy mode.
func TestGRPCProxyKeepsUnknownFields(t *testing.T) {
	s, stream, b := grpcAggregator(t, "Proxy")
	p, err := flowproto.FromFlow(flowtest.Full(1, false))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := proto.Marshal(p)
	raw = protowire.AppendString(protowire.AppendTag(raw, 77, protowire.BytesType), "newer")
	var f flow.Flow
	var q flowpb.Flow
	proto.Unmarshal(raw, &q)
	if n, err := flowproto.ToFlow(&q, &f); err != nil || n != 1 {
		t.Fatalf("%d %v", n, err)
	}
	s.Send(&f)
	got := readStream(t, stream, b, &flowpb.GetFlowsRequest{}, 1)
	if u := got[0].ProtoReflect().GetUnknown(); !strings.Contains(string(u), "newer") {
		t.Errorf("unknown field lost: %q", u)
	}
}

// TestGRPCAggregate: the two halves of an inter-node flow, sent over gRPC
// by the two nodes, come out of Aggregate mode as one record with each
// side's view; the flow stream's namespace filter passes it.
func TestGRPCAggregate(t *testing.T) {
	s, stream, b := grpcAggregator(t, "Aggregate")
	src := flowtest.Full(3, false)
	dst := flowtest.Full(3, false)
	src.Egress.RuleAction = flow.ActionAllow // a denied flow is not correlated
	for _, fl := range []flow.Field{flow.DestinationPodName, flow.DestinationPodNamespace, flow.DestinationPodUID,
		flow.DestinationPodLabels, flow.DestinationNodeName, flow.DestinationNodeUID, flow.IngressPolicyName,
		flow.IngressPolicyNamespace, flow.IngressPolicyUID, flow.IngressPolicyRuleName} {
		src.Present.Clear(fl)
	}
	src.DestinationPodName, src.DestinationPodNamespace, src.DestinationNodeName = "", "", ""
	src.Ingress = flow.Policy{}
	for _, fl := range []flow.Field{flow.SourcePodName, flow.SourcePodNamespace, flow.SourcePodUID,
		flow.SourcePodLabels, flow.SourceNodeName, flow.SourceNodeUID, flow.EgressPolicyName,
		flow.EgressPolicyNamespace, flow.EgressPolicyUID, flow.EgressPolicyRuleName} {
		dst.Present.Clear(fl)
	}
	dst.SourcePodName, dst.SourcePodNamespace, dst.SourceNodeName = "", "", ""
	dst.Egress = flow.Policy{}
	dst.Stats.OctetDeltaCount += 5
	s.Send(src, dst)
	got := readStream(t, stream, b, &flowpb.GetFlowsRequest{Filter: &flowpb.FlowFilter{Namespaces: []string{"ns-b"}}}, 1)
	p := got[0]
	k := p.GetK8S()
	if k.GetSourcePodName() != "client-3" || k.GetDestinationPodName() != "server-3" || p.GetAggregation() == nil {
		t.Fatalf("aggregated record: %v", p)
	}
	a := p.GetAggregation()
	if a.GetStatsFromSource().GetOctetDeltaCount() != src.Stats.OctetDeltaCount ||
		a.GetStatsFromDestination().GetOctetDeltaCount() != dst.Stats.OctetDeltaCount {
		t.Errorf("per-side stats: %v", a)
	}
	// Joined from two exporters' records, the flow names neither.
	if ip := p.GetIpfix().GetExporterIp(); ip != "" {
		t.Errorf("exporter %q in a correlated record, want none", ip)
	}
}

// TestGRPCCollectorOff: an empty sluice.grpcAddress runs no gRPC collector,
// and an aggregator that then needs no TLS (IPFIX over TCP, no flow
// stream) makes no certificates.
func TestGRPCCollectorOff(t *testing.T) {
	state := t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	cfg, err := config.Parse([]byte(`
aggregatorTransportProtocol: tcp
sluice: {grpcAddress: "", ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`), "off.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if got := a.Addrs(); got.GRPC != "" || got.IPFIX == "" {
		t.Errorf("addresses %+v: want IPFIX and no gRPC", got)
	}
	if _, err := os.Stat(filepath.Join(state, "sluice")); !os.IsNotExist(err) {
		t.Errorf("certificates made for nothing: %v", err)
	}
}

// TestGRPCProxyFastPathMatchesNormal: gRPC records exported over IPFIX in
// Proxy mode are the same, element for element, whether each gRPC stream
// writes them as export records (the fast path) or hands them on as flow
// records; both count them as rebuilt.
func TestGRPCProxyFastPathMatchesNormal(t *testing.T) {
	const n = 60
	run := func(fast bool) []string {
		dir := t.TempDir()
		coll := stubcollector.New(t)
		a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: none
clusterID: c1
recordContents: {podLabels: true}
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  apiAddress: "127.0.0.1:0"
  tls: {certDir: %s}
  proxy: {fastPath: %v}
`, coll.Addr(), filepath.Join(dir, "certs"), fast))
		q, _ := startSender(t, a.Addrs().GRPC, filepath.Join(dir, "certs"), n)
		for i := range n {
			f := flowtest.Full(i, false)
			switch i % 3 {
			case 0: // the L7 elements, which the export passes through
			case 1: // an inter-Node half: Proxy mode names the other Pod
				f.Present.Clear(flow.AppProtocolName)
				f.Present.Clear(flow.HTTPVals)
				f.AppProtocolName, f.HTTPVals = "", ""
				f.DestinationPodName, f.DestinationPodNamespace = "", ""
			default:
				f.Present.Clear(flow.AppProtocolName)
				f.Present.Clear(flow.HTTPVals)
				f.AppProtocolName, f.HTTPVals = "", ""
				f.SourceIP, f.DestinationIP = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
			}
			q.Send(f)
		}
		testkit.WaitFor(t, fmt.Sprintf("%d records at the collector", n), func() bool { return coll.Len() == n })
		testkit.WaitFor(t, "the records counted", func() bool {
			return metricValue(metrics(t, a.Addrs().API), `sluice_proxy_records_total{path="rebuilt"}`) == n
		})
		var out []string
		for _, r := range coll.Records() {
			keys := slices.Sorted(maps.Keys(r.Raw))
			var sb strings.Builder
			for _, k := range keys {
				fmt.Fprintf(&sb, "%s=%x ", k, r.Raw[k])
			}
			out = append(out, sb.String())
		}
		slices.Sort(out)
		return out
	}
	fast, normal := run(true), run(false)
	for i := range fast {
		if fast[i] != normal[i] {
			t.Fatalf("record %d differs:\n fast   %s\n normal %s", i, fast[i], normal[i])
		}
	}
}
