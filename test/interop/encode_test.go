package interop_test

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"sluice/ipfix"
)

// exportTime stamps every message our encoder builds in these tests.
var exportTime = time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)

// antreaFlow is a flow record with the Antrea Kubernetes context our
// exporter adds.
type antreaFlow struct {
	flowRecord
	SrcPod, SrcNamespace, DstPod string
}

// flowElements is the template our encoder tests export: an IPv4
// 5-tuple, counters, millisecond times, and Antrea string elements
// (enterprise 56506, variable length).
var flowElements = []string{
	"sourceIPv4Address", "destinationIPv4Address",
	"sourceTransportPort", "destinationTransportPort", "protocolIdentifier",
	"octetDeltaCount", "packetDeltaCount",
	"flowStartMilliseconds", "flowEndMilliseconds",
	"sourcePodName", "sourcePodNamespace", "destinationPodName",
}

const flowTemplateID = 256

// Observation domain of the encoder tests' messages.
const testDomain = 1

func flowTemplate(t testing.TB) *ipfix.Template {
	t.Helper()
	reg := ipfix.DefaultRegistry()
	elems := make([]*ipfix.InfoElement, len(flowElements))
	for i, name := range flowElements {
		ie, ok := reg.ByName(name)
		if !ok {
			t.Fatalf("registry has no element %q", name)
		}
		elems[i] = ie
	}
	tmpl, err := ipfix.TemplateOf(flowTemplateID, elems...)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// sampleFlows returns deterministic flows with values that exercise the
// whole width of each field: a counter above 2^32, ports above 2^15, TCP
// and UDP, times with milliseconds, and strings of several lengths
// (including one that needs the 3-octet length prefix).
func sampleFlows() []antreaFlow {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	long := make([]byte, 300)
	for i := range long {
		long[i] = byte('a' + i%26)
	}
	return []antreaFlow{
		{
			flowRecord: flowRecord{
				Key:     flowKey{netip.MustParseAddr("10.244.1.10"), netip.MustParseAddr("10.244.2.20"), 40000, 80, 6},
				Packets: 10, Octets: 1500,
				Start: base.Add(123 * time.Millisecond), End: base.Add(4567 * time.Millisecond),
			},
			SrcPod: "client-7d9f", SrcNamespace: "default", DstPod: "server-0",
		},
		{
			flowRecord: flowRecord{
				Key:     flowKey{netip.MustParseAddr("10.244.2.20"), netip.MustParseAddr("10.244.1.10"), 80, 40000, 6},
				Packets: 9, Octets: 8_000_000_000,
				Start: base.Add(124 * time.Millisecond), End: base.Add(4566 * time.Millisecond),
			},
			SrcPod: "server-0", SrcNamespace: "default", DstPod: "client-7d9f",
		},
		{
			flowRecord: flowRecord{
				Key:     flowKey{netip.MustParseAddr("192.168.77.3"), netip.MustParseAddr("10.96.0.10"), 53124, 53, 17},
				Packets: 1, Octets: 73,
				Start: base.Add(2 * time.Second), End: base.Add(2*time.Second + 999*time.Millisecond),
			},
			SrcPod: "", SrcNamespace: "kube-system", DstPod: string(long),
		},
		{
			flowRecord: flowRecord{
				Key:     flowKey{netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("172.16.255.254"), 65535, 33000, 6},
				Packets: 4_000_000, Octets: 5_000_000_000_000,
				Start: base.Add(59 * time.Second), End: base.Add(59*time.Second + 1*time.Millisecond),
			},
			SrcPod: "pod-ünïcode", SrcNamespace: "ns-2", DstPod: "x",
		},
	}
}

// encodeFlows encodes flows as two messages: the template with the first
// half of the flows, then the rest without a template (as an exporter
// sends data between template refreshes).
func encodeFlows(t testing.TB, flows []antreaFlow) [][]byte {
	t.Helper()
	tmpl := flowTemplate(t)
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{Now: func() time.Time { return exportTime }},
		func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(testDomain, tmpl); err != nil {
		t.Fatal(err)
	}
	for i, f := range flows {
		if i == len(flows)/2 {
			if err := enc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		err := enc.Begin(testDomain, tmpl).
			Addr(f.Key.Src).Addr(f.Key.Dst).
			Uint(uint64(f.Key.SrcPort)).Uint(uint64(f.Key.DstPort)).Uint(uint64(f.Key.Proto)).
			Uint(f.Octets).Uint(f.Packets).
			Time(f.Start).Time(f.End).
			String(f.SrcPod).String(f.SrcNamespace).String(f.DstPod).
			End()
		if err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 {
		t.Fatalf("encoder produced %d messages, want 2", len(msgs))
	}
	// Our own decoder must read back what the peers are about to read.
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	dec := ipfix.NewDecoder(sess)
	n := 0
	for i, m := range msgs {
		dm, err := decodeMessage(dec, m, time.Now())
		if err != nil {
			t.Fatalf("our decoder, message %d: %v", i, err)
		}
		for _, r := range dm.records {
			if n >= len(flows) || !r.equal(flows[n].flowRecord) {
				t.Fatalf("our decoder, record %d: %v", n, r)
			}
			n++
		}
	}
	if n != len(flows) {
		t.Fatalf("our decoder read %d records, want %d", n, len(flows))
	}
	return msgs
}
