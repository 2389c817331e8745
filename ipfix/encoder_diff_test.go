package ipfix_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"sluice/ipfix"
)

// The Encoder writes values through a precomputed plan with wide stores
// past each field; this test checks it against a reference that appends
// each value the plain way, on random templates, values (some of the wrong
// type, out of range or too long), record counts and message sizes.

// refValue appends v as a value of field f, or says why it cannot.
func refValue(b []byte, f *ipfix.Field, v any) ([]byte, error) {
	bad := errors.New("refused")
	l := int(f.Length)
	switch v := v.(type) {
	case uint64:
		if !f.Type.IsUnsigned() || (l < 8 && v>>(8*l) != 0) {
			return nil, bad
		}
		for k := l - 1; k >= 0; k-- {
			b = append(b, byte(v>>(8*k)))
		}
	case int64:
		if !f.Type.IsSigned() || (l < 8 && (v < -(1<<(8*l-1)) || v >= 1<<(8*l-1))) {
			return nil, bad
		}
		for k := l - 1; k >= 0; k-- {
			b = append(b, byte(v>>(8*k)))
		}
	case float64:
		switch {
		case f.Type != ipfix.Float32 && f.Type != ipfix.Float64:
			return nil, bad
		case l == 4:
			b = binary.BigEndian.AppendUint32(b, math.Float32bits(float32(v)))
		default:
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
		}
	case bool:
		if f.Type != ipfix.Boolean {
			return nil, bad
		}
		if v {
			b = append(b, 1)
		} else {
			b = append(b, 2)
		}
	case netip.Addr:
		switch {
		case f.Type != ipfix.IPv4Address && f.Type != ipfix.IPv6Address:
			return nil, bad
		case !v.IsValid():
			b = append(b, make([]byte, l)...)
		case f.Type == ipfix.IPv4Address && v.Is4():
			b = append(b, v.AsSlice()...)
		case f.Type == ipfix.IPv6Address && v.Is6():
			b = append(b, v.AsSlice()...)
		default:
			return nil, bad
		}
	case [6]byte:
		if f.Type != ipfix.MacAddress {
			return nil, bad
		}
		b = append(b, v[:]...)
	case time.Time:
		switch f.Type {
		case ipfix.DateTimeSeconds:
			b = binary.BigEndian.AppendUint32(b, uint32(v.Unix()))
		case ipfix.DateTimeMilliseconds:
			b = binary.BigEndian.AppendUint64(b, uint64(v.UnixMilli()))
		case ipfix.DateTimeMicroseconds, ipfix.DateTimeNanoseconds:
			frac := uint64(v.Nanosecond()) << 32 / 1e9
			if f.Type == ipfix.DateTimeMicroseconds {
				frac &^= 0x7ff
			}
			b = binary.BigEndian.AppendUint32(b, uint32(v.Unix()+2208988800))
			b = binary.BigEndian.AppendUint32(b, uint32(frac))
		default:
			return nil, bad
		}
	case string, []byte:
		s, isString := v.(string)
		if !isString {
			s = string(v.([]byte))
		}
		octets := f.Type == ipfix.OctetArray || f.Type == ipfix.BasicList
		if isString && f.Type != ipfix.String || !isString && !octets {
			return nil, bad
		}
		switch n := len(s); {
		case !f.Variable():
			if n != l {
				return nil, bad
			}
		case n < 255:
			b = append(b, byte(n))
		case n <= 65535:
			b = append(b, 255, byte(n>>8), byte(n))
		default:
			return nil, bad
		}
		b = append(b, s...)
	default:
		panic(fmt.Sprintf("value of type %T", v))
	}
	return b, nil
}

// write passes v to the RecordBuilder method of its Go type.
func write(w ipfix.RecordBuilder, v any) ipfix.RecordBuilder {
	switch v := v.(type) {
	case uint64:
		return w.Uint(v)
	case int64:
		return w.Int(v)
	case float64:
		return w.Float(v)
	case bool:
		return w.Bool(v)
	case netip.Addr:
		return w.Addr(v)
	case [6]byte:
		return w.MAC(v)
	case time.Time:
		return w.Time(v)
	case string:
		return w.String(v)
	case []byte:
		return w.Bytes(v)
	}
	panic(fmt.Sprintf("value of type %T", v))
}

// randomValue returns a value for a field of type t and length l, now and
// then one that does not fit or is of another type.
func randomValue(r *rand.Rand, t ipfix.DataType, l uint16) any {
	if r.IntN(40) == 0 {
		t = ipfix.DataType(r.IntN(int(ipfix.IPv6Address) + 1))
		if t == ipfix.BasicList-1 {
			t = ipfix.OctetArray
		}
	}
	bits := func() uint { return uint(r.IntN(65)) }
	strLen := func() int {
		switch {
		case l != ipfix.VariableLength && r.IntN(20) > 0:
			return int(l)
		case r.IntN(400) == 0:
			return 70000
		case r.IntN(10) == 0:
			return 250 + r.IntN(80)
		}
		return r.IntN(40)
	}
	switch {
	case t.IsUnsigned():
		return r.Uint64() >> (64 - bits()) >> 1 << 1 // bits() may be 0
	case t.IsSigned():
		return int64(r.Uint64()) >> (64 - bits()) >> 1
	case t == ipfix.Float32 || t == ipfix.Float64:
		return r.NormFloat64() * 1e6
	case t == ipfix.Boolean:
		return r.IntN(2) == 0
	case t == ipfix.MacAddress:
		return [6]byte{byte(r.Uint32()), 2, 3, 4, 5, byte(r.Uint32())}
	case t.IsTime():
		return time.Unix(r.Int64N(4e9), r.Int64N(1e9))
	case t == ipfix.IPv4Address || t == ipfix.IPv6Address:
		var a [16]byte
		binary.BigEndian.PutUint64(a[:], r.Uint64())
		binary.BigEndian.PutUint64(a[8:], r.Uint64())
		switch r.IntN(4) {
		case 0:
			return netip.Addr{}
		case 1:
			return netip.AddrFrom16(a)
		case 2:
			return netip.AddrFrom4([4]byte(a[:4])).Unmap()
		}
		if t == ipfix.IPv6Address {
			return netip.AddrFrom16(a)
		}
		return netip.AddrFrom4([4]byte(a[:4]))
	case t == ipfix.String:
		return string(bytes.Repeat([]byte{byte('a' + r.IntN(26))}, strLen()))
	}
	return bytes.Repeat([]byte{byte(r.Uint32())}, strLen())
}

// dataRecords returns the octets of every data set of msgs, concatenated.
func dataRecords(t *testing.T, msgs [][]byte, max int) []byte {
	t.Helper()
	var out []byte
	for _, m := range msgs {
		if len(m) > max || int(binary.BigEndian.Uint16(m[2:])) != len(m) {
			t.Fatalf("message of %d octets (header says %d, maximum %d)", len(m), binary.BigEndian.Uint16(m[2:]), max)
		}
		for off := ipfix.HeaderLen; off < len(m); {
			id, n := binary.BigEndian.Uint16(m[off:]), int(binary.BigEndian.Uint16(m[off+2:]))
			if n <= 4 || off+n > len(m) {
				t.Fatalf("set %d of %d octets at %d in a message of %d", id, n, off, len(m))
			}
			if id >= ipfix.MinDataSetID {
				out = append(out, m[off+4:off+n]...)
			}
			off += n
		}
	}
	return out
}

func TestEncoderMatchesReference(t *testing.T) {
	types := []ipfix.DataType{ipfix.OctetArray, ipfix.Unsigned8, ipfix.Unsigned16, ipfix.Unsigned32, ipfix.Unsigned64,
		ipfix.Signed8, ipfix.Signed16, ipfix.Signed32, ipfix.Signed64, ipfix.Float32, ipfix.Float64, ipfix.Boolean,
		ipfix.MacAddress, ipfix.String, ipfix.DateTimeSeconds, ipfix.DateTimeMilliseconds, ipfix.DateTimeMicroseconds,
		ipfix.DateTimeNanoseconds, ipfix.IPv4Address, ipfix.IPv6Address, ipfix.BasicList}
	var ies []ipfix.InfoElement
	for i, ty := range types {
		ies = append(ies, ipfix.InfoElement{Name: "e" + ty.String(), ID: uint16(i + 1), Type: ty})
	}
	reg, err := ipfix.NewRegistry(ies)
	if err != nil {
		t.Fatal(err)
	}
	var failed, written int
	for trial := range 3000 {
		r := rand.New(rand.NewPCG(uint64(trial), 1))
		fields := make([]ipfix.Field, 1+r.IntN(12))
		for k := range fields {
			ie, _ := reg.Lookup(0, uint16(1+r.IntN(len(types))))
			fields[k] = ipfix.Field{IE: ie}
			switch ty := ie.Type; {
			case ty.IsUnsigned() || ty.IsSigned():
				fields[k].Length = uint16(1 + r.IntN(int(ty.DefaultLength())))
			case ty == ipfix.Float64:
				fields[k].Length = uint16(4 + 4*r.IntN(2))
			case (ty == ipfix.String || ty == ipfix.OctetArray || ty == ipfix.BasicList) && r.IntN(3) == 0:
				fields[k].Length = uint16(1 + r.IntN(20))
			}
		}
		tmpl, err := ipfix.NewTemplate(256+uint16(r.IntN(3)), fields)
		if err != nil {
			t.Fatal(err)
		}
		max := []int{512, 1500, 65535}[r.IntN(3)]
		msgs, emit := collector()
		enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: max, Now: fixedClock}, emit)
		if err != nil {
			t.Fatal(err)
		}
		var want []byte
		for range 1 + r.IntN(40) {
			vals := make([]any, len(tmpl.Fields))
			for k := range vals {
				vals[k] = randomValue(r, tmpl.Fields[k].Type, tmpl.Fields[k].Length)
			}
			switch r.IntN(50) {
			case 0:
				vals = vals[:len(vals)-1]
			case 1:
				vals = append(vals, randomValue(r, ipfix.Unsigned8, 1))
			}
			var rec []byte
			var refErr error
			for k, v := range vals {
				if k >= len(tmpl.Fields) {
					refErr = errors.New("too many values")
					break
				}
				if rec, refErr = refValue(rec, &tmpl.Fields[k], v); refErr != nil {
					break
				}
			}
			if refErr == nil && len(vals) < len(tmpl.Fields) {
				refErr = errors.New("too few values")
			}
			if refErr == nil && ipfix.HeaderLen+4+len(rec) > max {
				refErr = ipfix.ErrTooLarge
			}
			w := enc.Begin(1, tmpl)
			for _, v := range vals {
				w = write(w, v)
			}
			err := w.End()
			switch {
			case refErr == nil && err != nil:
				t.Fatalf("trial %d: %v for values the reference encodes (template %v)", trial, err, tmpl.Fields)
			case refErr != nil && err == nil:
				t.Fatalf("trial %d: no error for values the reference refuses (%v)", trial, refErr)
			case errors.Is(refErr, ipfix.ErrTooLarge) != errors.Is(err, ipfix.ErrTooLarge):
				t.Fatalf("trial %d: error %v, reference %v", trial, err, refErr)
			case err != nil && !errors.Is(err, ipfix.ErrTooLarge) && !errors.Is(err, ipfix.ErrType):
				t.Fatalf("trial %d: error %v is neither ErrType nor ErrTooLarge", trial, err)
			case err != nil:
				failed++
			default:
				written++
				want = append(want, rec...)
			}
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
		if got := dataRecords(t, *msgs, max); !bytes.Equal(got, want) {
			t.Fatalf("trial %d: data records differ from the reference:\n got % x\nwant % x", trial, got, want)
		}
	}
	// The generator must exercise both outcomes, or the test proves little.
	if failed < 100 || written < 1000 {
		t.Fatalf("%d records written, %d refused", written, failed)
	}
}
