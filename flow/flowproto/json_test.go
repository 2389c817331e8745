package flowproto_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
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
		if !jsonAgrees(t, &e, jsonCase(r, i), fmt.Sprintf("flow %d", i)) {
			errs++
		}
	}
	if errs == 0 || errs > 1500 {
		t.Errorf("%d of 4000 records were errors: the cases are not what they should be", errs)
	}
}

// jsonAgrees checks that JSONEncoder and protojson agree on f: both fail
// (and Append leaves what was in its buffer as it was), or both succeed
// with texts that read back as the same message and the same JSON value
// (white space, field order and escapes aside). It reports whether they
// succeeded.
func jsonAgrees(t *testing.T, e *flowproto.JSONEncoder, f *flow.Flow, what string) bool {
	t.Helper()
	want, werr := flowproto.FromFlow(f)
	var wantText []byte
	if werr == nil {
		wantText, werr = protojson.Marshal(want)
	}
	out, err := e.Append([]byte("prefix"), f)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%s: error %v, protojson's %v", what, err, werr)
	}
	if string(out[:6]) != "prefix" {
		t.Fatalf("%s: Append changed what was there", what)
	}
	got := out[6:]
	if err != nil {
		if len(got) != 0 {
			t.Fatalf("%s: %d octets left after an error", what, len(got))
		}
		return false
	}
	var a, b flowpb.Flow
	if err := protojson.Unmarshal(wantText, &a); err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(got, &b); err != nil {
		t.Fatalf("%s: protojson cannot read %s: %v", what, got, err)
	}
	if d := cmp.Diff(&a, &b, protocmp.Transform()); d != "" {
		t.Fatalf("%s (-protojson +JSONEncoder):\n%s\nprotojson: %s\nJSONEncoder: %s", what, d, wantText, got)
	}
	var x, y any
	if err := json.Unmarshal(wantText, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &y); err != nil {
		t.Fatalf("%s: not JSON: %s: %v", what, got, err)
	}
	if d := cmp.Diff(x, y); d != "" {
		t.Fatalf("%s: JSON values differ (-protojson +JSONEncoder):\n%s", what, d)
	}
	return true
}

// An exporter's message with known fields of another wire type (a reader
// keeps them as unknown fields, and AppendFlow writes them back), in the
// top message and nested: left out of the JSON, as protojson leaves them.
func TestJSONEncoderWrongWireTypes(t *testing.T) {
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	msg := func(num protowire.Number, inner ...[]byte) []byte {
		var b []byte
		for _, x := range inner {
			b = append(b, x...)
		}
		return protowire.AppendBytes(tag(num, protowire.BytesType), b)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(num, protowire.VarintType), v)
	}
	fixed32 := func(num protowire.Number, v uint32) []byte {
		return protowire.AppendFixed32(tag(num, protowire.Fixed32Type), v)
	}
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(num, protowire.BytesType), s)
	}
	cases := map[string][]byte{
		"id as a varint":                  varint(1, 7),
		"ipfix as a varint":               varint(2, 7),
		"end_reason as bytes":             str(5, "x"),
		"proxy_snat_port as fixed32":      fixed32(15, 9),
		"start_ts seconds as bytes":       msg(3, str(1, "x"), varint(2, 5)),
		"transport port as bytes":         msg(7, varint(1, 6), str(2, "x")),
		"a label entry's key as a varint": msg(8, str(2, "ns"), msg(5, msg(1, msg(1, varint(1, 3), str(1, "k"), str(2, "v"))))),
	}
	var e flowproto.JSONEncoder
	for name, extra := range cases {
		wire := append(append(str(1, "flow-1"), varint(5, 2)...), extra...)
		var f flow.Flow
		if _, err := flowproto.NewDecoder().Decode(wire, &f); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		jsonAgrees(t, &e, &f, name)
	}
}

// FuzzJSONEncoder: whatever an exporter sends that the decoder takes, the
// Kafka sink's JSON agrees with protojson's.
func FuzzJSONEncoder(f *testing.F) {
	for _, b := range realMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fl flow.Flow
		if _, err := flowproto.NewDecoder().Decode(b, &fl); err != nil {
			return
		}
		var e flowproto.JSONEncoder
		jsonAgrees(t, &e, &fl, fmt.Sprintf("%x", b))
	})
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
