package aggregator_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
	"sluice/internal/testkit/testagg"
)

// sendIPFIX sends n Antrea v2.7 records over TCP to addr: inter-Node
// flows that only their source Node reports (distinct source ports).
func sendIPFIX(t *testing.T, addr string, n int) {
	t.Helper()
	flows := make([]flow.Flow, n)
	for i := range flows {
		flows[i] = flow.Flow{
			StartTime: time.Now().Add(-10 * time.Second).Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
			SourceIP: netip.AddrFrom4([4]byte{10, 244, 1, byte(i % 250)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
			SourcePort: uint16(10000 + i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeInterNode,
			SourcePodNamespace: "web", SourcePodName: "client", SourceNodeName: "node-a",
		}
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(ipfixgen.Messages(t, 1, flows)); err != nil {
		t.Fatal(err)
	}
}

// sinkTotals reads the "sink totals" line the aggregator logs for sink
// when it stops: records exported and dropped (all reasons).
func sinkTotals(t *testing.T, logs, sink string) (exported, dropped int) {
	t.Helper()
	for line := range strings.SplitSeq(logs, "\n") {
		if !strings.Contains(line, `msg="sink totals"`) || !strings.Contains(line, "sink="+sink+" ") {
			continue
		}
		kv := regexp.MustCompile(`(exported|dropped_[a-z-]+)=(\d+)`).FindAllStringSubmatch(line, -1)
		for _, m := range kv {
			v, _ := strconv.Atoi(m[2])
			if m[1] == "exported" {
				exported = v
			} else {
				dropped += v
			}
		}
		return exported, dropped
	}
	t.Fatalf("no sink totals for %s in the log:\n%s", sink, logs)
	return 0, 0
}

// TestShutdownLossIsCounted: an aggregator whose flow collector is down
// stops with records it could not send. Every record received is, for each
// sink, exported or counted as dropped (the collector's: when the drain
// timeout passes), and the final log line says so per sink, since the
// metrics end with the process. In Aggregate mode a flow log beside it
// gets every record, and its file holds exactly what it counts.
func TestShutdownLossIsCounted(t *testing.T) {
	for _, mode := range []string{"Aggregate", "Proxy"} {
		t.Run(mode, func(t *testing.T) { testShutdownLoss(t, mode) })
	}
}

func testShutdownLoss(t *testing.T, mode string) {
	downAddr := testkit.RefusedAddr(t) // the collector sink never connects
	logPath := filepath.Join(t.TempDir(), "flows.log")
	flowLogger := ""
	if mode == "Aggregate" {
		flowLogger = fmt.Sprintf("flowLogger: {enable: true, path: %q}", logPath)
	}
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
recordBufferSize: 64
flowCollector: {enable: true, address: "%s:tcp"}
%s
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", drainTimeout: 1s, aggregate: {exportOneSided: true}}
`, mode, downAddr, flowLogger))
	const n = 2000
	sendIPFIX(t, a.Addrs().IPFIX, n)
	testkit.WaitFor(t, "all records received", func() bool {
		return strings.Contains(metrics(t, a.Addrs().API), fmt.Sprintf(`sluice_collector_records_received_total{exporter="127.0.0.1",transport="tcp"} %d`, n))
	})
	stopped := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(stopped); d > 1*time.Second+testkit.WaitTimeout {
		t.Errorf("stop took %v with a 1s drain timeout", d)
	}
	logs := a.Logs()
	exported, dropped := sinkTotals(t, logs, "flowCollector")
	if exported != 0 || dropped != n {
		t.Errorf("flowCollector (down): exported %d, dropped %d; want 0 and %d", exported, dropped, n)
	}
	if !strings.Contains(logs, "records lost at shutdown") {
		t.Errorf("no line says records were lost at shutdown:\n%s", logs)
	}
	if flowLogger == "" {
		return
	}
	exported, dropped = sinkTotals(t, logs, "flowLogger")
	if exported != n || dropped != 0 {
		t.Errorf("flowLogger: exported %d, dropped %d; want %d and 0", exported, dropped, n)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines != exported {
		t.Errorf("flow log has %d lines, its sink counts %d exported", lines, exported)
	}
}
