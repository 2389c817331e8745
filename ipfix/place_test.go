package ipfix

import (
	"slices"
	"testing"
)

// FuzzPlace checks the decoder's fast placement of a record with
// variable-length fields against the field-by-field walk: the same spans
// and length whenever place succeeds, and place refusing a record the walk
// accepts only for a three-octet length prefix.
func FuzzPlace(f *testing.F) {
	f.Add([]byte{4, 0xff, 2, 0xff}, []byte{1, 2, 3, 4, 3, 'a', 'b', 'c', 9, 9, 0})
	f.Add([]byte{0xff, 0xff}, []byte{255, 0, 3, 'a', 'b', 'c', 0})
	f.Add([]byte{8, 0xff, 1}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 200})
	f.Fuzz(func(t *testing.T, layout, rec []byte) {
		if len(layout) == 0 || len(layout) > 64 || len(rec) > MaxMessageLen {
			return
		}
		// One octet a field: 0xff is variable, anything else a length.
		fs := make([]Field, len(layout))
		for i, c := range layout {
			fs[i] = Field{ID: uint16(i + 1), Length: uint16(c), Type: OctetArray}
			switch c {
			case 0xff:
				fs[i].Length, fs[i].Type = VariableLength, String
			case 4:
				fs[i].Type = Unsigned32
			}
		}
		tm := &Template{ID: 256, Fields: fs}
		tm.layout()
		if tm.fixedLen >= 0 {
			return // all fixed: the decoder uses tm.fixed
		}
		got, want := make([]span, len(fs)), make([]span, len(fs))
		p, ok := tm.place(rec, got)
		d := &Decoder{tmpl: tm}
		q, wok := d.walk(tm, rec, want)
		switch {
		case ok && (!wok || p != q || !slices.Equal(got, want)):
			t.Fatalf("place: %d %v; walk: %d %v (%v)", p, got, q, want, d.err)
		case !ok && wok && !longPrefix(fs, rec, want):
			t.Fatalf("place refused a record walk reads: %v", want)
		}
		if wok {
			for i := range fs {
				if want[i].typ != spanType(fs[i].Type) {
					t.Fatalf("field %d: span type %d, field type %d", i, want[i].typ, fs[i].Type)
				}
			}
		}
	})
}

// longPrefix reports whether a variable-length field of the record that
// spans describe has a three-octet length prefix.
func longPrefix(fs []Field, rec []byte, spans []span) bool {
	start := 0
	for i := range fs {
		if fs[i].Variable() && rec[start] == 255 {
			return true
		}
		start = int(spans[i].end)
	}
	return false
}
