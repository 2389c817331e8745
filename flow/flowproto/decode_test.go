package flowproto_test

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// sameAsGenerated checks that the Decoder gives what the generated path
// (proto.Unmarshal, then ToFlow) gives for b: the same error, or the same
// record and unknown-field count. b is decoded twice by one Decoder, the
// second time from its interning tables.
func sameAsGenerated(t *testing.T, b []byte) {
	t.Helper()
	var p flowpb.Flow
	perr := proto.Unmarshal(b, &p)
	var want flow.Flow
	var wantN int
	var werr error
	if perr == nil {
		wantN, werr = flowproto.ToFlow(&p, &want)
	}
	d := flowproto.NewDecoder()
	for pass := range 2 {
		var got flow.Flow
		n, err := d.Decode(b, &got)
		switch {
		case perr != nil:
			if !errors.Is(err, flowproto.ErrMalformed) {
				t.Fatalf("pass %d: proto.Unmarshal refuses %x (%v); Decode: %v", pass, b, perr, err)
			}
		case werr != nil:
			if err == nil || err.Error() != werr.Error() {
				t.Fatalf("pass %d: %x: ToFlow: %v; Decode: %v", pass, b, werr, err)
			}
		case err != nil:
			t.Fatalf("pass %d: %x: Decode: %v; ToFlow took it", pass, b, err)
		case n != wantN || !reflect.DeepEqual(&got, &want):
			t.Fatalf("pass %d: %x:\nDecode  %d %+v\ngenerated %d %+v", pass, b, n, got, wantN, want)
		}
	}
}

// realMessages are encoded Flows as exporters send them: Full records
// through FromFlow (with and without aggregation), the hand-written wire
// form with labels, an Antrea agent's typical record, and a few edges.
func realMessages(t testing.TB) [][]byte {
	var out [][]byte
	for i := range 4 {
		for _, agg := range []bool{false, true} {
			f := flowtest.Full(i, agg)
			f.Origin.ExportTime = time.Unix(1_790_000_000+int64(i), 0).UTC()
			f.Origin.SequenceNumber = uint32(i)
			f.Origin.Exporter = netip.MustParseAddr("192.0.2.9")
			p, err := flowproto.FromFlow(f)
			if err != nil {
				t.Fatal(err)
			}
			b, err := proto.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
			src, dst := flowtest.FullLabels()
			out = append(out, flowtest.Wire(f, src, dst))
		}
	}
	agent := &flowpb.Flow{
		Id:        "a1f0c2d4-0000-4000-8000-000000000001",
		StartTs:   &timestamppb.Timestamp{Seconds: 1_790_000_000, Nanos: 5},
		EndReason: flowpb.FlowEndReason_FLOW_END_REASON_ACTIVE_TIMEOUT,
		Ip:        &flowpb.IP{Version: flowpb.IPVersion_IP_VERSION_4, Source: []byte{10, 0, 0, 1}, Destination: []byte{10, 0, 0, 2}},
		Transport: &flowpb.Transport{ProtocolNumber: 6, SourcePort: 4000, DestinationPort: 80,
			Protocol: &flowpb.Transport_TCP{TCP: &flowpb.TCP{StateName: "ESTABLISHED"}}},
		K8S: &flowpb.Kubernetes{FlowType: flowpb.FlowType_FLOW_TYPE_INTRA_NODE, SourcePodName: "web-1", SourcePodNamespace: "default",
			SourcePodUid: "0f0e0d0c-0b0a-0908-0706-050403020100", SourcePodLabels: &flowpb.Labels{}},
		Stats: &flowpb.Stats{PacketTotalCount: 10, OctetTotalCount: 1000},
	}
	b, err := proto.Marshal(agent)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, b, nil, []byte{0x0a, 0x00}, []byte{0x32, 0x00}, []byte{0x42, 0x00})
	return out
}

func TestDecodeMatchesGeneratedOnRealMessages(t *testing.T) {
	for _, b := range realMessages(t) {
		sameAsGenerated(t, b)
	}
}

// TestDecodeTakesTheFastPath: a typical agent record decodes with at most
// one allocation (its ID) once its strings are interned.
func TestDecodeTakesTheFastPath(t *testing.T) {
	msgs := realMessages(t)
	b := msgs[len(msgs)-5] // the agent's record
	d := flowproto.NewDecoder()
	var f flow.Flow
	if _, err := d.Decode(b, &f); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		f = flow.Flow{}
		if _, err := d.Decode(b, &f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%v allocations per record, want at most 1", allocs)
	}
}

// TestDecodeMatchesGeneratedOnRandomMessages mutates real messages (bytes
// flipped, cut, spliced, fields added and repeated) and checks both paths
// agree on every result.
func TestDecodeMatchesGeneratedOnRandomMessages(t *testing.T) {
	msgs := realMessages(t)
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := append([]byte(nil), msgs[r.IntN(len(msgs))]...)
		for range 1 + r.IntN(3) {
			b = mutate(r, b, msgs)
		}
		sameAsGenerated(t, b)
	}
}

func mutate(r *rand.Rand, b []byte, msgs [][]byte) []byte {
	switch r.IntN(6) {
	case 0:
		if len(b) > 0 {
			b[r.IntN(len(b))] ^= byte(1 << r.IntN(8))
		}
	case 1:
		if len(b) > 0 {
			b = b[:r.IntN(len(b))]
		}
	case 2: // a random field, known or not, of a random type
		num := protowire.Number(1 + r.IntN(40))
		if r.IntN(2) == 0 {
			b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), r.Uint64()>>r.IntN(64))
		} else {
			v := msgs[r.IntN(len(msgs))]
			v = v[:r.IntN(len(v)+1)]
			b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
		}
	case 3: // a repeated field: the message appended to itself
		b = append(b, b...)
	case 4:
		if len(b) > 0 {
			b[r.IntN(len(b))] = byte(r.Uint32())
		}
	case 5: // another message spliced in
		o := msgs[r.IntN(len(msgs))]
		if len(o) > 0 && len(b) > 0 {
			i, j := r.IntN(len(b)), r.IntN(len(o))
			b = append(b[:i:i], o[j:]...)
		}
	}
	return b
}

// TestRequestFlowsMatchesGenerated: RequestFlows finds the flows that
// proto.Unmarshal of an ExportRequest finds.
func TestRequestFlowsMatchesGenerated(t *testing.T) {
	msgs := realMessages(t)
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		var req []byte
		for range r.IntN(5) {
			req = protowire.AppendBytes(protowire.AppendTag(req, 1, protowire.BytesType), msgs[r.IntN(len(msgs))])
		}
		if r.IntN(3) == 0 {
			req = mutate(r, req, msgs)
		}
		sameRequest(t, req)
	}
}

func sameRequest(t *testing.T, req []byte) {
	t.Helper()
	var p flowpb.ExportRequest
	perr := proto.Unmarshal(req, &p)
	spans, err := flowproto.RequestFlows(req, nil)
	malformed := err != nil
	if err != nil && !errors.Is(err, flowproto.ErrMalformed) {
		t.Fatalf("RequestFlows: %v does not wrap ErrMalformed", err)
	}
	d := flowproto.NewDecoder()
	for _, s := range spans {
		var f flow.Flow
		if _, err := d.Decode(s, &f); errors.Is(err, flowproto.ErrMalformed) {
			malformed = true
		}
	}
	if (perr != nil) != malformed {
		t.Fatalf("%x: proto.Unmarshal: %v; RequestFlows and Decode malformed: %v", req, perr, malformed)
	}
	if perr == nil && len(spans) != len(p.GetFlows()) {
		t.Fatalf("%x: %d flows, generated code finds %d", req, len(spans), len(p.GetFlows()))
	}
}

func FuzzDecode(f *testing.F) {
	for _, b := range realMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		sameAsGenerated(t, b)
		req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), b)
		sameRequest(t, append(req, b...))
	})
}

// TestDecodeUIDWithDashesElsewhere: a UID with extra dashes in place of
// hex digits is refused, not a panic (flow.ParseUID indexed past the text
// and the UID).
func TestDecodeUIDWithDashesElsewhere(t *testing.T) {
	for _, uid := range []string{"0f0e0d0c-0b0a-0908-0706-0504030201-0", "0f0e0d0c-0b0a-0908-0706-0-0403020100", "-f0e0d0c-0b0a-0908-0706-050403020100"} {
		k := protowire.AppendString(protowire.AppendTag(nil, 4, protowire.BytesType), uid)
		b := protowire.AppendBytes(protowire.AppendTag(nil, 8, protowire.BytesType), k)
		sameAsGenerated(t, b)
		var f flow.Flow
		if _, err := flowproto.NewDecoder().Decode(b, &f); err == nil {
			t.Errorf("UID %q taken", uid)
		}
	}
}

// BenchmarkDecode compares the Decoder with the generated path on an
// Antrea agent's typical record, decoded into one reused flow.Flow as the
// collector's slabs do (see docs/performance.md).
func BenchmarkDecode(b *testing.B) {
	msgs := realMessages(b)
	msg := msgs[len(msgs)-5]
	b.Run("protowire", func(b *testing.B) {
		d := flowproto.NewDecoder()
		f := new(flow.Flow)
		b.ReportAllocs()
		for b.Loop() {
			*f = flow.Flow{}
			if _, err := d.Decode(msg, f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("generated", func(b *testing.B) {
		f := new(flow.Flow)
		b.ReportAllocs()
		for b.Loop() {
			var p flowpb.Flow
			if err := proto.Unmarshal(msg, &p); err != nil {
				b.Fatal(err)
			}
			*f = flow.Flow{}
			if _, err := flowproto.ToFlow(&p, f); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestRequestFlowsUpTo: beyond max, Flows are counted, not spanned, so
// that a request of many tiny Flows costs no span each.
func TestRequestFlowsUpTo(t *testing.T) {
	var req []byte
	for range 1000 {
		req = append(req, 0x0a, 0x00) // an empty Flow
	}
	spans, n, err := flowproto.RequestFlowsUpTo(req, nil, 10)
	if err != nil || n != 1000 || len(spans) != 10 || cap(spans) > 16 {
		t.Fatalf("%d spans (cap %d), %d flows, %v; want 10 spans, 1000 flows", len(spans), cap(spans), n, err)
	}
	all, err := flowproto.RequestFlows(req, nil)
	if err != nil || len(all) != 1000 {
		t.Fatalf("RequestFlows: %d spans, %v", len(all), err)
	}
}
