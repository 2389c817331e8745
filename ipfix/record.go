package ipfix

import (
	"bytes"
	"encoding/binary"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Record is a view of one data record: its template and its bytes. Values
// are read through typed accessors that check the field's type and return
// an error, never panic, on a mismatch or an index out of range.
type Record struct {
	Template *Template
	data     []byte
	spans    []span
	// longPrefix: a value under 255 octets came with the three-octet
	// length prefix.
	longPrefix bool
}

// MinimalLengths reports whether every variable-length value of the
// record has the shortest length prefix, as Encoder writes them: one
// octet below 255 octets of value. RFC 7011 §7 also allows three for any
// length, which a forwarder that copies octets may want to know.
func (r *Record) MinimalLengths() bool { return !r.longPrefix }

// NumFields is the number of fields in the record.
func (r *Record) NumFields() int { return len(r.spans) }

// Field describes field i. It panics if i is out of range, like a slice.
func (r *Record) Field(i int) *Field { return &r.Template.Fields[i] }

// Bytes returns the raw value of field i (for a variable-length field,
// without its length prefix), or nil if i is out of range. The slice
// aliases the message buffer.
func (r *Record) Bytes(i int) []byte {
	if uint(i) >= uint(len(r.spans)) {
		return nil
	}
	s := r.spans[i]
	return r.data[s.off:s.end:s.end]
}

// Len is the encoded length of record i's value.
func (r *Record) Len(i int) int {
	if uint(i) >= uint(len(r.spans)) {
		return 0
	}
	s := r.spans[i]
	return int(s.end) - int(s.off)
}

// typeSet is a set of DataTypes, for cheap type checks on hot paths.
type typeSet uint32

const (
	unsignedTypes typeSet = 1<<Unsigned8 | 1<<Unsigned16 | 1<<Unsigned32 | 1<<Unsigned64
	signedTypes   typeSet = 1<<Signed8 | 1<<Signed16 | 1<<Signed32 | 1<<Signed64
	floatTypes    typeSet = 1<<Float32 | 1<<Float64
	boolTypes     typeSet = 1 << Boolean
	addrTypes     typeSet = 1<<IPv4Address | 1<<IPv6Address
	macTypes      typeSet = 1 << MacAddress
	stringTypes   typeSet = 1 << String
	timeTypes     typeSet = 1<<DateTimeSeconds | 1<<DateTimeMilliseconds | 1<<DateTimeMicroseconds | 1<<DateTimeNanoseconds
	octetTypes    typeSet = 1<<OctetArray | 1<<BasicList | 1<<SubTemplateList | 1<<SubTemplateMultiList
)

func (s typeSet) has(t DataType) bool { return s&(1<<t) != 0 }

// typeSetNames says what a set of types reads as, for errors.
func (s typeSet) String() string {
	switch s {
	case unsignedTypes:
		return "an unsigned integer"
	case signedTypes:
		return "a signed integer"
	case floatTypes:
		return "a float"
	case boolTypes:
		return "a boolean"
	case addrTypes:
		return "an IP address"
	case macTypes:
		return "a MAC address"
	case stringTypes:
		return "a string"
	case timeTypes:
		return "a time"
	}
	return "octets"
}

// value checks that field i exists and has a type in want; not is the
// error's message for another type. It builds its errors from strings
// the template prepared (see Template.layout) instead of calling out, so
// that it stays within Go's inlining budget (cost 79 of 80): reading a
// field is one call, the accessor, not two. The accessors themselves do
// not fit: any call costs 57, and an error needs one or an allocation.
func (r *Record) value(i int, want typeSet, not string) ([]byte, error) {
	if uint(i) < uint(len(r.spans)) {
		s := r.spans[i]
		if want>>(s.typ&31)&1 != 0 { // spanType keeps typ below 32
			return r.data[s.off:s.end], nil
		}
		return nil, &FieldError{Index: i, Name: r.Template.names[i], Type: s.typ, Msg: not}
	}
	msg := "no such field"
	if i < 0 {
		msg = r.Template.absent
	}
	return nil, &FieldError{Index: i, Name: "?", Msg: msg}
}

// Uint reads an unsigned integer of any (reduced) size.
func (r *Record) Uint(i int) (uint64, error) {
	b, err := r.value(i, unsignedTypes, "not an unsigned integer")
	return beUint(b), err
}

// Int reads a signed integer of any (reduced) size, sign-extended.
func (r *Record) Int(i int) (int64, error) {
	b, err := r.value(i, signedTypes, "not a signed integer")
	if len(b) == 0 {
		return 0, err
	}
	shift := 64 - 8*uint(len(b))
	return int64(beUint(b)<<shift) >> shift, nil
}

// Float reads a float32 or float64 (possibly reduced to 4 octets).
func (r *Record) Float(i int) (float64, error) {
	b, err := r.value(i, floatTypes, "not a float")
	if err != nil {
		return 0, err
	}
	if len(b) == 4 {
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
	}
	return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
}

// Bool reads a boolean (RFC 7011 §6.1.5: 1 is true, 2 is false).
func (r *Record) Bool(i int) (bool, error) {
	b, err := r.value(i, boolTypes, "not a boolean")
	if err != nil {
		return false, err
	}
	switch b[0] {
	case 1:
		return true, nil
	case 2:
		return false, nil
	}
	return false, r.boolError(i)
}

// boolError is Bool's error for an octet other than 1 or 2, out of line
// as it formats the field's name.
//
//go:noinline
func (r *Record) boolError(i int) error {
	f := &r.Template.Fields[i]
	return &FieldError{Index: i, Name: f.Name(), Type: f.Type, Msg: "boolean octet is neither 1 nor 2"}
}

// Addr reads an ipv4Address or ipv6Address.
func (r *Record) Addr(i int) (netip.Addr, error) {
	b, err := r.value(i, addrTypes, "not an IP address")
	if len(b) == 4 {
		return netip.AddrFrom4([4]byte(b)), nil
	}
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.AddrFrom16([16]byte(b)), nil
}

// MAC reads a macAddress.
func (r *Record) MAC(i int) ([6]byte, error) {
	b, err := r.value(i, macTypes, "not a MAC address")
	if err != nil {
		return [6]byte{}, err
	}
	return [6]byte(b), nil
}

// String reads a string element. It allocates; StringBytes does not.
func (r *Record) String(i int) (string, error) {
	b, err := r.value(i, stringTypes, "not a string")
	return string(b), err
}

// StringBytes returns a string element's octets without copying them.
func (r *Record) StringBytes(i int) ([]byte, error) {
	return r.value(i, stringTypes, "not a string")
}

// ntpEpochOffset is the number of seconds from 1900-01-01 (NTP era 0) to
// the Unix epoch.
const ntpEpochOffset = 2208988800

// Time reads any dateTime type. dateTimeMicroseconds and
// dateTimeNanoseconds use the NTP format of RFC 7011 §6.1.9-10.
func (r *Record) Time(i int) (time.Time, error) {
	b, err := r.value(i, timeTypes, "not a time")
	if err != nil {
		return time.Time{}, err
	}
	switch r.Template.Fields[i].Type {
	case DateTimeSeconds:
		return time.Unix(int64(binary.BigEndian.Uint32(b)), 0).UTC(), nil
	case DateTimeMilliseconds:
		return time.UnixMilli(int64(binary.BigEndian.Uint64(b))).UTC(), nil
	}
	sec := int64(binary.BigEndian.Uint32(b)) - ntpEpochOffset
	frac := uint64(binary.BigEndian.Uint32(b[4:]))
	if r.Template.Fields[i].Type == DateTimeMicroseconds {
		frac &^= 0x7ff // RFC 7011 §6.1.9: the low 11 bits are not significant
	}
	return time.Unix(sec, int64((frac*1e9)>>32)).UTC(), nil
}

func beUint(b []byte) uint64 {
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	case 4:
		return uint64(binary.BigEndian.Uint32(b))
	case 8:
		return binary.BigEndian.Uint64(b)
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// Clone returns a copy of r that owns its bytes, for keeping a record
// beyond the next call to Next or Reset.
func (r *Record) Clone() *Record {
	return &Record{Template: r.Template, data: bytes.Clone(r.data), spans: slices.Clone(r.spans), longPrefix: r.longPrefix}
}

// Encoded returns the octets of fields i through j-1 exactly as they were
// received, length prefixes included, or nil if the range is not within
// the record. A forwarder copies runs of fields with it instead of reading
// and re-writing each value.
func (r *Record) Encoded(i, j int) []byte {
	if i < 0 || j > len(r.spans) || i >= j {
		return nil
	}
	start := 0
	if i > 0 {
		start = int(r.spans[i-1].end)
	}
	return r.data[start:r.spans[j-1].end]
}

// EncodedRecord is one data record already encoded for Template: its field
// values in template order as they go on the wire (variable-length ones
// with their length prefixes), without a set header.
type EncodedRecord struct {
	Template *Template
	Data     []byte
	// Arena, when set, holds Data and is released by the consumer once it
	// has copied it (see Arena).
	Arena *Arena
}
