// Package ipfixjson renders decoded IPFIX data records as JSON objects, one
// per record: element names as keys with typed values, unknown elements as
// "<enterprise>:<id>" with hex octets, and the message context under
// "@template", "@observationDomainId" and "@exportTime".
package ipfixjson

import (
	"encoding/hex"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"sluice/ipfix"
)

// AppendRecord appends r, from a message with header h, as one JSON object
// (no trailing newline).
func AppendRecord(b []byte, h ipfix.Header, r *ipfix.Record) []byte {
	b = append(b, `{"@template":`...)
	b = strconv.AppendUint(b, uint64(r.Template.ID), 10)
	b = append(b, `,"@observationDomainId":`...)
	b = strconv.AppendUint(b, uint64(h.ObservationDomainID), 10)
	b = append(b, `,"@exportTime":"`...)
	b = h.Time().AppendFormat(b, time.RFC3339)
	b = append(b, '"')
	if r.NumFields() > 0 {
		b = append(b, ',')
	}
	b = AppendFields(b, r)
	return append(b, '}')
}

// AppendFields appends r's fields as comma-separated "name":value members
// (no braces), for callers that wrap them in an object of their own.
func AppendFields(b []byte, r *ipfix.Record) []byte {
	for i := 0; i < r.NumFields(); i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, key(r, i))
		b = append(b, ':')
		b = AppendValue(b, r, i)
	}
	return b
}

// key is the field's name; a name that repeats within the record gets
// "#2", "#3"... so that no key is lost to a JSON reader.
func key(r *ipfix.Record, i int) string {
	f := r.Field(i)
	name := f.Name()
	n := 1
	for j := 0; j < i; j++ {
		if r.Field(j).Key() == f.Key() {
			n++
		}
	}
	if n > 1 {
		name += "#" + strconv.Itoa(n)
	}
	return name
}

// AppendValue appends field i's value as JSON: numbers as numbers, times
// as RFC 3339 strings, addresses as text, and octets as hex. A value its
// type cannot read (a boolean octet of 7, say) falls back to hex.
func AppendValue(b []byte, r *ipfix.Record, i int) []byte {
	f := r.Field(i)
	switch t := f.Type; {
	case t.IsUnsigned():
		if v, err := r.Uint(i); err == nil {
			return strconv.AppendUint(b, v, 10)
		}
	case t.IsSigned():
		if v, err := r.Int(i); err == nil {
			return strconv.AppendInt(b, v, 10)
		}
	case t == ipfix.Float32 || t == ipfix.Float64:
		if v, err := r.Float(i); err == nil {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return AppendString(b, strconv.FormatFloat(v, 'g', -1, 64))
			}
			bits := 64
			if r.Len(i) == 4 {
				bits = 32
			}
			return strconv.AppendFloat(b, v, 'g', -1, bits)
		}
	case t == ipfix.Boolean:
		if v, err := r.Bool(i); err == nil {
			return strconv.AppendBool(b, v)
		}
	case t == ipfix.MacAddress:
		if v, err := r.MAC(i); err == nil {
			b = append(b, '"')
			for j, c := range v {
				if j > 0 {
					b = append(b, ':')
				}
				b = hex.AppendEncode(b, []byte{c})
			}
			return append(b, '"')
		}
	case t == ipfix.String:
		if v, err := r.StringBytes(i); err == nil {
			return AppendString(b, v)
		}
	case t.IsTime():
		if v, err := r.Time(i); err == nil {
			b = append(b, '"')
			b = v.AppendFormat(b, time.RFC3339Nano)
			return append(b, '"')
		}
	case t == ipfix.IPv4Address || t == ipfix.IPv6Address:
		if v, err := r.Addr(i); err == nil {
			b = append(b, '"')
			b = v.AppendTo(b)
			return append(b, '"')
		}
	}
	b = append(b, '"')
	b = hex.AppendEncode(b, r.Bytes(i))
	return append(b, '"')
}

// AppendString appends s as a JSON string, byte for byte as
// encoding/json.Marshal writes it (invalid UTF-8 becomes U+FFFD; <, >, &,
// U+2028 and U+2029 are escaped), without allocating: the JSON sink
// renders every string of every record.
func AppendString[S string | []byte](b []byte, s S) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	from := 0 // s[from:i] is still to be copied as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[from:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			from = i
			continue
		}
		var q [utf8.UTFMax]byte
		r, n := utf8.DecodeRune(q[:copy(q[:], s[i:])])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, s[from:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[from:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		from = i
	}
	b = append(b, s[from:]...)
	return append(b, '"')
}
