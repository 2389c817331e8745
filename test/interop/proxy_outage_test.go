package interop_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// TestProxyCollectorOutage stops the external collector in the middle of
// a stream and restarts it on the same port. The aggregator (Proxy mode,
// TCP, a record buffer of 64) must reconnect, deliver what its buffer
// held, count what did not fit as dropped, and account for every record:
// delivered + dropped == sent, with no record delivered twice.
func TestProxyCollectorOutage(t *testing.T) {
	const (
		before = 40  // records sent and delivered before the outage
		during = 400 // records sent while the collector is down: far more than the buffer holds
		after  = 30  // records sent once the collector is back
		bufCap = 64
	)
	coll := proxyStartCollector(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
recordBufferSize: %d
flowCollector: {enable: true, address: "%s:tcp", observationDomainID: 5}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
`, bufCap, coll.addr))

	conn, err := net.Dial("tcp", a.Addrs().IPFIX)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(3, tmpl); err != nil {
		t.Fatal(err)
	}
	next := 0
	// send writes n records, numbered on from the last, one message each
	// so that the aggregator sees them as a stream.
	send := func(n int) {
		t.Helper()
		for range n {
			if err := ipfixtest.WriteAntreaV27(enc, 3, tmpl, ipfixtest.SampleFlow(next)); err != nil {
				t.Fatal(err)
			}
			if err := enc.Flush(); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	dropped := func() (float64, string) {
		m := proxyMetrics(t, a.Addrs().API)
		var parts []string
		for k, v := range m {
			if strings.HasPrefix(k, "sluice_sink_records_dropped_total{") && strings.Contains(k, `sink="flowCollector"`) {
				parts = append(parts, fmt.Sprintf("%s %v", k, v))
			}
		}
		sort.Strings(parts)
		return proxyMetricSum(m, "sluice_sink_records_dropped_total", `sink="flowCollector"`), strings.Join(parts, "; ")
	}

	sink := func(name string) float64 {
		return proxyMetricSum(proxyMetrics(t, a.Addrs().API), name, `sink="flowCollector"`)
	}

	send(before)
	proxyWait(t, 10*time.Second, "the records sent before the outage", func() bool { return coll.count() == before })
	attempts := sink("sluice_sink_connection_attempts_total")

	outage := time.Now()
	coll.stop()
	// The sink has noticed the collector is gone (read its FIN) before
	// the next records come.
	proxyWait(t, 10*time.Second, "the sink to notice the outage", func() bool { return sink("sluice_sink_connected") == 0 })
	send(during)
	// At least one failed reconnection attempt: a second attempt starts
	// only once the first has failed.
	proxyWait(t, 35*time.Second, "a failed reconnection attempt", func() bool {
		return sink("sluice_sink_connection_attempts_total") >= attempts+2
	})
	if err := coll.start(); err != nil {
		t.Fatalf("restarting the collector on %s: %v", coll.addr, err)
	}
	proxyWait(t, 35*time.Second, "the aggregator to reconnect", func() bool { return coll.sessionCount() >= 2 })
	t.Logf("collector down for %v", time.Since(outage).Round(time.Millisecond))
	// Let the sink drain what the buffer kept before more records come,
	// or they would push outage records out of the buffer too.
	proxyWait(t, 10*time.Second, "the buffered outage records", func() bool { return coll.count() >= before+min(64, during) })
	send(after)

	sent := before + during + after
	// Wait until every record is accounted for, or nothing has changed
	// for longer than the sink's flush interval (1 s).
	var delivered int
	var drops float64
	stable := time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		d := coll.count()
		dr, _ := dropped()
		if d != delivered || dr != drops {
			stable = time.Now()
		}
		delivered, drops = d, dr
		if float64(delivered)+drops >= float64(sent) || time.Since(stable) > 1500*time.Millisecond {
			break
		}
	}
	// Let anything still in flight land: the collector has read every
	// record the sink counts as sent.
	exported := sink("sluice_sink_records_exported_total")
	proxyWait(t, 10*time.Second, "the collector to read what the sink sent", func() bool { return float64(coll.count()) >= exported })
	delivered = coll.count()
	drops, detail := dropped()
	m := proxyMetrics(t, a.Addrs().API)
	exported = proxyMetricSum(m, "sluice_sink_records_exported_total", `sink="flowCollector"`)
	t.Logf("sent %d, delivered %d, exported (per the sink) %v, dropped %v: %s", sent, delivered, exported, drops, detail)

	if got := proxyMetricSum(m, "sluice_collector_records_received_total", `exporter="127.0.0.1"`, `transport="tcp"`); got != float64(sent) {
		t.Errorf("the aggregator received %v records, want %d", got, sent)
	}

	// Which records arrived: each at most once; all of those sent before
	// the outage and after the reconnection; of those sent during it, at
	// least what the buffer holds.
	if errs := coll.errList(); len(errs) > 0 {
		t.Errorf("collector stub: %v", errs)
	}
	portKey := proxyKey(t, "sourceTransportPort")
	seen := map[int]int{}
	for _, r := range coll.records() {
		i := int(binary.BigEndian.Uint16(r.Raw[portKey])) - int(ipfixtest.SampleFlow(0).SrcPort)
		if i < 0 || i >= sent {
			t.Errorf("record with source port %x was never sent", r.Raw[portKey])
			continue
		}
		seen[i]++
	}
	var dup, missBefore, missAfter, duringGot int
	for i := range sent {
		switch {
		case seen[i] > 1:
			dup++
		case seen[i] == 0 && i < before:
			missBefore++
		case seen[i] == 0 && i >= before+during:
			missAfter++
		case seen[i] == 1 && i >= before && i < before+during:
			duringGot++
		}
	}
	if dup > 0 {
		t.Errorf("%d records delivered more than once", dup)
	}
	if missBefore > 0 || missAfter > 0 {
		t.Errorf("missing %d records sent before the outage and %d sent after the reconnection", missBefore, missAfter)
	}

	// A sink that writes into a connection its peer has closed loses that
	// write yet counts it exported; the signature is exported > delivered.
	if exported > float64(delivered) {
		t.Errorf("%v records written after the collector closed were counted exported but never delivered; "+
			"delivered %d + dropped %v != sent %d; %d of the %d records sent during the outage delivered",
			exported-float64(delivered), delivered, drops, sent, duringGot, during)
		return
	}
	if float64(delivered)+drops != float64(sent) {
		t.Errorf("delivered %d + dropped %v != sent %d: %v records unaccounted for", delivered, drops, sent, float64(sent)-float64(delivered)-drops)
	}
	if exported != float64(delivered) {
		t.Errorf("the sink counts %v records exported, the collector received %d", exported, delivered)
	}
	if duringGot < bufCap {
		t.Errorf("only %d of the %d records sent during the outage were delivered after it; the buffer holds %d", duringGot, during, bufCap)
	}
	if lost := proxyMetricSum(m, "sluice_sink_records_dropped_total", `sink="flowCollector"`, `reason="buffer-full"`); lost == 0 {
		t.Errorf("no buffer-full drop counted, though %d records were sent into a buffer of %d while the collector was down", during, bufCap)
	}
}
