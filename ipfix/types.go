// Package ipfix is an IPFIX (RFC 7011, 7012, 5103) wire codec: the Information
// Element registry, per-session template state, a zero-allocation message
// decoder and an encoder that derives templates and values from one field list.
//
// It knows nothing about flows or Kubernetes; higher layers map elements to
// their own record model by (enterprise number, element ID).
package ipfix

import "fmt"

// DataType is an abstract data type of RFC 7012 §3.1.
type DataType uint8

// The abstract data types. The numeric values are those of the IANA
// "IPFIX Information Element Data Types" registry, so they can be carried
// in RFC 5610 type records unchanged.
const (
	OctetArray DataType = iota
	Unsigned8
	Unsigned16
	Unsigned32
	Unsigned64
	Signed8
	Signed16
	Signed32
	Signed64
	Float32
	Float64
	Boolean
	MacAddress
	String
	DateTimeSeconds
	DateTimeMilliseconds
	DateTimeMicroseconds
	DateTimeNanoseconds
	IPv4Address
	IPv6Address
	BasicList
	SubTemplateList
	SubTemplateMultiList
	numDataTypes
)

var dataTypeNames = [numDataTypes]string{
	OctetArray:           "octetArray",
	Unsigned8:            "unsigned8",
	Unsigned16:           "unsigned16",
	Unsigned32:           "unsigned32",
	Unsigned64:           "unsigned64",
	Signed8:              "signed8",
	Signed16:             "signed16",
	Signed32:             "signed32",
	Signed64:             "signed64",
	Float32:              "float32",
	Float64:              "float64",
	Boolean:              "boolean",
	MacAddress:           "macAddress",
	String:               "string",
	DateTimeSeconds:      "dateTimeSeconds",
	DateTimeMilliseconds: "dateTimeMilliseconds",
	DateTimeMicroseconds: "dateTimeMicroseconds",
	DateTimeNanoseconds:  "dateTimeNanoseconds",
	IPv4Address:          "ipv4Address",
	IPv6Address:          "ipv6Address",
	BasicList:            "basicList",
	SubTemplateList:      "subTemplateList",
	SubTemplateMultiList: "subTemplateMultiList",
}

func (t DataType) String() string {
	if t < numDataTypes {
		return dataTypeNames[t]
	}
	return fmt.Sprintf("dataType(%d)", uint8(t))
}

// ParseDataType returns the type with the given RFC 7012 name.
func ParseDataType(name string) (DataType, bool) {
	for i, n := range dataTypeNames {
		if n == name {
			return DataType(i), true
		}
	}
	return 0, false
}

// VariableLength is the field length that announces a variable-length field
// in a template (RFC 7011 §7).
const VariableLength = 0xFFFF

// DefaultLength is the natural encoded size of the type, or VariableLength
// for types without one.
func (t DataType) DefaultLength() uint16 {
	switch t {
	case Unsigned8, Signed8, Boolean:
		return 1
	case Unsigned16, Signed16:
		return 2
	case Unsigned32, Signed32, Float32, DateTimeSeconds, IPv4Address:
		return 4
	case Unsigned64, Signed64, Float64, DateTimeMilliseconds, DateTimeMicroseconds, DateTimeNanoseconds:
		return 8
	case MacAddress:
		return 6
	case IPv6Address:
		return 16
	}
	return VariableLength
}

// ValidLength reports whether a template field of type t may have length n.
// Integers may use reduced-size encoding (RFC 7011 §6.2) down to one octet;
// float64 may be reduced to float32; everything else has a fixed size, except
// the octet-array-like types, which take any length including variable.
func (t DataType) ValidLength(n uint16) bool {
	switch t {
	case Unsigned8, Unsigned16, Unsigned32, Unsigned64, Signed8, Signed16, Signed32, Signed64:
		return n >= 1 && n <= t.DefaultLength()
	case Float64:
		return n == 4 || n == 8
	case OctetArray, String, BasicList, SubTemplateList, SubTemplateMultiList:
		return true
	}
	return n == t.DefaultLength()
}

// IsUnsigned reports whether values of t read as unsigned integers.
func (t DataType) IsUnsigned() bool {
	return t >= Unsigned8 && t <= Unsigned64
}

// IsSigned reports whether values of t read as signed integers.
func (t DataType) IsSigned() bool {
	return t >= Signed8 && t <= Signed64
}

// IsTime reports whether t is one of the dateTime types.
func (t DataType) IsTime() bool {
	return t >= DateTimeSeconds && t <= DateTimeNanoseconds
}
