package flowproto

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/flow"
	"sluice/flow/flowpb"
)

// ErrMalformed is wrapped by the errors of a message that is not valid
// Protobuf (what proto.Unmarshal refuses).
var ErrMalformed = errors.New("flowproto: malformed Protobuf")

// RequestFlows appends to dst the encoded Flow messages of req, an encoded
// ExportRequest, as sub-slices of req, in order. Other fields of the
// request are skipped, as proto.Unmarshal keeps them unknown. A request
// whose outer structure is malformed is an error wrapping ErrMalformed;
// the Flows themselves are checked by Decoder.Decode.
func RequestFlows(req []byte, dst [][]byte) ([][]byte, error) {
	dst, _, err := RequestFlowsUpTo(req, dst, -1)
	return dst, err
}

// RequestFlowsUpTo is RequestFlows appending at most limit spans (all
// of them when limit < 0): n counts every Flow of req. A request of many tiny
// Flows (an empty one is 2 octets) then costs no span for each of those
// beyond what the caller accepts.
func RequestFlowsUpTo(req []byte, dst [][]byte, limit int) (_ [][]byte, n int, err error) {
	for len(req) > 0 {
		num, typ, k := protowire.ConsumeTag(req)
		if k < 0 {
			return dst, n, fmt.Errorf("%w: export request: %w", ErrMalformed, protowire.ParseError(k))
		}
		req = req[k:]
		if num == 1 && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(req)
			if k < 0 {
				return dst, n, fmt.Errorf("%w: export request: flow: %w", ErrMalformed, protowire.ParseError(k))
			}
			if limit < 0 || n < limit {
				dst = append(dst, v)
			}
			n++
			req = req[k:]
			continue
		}
		k = protowire.ConsumeFieldValue(num, typ, req)
		if k < 0 {
			return dst, n, fmt.Errorf("%w: export request: field %d: %w", ErrMalformed, num, protowire.ParseError(k))
		}
		req = req[k:]
	}
	return dst, n, nil
}

// Decoder turns encoded Flow messages into flow.Flow straight from the
// wire, without the generated structs: the same result as proto.Unmarshal
// followed by ToFlow, at a fraction of the cost. Strings that repeat (Pod,
// namespace, node names, UIDs, label sets) are interned: after their first
// sighting they cost no allocation. Messages the fast path does not cover
// (unknown fields, repeated or merged fields, L7 values, aggregation
// results, invalid values, anything malformed) take the generated path, so
// the result is always ToFlow's. Not safe for concurrent use: one per
// stream.
type Decoder struct {
	// last is the string each field had in the previous record, by slot
	// (a Kubernetes field's number, slotTCPState, slotExporter): a value
	// that repeats is found without hashing it.
	last        [numSlots]string
	strs        map[string]string
	labels      map[string]string // encoded Labels message -> JSON
	labelsBytes int               // held by labels, keys and values
}

// Bounds of the interning tables, each cleared when full: at most about
// 1 MiB of strings (as an IPFIX session's) and 256 KiB of label sets.
const (
	maxInterned    = 4096
	maxInternedLen = 256
	maxLabelsBytes = 256 << 10
	maxLabelsLen   = 4096
)

// Slots of Decoder.last besides the Kubernetes message's field numbers
// (1 to 35).
const (
	slotTCPState = 36 + iota
	slotExporter
	numSlots
)

// NewDecoder returns a Decoder with empty interning tables.
func NewDecoder() *Decoder {
	return &Decoder{strs: make(map[string]string), labels: make(map[string]string)}
}

// Decode fills f, which must be zero, from b, an encoded Flow message. It
// returns what proto.Unmarshal and ToFlow would: an error wrapping
// ErrMalformed when b does not decode, ToFlow's error for a value that
// cannot be represented (f is then partly filled and should be dropped),
// or the number of unknown fields, kept in f.ProtoUnknown.
func (d *Decoder) Decode(b []byte, f *flow.Flow) (unknown int, err error) {
	if d.fast(b, f) {
		return 0, nil
	}
	*f = flow.Flow{}
	var p flowpb.Flow
	if err := proto.Unmarshal(b, &p); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return ToFlow(&p, f)
}

// seen tracks which field numbers (below 64) a message has shown: a field
// seen twice is last-one-wins for scalars and a merge for messages, which
// the fast path leaves to the generated code.
type seen uint64

func (s *seen) first(num protowire.Number) bool {
	if num >= 64 {
		return false
	}
	bit := seen(1) << num
	if *s&bit != 0 {
		return false
	}
	*s |= bit
	return true
}

// field reads the tag and value of the field at b[p:], which must not
// be empty: v is a varint's value or a length-delimited value's length,
// and next is where the field ends (a length-delimited value is
// b[next-int(v):next]). num is 0 (never a valid field number) for
// anything else, a malformed field or a field seen before. Tags, varints
// and lengths of one or two octets, nearly all of a Flow's, are read
// inline; longer ones by protowire, with the same results. Positions
// instead of sub-slices keep the results in registers.
func field(b []byte, p int, s *seen) (num protowire.Number, typ protowire.Type, v uint64, next int) {
	if uint(p) >= uint(len(b)) {
		return 0, 0, 0, 0
	}
	t := uint64(b[p])
	p++
	if t >= 0x80 {
		if p >= len(b) || b[p] >= 0x80 {
			return slowField(b, p-1, s)
		}
		t = t&0x7f | uint64(b[p])<<7
		p++
	}
	num, typ = protowire.Number(t>>3), protowire.Type(t&7)
	if num == 0 || !s.first(num) {
		return 0, 0, 0, 0
	}
	if p < len(b) && b[p] < 0x80 {
		v = uint64(b[p])
		p++
	} else {
		var n int
		if v, n = varint(b[p:]); n < 0 {
			return 0, 0, 0, 0
		}
		p += n
	}
	switch typ {
	case protowire.VarintType:
		return num, typ, v, p
	case protowire.BytesType:
		if v > uint64(len(b)-p) {
			return 0, 0, 0, 0
		}
		return num, typ, v, p + int(v)
	}
	return 0, 0, 0, 0
}

// slowField is field for a tag of three octets or more.
func slowField(b []byte, p int, s *seen) (protowire.Number, protowire.Type, uint64, int) {
	num, typ, n := protowire.ConsumeTag(b[p:])
	if n < 0 || !s.first(num) {
		return 0, 0, 0, 0
	}
	p += n
	v, n := protowire.ConsumeVarint(b[p:])
	if n < 0 {
		return 0, 0, 0, 0
	}
	p += n
	switch typ {
	case protowire.VarintType:
		return num, typ, v, p
	case protowire.BytesType:
		if v > uint64(len(b)-p) {
			return 0, 0, 0, 0
		}
		return num, typ, v, p + int(v)
	}
	return 0, 0, 0, 0
}

// varint is protowire.ConsumeVarint with the two-octet case first.
func varint(b []byte) (uint64, int) {
	if len(b) > 1 && b[0] >= 0x80 && b[1] < 0x80 {
		return uint64(b[0]&0x7f) | uint64(b[1])<<7, 2
	}
	return protowire.ConsumeVarint(b)
}

// fast decodes b into f when every field of b is one it covers, and
// reports whether it did. On false, f is partly filled.
func (d *Decoder) fast(b []byte, f *flow.Flow) bool {
	var s seen
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 {
			return false
		}
		var m []byte
		if typ == protowire.BytesType {
			m = b[next-int(v) : next]
		}
		p = next
		if typ == protowire.VarintType {
			switch num {
			case 5: // end_reason
				if !enumOK(v) {
					return false
				}
				f.EndReason = uint8(v)
				setIf(f, flow.EndReason, f.EndReason != 0) // an int32 on the wire: its upper octets are not the value
			case 12: // flow_direction
				if !enumOK(v) {
					return false
				}
				f.FlowDirection = uint8(v)
				setIf(f, flow.FlowDirection, uint8(v) != 0)
			case 15: // proxy_snat_port
				if uint32(v) > 65535 {
					return false
				}
				f.ProxySnatPort = uint16(v)
				setIf(f, flow.ProxySnatPort, f.ProxySnatPort != 0)
			default:
				return false
			}
			continue
		}
		switch num {
		case 1: // id: unique per record, so not interned
			if !utf8.Valid(m) {
				return false
			}
			if len(m) > 0 {
				f.Origin.ID = string(m)
			}
		case 2:
			if !d.ipfix(m, f) {
				return false
			}
		case 3, 4:
			t, ok := timestamp(m)
			if !ok {
				return false
			}
			if num == 3 {
				f.StartTime = t
				f.Present.Set(flow.StartTime)
			} else {
				f.EndTime = t
				f.Present.Set(flow.EndTime)
			}
		case 6:
			if !ipMsg(m, f) {
				return false
			}
		case 7:
			if !d.transport(m, f) {
				return false
			}
		case 8:
			if !d.k8s(m, f) {
				return false
			}
		case 9:
			if !stats(m, &f.Stats, f, flow.PacketTotalCount) {
				return false
			}
		case 10:
			if !stats(m, &f.ReverseStats, f, flow.ReversePacketTotalCount) {
				return false
			}
		case 14:
			if !addr(m, &f.ProxySnatIP, f, flow.ProxySnatIP) {
				return false
			}
		default: // app, aggregation, unknown fields
			return false
		}
	}
	return true
}

// enumOK is enum8's test on an int32 enumeration as it comes off the wire.
func enumOK(v uint64) bool {
	e := int32(v)
	return e >= 0 && e <= 255
}

func (d *Decoder) ipfix(b []byte, f *flow.Flow) bool {
	var s seen
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 {
			return false
		}
		var m []byte
		if typ == protowire.BytesType {
			m = b[next-int(v) : next]
		}
		p = next
		switch {
		case num == 1 && typ == protowire.VarintType:
			if t := int64(v); t != 0 {
				f.Origin.ExportTime = time.Unix(t, 0).UTC()
			}
		case num == 2 && typ == protowire.VarintType:
			f.Origin.SequenceNumber = uint32(v)
		case num == 3 && typ == protowire.VarintType:
			f.Origin.ObservationDomainID = uint32(v)
		case num == 4 && typ == protowire.BytesType:
			str, ok := d.str(m, slotExporter)
			if !ok {
				return false
			}
			if a, err := netip.ParseAddr(str); err == nil {
				f.Origin.Exporter = a
			}
		default:
			return false
		}
	}
	return true
}

// Valid range of a google.protobuf.Timestamp (timestamppb's CheckValid).
const (
	minTimestamp = -62135596800 // 0001-01-01T00:00:00Z
	maxTimestamp = 253402300799 // 9999-12-31T23:59:59Z
)

func timestamp(b []byte) (time.Time, bool) {
	var s seen
	var sec int64
	var nanos int32
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 || typ != protowire.VarintType {
			return time.Time{}, false
		}
		p = next
		switch num {
		case 1:
			sec = int64(v)
		case 2:
			nanos = int32(v)
		default:
			return time.Time{}, false
		}
	}
	if sec < minTimestamp || sec > maxTimestamp || nanos < 0 || nanos >= 1e9 {
		return time.Time{}, false
	}
	return time.Unix(sec, int64(nanos)).UTC(), true
}

func ipMsg(b []byte, f *flow.Flow) bool {
	var s seen
	var version uint64
	var src, dst []byte
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 {
			return false
		}
		var m []byte
		if typ == protowire.BytesType {
			m = b[next-int(v) : next]
		}
		p = next
		switch {
		case num == 1 && typ == protowire.VarintType:
			version = v
		case num == 2 && typ == protowire.BytesType:
			src = m
		case num == 3 && typ == protowire.BytesType:
			dst = m
		default:
			return false
		}
	}
	if v := int32(version); v != 0 {
		for _, a := range [2][]byte{src, dst} {
			if len(a) != 0 && (v == int32(flowpb.IPVersion_IP_VERSION_4)) != (len(a) == 4) {
				return false
			}
		}
	}
	return addr(src, &f.SourceIP, f, flow.SourceIP) && addr(dst, &f.DestinationIP, f, flow.DestinationIP)
}

// addr is setAddr without the error: false for a length that is neither
// 4 nor 16.
func addr(b []byte, dst *netip.Addr, f *flow.Flow, field flow.Field) bool {
	if len(b) == 0 {
		return true
	}
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return false
	}
	*dst = a.Unmap()
	f.Present.Set(field)
	return true
}

func (d *Decoder) transport(b []byte, f *flow.Flow) bool {
	var s seen
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 {
			return false
		}
		var m []byte
		if typ == protowire.BytesType {
			m = b[next-int(v) : next]
		}
		p = next
		switch {
		case num == 1 && typ == protowire.VarintType:
			if uint32(v) > 255 {
				return false
			}
			f.Protocol = uint8(v)
		case num == 2 && typ == protowire.VarintType:
			if uint32(v) > 65535 {
				return false
			}
			f.SourcePort = uint16(v)
		case num == 3 && typ == protowire.VarintType:
			if uint32(v) > 65535 {
				return false
			}
			f.DestinationPort = uint16(v)
		case num == 4 && typ == protowire.BytesType: // TCP
			var ts seen
			f.TCPState = ""
			for q := 0; q < len(m); {
				n, t, l, next := field(m, q, &ts)
				if n != 1 || t != protowire.BytesType {
					return false
				}
				str := m[next-int(l) : next]
				q = next
				var ok bool
				if f.TCPState, ok = d.str(str, slotTCPState); !ok {
					return false
				}
			}
			f.Present.Set(flow.TCPState)
		default:
			return false
		}
	}
	f.Present.Set(flow.Protocol)
	f.Present.Set(flow.SourcePort)
	f.Present.Set(flow.DestinationPort)
	return true
}

// k8sStrings and k8sUIDs map the Kubernetes message's string fields, by
// number, to flow.Flow's.
var (
	k8sStrings = [36]flow.Field{
		2: flow.SourcePodNamespace, 3: flow.SourcePodName, 6: flow.SourceNodeName,
		8: flow.DestinationPodNamespace, 9: flow.DestinationPodName, 12: flow.DestinationNodeName,
		16: flow.DestinationServicePortName,
		19: flow.IngressPolicyNamespace, 20: flow.IngressPolicyName, 22: flow.IngressPolicyRuleName,
		25: flow.EgressPolicyNamespace, 26: flow.EgressPolicyName, 28: flow.EgressPolicyRuleName,
		30: flow.EgressName, 32: flow.EgressNodeName,
	}
	k8sUIDs = [36]flow.Field{
		4: flow.SourcePodUID, 7: flow.SourceNodeUID, 10: flow.DestinationPodUID, 13: flow.DestinationNodeUID,
		17: flow.DestinationServiceUID, 21: flow.IngressPolicyUID, 27: flow.EgressPolicyUID,
		33: flow.EgressNodeUID, 34: flow.EgressUID,
	}
)

func k8sString(f *flow.Flow, num protowire.Number) *string {
	switch num {
	case 2:
		return &f.SourcePodNamespace
	case 3:
		return &f.SourcePodName
	case 6:
		return &f.SourceNodeName
	case 8:
		return &f.DestinationPodNamespace
	case 9:
		return &f.DestinationPodName
	case 12:
		return &f.DestinationNodeName
	case 16:
		return &f.DestinationServicePortName
	case 19:
		return &f.Ingress.Namespace
	case 20:
		return &f.Ingress.Name
	case 22:
		return &f.Ingress.RuleName
	case 25:
		return &f.Egress.Namespace
	case 26:
		return &f.Egress.Name
	case 28:
		return &f.Egress.RuleName
	case 30:
		return &f.EgressName
	case 32:
		return &f.EgressNodeName
	}
	return nil
}

func k8sUID(f *flow.Flow, num protowire.Number) *flow.UID {
	switch num {
	case 4:
		return &f.SourcePodUID
	case 7:
		return &f.SourceNodeUID
	case 10:
		return &f.DestinationPodUID
	case 13:
		return &f.DestinationNodeUID
	case 17:
		return &f.DestinationServiceUID
	case 21:
		return &f.Ingress.UID
	case 27:
		return &f.Egress.UID
	case 33:
		return &f.EgressNodeUID
	case 34:
		return &f.EgressUID
	}
	return nil
}

func (d *Decoder) k8s(b []byte, f *flow.Flow) bool {
	var s seen
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 {
			return false
		}
		var m []byte
		if typ == protowire.BytesType {
			m = b[next-int(v) : next]
		}
		p = next
		if typ == protowire.VarintType {
			if num == 15 { // destination_service_port
				if uint32(v) > 65535 {
					return false
				}
				f.DestinationServicePort = uint16(v)
				continue
			}
			if !enumOK(v) {
				return false
			}
			switch num {
			case 1:
				f.FlowType = uint8(v)
			case 18:
				f.Ingress.Type = uint8(v)
			case 23:
				f.Ingress.RuleAction = uint8(v)
			case 24:
				f.Egress.Type = uint8(v)
			case 29:
				f.Egress.RuleAction = uint8(v)
			default:
				return false
			}
			continue
		}
		if dst := k8sString(f, num); dst != nil {
			var ok bool
			if *dst, ok = d.str(m, int(num)); !ok {
				return false
			}
			setIf(f, k8sStrings[num], len(m) != 0)
			continue
		}
		if dst := k8sUID(f, num); dst != nil {
			str, ok := d.str(m, int(num))
			if !ok {
				return false
			}
			if str != "" {
				if *dst, ok = flow.ParseUID(str); !ok {
					return false
				}
				f.Present.Set(k8sUIDs[num])
			}
			continue
		}
		ok := true
		switch num {
		case 5, 11: // Pod labels
			var js string
			if js, ok = d.labelsJSON(m); !ok {
				return false
			}
			if num == 5 {
				f.SourcePodLabels = js
				f.Present.Set(flow.SourcePodLabels)
			} else {
				f.DestinationPodLabels = js
				f.Present.Set(flow.DestinationPodLabels)
			}
		case 14:
			ok = addr(m, &f.DestinationClusterIP, f, flow.DestinationClusterIP)
		case 31:
			ok = addr(m, &f.EgressIP, f, flow.EgressIP)
		case 35:
			ok = addr(m, &f.DestinationServiceIP, f, flow.DestinationServiceIP)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
	// Always present when the message is (see the package comment).
	for _, fl := range [...]flow.Field{flow.FlowType, flow.DestinationServicePort,
		flow.IngressPolicyType, flow.IngressPolicyRuleAction, flow.EgressPolicyType, flow.EgressPolicyRuleAction} {
		f.Present.Set(fl)
	}
	return true
}

func stats(b []byte, dst *flow.Stats, f *flow.Flow, first flow.Field) bool {
	var s seen
	for p := 0; p < len(b); {
		num, typ, v, next := field(b, p, &s)
		if num == 0 || typ != protowire.VarintType {
			return false
		}
		p = next
		switch num {
		case 1:
			dst.PacketTotalCount = v
		case 2:
			dst.PacketDeltaCount = v
		case 3:
			dst.OctetTotalCount = v
		case 4:
			dst.OctetDeltaCount = v
		default:
			return false
		}
	}
	for i := range flow.Field(4) {
		f.Present.Set(first + i)
	}
	return true
}

// str returns b as an interned string; false when b is not UTF-8 (which
// proto.Unmarshal refuses in a string field). slot is the field's place
// in d.last.
func (d *Decoder) str(b []byte, slot int) (string, bool) {
	if s := d.last[slot]; s == string(b) { // no allocation for the compare
		return s, true
	}
	s, ok := d.intern(b)
	if ok && len(s) <= maxInternedLen {
		d.last[slot] = s
	}
	return s, ok
}

// intern returns b as a string from d.strs, adding it if there is room.
func (d *Decoder) intern(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	if s, ok := d.strs[string(b)]; ok { // no allocation for the lookup
		return s, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	s := string(b)
	if len(b) > maxInternedLen {
		return s, true
	}
	if len(d.strs) >= maxInterned {
		clear(d.strs)
	}
	d.strs[s] = s
	return s, true
}

// labelsJSON returns the JSON form of an encoded Labels message, as
// ToFlow writes it, from a cache of the label sets seen: the generated
// code decodes each set once.
func (d *Decoder) labelsJSON(b []byte) (string, bool) {
	if js, ok := d.labels[string(b)]; ok {
		return js, true
	}
	var l flowpb.Labels
	if err := proto.Unmarshal(b, &l); err != nil || len(l.ProtoReflect().GetUnknown()) != 0 {
		return "", false
	}
	js, err := labelsToJSON(&l)
	if err != nil {
		return "", false
	}
	if len(b) <= maxLabelsLen {
		if d.labelsBytes += len(b) + len(js); d.labelsBytes > maxLabelsBytes {
			clear(d.labels)
			d.labelsBytes = len(b) + len(js)
		}
		d.labels[string(b)] = js
	}
	return js, true
}
