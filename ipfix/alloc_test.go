package ipfix_test

import (
	"io"
	"testing"
	"time"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// readAll reads every field of every record through the typed accessors,
// as a collector normalising records would.
func readAll(d *ipfix.Decoder, msg []byte) (n int, sum uint64, err error) {
	if err := d.Reset(msg, t0); err != nil {
		return 0, 0, err
	}
	for d.Next() {
		r := d.Record()
		n++
		for i := 0; i < r.NumFields(); i++ {
			switch t := r.Field(i).Type; {
			case t.IsUnsigned():
				v, _ := r.Uint(i)
				sum += v
			case t.IsTime():
				v, _ := r.Time(i)
				sum += uint64(v.Unix())
			case t == ipfix.IPv4Address || t == ipfix.IPv6Address:
				v, _ := r.Addr(i)
				sum += uint64(v.BitLen())
			case t == ipfix.String:
				v, _ := r.StringBytes(i)
				sum += uint64(len(v))
			}
		}
	}
	return n, sum, d.Err()
}

func TestDecodeAllocatesNothingPerRecord(t *testing.T) {
	msgs := encodeAntrea(t, 200, ipfix.MaxMessageLen)
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	for _, m := range msgs { // learn the template; size scratch space
		if _, _, err := readAll(d, m); err != nil {
			t.Fatal(err)
		}
	}
	data := msgs[len(msgs)-1]
	allocs := testing.AllocsPerRun(100, func() {
		if n, _, err := readAll(d, data); err != nil || n == 0 {
			t.Fatalf("%d records, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("decoding a message of records allocates %.1f times", allocs)
	}
}

func TestEncodeAllocatesNothingPerRecord(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	tmpl, _ := ipfixtest.Template(reg, 256, ipfixtest.AntreaV27IPv4())
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: fixedClock}, func([]byte) error { return nil })
	f := ipfixtest.SampleFlow(1)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := ipfixtest.WriteAntreaV27(enc, 1, tmpl, f); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("encoding a record allocates %.1f times", allocs)
	}
}

func BenchmarkDecodeAntreaV27(b *testing.B) {
	msgs := encodeAntrea(b, 2000, ipfix.MaxMessageLen)
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	records := 0
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			n, _, err := readAll(d, m)
			if err != nil {
				b.Fatal(err)
			}
			records += n
		}
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkEncodeAntreaV27(b *testing.B) {
	reg := ipfix.DefaultRegistry()
	tmpl, _ := ipfixtest.Template(reg, 256, ipfixtest.AntreaV27IPv4())
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{Now: time.Now}, func(m []byte) error { _, err := io.Discard.Write(m); return err })
	f := ipfixtest.SampleFlow(1)
	b.ReportAllocs()
	for b.Loop() {
		if err := ipfixtest.WriteAntreaV27(enc, 1, tmpl, f); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
