package ipfix_test

import (
	"bytes"
	"errors"
	"testing"

	"sluice/ipfix"
)

// TestRecordBuilderReserve writes a record whose fields, a string among
// them, are filled in through Reserve, and checks it is the record
// written field by field; and that Reserve gives nothing, leaving the
// builder as it was, when it cannot.
func TestRecordBuilderReserve(t *testing.T) {
	ie := func(name string) ipfix.Field { return defaultField(t, name) }
	tmpl, err := ipfix.NewTemplate(300, []ipfix.Field{ie("sourceTransportPort"), ie("interfaceName"), ie("protocolIdentifier")})
	if err != nil {
		t.Fatal(err)
	}
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock, MaxMessageSize: 512}, emit)
	p, b := enc.Begin(1, tmpl).Uint(443).Reserve(2, 6)
	if len(p) != 6 {
		t.Fatalf("Reserve(2, 6) gave %d octets", len(p))
	}
	copy(p, "\x04eth0\x06")
	if err := b.End(); err != nil {
		t.Fatal(err)
	}
	if err := enc.Begin(1, tmpl).Uint(443).String("eth0").Uint(6).End(); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	m := (*msgs)[0]
	const recLen = 2 + 5 + 1
	data := m[len(m)-2*recLen:]
	if !bytes.Equal(data[:recLen], data[recLen:]) {
		t.Fatalf("record written through Reserve %x, field by field %x", data[:recLen], data[recLen:])
	}

	// Past the template's end, or more than any message: nothing, and
	// the builder goes on as it was.
	b = enc.Begin(1, tmpl).Uint(443)
	for _, r := range []struct{ n, octets int }{{3, 6}, {-1, 0}, {2, -1}, {2, 70000}} {
		if p, b2 := b.Reserve(r.n, r.octets); p != nil || b2 != b {
			t.Fatalf("Reserve(%d, %d) gave %d octets", r.n, r.octets, len(p))
		}
	}
	if err := b.String("eth1").Uint(6).End(); err != nil {
		t.Fatal(err)
	}
	// No room in the buffer (twice a 512-octet message): nothing, and
	// the string written in its place fails as it would have.
	b = enc.Begin(1, tmpl).Uint(443)
	if p, _ := b.Reserve(2, 5000); p != nil {
		t.Fatal("Reserve beyond the buffer gave octets")
	}
	if err := b.String(string(make([]byte, 4999))).Uint(6).End(); !errors.Is(err, ipfix.ErrTooLarge) {
		t.Fatalf("the record beyond the buffer: %v", err)
	}
	// A builder that failed gives nothing, and keeps its error.
	b = enc.Begin(1, tmpl).String("x")
	if p, b2 := b.Reserve(2, 6); p != nil || b2.End() == nil {
		t.Fatal("Reserve after a failed write gave octets, or lost the failure")
	}
}
