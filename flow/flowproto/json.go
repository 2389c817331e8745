package flowproto

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/ipfix/ipfixjson"
)

// JSONEncoder writes Flow messages in Protobuf's JSON mapping, the text
// protojson.Marshal gives for FromFlow's message, without building that
// message: it writes the Protobuf bytes with AppendFlow and transcodes
// them, driven by the message's descriptor. FromFlow and protojson cost
// 221 allocations for an aggregated record (BenchmarkJSON); this costs
// none once its buffer has grown.
//
// The text may differ from protojson's in white space (protojson's varies
// on purpose), in the order of the fields and in how strings are escaped;
// it reads back as the same message. A string that is not valid UTF-8 is
// an error, as it is for protojson. The zero JSONEncoder is ready to use;
// it is not safe for concurrent use.
type JSONEncoder struct {
	wire []byte
}

// Append appends f's Flow message in JSON to b.
func (e *JSONEncoder) Append(b []byte, f *flow.Flow) ([]byte, error) {
	wire, err := AppendFlow(e.wire[:0], f)
	e.wire = wire
	if err != nil {
		return b, err
	}
	start := len(b)
	b, err = appendJSONMessage(b, wire, flowJSON())
	if err != nil {
		return b[:start], fmt.Errorf("flowproto: JSON: %w", err)
	}
	return b, nil
}

// jsonMsg is what the transcoder needs of a message type, by field number.
type jsonMsg struct {
	fields    []*jsonField // by number; nil where there is none
	timestamp bool         // google.protobuf.Timestamp: an RFC 3339 string
}

type jsonField struct {
	key   string // `"jsonName":`
	kind  protoreflect.Kind
	wire  protowire.Type // the wire type of its values; another is an unknown field
	msg   *jsonMsg
	enum  []string         // value names by number 0 to 255 ("" where there is none)
	enumX map[int32]string // names of values outside 0 to 255
	isMap bool             // a map<string, string> (the only map of the schema)
}

var flowJSON = sync.OnceValue(func() *jsonMsg {
	return newJSONMsg((&flowpb.Flow{}).ProtoReflect().Descriptor(), map[protoreflect.FullName]*jsonMsg{})
})

func newJSONMsg(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*jsonMsg) *jsonMsg {
	if m := seen[md.FullName()]; m != nil {
		return m
	}
	m := &jsonMsg{timestamp: md.FullName() == "google.protobuf.Timestamp"}
	seen[md.FullName()] = m
	fs := md.Fields()
	top := 0
	for i := range fs.Len() {
		top = max(top, int(fs.Get(i).Number()))
	}
	m.fields = make([]*jsonField, top+1)
	for i := range fs.Len() {
		fd := fs.Get(i)
		jf := &jsonField{key: strconv.Quote(fd.JSONName()) + ":", kind: fd.Kind(), wire: wireType(fd.Kind()), isMap: fd.IsMap()}
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() != protoreflect.StringKind || fd.MapValue().Kind() != protoreflect.StringKind || fd.Number() >= 64 {
				panic(fmt.Sprintf("flowproto: map field %s is not a map<string, string> numbered below 64", fd.FullName()))
			}
		case fd.IsList():
			panic(fmt.Sprintf("flowproto: repeated field %s has no JSON transcoding", fd.FullName()))
		case fd.Kind() == protoreflect.MessageKind:
			jf.msg = newJSONMsg(fd.Message(), seen)
		case fd.Kind() == protoreflect.EnumKind:
			vs := fd.Enum().Values()
			for j := range vs.Len() {
				v := vs.Get(j)
				n := int(v.Number())
				if n < 0 || n >= 256 {
					if jf.enumX == nil {
						jf.enumX = map[int32]string{}
					}
					jf.enumX[int32(n)] = string(v.Name())
					continue
				}
				for len(jf.enum) <= n {
					jf.enum = append(jf.enum, "")
				}
				jf.enum[n] = string(v.Name())
			}
		case wireType(fd.Kind()) != protowire.VarintType && wireType(fd.Kind()) != protowire.BytesType,
			fd.Kind() == protoreflect.GroupKind:
			panic(fmt.Sprintf("flowproto: field %s of kind %v has no JSON transcoding", fd.FullName(), fd.Kind()))
		}
		m.fields[fd.Number()] = jf
	}
	return m
}

// wireType is the wire type of a field of kind k (no floats, groups or
// fixed-width integers in the schema: newJSONMsg refuses the first two,
// and the last would be written as fixed-width).
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return protowire.Fixed64Type
	default:
		return protowire.VarintType
	}
}

var (
	errWire  = errors.New("malformed Protobuf")
	errUTF8  = errors.New("a string is not valid UTF-8")
	errSplit = errors.New("a map's entries are not together")
)

// appendJSONMessage transcodes the message wire of type m as a JSON object.
// Zero scalars are left out, as protojson leaves them out.
func appendJSONMessage(b, wire []byte, m *jsonMsg) ([]byte, error) {
	if m.timestamp {
		return appendJSONTimestamp(b, wire)
	}
	b = append(b, '{')
	first := true
	sep := func() {
		if !first {
			b = append(b, ',')
		}
		first = false
	}
	var mapsDone uint64 // map fields written, by number (each must be one run)
	for len(wire) > 0 {
		num, typ, n := protowire.ConsumeTag(wire)
		if n < 0 {
			return b, errWire
		}
		wire = wire[n:]
		var jf *jsonField
		if int(num) < len(m.fields) {
			jf = m.fields[num]
		}
		if jf == nil || typ != jf.wire {
			// Unknown, or a known number with another wire type (a reader
			// keeps that as an unknown field): protojson leaves it out.
			if n = protowire.ConsumeFieldValue(num, typ, wire); n < 0 {
				return b, errWire
			}
			wire = wire[n:]
			continue
		}
		if jf.isMap {
			if mapsDone&(1<<num) != 0 {
				return b, errSplit
			}
			mapsDone |= 1 << num
			var err error
			sep()
			b = append(b, jf.key...)
			if b, wire, err = appendJSONMap(b, wire, num); err != nil {
				return b, err
			}
			continue
		}
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(wire)
			if n < 0 {
				return b, errWire
			}
			wire = wire[n:]
			if v == 0 {
				continue
			}
			sep()
			b = append(b, jf.key...)
			b = appendJSONVarint(b, jf, v)
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(wire)
			if n < 0 {
				return b, errWire
			}
			wire = wire[n:]
			if jf.kind != protoreflect.MessageKind && len(v) == 0 {
				continue
			}
			sep()
			b = append(b, jf.key...)
			var err error
			switch jf.kind {
			case protoreflect.MessageKind:
				b, err = appendJSONMessage(b, v, jf.msg)
			case protoreflect.StringKind:
				b, err = appendJSONString(b, v)
			case protoreflect.BytesKind:
				b = append(b, '"')
				b = base64.StdEncoding.AppendEncode(b, v)
				b = append(b, '"')
			default:
				err = errWire
			}
			if err != nil {
				return b, err
			}
		default:
			return b, errWire
		}
	}
	return append(b, '}'), nil
}

// appendJSONVarint writes a varint field's value: 64-bit integers as
// quoted decimals, enumerations by name, as protojson does.
func appendJSONVarint(b []byte, jf *jsonField, v uint64) []byte {
	switch jf.kind {
	case protoreflect.Int64Kind:
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(v), 10)
		return append(b, '"')
	case protoreflect.Uint64Kind:
		b = append(b, '"')
		b = strconv.AppendUint(b, v, 10)
		return append(b, '"')
	case protoreflect.Int32Kind:
		return strconv.AppendInt(b, int64(int32(v)), 10)
	case protoreflect.BoolKind:
		return append(b, "true"...)
	case protoreflect.EnumKind:
		name := ""
		if v < uint64(len(jf.enum)) {
			name = jf.enum[v]
		} else if jf.enumX != nil {
			name = jf.enumX[int32(v)]
		}
		if name != "" {
			b = append(b, '"')
			b = append(b, name...)
			return append(b, '"')
		}
		return strconv.AppendInt(b, int64(int32(v)), 10)
	default: // uint32
		return strconv.AppendUint(b, uint64(uint32(v)), 10)
	}
}

// appendJSONMap writes the run of map entries (field num) at the start of
// wire as one object and returns the wire after them. A key given twice
// is written once, with its last value, as a Protobuf reader keeps it.
func appendJSONMap(b, wire []byte, num protowire.Number) ([]byte, []byte, error) {
	b = append(b, '{')
	first := true
	rest := wire
	for len(rest) > 0 {
		entry, n := protowire.ConsumeBytes(rest)
		if n < 0 {
			return b, nil, errWire
		}
		rest = rest[n:]
		k, v, err := mapEntry(entry)
		if err != nil {
			return b, nil, err
		}
		if lastForKey(rest, num, k) { // else a later entry has the same key
			if !first {
				b = append(b, ',')
			}
			first = false
			if b, err = appendJSONString(b, k); err != nil {
				return b, nil, err
			}
			b = append(b, ':')
			if b, err = appendJSONString(b, v); err != nil {
				return b, nil, err
			}
		}
		// Another entry of the map follows?
		n2, t2, m := protowire.ConsumeTag(rest)
		if m < 0 || n2 != num || t2 != protowire.BytesType {
			break
		}
		rest = rest[m:]
	}
	return append(b, '}'), rest, nil
}

// lastForKey reports whether no entry of the map run at the start of wire
// (after the current entry) has key k.
func lastForKey(wire []byte, num protowire.Number, k []byte) bool {
	for len(wire) > 0 {
		n2, t2, m := protowire.ConsumeTag(wire)
		if m < 0 || n2 != num || t2 != protowire.BytesType {
			return true
		}
		entry, n := protowire.ConsumeBytes(wire[m:])
		if n < 0 {
			return true
		}
		wire = wire[m+n:]
		if k2, _, err := mapEntry(entry); err == nil && string(k2) == string(k) {
			return false
		}
	}
	return true
}

// mapEntry reads a map entry's key (field 1) and value (field 2).
func mapEntry(entry []byte) (k, v []byte, err error) {
	for len(entry) > 0 {
		num, typ, n := protowire.ConsumeTag(entry)
		if n < 0 {
			return nil, nil, errWire
		}
		entry = entry[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			// Not the key or the value: unknown, and left out.
			if n = protowire.ConsumeFieldValue(num, typ, entry); n < 0 {
				return nil, nil, errWire
			}
			entry = entry[n:]
			continue
		}
		x, m := protowire.ConsumeBytes(entry)
		if m < 0 {
			return nil, nil, errWire
		}
		entry = entry[m:]
		if num == 1 {
			k = x
		} else {
			v = x
		}
	}
	return k, v, nil
}

// appendJSONString writes s as a JSON string; invalid UTF-8 is an error,
// as it is for protojson (ipfixjson.AppendString would replace it).
func appendJSONString(b, s []byte) ([]byte, error) {
	if !utf8.Valid(s) {
		return b, errUTF8
	}
	return ipfixjson.AppendString(b, s), nil
}

// appendJSONTimestamp writes a Timestamp message as protojson does: RFC
// 3339 in UTC with 0, 3, 6 or 9 fractional digits.
func appendJSONTimestamp(b, wire []byte) ([]byte, error) {
	var secs int64
	var nanos int32
	for len(wire) > 0 {
		num, typ, n := protowire.ConsumeTag(wire)
		if n < 0 {
			return b, errWire
		}
		wire = wire[n:]
		if typ != protowire.VarintType {
			// Unknown to the Timestamp: left out.
			if n = protowire.ConsumeFieldValue(num, typ, wire); n < 0 {
				return b, errWire
			}
			wire = wire[n:]
			continue
		}
		v, m := protowire.ConsumeVarint(wire)
		if m < 0 {
			return b, errWire
		}
		wire = wire[m:]
		switch num {
		case 1:
			secs = int64(v)
		case 2:
			nanos = int32(v)
		}
	}
	if secs < minTimestamp || secs > maxTimestamp || nanos < 0 || nanos > 999_999_999 {
		return b, fmt.Errorf("timestamp %d.%09d out of range", secs, nanos)
	}
	// protojson's fraction: none, or 3, 6 or 9 digits, as few as hold it.
	layout := "2006-01-02T15:04:05.000000000"
	switch {
	case nanos == 0:
		layout = "2006-01-02T15:04:05"
	case nanos%1_000_000 == 0:
		layout = "2006-01-02T15:04:05.000"
	case nanos%1_000 == 0:
		layout = "2006-01-02T15:04:05.000000"
	}
	b = append(b, '"')
	b = time.Unix(secs, int64(nanos)).UTC().AppendFormat(b, layout)
	return append(b, 'Z', '"'), nil
}
