package ipfix_test

import (
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sluice/ipfix"
)

// Hand-built wire bytes, so that the decoder is tested against RFC 7011
// layouts rather than only against our own encoder.

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// message wraps sets in a header for domain.
func message(domain uint32, sets ...[]byte) []byte {
	body := cat(sets...)
	return cat(u16(10), u16(uint16(16+len(body))), u32(1767225600), u32(0), u32(domain), body)
}

func set(id uint16, body ...[]byte) []byte {
	b := cat(body...)
	return cat(u16(id), u16(uint16(4+len(b))), b)
}

// spec is a field specifier; pen 0 means IANA.
type spec struct {
	id     uint16
	length uint16
	pen    uint32
}

func tmplRec(id uint16, fields ...spec) []byte {
	b := cat(u16(id), u16(uint16(len(fields))))
	for _, f := range fields {
		if f.pen != 0 {
			b = cat(b, u16(f.id|0x8000), u16(f.length), u32(f.pen))
		} else {
			b = cat(b, u16(f.id), u16(f.length))
		}
	}
	return b
}

func optTmplRec(id, scope uint16, fields ...spec) []byte {
	r := tmplRec(id, fields...)
	return cat(r[:4], u16(scope), r[4:])
}

type decoded struct {
	recs []*ipfix.Record
	err  error
}

// decode runs one message through d and copies out the records.
func decode(t *testing.T, d *ipfix.Decoder, msg []byte, now time.Time) decoded {
	t.Helper()
	var out decoded
	if err := d.Reset(msg, now); err != nil {
		out.err = err
		return out
	}
	for d.Next() {
		out.recs = append(out.recs, d.Record().Clone())
	}
	out.err = d.Err()
	return out
}

func newDecoder(ttl time.Duration) *ipfix.Decoder {
	return ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{TemplateTTL: ttl}))
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestSeveralSetsInOneMessage(t *testing.T) {
	d := newDecoder(0)
	msg := message(5,
		set(2, tmplRec(256, spec{8, 4, 0}, spec{1, 8, 0})),
		set(256, u32(0x0a000001), u32(0), u32(100), u32(0x0a000002), u32(0), u32(200)),
		set(3, optTmplRec(257, 1, spec{149, 4, 0}, spec{41, 8, 0})),
		set(257, u32(5), u32(0), u32(7)),
		set(256, u32(0x0a000003), u32(0), u32(300)),
	)
	got := decode(t, d, msg, t0)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.recs) != 4 {
		t.Fatalf("got %d records, want 4", len(got.recs))
	}
	wantOct := []uint64{100, 200, 0, 300}
	for i, r := range got.recs {
		if i == 2 {
			if !r.Template.IsOptions() || r.Template.ID != 257 {
				t.Fatalf("record 2 template %d, options %v", r.Template.ID, r.Template.IsOptions())
			}
			v, err := r.Uint(1)
			if err != nil || v != 7 {
				t.Fatalf("options record value %d %v", v, err)
			}
			continue
		}
		v, err := r.Uint(1)
		if err != nil || v != wantOct[i] {
			t.Errorf("record %d octets %d %v, want %d", i, v, err, wantOct[i])
		}
	}
	if st := d.Session().Stats; st.TemplatesAdded != 2 || st.DataRecords != 4 || st.Messages != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestVariableLengthFields(t *testing.T) {
	long := strings.Repeat("p", 300)
	d := newDecoder(0)
	msg := message(1,
		set(2, tmplRec(300, spec{101, 0xffff, ipfix.EnterpriseAntrea}, spec{4, 1, 0}, spec{100, 0xffff, ipfix.EnterpriseAntrea})),
		set(300,
			[]byte{3}, []byte("abc"), []byte{6}, []byte{255}, u16(300), []byte(long),
			[]byte{0}, []byte{17}, []byte{255}, u16(0),
		),
	)
	got := decode(t, d, msg, t0)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if len(got.recs) != 2 {
		t.Fatalf("got %d records", len(got.recs))
	}
	want := [][2]string{{"abc", long}, {"", ""}}
	for i, r := range got.recs {
		a, err1 := r.String(0)
		b, err2 := r.String(2)
		if err1 != nil || err2 != nil || a != want[i][0] || b != want[i][1] {
			t.Errorf("record %d: %q %q %v %v", i, a, b, err1, err2)
		}
	}
	if p, _ := got.recs[1].Uint(1); p != 17 {
		t.Errorf("protocol %d", p)
	}
}

func TestReducedSizeAndTypes(t *testing.T) {
	d := newDecoder(0)
	msg := message(1,
		set(2, tmplRec(256,
			spec{1, 3, 0},        // octetDeltaCount (unsigned64) in 3 octets
			spec{2, 1, 0},        // packetDeltaCount in 1
			spec{56, 6, 0},       // sourceMacAddress
			spec{27, 16, 0},      // sourceIPv6Address
			spec{154, 8, 0},      // flowStartMicroseconds (NTP)
			spec{156, 8, 0},      // flowStartNanoseconds (NTP)
			spec{152, 8, 0},      // flowStartMilliseconds
			spec{150, 4, 0},      // flowStartSeconds
			spec{89, 4, 0},       // forwardingStatus, registered narrower, sent as 4
			spec{210, 2, 0},      // paddingOctets
			spec{999, 5, 12345},  // unknown enterprise element
			spec{1001, 2, 0},     // unknown IANA element
			spec{8, 3, 0},        // sourceIPv4Address with an impossible length
			spec{151, 0xffff, 0}, // flowEndSeconds sent variable-length: kept raw
		)),
		set(256,
			[]byte{0x01, 0x02, 0x03}, []byte{9},
			[]byte{0, 0x11, 0x22, 0x33, 0x44, 0x55},
			netip.MustParseAddr("2001:db8::1").AsSlice(),
			// 2026-01-01 in NTP seconds, half a second as fraction.
			u32(uint32(t0.Unix()+2208988800)), u32(1<<31),
			u32(uint32(t0.Unix()+2208988800)), u32(1<<30),
			binary.BigEndian.AppendUint64(nil, uint64(t0.UnixMilli()+1)),
			u32(uint32(t0.Unix())),
			u32(0x40000001),
			[]byte{0, 0},
			[]byte{1, 2, 3, 4, 5}, []byte{7, 8}, []byte{1, 2, 3},
			[]byte{4}, u32(uint32(t0.Unix())),
		),
	)
	got := decode(t, d, msg, t0)
	if got.err != nil || len(got.recs) != 1 {
		t.Fatalf("%v, %d records", got.err, len(got.recs))
	}
	r := got.recs[0]
	check := func(name string, got, want any, err error) {
		t.Helper()
		if err != nil || got != want {
			t.Errorf("%s = %v (%v), want %v", name, got, err, want)
		}
	}
	v, err := r.Uint(0)
	check("octetDeltaCount", v, uint64(0x010203), err)
	v, err = r.Uint(1)
	check("packetDeltaCount", v, uint64(9), err)
	mac, err := r.MAC(2)
	check("mac", mac, [6]byte{0, 0x11, 0x22, 0x33, 0x44, 0x55}, err)
	a, err := r.Addr(3)
	check("ipv6", a, netip.MustParseAddr("2001:db8::1"), err)
	tm, err := r.Time(4)
	check("micro", tm, t0.Add(500*time.Millisecond), err)
	tm, err = r.Time(5)
	check("nano", tm, t0.Add(250*time.Millisecond), err)
	tm, err = r.Time(6)
	check("milli", tm, t0.Add(time.Millisecond), err)
	tm, err = r.Time(7)
	check("seconds", tm, t0, err)
	v, err = r.Uint(8)
	check("wide forwardingStatus", v, uint64(0x40000001), err)
	for i, want := range map[int]string{10: "12345:999", 11: "0:1001", 12: "sourceIPv4Address", 13: "flowEndSeconds"} {
		f := r.Field(i)
		if f.Type != ipfix.OctetArray || f.Name() != want {
			t.Errorf("field %d: %s typed %s, want raw octets named %s", i, f.Name(), f.Type, want)
		}
	}
	if b := r.Bytes(10); string(b) != "\x01\x02\x03\x04\x05" {
		t.Errorf("unknown element octets %x", b)
	}
	if b := r.Bytes(13); len(b) != 4 {
		t.Errorf("raw variable field %x", b)
	}
	// Type checks: wrong accessor, out of range.
	if _, err := r.String(0); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("String on unsigned: %v", err)
	}
	if _, err := r.Uint(3); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("Uint on address: %v", err)
	}
	if _, err := r.Addr(12); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("Addr on a 3-octet address: %v", err)
	}
	if _, err := r.Uint(99); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("Uint out of range: %v", err)
	}
	if r.Bytes(-1) != nil || r.Bytes(99) != nil {
		t.Error("Bytes out of range returned data")
	}
}

func TestSignedFloatBool(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	// Elements of these types with custom IDs, via a private registry.
	custom, err := ipfix.NewRegistry([]ipfix.InfoElement{
		{Name: "s64", EnterpriseID: 1, ID: 1, Type: ipfix.Signed64},
		{Name: "f64", EnterpriseID: 1, ID: 2, Type: ipfix.Float64},
		{Name: "f32", EnterpriseID: 1, ID: 3, Type: ipfix.Float32},
		{Name: "b", EnterpriseID: 1, ID: 4, Type: ipfix.Boolean},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = reg
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{Registry: custom}))
	msg := message(1,
		set(2, tmplRec(256, spec{1, 3, 1}, spec{2, 4, 1}, spec{2, 8, 1}, spec{3, 4, 1}, spec{4, 1, 1}, spec{4, 1, 1})),
		set(256, []byte{0xff, 0xff, 0xfe}, u32(math.Float32bits(1.5)), binary.BigEndian.AppendUint64(nil, math.Float64bits(-2.25)),
			u32(math.Float32bits(3)), []byte{1}, []byte{7}),
	)
	got := decode(t, d, msg, t0)
	if got.err != nil || len(got.recs) != 1 {
		t.Fatalf("%v %d", got.err, len(got.recs))
	}
	r := got.recs[0]
	if v, err := r.Int(0); err != nil || v != -2 {
		t.Errorf("signed = %d %v", v, err)
	}
	if v, err := r.Float(1); err != nil || v != 1.5 {
		t.Errorf("reduced float64 = %v %v", v, err)
	}
	if v, err := r.Float(2); err != nil || v != -2.25 {
		t.Errorf("float64 = %v %v", v, err)
	}
	if v, err := r.Float(3); err != nil || v != 3 {
		t.Errorf("float32 = %v %v", v, err)
	}
	if v, err := r.Bool(4); err != nil || !v {
		t.Errorf("bool = %v %v", v, err)
	}
	if _, err := r.Bool(5); !errors.Is(err, ipfix.ErrType) {
		t.Errorf("bool octet 7: %v", err)
	}
}

func TestTemplateLifecycle(t *testing.T) {
	d := newDecoder(0)
	sess := d.Session()
	def := set(2, tmplRec(256, spec{4, 1, 0}))
	data := set(256, []byte{6})
	if got := decode(t, d, message(1, def, data), t0); got.err != nil || len(got.recs) != 1 {
		t.Fatalf("%v %d", got.err, len(got.recs))
	}
	first := sess.Template(1, 256, t0)
	// Unchanged re-announcement: same template object, counted as refresh.
	decode(t, d, message(1, def), t0)
	if sess.Template(1, 256, t0) != first || sess.Stats.TemplatesRefreshed != 1 {
		t.Fatalf("refresh replaced the template: %+v", sess.Stats)
	}
	// Same ID, new definition (as Antrea does across versions): replaced.
	got := decode(t, d, message(1, set(2, tmplRec(256, spec{4, 1, 0}, spec{7, 2, 0})), set(256, []byte{17}, u16(53))), t0)
	if got.err != nil || len(got.recs) != 1 || got.recs[0].NumFields() != 2 || sess.Stats.TemplatesReplaced != 1 {
		t.Fatalf("replace: %v %d %+v", got.err, len(got.recs), sess.Stats)
	}
	// Other domains are separate.
	got = decode(t, d, message(2, set(256, []byte{6})), t0)
	if len(got.recs) != 0 || sess.Stats.UnknownTemplateSets != 1 {
		t.Fatalf("domain 2 saw domain 1's template: %+v", sess.Stats)
	}
	// An invalid re-announcement removes the old definition.
	got = decode(t, d, message(1, set(2, tmplRec(256, spec{4, 0, 0}))), t0)
	if !errors.Is(got.err, ipfix.ErrMalformed) || sess.Template(1, 256, t0) != nil {
		t.Fatalf("invalid re-announcement: %v, template kept: %v", got.err, sess.Template(1, 256, t0) != nil)
	}
}

func TestWithdrawal(t *testing.T) {
	d := newDecoder(0)
	sess := d.Session()
	decode(t, d, message(1,
		set(2, tmplRec(256, spec{4, 1, 0}), tmplRec(257, spec{4, 1, 0})),
		set(3, optTmplRec(258, 1, spec{149, 4, 0}))), t0)
	if sess.NumTemplates() != 3 {
		t.Fatalf("%d templates", sess.NumTemplates())
	}
	// Withdraw 256 alone, then the data for 256 is skipped but 257's is
	// decoded in the same message.
	got := decode(t, d, message(1, set(2, u16(256), u16(0)), set(256, []byte{1}), set(257, []byte{2})), t0)
	if got.err != nil || len(got.recs) != 1 || got.recs[0].Template.ID != 257 || sess.Stats.UnknownTemplateSets != 1 {
		t.Fatalf("%v %d %+v", got.err, len(got.recs), sess.Stats)
	}
	// Withdraw all (non-options) templates: the options template stays.
	decode(t, d, message(1, set(2, u16(2), u16(0))), t0)
	if sess.Template(1, 257, t0) != nil || sess.Template(1, 258, t0) == nil {
		t.Fatal("withdraw-all removed the wrong templates")
	}
	decode(t, d, message(1, set(3, u16(3), u16(0))), t0)
	if sess.NumTemplates() != 0 || sess.Stats.TemplatesWithdrawn != 3 {
		t.Fatalf("%d templates left, %+v", sess.NumTemplates(), sess.Stats)
	}
}

func TestUDPTemplateExpiry(t *testing.T) {
	d := newDecoder(ipfix.DefaultUDPTemplateTTL)
	def := set(2, tmplRec(256, spec{4, 1, 0}))
	decode(t, d, message(1, def), t0)
	if got := decode(t, d, message(1, set(256, []byte{6})), t0.Add(29*time.Minute)); len(got.recs) != 1 {
		t.Fatal("template expired early")
	}
	// A refresh restarts the clock.
	decode(t, d, message(1, def), t0.Add(29*time.Minute))
	if got := decode(t, d, message(1, set(256, []byte{6})), t0.Add(58*time.Minute)); len(got.recs) != 1 {
		t.Fatal("refreshed template expired")
	}
	got := decode(t, d, message(1, set(256, []byte{6})), t0.Add(29*time.Minute+31*time.Minute+time.Second))
	if len(got.recs) != 0 || d.Session().Stats.TemplatesExpired != 1 || d.Session().Stats.UnknownTemplateSets != 1 {
		t.Fatalf("template did not expire: %+v", d.Session().Stats)
	}
	// Expire sweeps templates nobody looks up.
	decode(t, d, message(9, def), t0)
	if n := d.Session().Expire(t0.Add(time.Hour)); n != 1 || d.Session().NumTemplates() != 0 {
		t.Fatalf("Expire removed %d", n)
	}
}

func TestPadding(t *testing.T) {
	d := newDecoder(0)
	// Data set padded with 3 zero octets (record length 4); template set
	// padded with 2.
	msg := message(1, set(2, tmplRec(256, spec{8, 4, 0}), []byte{0, 0}), set(256, u32(1), u32(2), []byte{0, 0, 0}))
	got := decode(t, d, msg, t0)
	if got.err != nil || len(got.recs) != 2 {
		t.Fatalf("%v %d", got.err, len(got.recs))
	}
}

func TestTemplateLimit(t *testing.T) {
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{MaxTemplates: 2}))
	got := decode(t, d, message(1, set(2, tmplRec(256, spec{4, 1, 0}), tmplRec(257, spec{4, 1, 0}), tmplRec(258, spec{4, 1, 0}))), t0)
	if !errors.Is(got.err, ipfix.ErrTemplateLimit) || d.Session().NumTemplates() != 2 {
		t.Fatalf("%v, %d templates", got.err, d.Session().NumTemplates())
	}

	// The field budget: 3 fields in all.
	d = ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{MaxTemplateFields: 3}))
	two := []spec{{4, 1, 0}, {7, 2, 0}}
	if got := decode(t, d, message(1, set(2, tmplRec(256, two...))), t0); got.err != nil {
		t.Fatal(got.err)
	}
	if got := decode(t, d, message(1, set(2, tmplRec(257, two...))), t0); !errors.Is(got.err, ipfix.ErrTemplateLimit) {
		t.Fatalf("second 2-field template: %v", got.err)
	}
	// Replacing 256 by a 3-field definition fits: the old fields are given back.
	if got := decode(t, d, message(1, set(2, tmplRec(256, append(two, spec{11, 2, 0})...))), t0); got.err != nil {
		t.Fatalf("replacement: %v", got.err)
	}
	// Withdrawing it frees the budget for 257.
	if got := decode(t, d, message(1, set(2, u16(256), u16(0)), set(2, tmplRec(257, two...))), t0); got.err != nil {
		t.Fatalf("after withdrawal: %v", got.err)
	}
}

func TestMalformed(t *testing.T) {
	okTmpl := set(2, tmplRec(256, spec{4, 1, 0}, spec{101, 0xffff, ipfix.EnterpriseAntrea}))
	cases := []struct {
		name string
		msg  []byte
		want string // in the error text
		recs int    // records decoded before the error
	}{
		{"short header", []byte{0, 10, 0, 16}, "header needs 16", 0},
		{"version 9", cat(u16(9), u16(16), make([]byte, 12)), "version 9", 0},
		{"length mismatch", append(message(1), 0), "says 16 octets, message has 17", 0},
		{"set shorter than header", message(1, cat(u16(256), u16(3))), "set length 3 is shorter", 0},
		{"set overruns", message(1, cat(u16(2), u16(40), tmplRec(256, spec{4, 1, 0}))), "overruns the message", 0},
		{"trailing octets", cat(message(1, okTmpl)[:2], u16(uint16(16+len(okTmpl)+2)), message(1, okTmpl)[4:], []byte{0, 1}), "too few for a set header", 0},
		{"template ID below 256", message(1, set(2, tmplRec(255, spec{4, 1, 0}))), "template ID 255", 0},
		{"zero-length field", message(1, set(2, tmplRec(256, spec{4, 0, 0}))), "has length 0", 0},
		{"truncated specifier", message(1, set(2, u16(256), u16(2), u16(4), u16(1))), "field specifier 1 of 2 truncated", 0},
		{"truncated enterprise number", message(1, set(2, u16(256), u16(1), u16(0x8001), u16(4), u16(0))), "enterprise number of field 0 truncated", 0},
		{"options scope 0", message(1, set(3, optTmplRec(256, 0, spec{4, 1, 0}))), "scope field count 0", 0},
		{"options scope too big", message(1, set(3, optTmplRec(256, 2, spec{4, 1, 0}))), "scope field count 2", 0},
		{"template set garbage", message(1, set(2, tmplRec(256, spec{4, 1, 0}), []byte{0, 0, 0, 0, 9})), "trailing octets", 0},
		{"3-octet length overruns", message(1, okTmpl, set(256, []byte{6, 255, 0xff, 0xff}, []byte("abc"))), "value of 65535 octets overruns", 0},
		{"3-octet length truncated", message(1, okTmpl, set(256, []byte{6, 3}, []byte("abc"), []byte{6, 255, 1})), "3-octet length", 1},
		{"huge fixed record", message(1, set(2, tmplRec(256, spec{1000, 0xfffe, 0}))), "cannot fit in a message", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := decode(t, newDecoder(0), c.msg, t0)
			if got.err == nil || !strings.Contains(got.err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", got.err, c.want)
			}
			if !errors.Is(got.err, ipfix.ErrMalformed) {
				t.Errorf("%v is not ErrMalformed", got.err)
			}
			if len(got.recs) != c.recs {
				t.Errorf("%d records before the error, want %d", len(got.recs), c.recs)
			}
		})
	}
}

func TestErrorLocation(t *testing.T) {
	okTmpl := set(2, tmplRec(256, spec{4, 1, 0}, spec{101, 0xffff, ipfix.EnterpriseAntrea}))
	msg := message(1, okTmpl, set(256, []byte{6, 9}, []byte("ab")))
	got := decode(t, newDecoder(0), msg, t0)
	var de *ipfix.DecodeError
	if !errors.As(got.err, &de) {
		t.Fatalf("%T %v", got.err, got.err)
	}
	wantOff := 16 + len(okTmpl) + 4 + 2 // the string's value, after its length octet
	if de.Offset != wantOff || de.SetID != 256 || de.TemplateID != 256 || !strings.Contains(de.Error(), "sourcePodName") {
		t.Fatalf("%+v: %v (want offset %d)", de, de, wantOff)
	}
}

func TestRegistry(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	for _, id := range []uint16{1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 27, 28, 61, 85, 86, 136, 148, 150, 151, 152, 153, 154, 155, 156, 403, 404, 405} {
		if _, ok := reg.Lookup(0, id); !ok {
			t.Errorf("IANA element %d missing", id)
		}
	}
	for id := uint16(100); id <= 172; id++ {
		if _, ok := reg.Lookup(ipfix.EnterpriseAntrea, id); !ok {
			t.Errorf("Antrea element %d missing", id)
		}
	}
	rev, ok := reg.ByName("reverseOctetDeltaCount")
	if !ok || rev.EnterpriseID != ipfix.EnterpriseReverse || rev.ID != 1 || rev.Type != ipfix.Unsigned64 {
		t.Errorf("reverseOctetDeltaCount = %+v", rev)
	}
	if ie, _ := reg.Lookup(ipfix.EnterpriseAntrea, 159); ie == nil || ie.Name != "sourcePodUUID" || ie.DefaultLength() != 16 {
		t.Errorf("sourcePodUUID = %+v", ie)
	}
	if _, ok := reg.Lookup(ipfix.EnterpriseReverse, 149); ok {
		t.Error("observationDomainId must not have a reverse element")
	}
	if _, err := ipfix.NewRegistry([]ipfix.InfoElement{{Name: "a", ID: 1, Type: ipfix.Unsigned8}, {Name: "b", ID: 1, Type: ipfix.Unsigned8}}); err == nil {
		t.Error("duplicate identity accepted")
	}
	if _, err := ipfix.NewRegistry([]ipfix.InfoElement{{Name: "a", ID: 1, Type: ipfix.IPv4Address, Length: 3}}); err == nil {
		t.Error("invalid length accepted")
	}
}
