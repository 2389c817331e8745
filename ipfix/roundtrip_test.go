package ipfix_test

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// encodeAntrea encodes n Antrea v2.7 records (template first) and returns
// the messages.
func encodeAntrea(t testing.TB, n, maxSize int) [][]byte {
	t.Helper()
	reg := ipfix.DefaultRegistry()
	tmpl, err := ipfixtest.Template(reg, 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: maxSize, Now: func() time.Time { return time.Unix(1767225600, 0) }},
		func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(7, tmpl); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := ipfixtest.WriteAntreaV27(enc, 7, tmpl, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func TestRoundTripAntrea(t *testing.T) {
	msgs := encodeAntrea(t, 500, 1400)
	if len(msgs) < 2 {
		t.Fatalf("expected the 1400-octet limit to split 500 records, got %d message(s)", len(msgs))
	}
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	d := ipfix.NewDecoder(sess)
	var seq uint32
	i := 0
	for _, m := range msgs {
		if len(m) > 1400 {
			t.Fatalf("message of %d octets exceeds the maximum", len(m))
		}
		if err := d.Reset(m, time.Now()); err != nil {
			t.Fatal(err)
		}
		if d.Header().SequenceNumber != seq {
			t.Fatalf("sequence number %d, want %d", d.Header().SequenceNumber, seq)
		}
		for d.Next() {
			r := d.Record()
			want := ipfixtest.SampleFlow(i)
			src, err := r.Addr(r.Template.Index(0, 8))
			if err != nil || src != want.Src {
				t.Fatalf("record %d: source %v %v, want %v", i, src, err, want.Src)
			}
			oct, err := r.Uint(r.Template.Index(0, 85))
			if err != nil || oct != want.Octets {
				t.Fatalf("record %d: octets %d %v, want %d", i, oct, err, want.Octets)
			}
			pod, err := r.String(r.Template.Index(ipfix.EnterpriseAntrea, 101))
			if err != nil || pod != want.SrcPod {
				t.Fatalf("record %d: pod %q %v, want %q", i, pod, err, want.SrcPod)
			}
			st, err := r.Time(0)
			if err != nil || !st.Equal(want.Start) {
				t.Fatalf("record %d: start %v %v", i, st, err)
			}
			rev, err := r.Uint(r.Template.Index(ipfix.EnterpriseReverse, 85))
			if err != nil || rev != want.RevOctets {
				t.Fatalf("record %d: reverse octets %d %v", i, rev, err)
			}
			snat, err := r.Addr(r.Template.Index(ipfix.EnterpriseAntrea, 170))
			if err != nil || snat != netip.IPv4Unspecified() {
				t.Fatalf("record %d: snat %v %v", i, snat, err)
			}
			i++
			seq++
		}
		if err := d.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if i != 500 {
		t.Fatalf("decoded %d records, want 500", i)
	}
}
