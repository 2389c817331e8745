package flowproto_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// exporterShaped is flowtest.Full without what exporters never send
// (labels, L7 values, aggregation results), with each field present or
// not at random, and some values at their extremes.
func exporterShaped(r *rand.Rand, i int) *flow.Flow {
	f := flowtest.Full(i, false)
	f.Present.Clear(flow.SourcePodLabels)
	f.Present.Clear(flow.DestinationPodLabels)
	f.Present.Clear(flow.AppProtocolName)
	f.Present.Clear(flow.HTTPVals)
	for fl := range flow.ClusterID + 1 {
		if r.IntN(3) == 0 {
			f.Present.Clear(fl)
		}
	}
	switch r.IntN(6) {
	case 0:
		f.SourceIP, f.DestinationIP = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	case 1:
		f.Stats = flow.Stats{PacketTotalCount: 1 << 63, OctetTotalCount: ^uint64(0)}
	case 2:
		f.StartTime = time.Unix(-5, 7) // before 1970: negative seconds
	case 3:
		f.Origin = flow.Origin{}
	case 4:
		f.TCPState = "" // present and empty: an empty TCP message
	case 5:
		f.SourcePodName = string(make([]byte, 300)) // a two-octet length
	}
	return f
}

func TestAppendFlowMatchesFromFlow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		f := exporterShaped(r, i)
		if i%50 == 0 { // the fallback path too
			f = flowtest.Full(i, i%100 == 0)
		}
		want, err := flowproto.FromFlow(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := flowproto.AppendFlow([]byte("prefix"), f)
		if err != nil {
			t.Fatal(err)
		}
		if string(b[:6]) != "prefix" {
			t.Fatal("AppendFlow changed what was there")
		}
		var got flowpb.Flow
		if err := proto.Unmarshal(b[6:], &got); err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		if d := cmp.Diff(want, &got, protocmp.Transform()); d != "" {
			t.Fatalf("flow %d (-FromFlow +AppendFlow):\n%s", i, d)
		}
	}
}

func TestAppendExportRequest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var flows []flow.Flow
	for i := range 300 {
		flows = append(flows, *exporterShaped(r, i))
	}
	flows[7].SourcePodLabels = "not json" // no Protobuf form: left out
	flows[7].Present.Set(flow.SourcePodLabels)
	var bad []int
	b := flowproto.AppendExportRequest(nil, flows, func(f *flow.Flow, err error) {
		if err == nil || errors.Unwrap(err) == nil {
			t.Errorf("bad record without its error: %v", err)
		}
		bad = append(bad, int(f.SourcePort))
	})
	var req flowpb.ExportRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	if len(req.Flows) != len(flows)-1 || len(bad) != 1 || bad[0] != int(flows[7].SourcePort) {
		t.Fatalf("%d flows, bad %v; want %d and one", len(req.Flows), bad, len(flows)-1)
	}
	j := 0
	for i := range flows {
		if i == 7 {
			continue
		}
		want, err := flowproto.FromFlow(&flows[i])
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, req.Flows[j], protocmp.Transform()); d != "" {
			t.Fatalf("flow %d:\n%s", i, d)
		}
		j++
	}
}

func BenchmarkEncode(b *testing.B) {
	// Every field an exporter sends is set.
	flows := make([]flow.Flow, 100)
	for i := range flows {
		flows[i] = *flowtest.Full(i, false)
		for _, fl := range []flow.Field{flow.SourcePodLabels, flow.DestinationPodLabels, flow.AppProtocolName, flow.HTTPVals} {
			flows[i].Present.Clear(fl)
		}
	}
	b.Run("FromFlow+Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := &flowpb.ExportRequest{}
			for i := range flows {
				p, err := flowproto.FromFlow(&flows[i])
				if err != nil {
					b.Fatal(err)
				}
				req.Flows = append(req.Flows, p)
			}
			if _, err := proto.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendExportRequest", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = flowproto.AppendExportRequest(buf[:0], flows, func(*flow.Flow, error) { b.Fatal("bad") })
		}
	})
}

// TestAppendFlowAggregateRecords: what the aggregator exports (labels,
// L7 values, the aggregation, an exporter's address) is written directly,
// and reads back as FromFlow's message; labels in every JSON shape,
// plain or not, give FromFlow's result or its error.
func TestAppendFlowAggregateRecords(t *testing.T) {
	labels := []string{
		`{"app":"client","tier":"front"}`, `{}`, ` { "a" : "b" , "c":"" } `, `{"":""}`, `{"a":"1","a":"2"}`,
		`{"k":"välue ✓"}`, `{"esc":"a\"b"}`, `{"u":"\u00e9\ud83d\ude00"}`, `{"slash":"a\/b"}`, `null`, ` null `,
		`{"a":null}`, `{"bad utf8":"` + "\xff" + `"}`, `{"ctl":"` + "\x01" + `"}`, `not json`, `{"a":1}`, `{"a":"b"`,
		`{"a":"b"} x`, `{"a":"b",}`, `[]`, `{"a" "b"}`, `"s"`, "{\n\t\"a\":\r\"b\"}", `{"a":"` + string(make([]byte, 200)) + `"}`,
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 3000 {
		f := flowtest.Full(i, i%3 != 0)
		f.Origin.Exporter = netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
		f.Origin.ObservationDomainID = uint32(i)
		if i%7 == 0 {
			f.Origin.Exporter = netip.MustParseAddr("fe80::1%" + string(make([]byte, 150))) // a long text form
		}
		f.SourcePodLabels = labels[r.IntN(len(labels))]
		f.DestinationPodLabels = labels[r.IntN(len(labels))]
		for fl := range flow.ClusterID + 1 {
			if r.IntN(4) == 0 {
				f.Present.Clear(fl)
			}
		}
		if f.Aggregation != nil && i%5 == 0 {
			f.Aggregation.EndFromSource = time.Time{}
			f.Aggregation.StatsFromDestination = flow.Stats{}
		}
		want, werr := flowproto.FromFlow(f)
		var wantBytes []byte
		if werr == nil {
			// Marshalling is where invalid UTF-8 in a map fails.
			wantBytes, werr = proto.Marshal(want)
		}
		b, err := flowproto.AppendFlow([]byte("prefix"), f)
		if (err != nil) != (werr != nil) {
			t.Fatalf("flow %d (labels %q, %q): error %v, FromFlow's %v", i, f.SourcePodLabels, f.DestinationPodLabels, err, werr)
		}
		if string(b[:6]) != "prefix" {
			t.Fatal("AppendFlow changed what was there")
		}
		if err != nil {
			if len(b) != 6 {
				t.Fatalf("flow %d: %d octets left after an error", i, len(b)-6)
			}
			continue
		}
		var got, again flowpb.Flow
		if err := proto.Unmarshal(b[6:], &got); err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		if err := proto.Unmarshal(wantBytes, &again); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(&again, &got, protocmp.Transform()); d != "" {
			t.Fatalf("flow %d (labels %q, %q) (-FromFlow +AppendFlow):\n%s", i, f.SourcePodLabels, f.DestinationPodLabels, d)
		}
	}
}

// TestAppendFlowAllocatesNothing: a record of Aggregate mode, labels and
// aggregation included, is written without an allocation.
func TestAppendFlowAllocatesNothing(t *testing.T) {
	f := flowtest.Full(3, true)
	f.Origin.Exporter = netip.MustParseAddr("192.0.2.9")
	b := make([]byte, 0, 4096)
	var err error
	if n := testing.AllocsPerRun(100, func() { b, err = flowproto.AppendFlowField(b[:0], 1, f) }); n != 0 || err != nil {
		t.Fatalf("%v allocations (err %v)", n, err)
	}
}
