package kafkain

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

func TestDecodeValue(t *testing.T) {
	good, err := flowproto.AppendFlow(nil, flowtest.Full(3, false))
	if err != nil {
		t.Fatal(err)
	}
	p, err := flowproto.FromFlow(flowtest.Full(4, false))
	if err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	newer := protowire.AppendString(protowire.AppendTag(append([]byte(nil), good...), 900, protowire.BytesType), "x")
	for _, c := range []struct {
		name    string
		v       []byte
		reason  string
		unknown int
		id      string
	}{
		{"proto", good, "", 0, "flow-3"},
		{"json", js, "", 0, "flow-4"},
		{"newer schema", newer, "", 1, "flow-3"},
		{"garbage", []byte("garbage"), ReasonMalformed, 0, ""},
		{"truncated varint", []byte{0x08, 0xff}, ReasonMalformed, 0, ""},
		{"bad json", []byte(`{"id":`), ReasonMalformed, 0, ""},
		// A port over 65535 (Flow's field 7 is the Transport message, whose
		// source_port is field 2).
		{"invalid value", protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType),
			protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 70000)), ReasonValue, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f flow.Flow
			unknown, reason, err := decodeValue(flowproto.NewDecoder(), c.v, &f)
			if reason != c.reason || (err != nil) != (c.reason != "") {
				t.Fatalf("reason %q, err %v; want reason %q", reason, err, c.reason)
			}
			if unknown != c.unknown {
				t.Errorf("%d unknown fields, want %d", unknown, c.unknown)
			}
			if err == nil && f.Origin.ID != c.id {
				t.Errorf("id %q, want %q", f.Origin.ID, c.id)
			}
		})
	}
}

// FuzzDecodeValue: no value makes the decoder panic, and a value it takes
// encodes again.
func FuzzDecodeValue(f *testing.F) {
	good, _ := flowproto.AppendFlow(nil, flowtest.Full(1, false))
	f.Add(good)
	f.Add([]byte(`{"id":"x","transport":{"protocolNumber":6}}`))
	f.Add([]byte("garbage"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, v []byte) {
		var fl flow.Flow
		_, reason, err := decodeValue(flowproto.NewDecoder(), v, &fl)
		if err != nil {
			if reason == "" {
				t.Fatalf("an error without a reason: %v", err)
			}
			return
		}
		if _, err := flowproto.FromFlow(&fl); err != nil {
			t.Fatalf("a decoded value does not encode again: %v", err)
		}
	})
}
