package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/proxy"
	"sluice/ring"
)

// flowCase is a flow record for ForwardFlow, made afresh for each use.
type flowCase struct {
	name string
	make func() *flow.Flow
	// passed: it has something to pass through (taken only without
	// pass-through).
	passed bool
}

func flowCases() []flowCase {
	ip := netip.MustParseAddr
	return []flowCase{
		{name: "full", make: func() *flow.Flow { f := flowtest.Full(3, false); clearL7(f); return f }},
		{name: "full with L7 elements", passed: true, make: func() *flow.Flow { return flowtest.Full(4, false) }},
		{name: "IPv6, both Pods in the store", make: func() *flow.Flow {
			f := flowtest.Full(5, false)
			clearL7(f)
			f.SourceIP, f.DestinationIP = ip("fd00::5"), ip("fd00::7")
			f.DestinationClusterIP, f.DestinationServiceIP, f.ProxySnatIP, f.EgressIP = ip("fd00::100"), ip("fd00::101"), ip("fd00::102"), ip("fd00::103")
			return f
		}},
		{name: "inter-Node half naming its source only", make: func() *flow.Flow {
			f := flowtest.Full(6, false)
			clearL7(f)
			f.SourceIP, f.DestinationIP = ip("10.244.1.5"), ip("10.244.2.7")
			f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = "", "", ""
			f.SourcePodLabels, f.DestinationPodLabels = "", ""
			return f
		}},
		{name: "to an external address", make: func() *flow.Flow {
			f := flowtest.Full(7, false)
			clearL7(f)
			f.FlowType = flow.FlowTypeToExternal
			f.DestinationIP = ip("198.51.100.9")
			f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = "", "", ""
			return f
		}},
		{name: "an element of a newer agent", passed: true, make: func() *flow.Flow {
			f := flowtest.Full(8, false)
			clearL7(f)
			f.Unknown = []flow.Element{{EnterpriseID: 56506, ID: 999, Length: 4, Value: []byte{1, 2, 3, 4}}}
			return f
		}},
	}
}

// clearL7 removes the two L7 elements of agents v1.15 to v2.5, which the
// export template carries only as passed-through elements.
func clearL7(f *flow.Flow) {
	f.AppProtocolName, f.HTTPVals = "", ""
	f.Present.Clear(flow.AppProtocolName)
	f.Present.Clear(flow.HTTPVals)
}

// newRecordEncoder is an encoder that only builds records (EncodeRecord).
func newRecordEncoder(t *testing.T) *ipfix.Encoder {
	t.Helper()
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// normalWrite is what Run writes for f: Process, then the Exporter.
func normalWrite(t *testing.T, p *proxy.Proxy, ex *ipfixmap.Exporter, enc *ipfix.Encoder, f *flow.Flow) ipfix.EncodedRecord {
	t.Helper()
	p.Process(f)
	tm, _, err := ex.Template(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := enc.EncodeRecord(tm, func(rb ipfix.RecordBuilder) error { return ex.Write(rb, tm, f) })
	if err != nil {
		t.Fatal(err)
	}
	return ipfix.EncodedRecord{Template: tm, Data: bytes.Clone(data)}
}

// TestForwardFlowMatchesRun: a session's forwarder writes a flow record,
// on the caller's goroutine, octet for octet as Run writes it, for every
// kind of record it takes; those with elements to pass through (with
// pass-through on) it declines, leaving them as they were.
func TestForwardFlowMatchesRun(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, passThrough := range []bool{true, false} {
		for _, labels := range []bool{true, false} {
			names := labels // names off, labels off: the smallest export
			t.Run(fmt.Sprintf("passThrough=%v/names,labels=%v", passThrough, labels), func(t *testing.T) {
				newEx := func() *ipfixmap.Exporter {
					ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: names, Proxy: true}, passThrough, ipfix.MinDataSetID)
					if err != nil {
						t.Fatal(err)
					}
					return ex
				}
				opts := proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore(), ClusterID: "c", PodLabels: labels})}
				fw, err := proxy.NewForwarding(proxy.New(opts), table, newEx())
				if err != nil || fw == nil {
					t.Fatal(fw, err)
				}
				ff, ok := fw.NewForwarder().(flow.FlowForwarder)
				if !ok {
					t.Fatal("a session's forwarder is not a FlowForwarder")
				}
				p, ex, enc := proxy.New(opts), newEx(), newRecordEncoder(t)
				arena := make([]byte, 0, 64<<10) // room for all: each record lands where it was appended
				var out []ipfix.EncodedRecord
				var want []ipfix.EncodedRecord
				for _, c := range flowCases() {
					f := c.make()
					before := fmt.Sprintf("%+v", *f)
					var took bool
					arena, out, took, err = ff.ForwardFlow(f, arena, out)
					if err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					if wantTook := !(c.passed && passThrough); took != wantTook {
						t.Fatalf("%s: taken %v, want %v", c.name, took, wantTook)
					}
					if !took {
						if after := fmt.Sprintf("%+v", *f); after != before {
							t.Fatalf("%s: a declined record changed:\n%s\n%s", c.name, before, after)
						}
						continue
					}
					want = append(want, normalWrite(t, p, ex, enc, c.make()))
				}
				if len(out) != len(want) {
					t.Fatalf("%d records, want %d", len(out), len(want))
				}
				at := 0
				for i, r := range out {
					if !bytes.Equal(r.Data, want[i].Data) {
						t.Errorf("record %d:\n got % x\nwant % x", i, r.Data, want[i].Data)
					}
					if r.Template.ID != want[i].Template.ID {
						t.Errorf("record %d: template %d, want %d", i, r.Template.ID, want[i].Template.ID)
					}
					if &r.Data[0] != &arena[at] {
						t.Errorf("record %d is not in the arena where it was appended", i)
					}
					at += len(r.Data)
				}
				if at != len(arena) {
					t.Errorf("the arena holds %d octets, the records %d", len(arena), at)
				}
			})
		}
	}
}

// TestForwardFlowEncodeError: a record enriched but too large to write is
// taken and dropped with an error (the caller hands it to Run, which
// reports it); the arena and the records before it are as they were.
// Run counts what a gRPC stream forwarded as rebuilt.
func TestForwardFlowEncodeError(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, false, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	m := proxy.NewMetrics(prometheus.NewRegistry())
	fw, err := proxy.NewForwarding(proxy.New(proxy.Options{Metrics: m}), table, ex)
	if err != nil || fw == nil {
		t.Fatal(fw, err)
	}
	ff := fw.NewForwarder().(flow.FlowForwarder)
	arena, out, took, err := ff.ForwardFlow(flowtest.Full(1, false), nil, nil)
	if err != nil || !took || len(out) != 1 {
		t.Fatalf("%v %v %d", took, err, len(out))
	}
	big := flowtest.Full(2, false)
	big.SourcePodName = strings.Repeat("x", 70000)
	arena2, out2, took, err := ff.ForwardFlow(big, arena, out)
	if !took || err == nil {
		t.Fatalf("an unwritable record: taken %v, err %v", took, err)
	}
	if len(out2) != 1 || len(arena2) != len(arena) || !bytes.Equal(out2[0].Data, out[0].Data) {
		t.Fatalf("the failed record left %d records, %d octets (had %d)", len(out2), len(arena2), len(arena))
	}

	// Run reports the error and counts both records as rebuilt.
	in := make(chan flow.Batch)
	buf := ring.New[ipfix.EncodedRecord](16)
	c := buf.Consumer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 4)
	go fw.Run(ctx, in, buf, func(err error) { errs <- err })
	in <- flow.Batch{Encoded: out2, Rebuilt: 1, EncodeErrs: []error{err}}
	if got := <-errs; !errors.Is(got, err) {
		t.Errorf("Run reported %v, want %v", got, err)
	}
	recs, ok := c.Next(ctx, nil, 1)
	if !ok || len(recs) != 1 || !bytes.Equal(recs[0].Data, out[0].Data) {
		t.Fatalf("Run handed on %d records", len(recs))
	}
	if r, cp := testutil.ToFloat64(m.Records.WithLabelValues("rebuilt")), testutil.ToFloat64(m.Records.WithLabelValues("copied")); r != 2 || cp != 0 {
		t.Errorf("rebuilt %v copied %v, want 2 and 0", r, cp)
	}
}
