package aggregator_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/aggregator"
	"sluice/certs"
	"sluice/config"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

const inventory = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: client-0, namespace: default, uid: 11111111-2222-4333-8444-555555555555, creationTimestamp: "2025-01-01T00:00:00Z", labels: {app: client}}
  spec: {nodeName: node-1}
  status: {podIP: 10.244.1.2, podIPs: [{ip: 10.244.1.2}]}
`

func metrics(t *testing.T, api string) string {
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestProxyOverMutualTLS: an exporter with the generated client
// certificate sends Antrea v2.7 records over TLS; the collector receives
// them with the Proxy-mode elements; a client without a certificate is
// refused and counted. The same, record for record, on the fast path
// (the default) and without it.
// metricValue is the value of series (name and labels, as /metrics
// prints them) in the text m, or -1 when m has none.
func metricValue(m, series string) float64 {
	for line := range strings.Lines(m) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func TestProxyOverMutualTLS(t *testing.T) {
	for _, fast := range []bool{true, false} {
		t.Run(fmt.Sprintf("fastPath=%v", fast), func(t *testing.T) { testProxyOverMutualTLS(t, fast) })
	}
}

func testProxyOverMutualTLS(t *testing.T, fast bool) {
	dir := t.TempDir()
	coll := stubcollector.New(t)
	inv := filepath.Join(dir, "inventory.yaml")
	os.WriteFile(inv, []byte(inventory), 0o644)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tls
clusterID: test-cluster
recordContents: {podLabels: true}
flowCollector: {enable: true, address: "%s:tcp", observationDomainID: 77}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  inventory: %s
  tls: {certDir: %s}
  proxy: {fastPath: %v}
`, coll.Addr(), inv, filepath.Join(dir, "certs"), fast))
	addrs := a.Addrs()

	bundle, err := certs.Ensure(filepath.Join(dir, "certs"), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Refused: no client certificate.
	noCert := &tls.Config{RootCAs: bundle.CAPool, ServerName: "localhost"}
	if c, err := tls.Dial("tcp", addrs.IPFIX, noCert); err == nil {
		// TLS 1.3 reports the refusal on the first read.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
	testkit.WaitFor(t, "the refusal to be counted", func() bool {
		return strings.Contains(metrics(t, addrs.API), `sluice_collector_sessions_refused_total{reason="tls-handshake",transport="tls"} 1`)
	})

	conn, err := tls.Dial("tcp", addrs.IPFIX, bundle.ClientTLS("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tmpl, _ := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(9, tmpl)
	for i := range 20 {
		if err := ipfixtest.WriteAntreaV27(enc, 9, tmpl, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
	}
	enc.Flush()
	testkit.WaitFor(t, "20 records at the collector", func() bool { return coll.Len() == 20 })

	first := coll.Records()[0]
	raw, f := first.Raw, first.Flow
	if !bytes.Equal(raw["0:405"], []byte{0, 0, 0, 9}) {
		t.Errorf("originalObservationDomainId = %x, want 9", raw["0:405"])
	}
	if !bytes.Equal(raw["0:403"], []byte{127, 0, 0, 1}) {
		t.Errorf("originalExporterIPv4Address = %x", raw["0:403"])
	}
	if f.SourcePodName != "client-0" || f.ClusterID != "test-cluster" || f.SourcePodLabels != `{"app":"client"}` {
		t.Errorf("record %+v", f)
	}
	if f.FlowDirection != flow.DirectionUnknown { // SampleFlow has both Pods: unknown
		t.Errorf("flowDirection %d", f.FlowDirection)
	}
	m := metrics(t, addrs.API)
	for _, want := range []string{
		`sluice_collector_records_received_total{exporter="127.0.0.1",transport="tls"} 20`,
		`sluice_sink_records_exported_total{sink="flowCollector"} 20`,
		`sluice_collector_sessions_open{transport="tls"} 1`,
		map[bool]string{true: `sluice_proxy_records_total{path="copied"} 20`, false: `sluice_proxy_records_total{path="rebuilt"} 20`}[fast],
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	var rm map[string]any
	getJSON(t, "http://"+addrs.API+"/recordmetrics", &rm)
	if rm["numRecordsExported"] != float64(20) || rm["numRecordsReceived"] != float64(20) {
		t.Errorf("/recordmetrics: %v, want 20 received and exported", rm)
	}
	resp, err := http.Get("http://" + addrs.API + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("readyz: %v %v", resp, err)
	}
	if err := a.Stop(); err != nil {
		t.Errorf("run: %v", err)
	}
}

// TestAggregateCorrelatesTwoNodes: the source node and the destination
// node each send their half of 20 inter-node connections over their own
// TCP session; the collector gets one record per connection carrying both
// Pods and both nodes' counters.
func TestAggregateCorrelatesTwoNodes(t *testing.T) {
	coll := stubcollector.New(t)
	logPath := filepath.Join(t.TempDir(), "flows.log")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
flowLogger: {enable: true, path: %q}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`, coll.Addr(), logPath))
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	node := func(domain uint32, half func(i int, f *flow.Flow)) {
		conn, err := net.Dial("tcp", a.Addrs().IPFIX)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
		enc.AddTemplate(domain, tmpl)
		for i := range 20 {
			f := flow.Flow{
				StartTime: time.Now().Add(-10 * time.Second).Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
				SourceIP: netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
				SourcePort: uint16(40000 + i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeInterNode,
				Stats: flow.Stats{OctetTotalCount: 1000, PacketTotalCount: 10, OctetDeltaCount: 1000, PacketDeltaCount: 10},
			}
			half(i, &f)
			if err := ipfixmap.WriteRecord(enc.Begin(domain, tmpl), els, &f); err != nil {
				t.Fatal(err)
			}
		}
		enc.Flush()
	}
	node(1, func(i int, f *flow.Flow) {
		f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = "web", fmt.Sprintf("client-%d", i), "node-a"
	})
	node(2, func(i int, f *flow.Flow) {
		f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "web", "server", "node-b"
		f.Stats.OctetTotalCount = 990 // the destination saw a little less
	})
	testkit.WaitFor(t, "20 correlated records", func() bool { return coll.Len() >= 20 })
	// Nothing more comes: the store has taken all 40 records, and the
	// collector holds every record the sink sent.
	testkit.WaitFor(t, "the collector to hold what the sink sent", func() bool {
		m := metrics(t, a.Addrs().API)
		return metricValue(m, "sluice_aggregate_records_total") == 40 &&
			metricValue(m, `sluice_sink_records_exported_total{sink="flowCollector"}`) == float64(coll.Len())
	})
	got := coll.Records()
	if len(got) != 20 {
		t.Fatalf("%d records for 20 connections", len(got))
	}
	seen := map[uint16]bool{}
	for i, r := range got {
		f, raw := r.Flow, r.Raw
		if f.SourcePodName == "" || f.DestinationPodName != "server" || f.SourceNodeName != "node-a" || f.DestinationNodeName != "node-b" {
			t.Errorf("record %d not correlated: %+v", i, f)
		}
		if want := fmt.Sprintf("client-%d", f.SourcePort-40000); f.SourcePodName != want {
			t.Errorf("record for port %d names %s", f.SourcePort, f.SourcePodName)
		}
		seen[f.SourcePort] = true
		// octetTotalCountFromSourceNode (56506:121) and ...FromDestinationNode (56506:129).
		if !bytes.Equal(raw["56506:121"], []byte{0, 0, 0, 0, 0, 0, 3, 0xe8}) || !bytes.Equal(raw["56506:129"], []byte{0, 0, 0, 0, 0, 0, 3, 0xde}) {
			t.Errorf("per-node totals %x %x, want 1000 and 990", raw["56506:121"], raw["56506:129"])
		}
		if f.Stats.OctetTotalCount != 1000 {
			t.Errorf("common total %d, want the larger, 1000", f.Stats.OctetTotalCount)
		}
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct connections", len(seen))
	}

	// The flow-record API shows the tracked flows, filtered.
	var recs []map[string]any
	getJSON(t, "http://"+a.Addrs().API+"/flowrecords", &recs)
	if len(recs) != 20 {
		t.Errorf("/flowrecords: %d records, want 20", len(recs))
	}
	getJSON(t, "http://"+a.Addrs().API+"/flowrecords?srcport=40003&proto=tcp", &recs)
	if len(recs) != 1 || recs[0]["sourcePodName"] != "client-3" || recs[0]["destinationPodName"] != "server" ||
		recs[0]["octetTotalCountFromDestinationNode"] != float64(990) {
		t.Errorf("/flowrecords?srcport=40003: %v", recs)
	}
	var rm map[string]any
	getJSON(t, "http://"+a.Addrs().API+"/recordmetrics", &rm)
	if rm["numRecordsReceived"] != float64(40) || rm["numFlows"] != float64(20) || rm["numRecordsExported"] != float64(20) ||
		rm["withLogExporter"] != true || rm["withIPFIXExporter"] != true || rm["numConnToCollector"] != float64(2) {
		t.Errorf("/recordmetrics: %v", rm)
	}
	// The correlation store's counters are on /metrics too.
	m := metrics(t, a.Addrs().API)
	for _, want := range []string{"sluice_aggregate_records_total 40", "sluice_aggregate_correlated_total 20", "sluice_aggregate_flows 20"} {
		if !strings.Contains(m, "\n"+want+"\n") {
			t.Errorf("/metrics has no %q", want)
		}
	}

	// At shutdown the flow log holds one line per connection.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	} // for the cleanup
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 20 {
		t.Fatalf("flow log has %d lines, want 20:\n%s", len(lines), b)
	}
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) != 30 || !strings.HasPrefix(f[7], "client-") || f[10] != "server" || f[9] != "node-a" || f[12] != "node-b" || f[6] != "TCP" {
			t.Errorf("flow log line %q", l)
		}
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

func TestBadKubeconfigNamesTheKey(t *testing.T) {
	cfg, err := config.Parse([]byte("mode: Proxy\nsluice:\n  kubeconfig: /nonexistent/kubeconfig\n  ipfixAddress: 127.0.0.1:0\n  apiAddress: 127.0.0.1:0\n"), "k.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "k.yaml:3") || !strings.Contains(err.Error(), "sluice.kubeconfig") {
		t.Fatalf("error %v should name k.yaml:3 and sluice.kubeconfig", err)
	}
}

// TestRunEndsWhenACollectorFails: losing the IPFIX listener ends the run
// with an error instead of leaving a process that serves nothing.
func TestRunEndsWhenACollectorFails(t *testing.T) {
	dir := t.TempDir()
	inv := filepath.Join(dir, "inventory.yaml")
	os.WriteFile(inv, []byte(inventory), 0o644)
	cfg, err := config.Parse([]byte(fmt.Sprintf("mode: Proxy\naggregatorTransportProtocol: tcp\nsluice:\n  ipfixAddress: 127.0.0.1:0\n  apiAddress: 127.0.0.1:0\n  inventory: %s\n", inv)), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The gRPC collector always runs: give it a free port and its own
	// certificates.
	cfg.Sluice.GRPCAddress = "127.0.0.1:0"
	if cfg.Sluice.TLS.CertDir == "" && cfg.Sluice.TLS.CertFile == "" {
		cfg.Sluice.TLS.CertDir = t.TempDir()
	}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	testkit.WaitFor(t, "the aggregator to serve", func() bool {
		resp, err := http.Get("http://" + a.Addrs().API + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	a.CloseIPFIXListenerForTest()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "listener closed") {
			t.Fatalf("run ended with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its collector failed")
	}
}

// TestShutdownFlushOutrunsTheBuffer: 3000 flows are held when the
// aggregator stops, far more than its 16-record buffer; the final flush
// waits for the sinks, so the flow log gets every one.
func TestShutdownFlushOutrunsTheBuffer(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "flows.log")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
recordBufferSize: 16
flowLogger: {enable: true, path: %q}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", aggregate: {exportOneSided: true}}
`, logPath))
	// Inter-Node flows only their source Node reports: held for
	// correlation until the flush.
	const n = 3000
	sendIPFIX(t, a.Addrs().IPFIX, n)
	testkit.WaitFor(t, "all flows held", func() bool {
		return strings.Contains(metrics(t, a.Addrs().API), "sluice_collector_records_received_total{exporter=\"127.0.0.1\",transport=\"tcp\"} 3000")
	})
	var rm map[string]any
	testkit.WaitFor(t, "3000 flows tracked", func() bool {
		getJSON(t, "http://"+a.Addrs().API+"/recordmetrics", &rm)
		return rm["numFlows"] == float64(n)
	})
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "\n"); got != n {
		t.Fatalf("flow log has %d lines after shutdown, want %d", got, n)
	}
}

// TestCloseReleasesWhatNewBound: an aggregator made and never run gives its
// ports back on Close, the flow stream service's included.
func TestCloseReleasesWhatNewBound(t *testing.T) {
	dir := t.TempDir()
	yaml := "mode: Aggregate\naggregatorTransportProtocol: tcp\nflowStreamService:\n  enable: true\n" +
		"sluice:\n  ipfixAddress: 127.0.0.1:0\n  apiAddress: 127.0.0.1:0\n  grpcAddress: 127.0.0.1:0\n  flowStreamAddress: 127.0.0.1:0\n" +
		"  tls:\n    certDir: " + dir + "\n"
	cfg, err := config.Parse([]byte(yaml), "close.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addrs := a.Addrs()
	a.Close()
	for _, addr := range []string{addrs.IPFIX, addrs.API, addrs.GRPC, addrs.FlowStream} {
		if addr == "" {
			t.Fatalf("an address is missing: %+v", addrs)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s still bound after Close: %v", addr, err)
			continue
		}
		ln.Close()
	}
}

// TestNewRefusesUnsupportedSinks: a configuration made in code is checked
// against the sinks this build runs, as a file is: here a sink its
// registry entry says cannot run in Proxy mode.
func TestNewRefusesUnsupportedSinks(t *testing.T) {
	cfg := config.Default()
	cfg.Mode = config.ModeProxy
	cfg.FlowLogger.Enable = true
	_, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "flowLogger.enable: the flow logger sink cannot be used in Proxy mode") {
		t.Errorf("New with the flow logger in Proxy mode: %v", err)
	}
}

// TestRunEndsWhenTheMetadataSourceFails: a Pod metadata source whose Run
// fails (here a real Kubernetes source, whose second Run is refused)
// ends the aggregator's run with its error, instead of leaving a process
// that serves records without enrichment and says nothing.
func TestRunEndsWhenTheMetadataSourceFails(t *testing.T) {
	dir := t.TempDir()
	// A server that refuses connections: the permission check cannot ask
	// it, which the aggregator tolerates (it starts anyway).
	server := "https://" + testkit.RefusedAddr(t)
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf("mode: Proxy\naggregatorTransportProtocol: tcp\nsluice:\n  ipfixAddress: 127.0.0.1:0\n  apiAddress: 127.0.0.1:0\n  grpcAddress: \"\"\n  kubeconfig: %s\n", kc)), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	src := a.MetadataSourceForTest()
	if src == nil {
		t.Fatal("no metadata source")
	}
	// Its one Run, ended at once: the aggregator's is then refused.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := src.Run(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "Pod metadata source failed") || !strings.Contains(err.Error(), "more than once") {
			t.Fatalf("run ended with %v, want the metadata source's error", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its metadata source failed")
	}
}
