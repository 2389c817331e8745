package ipfix_test

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sluice/ipfix"
)

func collector() (*[][]byte, func([]byte) error) {
	var msgs [][]byte
	return &msgs, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil }
}

func fixedClock() time.Time { return t0 }

func TestEncoderSequenceNumbersPerDomain(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	tmpl, err := ipfix.TemplateOf(256, reg.MustByName("protocolIdentifier"), reg.MustByName("sourceIPv4Address"))
	if err != nil {
		t.Fatal(err)
	}
	msgs, emit := collector()
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, emit)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("10.0.0.1")
	write := func(domain uint32, n int) {
		t.Helper()
		if err := enc.AddTemplate(domain, tmpl); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := enc.Begin(domain, tmpl).Uint(6).Addr(src).End(); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 3)
	write(2, 5)
	write(1, 4) // domain 1 continues at 3
	write(1, 1)
	want := []struct{ domain, seq uint32 }{{1, 0}, {2, 0}, {1, 3}, {1, 7}}
	if len(*msgs) != len(want) {
		t.Fatalf("%d messages", len(*msgs))
	}
	for i, m := range *msgs {
		h, err := ipfix.ParseHeader(m)
		if err != nil {
			t.Fatal(err)
		}
		if h.ObservationDomainID != want[i].domain || h.SequenceNumber != want[i].seq || h.ExportTime != uint32(t0.Unix()) {
			t.Errorf("message %d: %+v, want %+v", i, h, want[i])
		}
	}
	if enc.SequenceNumber(1) != 8 || enc.SequenceNumber(2) != 5 {
		t.Errorf("totals %d %d", enc.SequenceNumber(1), enc.SequenceNumber(2))
	}
	// Switching domain mid-message flushes implicitly.
	enc.Begin(3, tmpl).Uint(1).Addr(src).End()
	enc.Begin(4, tmpl).Uint(1).Addr(src).End()
	enc.Flush()
	if len(*msgs) != 6 {
		t.Errorf("domain switch: %d messages, want 6", len(*msgs))
	}
}

func TestEncoderMaxSize(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	tmpl, _ := ipfix.TemplateOf(256, reg.MustByName("sourcePodName"))
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 512, Now: fixedClock}, emit)
	enc.AddTemplate(1, tmpl)
	// 100-octet strings: 101 per record; 16 + 8 (template set) + 4 + 4*101 = 432,
	// the fifth record spills into a second message.
	name := strings.Repeat("n", 100)
	for range 9 {
		if err := enc.Begin(1, tmpl).String(name).End(); err != nil {
			t.Fatal(err)
		}
	}
	// A record that can never fit is refused and leaves no trace.
	if err := enc.Begin(1, tmpl).String(strings.Repeat("x", 600)).End(); !errors.Is(err, ipfix.ErrTooLarge) {
		t.Fatalf("oversized record: %v", err)
	}
	enc.Flush()
	d := newDecoder(0)
	total := 0
	for _, m := range *msgs {
		if len(m) > 512 {
			t.Fatalf("message of %d octets", len(m))
		}
		got := decode(t, d, m, t0)
		if got.err != nil {
			t.Fatal(got.err)
		}
		for _, r := range got.recs {
			if s, _ := r.String(0); s != name {
				t.Fatalf("record holds %q", s)
			}
		}
		total += len(got.recs)
	}
	if total != 9 || len(*msgs) != 3 {
		t.Fatalf("%d records in %d messages, want 9 in 3", total, len(*msgs))
	}
	if _, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 100}, emit); err == nil {
		t.Error("a 100-octet maximum was accepted")
	}
}

func TestRecordBuilderChecks(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	tmpl, err := ipfix.NewTemplate(256, []ipfix.Field{
		{IE: reg.MustByName("protocolIdentifier")},
		{IE: reg.MustByName("octetDeltaCount"), Length: 2},
		{IE: reg.MustByName("sourceIPv4Address")},
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, emit)
	v4 := netip.MustParseAddr("10.1.2.3")
	cases := []struct {
		name  string
		write func(w ipfix.RecordBuilder) ipfix.RecordBuilder
		want  string
	}{
		{"wrong type", func(w ipfix.RecordBuilder) ipfix.RecordBuilder { return w.String("tcp") }, "cannot write a string"},
		{"overflow", func(w ipfix.RecordBuilder) ipfix.RecordBuilder { return w.Uint(6).Uint(70000) }, "does not fit in 2 octets"},
		{"family", func(w ipfix.RecordBuilder) ipfix.RecordBuilder {
			return w.Uint(6).Uint(1).Addr(netip.MustParseAddr("::1"))
		}, "other family"},
		{"too few", func(w ipfix.RecordBuilder) ipfix.RecordBuilder { return w.Uint(6) }, "not written"},
		{"too many", func(w ipfix.RecordBuilder) ipfix.RecordBuilder { return w.Uint(6).Uint(1).Addr(v4).Uint(1) }, "only 3 fields"},
	}
	for _, c := range cases {
		err := c.write(enc.Begin(1, tmpl)).End()
		if !errors.Is(err, ipfix.ErrType) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// Failed records leave no empty set behind: nothing is sent.
	enc.Flush()
	if len(*msgs) != 0 {
		t.Fatalf("failed records produced %d message(s): % x", len(*msgs), (*msgs)[0])
	}
	// After all those failures, a good record still makes a clean message.
	if err := enc.Begin(1, tmpl).Uint(17).Uint(65535).Addr(v4).End(); err != nil {
		t.Fatal(err)
	}
	enc.Flush()
	if len(*msgs) != 1 {
		t.Fatalf("%d messages", len(*msgs))
	}
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	d := ipfix.NewDecoder(sess)
	tmsgs, temit := collector()
	tenc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, temit)
	tenc.AddTemplate(1, tmpl)
	tenc.Flush()
	decode(t, d, (*tmsgs)[0], t0)
	got := decode(t, d, (*msgs)[0], t0)
	if got.err != nil || len(got.recs) != 1 {
		t.Fatalf("%v %d", got.err, len(got.recs))
	}
	if v, _ := got.recs[0].Uint(1); v != 65535 {
		t.Errorf("octets %d", v)
	}
	if h, _ := ipfix.ParseHeader((*msgs)[0]); h.SequenceNumber != 0 || enc.SequenceNumber(1) != 1 {
		t.Errorf("failed records were counted: seq %d, total %d", h.SequenceNumber, enc.SequenceNumber(1))
	}
}

func TestTemplateOfRejects(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	if _, err := ipfix.TemplateOf(255, reg.MustByName("protocolIdentifier")); err == nil {
		t.Error("template ID 255 accepted")
	}
	if _, err := ipfix.NewTemplate(256, []ipfix.Field{{IE: reg.MustByName("sourceIPv4Address"), Length: 8}}); err == nil {
		t.Error("8-octet IPv4 field accepted")
	}
	if _, err := ipfix.NewTemplate(256, []ipfix.Field{{ID: 5}}); err == nil {
		t.Error("field without element accepted")
	}
}

func TestAllTypesRoundTrip(t *testing.T) {
	reg, err := ipfix.NewRegistry([]ipfix.InfoElement{
		{Name: "u8", ID: 1, Type: ipfix.Unsigned8}, {Name: "s16", ID: 2, Type: ipfix.Signed16},
		{Name: "s32r", ID: 3, Type: ipfix.Signed32}, {Name: "f32", ID: 4, Type: ipfix.Float32},
		{Name: "f64", ID: 5, Type: ipfix.Float64}, {Name: "b", ID: 6, Type: ipfix.Boolean},
		{Name: "mac", ID: 7, Type: ipfix.MacAddress}, {Name: "oct", ID: 8, Type: ipfix.OctetArray},
		{Name: "tsec", ID: 9, Type: ipfix.DateTimeSeconds}, {Name: "tms", ID: 10, Type: ipfix.DateTimeMilliseconds},
		{Name: "tus", ID: 11, Type: ipfix.DateTimeMicroseconds}, {Name: "tns", ID: 12, Type: ipfix.DateTimeNanoseconds},
		{Name: "v6", ID: 13, Type: ipfix.IPv6Address}, {Name: "uuid", ID: 14, Type: ipfix.OctetArray, Length: 16},
	})
	if err != nil {
		t.Fatal(err)
	}
	var fields []ipfix.Field
	for id := uint16(1); id <= 14; id++ {
		ie, _ := reg.Lookup(0, id)
		f := ipfix.Field{IE: ie}
		if id == 3 {
			f.Length = 3
		}
		fields = append(fields, f)
	}
	tmpl, err := ipfix.NewTemplate(400, fields)
	if err != nil {
		t.Fatal(err)
	}
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, emit)
	enc.AddTemplate(9, tmpl)
	when := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.UTC)
	uuid := bytes.Repeat([]byte{0xab}, 16)
	err = enc.Begin(9, tmpl).Uint(200).Int(-300).Int(-70000).Float(0.5).Float(-1e300).Bool(false).
		MAC([6]byte{1, 2, 3, 4, 5, 6}).Bytes([]byte{9, 8, 7}).Time(when).Time(when).Time(when).Time(when).
		Addr(netip.MustParseAddr("2001:db8::9")).Bytes(uuid).End()
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Begin(9, tmpl).Uint(1).Int(1).Int(1 << 23).End(); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("2^23 in a 3-octet signed field: %v", err)
	}
	enc.Flush()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{Registry: reg}))
	got := decode(t, d, (*msgs)[0], t0)
	if got.err != nil || len(got.recs) != 1 {
		t.Fatalf("%v %d", got.err, len(got.recs))
	}
	r := got.recs[0]
	u, _ := r.Uint(0)
	i16, _ := r.Int(1)
	i24, _ := r.Int(2)
	f32, _ := r.Float(3)
	f64, _ := r.Float(4)
	b, err := r.Bool(5)
	mac, _ := r.MAC(6)
	if u != 200 || i16 != -300 || i24 != -70000 || f32 != 0.5 || f64 != -1e300 || b || err != nil || mac != [6]byte{1, 2, 3, 4, 5, 6} {
		t.Errorf("values %v %v %v %v %v %v %v", u, i16, i24, f32, f64, b, mac)
	}
	if !bytes.Equal(r.Bytes(7), []byte{9, 8, 7}) || !bytes.Equal(r.Bytes(13), uuid) {
		t.Errorf("octets %x %x", r.Bytes(7), r.Bytes(13))
	}
	wantTimes := []time.Time{when.Truncate(time.Second), when.Truncate(time.Millisecond), when.Truncate(time.Microsecond), when}
	for i, want := range wantTimes {
		got, err := r.Time(8 + i)
		// NTP fractions are 2^-32 s; allow for that rounding, and for the
		// 11 bits microsecond precision drops.
		diff := got.Sub(want)
		if err != nil || diff < -time.Microsecond || diff > time.Microsecond {
			t.Errorf("time field %d = %v, want %v", 8+i, got, want)
		}
	}
	if a, _ := r.Addr(12); a != netip.MustParseAddr("2001:db8::9") {
		t.Errorf("v6 %v", a)
	}
}

// TestOneSetPerMessage: with the option, every message holds one set, as
// go-ipfix's collector (Antrea's Flow Aggregator) requires.
func TestOneSetPerMessage(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	t4, _ := ipfix.TemplateOf(256, reg.MustByName("sourceIPv4Address"))
	t6, _ := ipfix.TemplateOf(257, reg.MustByName("sourceIPv6Address"))
	for _, one := range []bool{false, true} {
		msgs, emit := collector()
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{OneSetPerMessage: one, Now: fixedClock}, emit)
		enc.AddTemplate(1, t4)
		enc.AddTemplate(1, t6)
		enc.Begin(1, t4).Addr(netip.MustParseAddr("10.0.0.1")).End()
		enc.Begin(1, t4).Addr(netip.MustParseAddr("10.0.0.2")).End()
		enc.Begin(1, t6).Addr(netip.MustParseAddr("::1")).End()
		enc.Begin(1, t4).Addr(netip.MustParseAddr("10.0.0.3")).End()
		enc.Flush()
		sets := 0
		for _, m := range *msgs {
			n := 0
			for off := ipfix.HeaderLen; off < len(m); n++ {
				off += int(m[off+2])<<8 | int(m[off+3])
			}
			if one && n != 1 {
				t.Errorf("a message holds %d sets", n)
			}
			sets += n
		}
		// template set, data 256 (2 records), data 257, data 256.
		if sets != 4 || (one && len(*msgs) != 4) || (!one && len(*msgs) != 1) {
			t.Errorf("one=%v: %d sets in %d messages", one, sets, len(*msgs))
		}
		d := newDecoder(0)
		n := 0
		for _, m := range *msgs {
			got := decode(t, d, m, t0)
			if got.err != nil {
				t.Fatal(got.err)
			}
			n += len(got.recs)
		}
		if n != 4 {
			t.Errorf("one=%v: decoded %d records", one, n)
		}
	}
}

// TestRecordBuilderEndTwice: a builder is a value, so a copy can be ended
// again; that must not commit or count the record twice.
func TestRecordBuilderEndTwice(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	tmpl, _ := ipfix.TemplateOf(256, reg.MustByName("protocolIdentifier"))
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, emit)
	b := enc.Begin(1, tmpl).Uint(6)
	if err := b.End(); err != nil {
		t.Fatal(err)
	}
	if err := b.End(); err == nil {
		t.Error("a second End succeeded")
	}
	// Writes not chained into the builder that is ended are missing.
	b = enc.Begin(1, tmpl)
	b.Uint(17)
	if err := b.End(); !errors.Is(err, ipfix.ErrType) || !strings.Contains(err.Error(), "not written") {
		t.Errorf("End of a builder whose write was dropped: %v", err)
	}
	enc.Flush()
	if len(*msgs) != 1 || enc.SequenceNumber(1) != 1 || len((*msgs)[0]) != ipfix.HeaderLen+4+1 {
		t.Fatalf("%d messages, %d records", len(*msgs), enc.SequenceNumber(1))
	}
}

// TestRecordBuilderFixedAndEncoded writes a record with a block of
// fixed-length fields and a run of fields encoded elsewhere, and checks
// it decodes as the same values written field by field; and that the
// two refuse what they cannot write.
func TestRecordBuilderFixedAndEncoded(t *testing.T) {
	ie := func(name string) ipfix.Field { return defaultField(t, name) }
	tmpl, err := ipfix.NewTemplate(300, []ipfix.Field{ie("sourceTransportPort"), ie("packetTotalCount"), ie("interfaceName"), ie("protocolIdentifier")})
	if err != nil {
		t.Fatal(err)
	}
	run, err := ipfix.NewTemplate(301, tmpl.Fields[2:4])
	if err != nil {
		t.Fatal(err)
	}
	side, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	octets, err := side.EncodeRecord(run, func(b ipfix.RecordBuilder) error { return b.String("eth0").Uint(6).End() })
	if err != nil {
		t.Fatal(err)
	}
	octets = append([]byte(nil), octets...)
	msgs, emit := collector()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, emit)
	p, b := enc.Begin(1, tmpl).Fixed(2)
	if len(p) != 10 {
		t.Fatalf("Fixed(2) gave %d octets, want 10", len(p))
	}
	p[0], p[1] = 0x01, 0xbb
	p[9] = 42
	if err := b.Encoded(2, octets).End(); err != nil {
		t.Fatal(err)
	}
	if err := enc.Begin(1, tmpl).Uint(443).Uint(42).String("eth0").Uint(6).End(); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	m := (*msgs)[0]
	recLen := 2 + 8 + 5 + 1
	data := m[len(m)-2*recLen:]
	if !bytes.Equal(data[:recLen], data[recLen:]) {
		t.Fatalf("record written in blocks %x, field by field %x", data[:recLen], data[recLen:])
	}
	if _, b := enc.Begin(1, tmpl).Fixed(3); b.End() == nil { // interfaceName is variable-length
		t.Fatal("Fixed over a variable-length field was accepted")
	}
	if err := enc.Begin(1, tmpl).Uint(1).Uint(2).Encoded(3, octets).End(); err == nil {
		t.Fatal("Encoded past the template's end was accepted")
	}
}

// defaultField is the template field of the default registry's element
// name, at its default length.
func defaultField(t *testing.T, name string) ipfix.Field {
	t.Helper()
	e, ok := ipfix.DefaultRegistry().ByName(name)
	if !ok {
		t.Fatalf("no element %s", name)
	}
	return ipfix.Field{IE: e}
}
