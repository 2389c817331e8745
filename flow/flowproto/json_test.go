package flowproto_test

import (
	"encoding/json"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// jsonCase is a record in a shape the JSON transcoding must get right.
func jsonCase(r *rand.Rand, i int) *flow.Flow {
	labels := []string{`{"app":"client","tier":"front"}`, `{}`, `{"a":"1","a":"2","b":"3","a":"4"}`, `{"k":"välue ✓"}`,
		`{"esc":"a\"b\\c"}`, `{"ctl":"x\ny\u0001"}`, `{"":""}`, `not json`, `{"bad utf8":"` + "\xff" + `"}`}
	var f *flow.Flow
	if i%2 == 0 {
		f = exporterShaped(r, i)
	} else {
		f = flowtest.Full(i, i%3 != 0)
		f.SourcePodLabels = labels[r.IntN(len(labels))]
		f.DestinationPodLabels = labels[r.IntN(len(labels))]
	}
	f.Origin.Exporter = netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
	switch r.IntN(12) {
	case 0:
		f.SourcePodName = "quote\" backslash\\ tab\t nl\n cr\r ctl\x1f del\x7f <&> \u2028 é ✓"
	case 1:
		f.DestinationPodNamespace = "bad\xffutf8" // protojson refuses it: an error
	case 2:
		f.EndTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) // out of Timestamp's range: an error
	case 3:
		f.StartTime = time.Unix(1_750_000_000, 123_000_000) // milliseconds
	case 4:
		f.StartTime = time.Unix(1_750_000_000, 123_456_000) // microseconds
	case 5:
		f.StartTime = time.Unix(1_750_000_000, 1) // nanoseconds
	case 6:
		f.EndReason, f.FlowType = 200, 99 // numbers with no enumeration name
	case 7:
		f.ProtoUnknown = []byte{0xf8, 0x07, 0x01} // field 127: the FromFlow path, left out of JSON
	case 8:
		f.Stats = flow.Stats{PacketTotalCount: 1 << 63, OctetTotalCount: ^uint64(0)}
	}
	return f
}

// JSONEncoder's text reads back as the message protojson writes for
// FromFlow's message, and fails where protojson fails.
func TestJSONEncoderMatchesProtojson(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var e flowproto.JSONEncoder
	errs := 0
	for i := range 4000 {
		f := jsonCase(r, i)
		want, werr := flowproto.FromFlow(f)
		var wantText []byte
		if werr == nil {
			wantText, werr = protojson.Marshal(want)
		}
		got, err := e.Append([]byte("prefix"), f)
		if (err != nil) != (werr != nil) {
			t.Fatalf("flow %d: error %v, protojson's %v", i, err, werr)
		}
		if string(got[:6]) != "prefix" {
			t.Fatal("Append changed what was there")
		}
		if err != nil {
			errs++
			if len(got) != 6 {
				t.Fatalf("flow %d: %d octets left after an error", i, len(got)-6)
			}
			continue
		}
		if !json.Valid(got[6:]) {
			t.Fatalf("flow %d: not JSON: %s", i, got[6:])
		}
		var a, b flowpb.Flow
		if err := protojson.Unmarshal(wantText, &a); err != nil {
			t.Fatal(err)
		}
		if err := protojson.Unmarshal(got[6:], &b); err != nil {
			t.Fatalf("flow %d: protojson cannot read %s: %v", i, got[6:], err)
		}
		if d := cmp.Diff(&a, &b, protocmp.Transform()); d != "" {
			t.Fatalf("flow %d (-protojson +JSONEncoder):\n%s\nprotojson: %s\nJSONEncoder: %s", i, d, wantText, got[6:])
		}
		// The same text but for white space and field order: compare as
		// generic JSON values.
		var x, y any
		if err := json.Unmarshal(wantText, &x); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got[6:], &y); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(x, y); d != "" {
			t.Fatalf("flow %d: JSON values differ (-protojson +JSONEncoder):\n%s", i, d)
		}
	}
	if errs == 0 || errs > 1500 {
		t.Errorf("%d of 4000 records were errors: the cases are not what they should be", errs)
	}
}

// An aggregated record, labels included, is written without an
// allocation once the encoder's buffer has grown.
func TestJSONEncoderAllocatesNothing(t *testing.T) {
	f := flowtest.Full(3, true)
	f.Origin.Exporter = netip.MustParseAddr("192.0.2.9")
	f.SourcePodLabels = `{"app":"client","tier":"front"}`
	var e flowproto.JSONEncoder
	b := make([]byte, 0, 8192)
	var err error
	if n := testing.AllocsPerRun(100, func() { b, err = e.Append(b[:0], f) }); n != 0 || err != nil {
		t.Fatalf("%v allocations (err %v)", n, err)
	}
}

func BenchmarkJSON(b *testing.B) {
	f := flowtest.Full(3, true)
	f.Origin.Exporter = netip.MustParseAddr("192.0.2.9")
	f.SourcePodLabels = `{"app":"client","tier":"front"}`
	b.Run("JSONEncoder", func(b *testing.B) {
		var e flowproto.JSONEncoder
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = e.Append(buf[:0], f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protojson", func(b *testing.B) {
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			p, err := flowproto.FromFlow(f)
			if err != nil {
				b.Fatal(err)
			}
			if buf, err = (protojson.MarshalOptions{}).MarshalAppend(buf[:0], p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
