package aggregator_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
)

// distinctFlows are n records of type ft, each with its own source
// address and port: inter-Node ones that only their source Node reports,
// or intra-Node ones (Aggregate mode exports them at its next tick).
func distinctFlows(n int, ft uint8) []flow.Flow {
	now := time.Now().Truncate(time.Second)
	flows := make([]flow.Flow, n)
	for i := range flows {
		flows[i] = flow.Flow{
			StartTime: now.Add(-10 * time.Second), EndTime: now,
			SourceIP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), byte(i >> 8)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
			SourcePort: uint16(i), DestinationPort: 443, Protocol: 6, FlowType: ft,
			SourcePodNamespace: "web", SourcePodName: "client", SourceNodeName: "node-a",
		}
		if ft == flow.FlowTypeIntraNode {
			flows[i].DestinationPodNamespace, flows[i].DestinationPodName, flows[i].DestinationNodeName = "web", "server", "node-a"
		}
	}
	return flows
}

// exporterConn is an exporter's TCP connection to the aggregator, with
// a small send buffer, so that what the exporter has written is close to
// what the aggregator has read.
func exporterConn(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tc := c.(*net.TCPConn)
	if err := tc.SetWriteBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestSlowCollectorSlowsExporters: a live collector that reads slower than
// the exporter sends (a real TCP IPFIX receiver that pauses after each
// message), behind a Proxy-mode aggregator with a small buffer. The
// aggregator waits for it rather than overwrite what it has not sent
// (sluice.sinkOverflow's default, block): every record reaches the
// collector, none is counted as dropped (with drop, about half are), and
// the exporter is held back by TCP. Proxy mode's two paths (the fast path of encoded records,
// and the general one), and Aggregate mode.
func TestSlowCollectorSlowsExporters(t *testing.T) {
	for _, c := range []struct {
		mode     string
		fastPath bool
	}{{"Proxy", true}, {"Proxy", false}, {"Aggregate", true}} {
		t.Run(fmt.Sprintf("%s/fastPath=%v", c.mode, c.fastPath), func(t *testing.T) { testSlowCollector(t, c.mode, c.fastPath) })
	}
}

func testSlowCollector(t *testing.T, mode string, fastPath bool) {
	const n = 40000
	coll := stubcollector.NewSlow(t, 2*time.Millisecond)
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
recordBufferSize: 256
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  drainTimeout: 5s
  sinkStallTimeout: 20s
  proxy: {fastPath: %v}
  aggregate: {fastPath: %v}
`, mode, coll.Addr(), fastPath, fastPath))
	msgs := ipfixgen.Messages(t, 1, distinctFlows(n, flow.FlowTypeIntraNode))
	conn := exporterConn(t, a.Addrs().IPFIX)
	var atLastWrite atomic.Int64
	written := make(chan error, 1)
	go func() {
		_, err := conn.Write(msgs)
		atLastWrite.Store(int64(coll.Len()))
		written <- err
	}()
	seen, followed := map[uint32]bool{}, 0
	distinct := func() int {
		fs := coll.FlowsSince(followed)
		for i := range fs {
			ip := fs[i].SourceIP.As4()
			seen[uint32(ip[2])<<16|uint32(fs[i].SourcePort)] = true
		}
		followed += len(fs)
		return len(seen)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, fmt.Sprintf("all %d records at the collector, or some dropped", n), func() bool {
		return distinct() == n || metricValue(metrics(t, a.Addrs().API), `sluice_sink_records_dropped_total{reason="buffer-full",sink="flowCollector"}`) > 0
	})
	m := metrics(t, a.Addrs().API)
	waited := metricValue(m, "sluice_pipeline_backpressure_seconds_total")
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	exported, dropped := sinkTotals(t, a.Logs(), "flowCollector")
	t.Logf("%d records (%d bytes) sent; %d at the collector when the exporter's write returned; pipeline waited %.2fs; sink exported %d, dropped %d",
		n, len(msgs), atLastWrite.Load(), waited, exported, dropped)
	if exported != n || dropped != 0 || coll.Len() != n {
		t.Errorf("flowCollector: exported %d, dropped %d, collector received %d; want %d, 0, %d", exported, dropped, coll.Len(), n, n)
	}
	if waited <= 0 {
		t.Errorf("sluice_pipeline_backpressure_seconds_total = %v, want > 0", waited)
	}
	// How many records had reached the collector when the exporter's
	// write returned is logged, not asserted: loopback buffers hold
	// megabytes of the 6 MB sent, and with drop 17,536-23,552 had also
	// arrived by then, while under load 12-15 block saw as few as 5,484.
	// The counts above are what tell block from drop.
	for _, err := range coll.Errors() {
		t.Errorf("collector: %v", err)
	}
}

// hungCollector accepts connections and never reads from them: a
// collector that is up but stuck. Its receive buffers are small, so
// that the sink's writes block soon. close closes it and its
// connections (then connections are refused).
func hungCollector(t *testing.T) (addr string, close func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetReadBuffer(4 << 10)
			select {
			case conns <- c:
			default:
				c.Close()
			}
		}
	}()
	var once atomic.Bool
	close = func() {
		if once.Swap(true) {
			return
		}
		ln.Close()
		for {
			select {
			case c := <-conns:
				c.Close()
			default:
				return
			}
		}
	}
	t.Cleanup(close)
	return ln.Addr().String(), close
}

// TestStuckCollectorDoesNotStallOthers: the flow collector accepts the
// sink's connection and reads nothing. Once the sink has sent nothing for
// sluice.sinkStallTimeout, the aggregator stops waiting for it and
// overwrites what it has not read (counted as dropped, for that sink
// only): the flow logger beside it gets every record, and the exporter
// is not held back past that.
func TestStuckCollectorDoesNotStallOthers(t *testing.T) {
	const n = 100000
	const stall = time.Second
	addr, closeColl := hungCollector(t)
	logPath := filepath.Join(t.TempDir(), "flows.log")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
recordBufferSize: 256
flowCollector: {enable: true, address: "%s:tcp"}
flowLogger: {enable: true, path: %q}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  drainTimeout: 2s
  sinkStallTimeout: %s
`, addr, logPath, stall))
	conn := exporterConn(t, a.Addrs().IPFIX)
	if _, err := conn.Write(ipfixgen.Messages(t, 1, distinctFlows(n, flow.FlowTypeIntraNode))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, fmt.Sprintf("all %d records in the flow log", n), func() bool {
		return metricValue(metrics(t, a.Addrs().API), `sluice_sink_records_exported_total{sink="flowLogger"}`) == n
	})
	waited := metricValue(metrics(t, a.Addrs().API), "sluice_pipeline_backpressure_seconds_total")
	closeColl() // so that the sink's blocked write ends at once
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	logs := a.Logs()
	exported, dropped := sinkTotals(t, logs, "flowLogger")
	cExported, cDropped := sinkTotals(t, logs, "flowCollector")
	t.Logf("pipeline waited %.2fs; flowLogger exported %d, dropped %d; flowCollector (stuck) exported %d, dropped %d",
		waited, exported, dropped, cExported, cDropped)
	if exported != n || dropped != 0 {
		t.Errorf("flowLogger: exported %d, dropped %d; want %d and 0", exported, dropped, n)
	}
	if cDropped == 0 || cExported+cDropped != n {
		t.Errorf("flowCollector (stuck): exported %d, dropped %d; want some dropped and %d in all", cExported, cDropped, n)
	}
	if waited < stall.Seconds()*0.9 {
		t.Errorf("the pipeline waited %.2fs for the stuck sink, less than the stall timeout %s", waited, stall)
	}
	if !strings.Contains(logs, "sent nothing for sluice.sinkStallTimeout") || !strings.Contains(logs, "sink=flowCollector") {
		t.Error("no warning names the stuck sink")
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines != n {
		t.Errorf("flow log has %d lines, want %d", lines, n)
	}
}

// TestShutdownWithBlockedProducer: the pipeline is waiting for a slow
// collector (sluice.sinkStallTimeout far away) when the aggregator is
// stopped. It stops within sluice.drainTimeout and a margin: the drain
// stops the sink that holds back the final flush, that sink gives up the
// write the collector holds back (ipfixconn's StopWrites) and the records
// it holds, and what it did not send is counted.
func TestShutdownWithBlockedProducer(t *testing.T) {
	const n = 40000
	const drain = time.Second
	coll := stubcollector.NewSlow(t, 20*time.Millisecond)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
recordBufferSize: 256
flowCollector: {enable: true, address: "%s:tcp", maxIPFIXMsgSize: 1400}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  drainTimeout: %s
  sinkStallTimeout: 10m
`, coll.Addr(), drain))
	conn := exporterConn(t, a.Addrs().IPFIX)
	msgs := ipfixgen.Messages(t, 1, distinctFlows(n, flow.FlowTypeInterNode))
	go func() { _, _ = conn.Write(msgs) }()
	// Past the first thousand records at the collector, the sockets
	// between it and the aggregator are full: the pipeline waits for it
	// for good.
	testkit.WaitFor(t, "the pipeline waiting for the slow collector", func() bool {
		return coll.Len() >= 1000 && metricValue(metrics(t, a.Addrs().API), "sluice_pipeline_backpressure_waiting") == 1
	})
	start := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	exported, dropped := sinkTotals(t, a.Logs(), "flowCollector")
	t.Logf("stopped in %s (drainTimeout %s); sink exported %d, dropped %d", took, drain, exported, dropped)
	if margin := 5 * time.Second; took > drain+margin {
		t.Errorf("stopping took %s with the pipeline blocked, more than drainTimeout %s + %s", took, drain, margin)
	}
	if dropped == 0 {
		t.Error("nothing counted as dropped, though the slow collector could not have had every record")
	}
	if !strings.Contains(a.Logs(), "records lost at shutdown") {
		t.Error("no line says records were lost at shutdown")
	}
}
