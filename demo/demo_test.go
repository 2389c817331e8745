package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/config"
	"sluice/exporter/source"
	"sluice/internal/testkit/chserver"
	"sluice/ipfix"
	"sluice/traceflow/crd"
)

// runDemo runs the demo for a few seconds, as `sluice demo` would with
// --out, and returns its summary and output.
func runDemo(t *testing.T, mode string) (*Summary, string, string) {
	t.Helper()
	out := t.TempDir()
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum, err := Run(ctx, Options{Mode: mode, Duration: 4 * time.Second, Rate: 150, Out: out, Stdout: &stdout,
		Refresh: time.Second, Seed: 1})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, stdout.String())
	}
	return sum, out, stdout.String()
}

// checkCommon: records flowed, none was lost between the exporters and
// the aggregator nor between the aggregator and its collector, skew was
// seen both ways, and the final trace went out through the Egress.
func checkCommon(t *testing.T, sum *Summary, stdout string) {
	t.Helper()
	if sum.Sent == 0 || sum.Received != sum.Sent || sum.Lost != 0 {
		t.Errorf("sent %d, received %d, lost %d: want the same non-zero count and none lost", sum.Sent, sum.Received, sum.Lost)
	}
	var perNode uint64
	for _, e := range sum.Exporters {
		if e.Sent == 0 {
			t.Errorf("the exporter of %s sent nothing", e.Node)
		}
		perNode += e.Sent
	}
	if perNode != sum.Sent {
		t.Errorf("the exporters sent %d together, the total says %d", perNode, sum.Sent)
	}
	if sum.PerExporter {
		for _, e := range sum.Exporters {
			if e.Received != e.Sent {
				t.Errorf("%s: sent %d, the aggregator received %d", e.Node, e.Sent, e.Received)
			}
			switch {
			case strings.HasPrefix(e.Profile, "v1.13") && e.SkewMissing == 0:
				t.Errorf("%s (%s): no missing elements counted", e.Node, e.Profile)
			case strings.HasPrefix(e.Profile, "future") && e.SkewUnknown != 2*e.Received:
				t.Errorf("%s (%s): %d unknown elements in %d records, want 2 a record", e.Node, e.Profile, e.SkewUnknown, e.Received)
			}
		}
	}
	if got := sum.SinkExported[config.SinkFlowCollector]; got == 0 || got != sum.CollectorReceived {
		t.Errorf("the aggregator exported %d records to its collector, which received %d", got, sum.CollectorReceived)
	}
	if sum.BothPods == 0 {
		t.Error("no exported record names both Pods")
	}
	if len(sum.Denied) == 0 {
		t.Error("no route was denied by the example's policies")
	}
	// The denied routes are traffic too: their records name the policy.
	if sum.DeniedRecords == 0 || len(sum.RecentDenied) == 0 || !strings.Contains(sum.RecentDenied[0], " by ") {
		t.Errorf("%d records of denied connections (latest %q)", sum.DeniedRecords, sum.RecentDenied)
	}
	if len(sum.Egresses) == 0 || sum.Egresses[0].IP == "" || sum.Egresses[0].Records == 0 {
		t.Errorf("no record names an Egress with its IP: %+v", sum.Egresses)
	}
	for _, want := range []string{"EGRESSNAME", "EGRESSIP", "records of denied connections arrived"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if !sum.TraceDelivered() {
		t.Fatalf("the trace did not succeed: %+v", sum.Trace)
	}
	var toEgressNode, snat, out bool
	for _, r := range sum.Trace.Status.Results {
		for _, o := range r.Observations {
			switch o.Action {
			case crd.ActionForwardedToEgressNode:
				toEgressNode = true
			case crd.ActionMarkedForSNAT:
				snat = true
			case crd.ActionForwardedOutOfNetwork:
				out = true
			}
		}
	}
	if !toEgressNode || !snat || !out {
		t.Errorf("the trace was not tunnelled to the Egress Node, SNATed and sent out: %+v", sum.Trace.Status.Results)
	}
	for _, want := range []string{"== sluice demo: summary ==", "lost 0", "phase: Succeeded", "action: MarkedForSNAT"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(stdout, "\x1b[") {
		t.Error("plain output holds terminal escapes")
	}
	// The capture is the aggregator's IPFIX stream: every record of it.
	f, err := os.Open(sum.Capture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	mr := ipfix.NewMessageReader(f)
	var records uint64
	for {
		msg, err := mr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("capture: %v", err)
		}
		if err := dec.Reset(msg, time.Now()); err != nil {
			t.Fatalf("capture: %v", err)
		}
		for dec.Next() {
			records++
		}
	}
	if records != sum.CollectorReceived {
		t.Errorf("the capture holds %d records, the collector counted %d", records, sum.CollectorReceived)
	}
}

func TestDemoAggregate(t *testing.T) {
	sum, out, stdout := runDemo(t, config.ModeAggregate)
	checkCommon(t, sum, stdout)
	if sum.Correlated == 0 {
		t.Error("no inter-Node record was correlated from both Nodes' records")
	}
	// The flow log: correlated inter-Node lines name both Pods and both
	// (different) Nodes; a Service connection names its port.
	f, err := os.Open(filepath.Join(out, "flows.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines, interNode, service uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ",")
		if len(fs) != 30 {
			t.Fatalf("flow log line of %d fields, want 30: %s", len(fs), sc.Text())
		}
		lines++
		srcPod, srcNode, dstPod, dstNode := fs[7], fs[9], fs[10], fs[12]
		if srcPod != "" && dstPod != "" && srcNode != "" && dstNode != "" && srcNode != dstNode {
			interNode++
		}
		if fs[16] != "" && dstPod != "" {
			service++
		}
	}
	if lines != sum.SinkExported[config.SinkFlowLogger] {
		t.Errorf("%d flow log lines, the flow logger counted %d", lines, sum.SinkExported[config.SinkFlowLogger])
	}
	if interNode == 0 || service == 0 {
		t.Errorf("flow log: %d inter-Node lines with both Pods and Nodes, %d Service lines with the endpoint Pod; want some of each", interNode, service)
	}
}

func TestDemoProxy(t *testing.T) {
	sum, out, stdout := runDemo(t, config.ModeProxy)
	checkCommon(t, sum, stdout)
	if sum.PassedThrough == 0 {
		t.Error("Proxy mode passed no unknown element through to the collector")
	}
	if sum.FlowLog != "" {
		t.Errorf("Proxy mode has no flow log, yet the summary names %s", sum.FlowLog)
	}
	if _, err := os.Stat(filepath.Join(out, "flows.log")); err == nil {
		t.Error("Proxy mode wrote a flow log")
	}
}

// TestExampleTraffic: the bundled cluster's annotations resolve to
// routes, Services keep their ClusterIP with every endpoint, and the
// policies deny what the files say they deny.
func TestExampleTraffic(t *testing.T) {
	ctx := context.Background()
	objs, err := loadObjects(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := buildModel(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	var cart *route
	for i, r := range m.routes {
		if r.client.Key() == "web/frontend-1" && r.traceDst == "web/cart" {
			cart = &m.routes[i]
		}
		if r.client.Key() == "batch/crawler-0" && !r.external {
			t.Errorf("the quarantined crawler may reach %s", r.traceDst)
		}
	}
	if cart == nil {
		t.Fatal("no route from web/frontend-1 to the cart Service")
	}
	if cart.dst != netip.MustParseAddrPort("10.96.10.10:8080") || len(cart.endpoints) != 2 {
		t.Errorf("cart route to %v via %v, want the ClusterIP and both endpoints", cart.dst, cart.endpoints)
	}
	denied := map[string]bool{}
	for _, d := range m.denied {
		denied[d.Client+" "+strings.Fields(d.Target)[0]] = true
	}
	for _, want := range []string{"batch/report-1 data/postgres", "web/frontend-2 payments/pay-api-1",
		"batch/crawler-0 web/frontend-3", "ops/prometheus-0 payments/pay-api-2"} {
		if !denied[want] {
			t.Errorf("%s is not denied (denied: %v)", want, denied)
		}
	}
	if r := m.egressRoute(); r.client.Key() != "batch/crawler-0" || !r.external {
		t.Errorf("the Egress trace starts from %s to %s, want the crawler to the outside", r.client.Key(), r.traceDst)
	}
}

func TestResolveErrors(t *testing.T) {
	objs, err := loadObjects(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := buildModel(context.Background(), objs)
	if err != nil {
		t.Fatal(err)
	}
	st := m.tf.State
	client := st.Pod("web", "frontend-1")
	for _, bad := range []string{"web/cart", "web/cart:99999", "web/cart:9999", "web/nothing:80", "web/app=none:80",
		"cart:8080", "data/postgres:5432/udp"} {
		if _, err := resolve(st, client, bad); err == nil {
			t.Errorf("%q resolved", bad)
		}
	}
	rs, err := resolve(st, client, "kube-system/k8s-app=kube-dns:53/udp")
	if err != nil || len(rs) != 2 || rs[0].proto != source.ProtoUDP {
		t.Errorf("DNS: %+v, %v: want two UDP routes", rs, err)
	}
}

// TestNodeView: the server's Node sees a Service connection already
// translated, and not an unanswered (denied) one; a Node with neither end
// sees nothing of it.
func TestNodeView(t *testing.T) {
	client, vip, ep := netip.MustParseAddrPort("10.10.1.5:40000"), netip.MustParseAddrPort("10.96.10.10:8080"), netip.MustParseAddrPort("10.10.2.6:8080")
	table := fixedSource{{ID: 1, Proto: source.ProtoTCP, OrigSrc: client, OrigDst: vip, ReplySrc: ep, ReplyDst: client, Packets: 3, ReversePackets: 2},
		{ID: 2, Proto: source.ProtoTCP, OrigSrc: netip.MustParseAddrPort("10.10.1.5:40001"), OrigDst: ep, ReplySrc: ep,
			ReplyDst: netip.MustParseAddrPort("10.10.1.5:40001"), Packets: 2}}
	view := func(cidr string) []source.Conn {
		v := &nodeView{cluster: table, local: []netip.Prefix{netip.MustParsePrefix(cidr)}}
		out, err := v.Dump(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if c := view("10.10.1.0/24"); len(c) != 2 || c[0].OrigDst != vip {
		t.Errorf("client Node: %+v, want the connection to the ClusterIP and the unanswered one", c)
	}
	if c := view("10.10.2.0/24"); len(c) != 1 || c[0].OrigDst != ep || c[0].OrigSrc != client {
		t.Errorf("server Node: %+v, want the connection to the endpoint", c)
	}
	if c := view("10.10.3.0/24"); len(c) != 0 {
		t.Errorf("third Node: %+v, want nothing", c)
	}
}

type fixedSource []source.Conn

func (f fixedSource) Dump(_ context.Context, dst []source.Conn) ([]source.Conn, error) {
	return append(dst, f...), nil
}

func (fixedSource) Close() error { return nil }

// TestDemoClickHouse: given a ClickHouse, the demo's aggregator creates
// the flows table and writes every record it exports there too.
func TestDemoClickHouse(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{})
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sum, err := Run(ctx, Options{Mode: config.ModeAggregate, Duration: 4 * time.Second, Rate: 150, Stdout: &stdout,
		Refresh: time.Second, Seed: 1, ClickHouseURL: "tcp://" + srv.Addr})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, stdout.String())
	}
	rows := srv.Count(srv.Conn(), "flows")
	if got := sum.SinkExported[config.SinkClickHouse]; got == 0 || int64(got) != rows {
		t.Errorf("the sink counted %d rows, the table has %d", got, rows)
	}
	if !strings.Contains(stdout.String(), "clickHouse: ") {
		t.Errorf("the summary does not mention ClickHouse:\n%s", stdout.String())
	}
}
