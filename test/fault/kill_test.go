// Package fault is the fault suite: Sluice run as separate processes (the
// built binary) on loopback, faults injected for real (signals, servers
// going away), and every record sent either delivered to an independent
// receiver or counted as lost by a metric. See docs/reliability.md.
package fault

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"sluice/certs"
	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
)

// recordKey tells records apart: a connection's successive records differ
// in their counters.
type recordKey struct {
	src, dst         netip.Addr
	sport, dport     uint16
	proto, endReason uint8
	packets, octets  uint64
	start, end       int64
}

func keyOf(f *flow.Flow) recordKey {
	return recordKey{f.SourceIP, f.DestinationIP, f.SourcePort, f.DestinationPort, f.Protocol, f.EndReason,
		f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.StartTime.UnixMilli(), f.EndTime.UnixMilli()}
}

// pipeline is an aggregator (Proxy mode, IPFIX out to a stub collector)
// that can be killed and started again on the same addresses.
type pipeline struct {
	t       *testing.T
	coll    *stubcollector.Collector
	config  string
	certDir string
	ipfix   string // the aggregator's IPFIX address (TCP)
	grpc    string
	api     string
	runs    int
	// metrics are the exporters' metrics addresses by name.
	metrics map[string]string
}

// exporterMetrics returns the metrics address of the exporter name.
func (p *pipeline) exporterMetrics(name string) string {
	if p.metrics == nil {
		p.metrics = map[string]string{}
	}
	if p.metrics[name] == "" {
		p.metrics[name] = freeAddr(p.t, "tcp")
	}
	return p.metrics[name]
}

// newPipeline prepares an aggregator whose IPFIX collector takes transport
// (tcp, tls or udp).
func newPipeline(t *testing.T, transport, drainTimeout string) *pipeline {
	return newPipelineBuffer(t, transport, drainTimeout, 65536)
}

// newPipelineBuffer is newPipeline with the aggregator's record buffer of
// the given size.
func newPipelineBuffer(t *testing.T, transport, drainTimeout string, buffer int) *pipeline {
	dir := t.TempDir()
	network := "tcp"
	if transport == "udp" {
		network = "udp"
	}
	p := &pipeline{t: t, coll: stubcollector.New(t), certDir: filepath.Join(dir, "certs"),
		ipfix: freeAddr(t, network), grpc: freeAddr(t, "tcp"), api: freeAddr(t, "tcp")}
	if _, err := certs.Ensure(p.certDir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	p.config = filepath.Join(dir, "aggregator.yaml")
	writeFile(t, p.config, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: %s
recordBufferSize: %d
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  ipfixAddress: %q
  grpcAddress: %q
  apiAddress: %q
  drainTimeout: %s
  tls: {certDir: %s}
`, transport, buffer, p.coll.Addr(), p.ipfix, p.grpc, p.api, drainTimeout, p.certDir))
	return p
}

// startAggregator starts the aggregator and waits until it runs.
func (p *pipeline) startAggregator() *proc {
	p.runs++
	a := start(p.t, fmt.Sprintf("aggregator#%d", p.runs), "aggregator", "--config", p.config)
	a.waitLine(p.t, "aggregator running", nil)
	return a
}

// startExporter starts an exporter of synthetic connections over proto
// ("tcp", "tls", "udp" or "grpc") at rate new connections per second.
func (p *pipeline) startExporter(name, proto string, rate int) *proc {
	addr := p.ipfix
	if proto == "grpc" {
		addr = p.grpc
	}
	args := []string{"exporter", "--source", "synthetic", "--node", name,
		"--pod-cidr", "10.244.1.0/24", "--rate", fmt.Sprint(rate),
		"--poll-interval", "1s", "--active-timeout", "2s", "--idle-timeout", "2s",
		"--collector", addr + ":" + proto, "--metrics-address", p.exporterMetrics(name)}
	if proto == "tls" || proto == "grpc" {
		args = append(args, "--tls-cert-dir", p.certDir)
	}
	return start(p.t, name, args...)
}

// TestAggregatorKilled is scenario 1: an aggregator killed (SIGKILL)
// mid-stream and started again 5 s later. Exporters keep their records
// while it is down and deliver them after. Over gRPC nothing is lost
// (records the killed process had not written on are not confirmed, and
// are sent again: duplicates, at most the resent count). Over IPFIX/TCP, which has no
// acknowledgement, what the killed process and the socket buffers held is
// the one window of loss: measured, and bounded here by what the exporter
// wrote in the last seconds before the kill.
func TestAggregatorKilled(t *testing.T) {
	for _, proto := range []string{"grpc", "tcp", "tls", "udp"} {
		t.Run(proto, func(t *testing.T) { testAggregatorKilled(t, proto) })
	}
}

func testAggregatorKilled(t *testing.T, proto string) {
	const rate = 400 // new connections per second
	transport := proto
	if proto == "grpc" {
		transport = "tcp"
	}
	p := newPipeline(t, transport, "10s")
	agg := p.startAggregator()
	exp := p.startExporter("node-1", proto, rate)
	testkit.WaitFor(t, "records at the collector", func() bool { return p.coll.Len() >= 2000 })

	atKill := p.coll.Len()
	killed := time.Now()
	agg.signal(t, syscall.SIGKILL)
	// The fault: the aggregator stays down for 5 s (the scenario's
	// outage, not a wait for anything).
	time.Sleep(5 * time.Second)
	// What the exporter wrote to the killed aggregator: with nobody
	// listening it can write nothing more until the restart. Only those
	// not at the collector at the kill can be lost.
	exportedTotal := regexp.MustCompile(`(?m)^sluice_exporter_records_exported_total (\S+)$`)
	writtenAtKill := metric(t, p.metrics["node-1"], exportedTotal)
	if writtenAtKill < 0 {
		t.Fatal("cannot read the exporter's metrics")
	}
	inFlight := writtenAtKill - atKill
	agg = p.startAggregator()
	restarted := time.Since(killed)
	testkit.WaitFor(t, "records after the restart", func() bool { return p.coll.Len() >= atKill+4000 })

	exp.signal(t, syscall.SIGTERM)
	e := exp.line("exporter stopped", nil)
	if e == nil {
		t.Fatal("the exporter did not log its totals")
	}
	// Every record the exporter wrote has reached the second aggregator's
	// sink or been lost before; let the sink finish, then stop it.
	agg.signal(t, syscall.SIGTERM)
	s := agg.line("sink totals", map[string]any{"sink": "flowCollector"})
	if s == nil {
		t.Fatal("the aggregator did not log its sink totals")
	}
	exported, resent := num(t, e, "exported"), num(t, e, "resent")
	produced, unsent := num(t, e, "records"), num(t, e, "unsent")
	expDropped := num(t, e, "dropped_buffer-full") + num(t, e, "dropped_encode-error")
	aggDropped := num(t, s, "dropped_buffer-full") + num(t, s, "dropped_send-error") + num(t, s, "dropped_encode-error") + num(t, s, "dropped_shutdown")

	perSecond := float64(exported-resent) / time.Since(killed.Add(-time.Duration(float64(atKill)/float64(rate)*float64(time.Second)))).Seconds()
	// The window: what was in flight at the kill. UDP has no connection
	// to lose: what is sent while the aggregator is down is lost too,
	// bounded by the outage.
	bound := inFlight
	switch proto {
	case "grpc":
		// Proxy mode confirms a stream only once its records are
		// written on: nothing confirmed can be lost with the process.
		bound = 0
	case "udp":
		bound += int((restarted.Seconds() + 2) * perSecond)
	}
	// Both aggregators are gone (one killed, one stopped): once the
	// collector has read their connections to the end, nothing more can
	// arrive, and one snapshot gives the records delivered and the
	// duplicates among them.
	received, delivered := collected(t, p.coll)
	duplicates := received - delivered
	if errs := p.coll.Errors(); len(errs) > 0 {
		t.Errorf("the collector saw errors: %v", errs)
	}
	if aggDropped != 0 || unsent != 0 {
		t.Errorf("counted losses: exporter unsent %d, aggregator sink dropped %d", unsent, aggDropped)
	}
	lost := produced - expDropped - delivered
	t.Logf("%s: produced %d, exporter wrote %d (resent %d, dropped %d), delivered %d distinct (%d duplicates), lost %d; %d at the collector when killed, %d written and not there yet, back after %v",
		proto, produced, exported, resent, expDropped, delivered, duplicates, lost, atKill, inFlight, restarted.Round(time.Millisecond))
	if lost > bound {
		t.Errorf("%s lost %d records, more than its window (%d; %d in flight when the aggregator was killed)", proto, lost, bound, inFlight)
	}
	if perSecond > 0 {
		t.Logf("%s: loss window %.0f ms of traffic at %.0f records/s", proto, float64(lost)/perSecond*1000, perSecond)
	}
	switch proto {
	case "grpc":
		// What the exporter keeps until confirmed cannot be lost, and
		// the aggregator confirms only what it wrote on (checked above
		// with a window of 0).
		if duplicates > resent {
			t.Errorf("%d duplicates, more than the %d records sent again", duplicates, resent)
		}
	default:
		// Over IPFIX a record is written once.
		if duplicates != 0 {
			t.Errorf("%d duplicates over IPFIX/%s", duplicates, proto)
		}
		if lost < 0 {
			t.Errorf("more records delivered (%d) than produced (%d)", delivered, produced-expDropped)
		}
	}
}
