package interop

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"

	"sluice/ipfix"
)

// TestDecodeZeroAllocs asserts that, once the session knows the template,
// decoding messages of Antrea records and reading every field through the
// typed accessors (strings without copying) allocates nothing.
func TestDecodeZeroAllocs(t *testing.T) {
	flows := sampleAntreaFlows(600, false)
	tmpl, data := sluiceMessages(t, flows, false, benchMsgSize)
	if len(data) < 2 {
		t.Fatalf("want several data messages, got %d", len(data))
	}
	d := primedDecoder(t, tmpl)
	var n int
	var err error
	allocs := testing.AllocsPerRun(20, func() {
		n, _, err = decodeSluice(d, data, sumSluice)
	})
	if err != nil || n != len(flows) {
		t.Fatalf("decoded %d of %d records: %v", n, len(flows), err)
	}
	if allocs != 0 {
		t.Errorf("decoding %d messages (%d records) allocates %v times, want 0", len(data), n, allocs)
	}
}

// TestEncodeZeroAllocs asserts the same of encoding, once the encoder has
// sent its template and sized its buffer.
func TestEncodeZeroAllocs(t *testing.T) {
	flows := sampleAntreaFlows(600, false)
	msgs := 0
	enc, tmpl := sluiceEncoder(t, benchMsgSize, func([]byte) error { msgs++; return nil })
	if err := encodeSluice(enc, tmpl, flows); err != nil {
		t.Fatal(err)
	}
	var err error
	allocs := testing.AllocsPerRun(20, func() { err = encodeSluice(enc, tmpl, flows) })
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("encoding %d records allocates %v times, want 0", len(flows), allocs)
	}
}

// decodeAll decodes messages with a fresh Sluice session and returns every
// record's values.
func decodeAll(t *testing.T, msgs [][]byte) [][]any {
	t.Helper()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	var out [][]any
	for _, m := range msgs {
		if err := d.Reset(m, time.Now()); err != nil {
			t.Fatal(err)
		}
		for d.Next() {
			v, err := sluiceValues(d.Record())
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if err := d.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestBenchmarkEncodersAreCorrect checks that both encoders of
// BenchmarkEncode produce the records they are given, so that the
// benchmark compares two correct encoders.
func TestBenchmarkEncodersAreCorrect(t *testing.T) {
	flows := sampleAntreaFlows(700, false)
	names := antreaNames(false)
	check := func(t *testing.T, msgs [][]byte) {
		if len(msgs) < 3 {
			t.Fatalf("want a template and several data messages, got %d messages", len(msgs))
		}
		for i, m := range msgs {
			if len(m) > benchMsgSize {
				t.Fatalf("message %d has %d octets", i, len(m))
			}
		}
		got := decodeAll(t, msgs)
		if len(got) != len(flows) {
			t.Fatalf("decoded %d records, encoded %d", len(got), len(flows))
		}
		for i := range flows {
			for _, d := range diffValues(names, got[i], flows[i].values()) {
				t.Errorf("record %d: %s", i, d)
			}
		}
	}
	t.Run("sluice", func(t *testing.T) {
		var msgs [][]byte
		enc, tmpl := sluiceEncoder(t, benchMsgSize, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
		if err := encodeSluice(enc, tmpl, flows); err != nil {
			t.Fatal(err)
		}
		check(t, msgs)
	})
	t.Run("goipfix", func(t *testing.T) {
		var msgs [][]byte
		g := newGoBytesEncoder(benchMsgSize, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
		if err := g.template(); err != nil {
			t.Fatal(err)
		}
		if err := g.encode(flows); err != nil {
			t.Fatal(err)
		}
		check(t, msgs)
	})
}

// TestBenchmarkDecodersAgree runs both decode paths of BenchmarkDecode on
// the same bytes and checks that they read the same values.
func TestBenchmarkDecodersAgree(t *testing.T) {
	flows := sampleAntreaFlows(700, false)
	tmpl, data := sluiceMessages(t, flows, false, benchMsgSize)

	want := sumFlows(flows)
	for name, sum := range map[string]func(*ipfix.Record) (uint64, error){"StringBytes": sumSluice, "String": sumSluiceString} {
		n, s, err := decodeSluice(primedDecoder(t, tmpl), data, sum)
		if err != nil || n != len(flows) {
			t.Fatalf("sluice (%s) decoded %d of %d records: %v", name, n, len(flows), err)
		}
		if s != want {
			t.Errorf("sluice (%s) checksum %d, values sent %d", name, s, want)
		}
	}

	cp := startGoIPFIXCollector(t, "tcp")
	conn, err := net.Dial("tcp", cp.GetAddress().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go conn.Write(bytes.Join(append([][]byte{tmpl}, data...), nil)) //nolint:errcheck // a short write shows as missing records
	got, sum := 0, uint64(0)
	timeout := time.After(10 * time.Second)
	for got < len(flows) {
		select {
		case msg := <-cp.GetMsgChan():
			if msg.GetSet().GetSetType() == entities.Template {
				continue
			}
			for _, rec := range msg.GetSet().GetRecords() {
				s, err := sumGoIPFIX(rec)
				if err != nil {
					t.Fatal(err)
				}
				sum += s
				got++
			}
		case <-timeout:
			t.Fatalf("go-ipfix decoded %d of %d records", got, len(flows))
		}
	}
	if sum != want {
		t.Errorf("go-ipfix checksum %d, values sent %d", sum, want)
	}
}
