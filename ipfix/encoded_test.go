package ipfix_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// TestEncodedRecordsRoundTrip: records built with EncodeRecord and added
// with AddEncoded make the same messages as records written with Begin,
// spilling into new messages at the same places; Record.Encoded gives each
// received record's octets back.
func TestEncodedRecordsRoundTrip(t *testing.T) {
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 300, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return time.Unix(1_767_000_000, 0) }
	collect := func(out *[][]byte) func([]byte) error {
		return func(m []byte) error { *out = append(*out, bytes.Clone(m)); return nil }
	}
	var direct, viaEncoded [][]byte
	de, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 1500, Now: now}, collect(&direct))
	ve, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 1500, Now: now}, collect(&viaEncoded))
	var recs [][]byte
	for i := range 40 {
		f := ipfixtest.SampleFlow(i)
		if err := ipfixtest.WriteAntreaV27(de, 5, tmpl, f); err != nil {
			t.Fatal(err)
		}
		// WriteAntreaV27 writes through an Encoder: give it one whose
		// message holds only this record, and take the record out.
		var one [][]byte
		oe, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, collect(&one))
		if err := ipfixtest.WriteAntreaV27(oe, 5, tmpl, f); err != nil {
			t.Fatal(err)
		}
		oe.Flush()
		rec := one[0][16+4:] // message header, set header
		recs = append(recs, rec)
		if err := ve.AddEncoded(5, tmpl, rec); err != nil {
			t.Fatal(err)
		}
	}
	de.Flush()
	ve.Flush()
	if len(direct) < 3 || len(direct) != len(viaEncoded) {
		t.Fatalf("%d messages written directly, %d from encoded records", len(direct), len(viaEncoded))
	}
	for i := range direct {
		if !bytes.Equal(direct[i], viaEncoded[i]) {
			t.Fatalf("message %d differs", i)
		}
	}
	// Encoded gives the records back, whole or in runs of fields.
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	n := 0
	tm, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error {
		return d.Reset(m, now())
	})
	tm.AddTemplate(5, tmpl)
	tm.Flush()
	for d.Next() {
	}
	for _, m := range direct {
		if err := d.Reset(m, now()); err != nil {
			t.Fatal(err)
		}
		for d.Next() {
			r := d.Record()
			whole := r.Encoded(0, r.NumFields())
			if !bytes.Equal(whole, recs[n]) {
				t.Fatalf("record %d: Encoded gives %x, sent %x", n, whole, recs[n])
			}
			var joined []byte
			for _, cut := range [][2]int{{0, 5}, {5, 17}, {17, r.NumFields()}} {
				joined = append(joined, r.Encoded(cut[0], cut[1])...)
			}
			if !bytes.Equal(joined, whole) {
				t.Fatalf("record %d: runs of fields do not add up", n)
			}
			if r.Encoded(3, 3) != nil || r.Encoded(-1, 2) != nil || r.Encoded(0, r.NumFields()+1) != nil {
				t.Fatal("Encoded of an empty or outside range is not nil")
			}
			n++
		}
	}
	if n != 40 {
		t.Fatalf("decoded %d records, want 40", n)
	}
	if err := ve.AddEncoded(5, tmpl, recs[0][:3]); err == nil {
		t.Error("a record shorter than the template allows was taken")
	}
	big, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 512}, func([]byte) error { return nil })
	if err := big.AddEncoded(5, tmpl, make([]byte, 600)); !errors.Is(err, ipfix.ErrTooLarge) {
		t.Errorf("a record larger than a message: %v, want ErrTooLarge", err)
	}
}

// TestEncodeRecord: the octets EncodeRecord returns are the record as a
// message carries it, and a write that ends no record is an error.
func TestEncodeRecord(t *testing.T) {
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 300, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	me, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	rb, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { t.Error("EncodeRecord sent a message"); return nil })
	me.AddTemplate(1, tmpl)
	me.Flush()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	if err := d.Reset(msgs[0], time.Now()); err != nil {
		t.Fatal(err)
	}
	for d.Next() {
	}
	for i := range 5 {
		if err := ipfixtest.WriteAntreaV27(me, 1, tmpl, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
		me.Flush()
		msg := msgs[len(msgs)-1]
		if err := d.Reset(msg, time.Now()); err != nil || !d.Next() {
			t.Fatal(err)
		}
		r := d.Record()
		// Written again, value by value, from what was decoded.
		got, err := rb.EncodeRecord(tmpl, func(b ipfix.RecordBuilder) error {
			for j := range r.NumFields() {
				switch f := r.Field(j); f.Type {
				case ipfix.String:
					v, _ := r.String(j)
					b = b.String(v)
				case ipfix.IPv4Address, ipfix.IPv6Address:
					v, _ := r.Addr(j)
					b = b.Addr(v)
				case ipfix.DateTimeSeconds:
					v, _ := r.Time(j)
					b = b.Time(v)
				default:
					v, _ := r.Uint(j)
					b = b.Uint(v)
				}
			}
			return b.End()
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := msg[20:]; !bytes.Equal(got, want) {
			t.Fatalf("record %d: %x, want %x", i, got, want)
		}
	}
	if _, err := rb.EncodeRecord(tmpl, func(b ipfix.RecordBuilder) error { return nil }); err == nil {
		t.Error("a write that ended no record was taken")
	}
	if _, err := rb.EncodeRecord(tmpl, func(b ipfix.RecordBuilder) error { return b.Uint(1).End() }); err == nil {
		t.Error("a record with one field of 43 was taken")
	}
}

// TestArenaPool: an Arena comes empty with the room asked for, and goes
// back only once every record it holds is released.
func TestArenaPool(t *testing.T) {
	var p ipfix.ArenaPool
	a := p.Get(1000)
	if len(a.Buf) != 0 || cap(a.Buf) < 1000 {
		t.Fatalf("arena of len %d, cap %d", len(a.Buf), cap(a.Buf))
	}
	a.Buf = append(a.Buf, "records"...)
	a.Hold(3)
	if a.Release(2) {
		t.Fatal("an arena with a record not released went back to the pool")
	}
	if b := p.Get(1000); b == a {
		t.Fatal("an arena with a record not released was handed out again")
	}
	if !a.Release(1) {
		t.Fatal("the last release did not return the arena")
	}
	// sync.Pool may drop what it is given (under -race it does, at
	// random): what comes back, new or reused, must be empty and sized.
	for range 10 {
		b := p.Get(1000)
		if len(b.Buf) != 0 || cap(b.Buf) < 1000 || len(b.Recs) != 0 {
			t.Fatalf("arena of len %d, cap %d, %d records", len(b.Buf), cap(b.Buf), len(b.Recs))
		}
		b.Buf = append(b.Buf, "x"...)
		b.Hold(0)
	}
	// A much larger arena is not handed out for a small message.
	big := p.Get(1 << 16)
	big.Hold(0)
	for range 10 {
		if s := p.Get(100); cap(s.Buf) > 2*100+4096 {
			t.Fatalf("an arena of %d octets for a message of 100", cap(s.Buf))
		}
	}
}

// TestAppendVariable: AppendVariable writes a value as RecordBuilder does,
// on both sides of the three-octet length prefix.
func TestAppendVariable(t *testing.T) {
	tmpl, err := ipfix.NewTemplate(256, []ipfix.Field{{IE: ipfix.DefaultRegistry().MustByName("sourcePodName"), Length: ipfix.VariableLength}})
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	for _, n := range []int{0, 1, 254, 255, 300, 65000} {
		v := strings.Repeat("p", n)
		want, err := enc.EncodeRecord(tmpl, func(b ipfix.RecordBuilder) error { return b.String(v).End() })
		if err != nil {
			t.Fatal(err)
		}
		if got := ipfix.AppendVariable([]byte("x"), v); !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Errorf("%d octets: %x…, want %x…", n, got[:min(len(got), 5)], want[:min(len(want), 4)])
		}
		if got := ipfix.AppendVariable(nil, []byte(v)); !bytes.Equal(got, want) {
			t.Errorf("%d octets as bytes: %x…, want %x…", n, got[:min(len(got), 4)], want[:min(len(want), 4)])
		}
	}
}
