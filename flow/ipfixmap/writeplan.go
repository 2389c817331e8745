package ipfixmap

import (
	"encoding/binary"
	"net/netip"
	"time"

	"sluice/flow"
	"sluice/ipfix"
)

// A write plan writes the values of an Exporter's base template without
// a call per element. Each element's put closure (and the accessor
// closure it calls) is replaced, once per template, by an op: a code that
// names both the value and how it is written, switched on in one loop (a
// jump table). A record's strings are looked up first, to know its
// length; then the builder gives the octets of all the base fields at
// once (RecordBuilder.Reserve), and the loop fills them in, the strings
// with their length prefix. A record the plan cannot write so (a string
// of 255 octets or more, which takes a longer prefix, or no room left in
// the message buffer) and a template with an element the plan cannot
// write exactly as its put would (a field of an unexpected type or
// length) are written by the elements' put, as before plans. The octets
// are the same either way; TestWritePlanMatchesPut checks it.

// valKind is the kind of an element's value, as its put writes it.
type valKind uint8

const (
	valNone      valKind = iota // only the element's put knows
	valUint                     // an unsigned integer of width octets
	valTime                     // a time; the zero Time is written as the epoch
	valAddr4                    // an address in an IPv4 field: zeros unless IPv4 (familyOr)
	valAddr6                    // an address in an IPv6 field, an IPv4 one mapped (flow.AddrIn)
	valAddr6Only                // an address in an IPv6 field, an IPv4 one as zeros (familyOr)
	valString                   // a string
	valUID                      // a flow.UID
	valEgressIP                 // f.EgressIP in its text form (putEgressIP)
)

// valRef says what an element's put writes: a value of a kind, which
// code names for the write plan.
type valRef struct {
	kind  valKind
	width uint8
	code  wcode
}

// wcode names a value and how the plan writes it. The codes below 128
// are flow.Field values (at most 128: see flow.Fields), each written in
// the one form its elements have; the others follow.
type wcode uint8

const (
	cSourceIPv6 wcode = 128 + iota // the IPv6 forms of address fields
	cDestinationIPv6
	cDestinationClusterIPv6
	cDestinationServiceIPv6
	cProxySnatIPv6
	cOriginDomain // Origin.ObservationDomainID
	cOriginExporter4
	cOriginExporter6
	cAggPacketTotalFromSource // the Aggregation's (zero without one)
	cAggOctetTotalFromSource
	cAggPacketDeltaFromSource
	cAggOctetDeltaFromSource
	cAggReversePacketTotalFromSource
	cAggReverseOctetTotalFromSource
	cAggReversePacketDeltaFromSource
	cAggReverseOctetDeltaFromSource
	cAggPacketTotalFromDestination
	cAggOctetTotalFromDestination
	cAggPacketDeltaFromDestination
	cAggOctetDeltaFromDestination
	cAggReversePacketTotalFromDestination
	cAggReverseOctetTotalFromDestination
	cAggReversePacketDeltaFromDestination
	cAggReverseOctetDeltaFromDestination
	cAggThroughput
	cAggReverseThroughput
	cAggThroughputFromSource
	cAggThroughputFromDestination
	cAggReverseThroughputFromSource
	cAggReverseThroughputFromDestination
	cAggEndFromSource
	cAggEndFromDestination
	cNone wcode = 255
)

// addrCode is the code of an address field's value in a field of an IP
// family.
func addrCode(field flow.Field, family int) wcode {
	if family != 6 {
		return wcode(field)
	}
	switch field {
	case flow.SourceIP:
		return cSourceIPv6
	case flow.DestinationIP:
		return cDestinationIPv6
	case flow.DestinationClusterIP:
		return cDestinationClusterIPv6
	case flow.DestinationServiceIP:
		return cDestinationServiceIPv6
	case flow.ProxySnatIP:
		return cProxySnatIPv6
	}
	return cNone
}

// opKind is how the plan writes a field.
type opKind uint8

const (
	opFixed  opKind = iota // a fixed-length value
	opString               // a string, with its length prefix
	opPut                  // none: only the element's put can
)

type planOp struct {
	kind opKind
	code wcode
	len  uint16 // an opFixed field's length
}

// maxStrings bounds the strings of a plan (a record's are gathered on the
// stack).
const maxStrings = 48

// writePlan writes the values of one base template, in its order.
type writePlan struct {
	ops []planOp
	// ok is false when some element needs its put: the plan is not
	// used.
	ok bool
	// fixed is the length of the fixed-length fields, and strings the
	// codes of the string ones, in order.
	fixed   int
	strings []wcode
}

// newWritePlan plans the writing of els as the leading fields of t.
func newWritePlan(els []*Element, t *ipfix.Template) *writePlan {
	p := &writePlan{ok: true}
	for i, el := range els {
		fd := &t.Fields[i]
		k := planKind(el, fd)
		p.ops = append(p.ops, planOp{kind: k, code: el.val.code, len: fd.Length})
		switch k {
		case opFixed:
			p.fixed += int(fd.Length)
		case opString:
			p.strings = append(p.strings, el.val.code)
		default:
			p.ok = false
		}
	}
	if len(p.strings) > maxStrings {
		p.ok = false
	}
	if p.ok {
		// A code write or fill has no case for (an element added to the
		// table without one) leaves the template to put, rather than
		// failing at export: try every code once on an empty record.
		var empty flow.Flow
		for _, c := range p.strings {
			if _, known := stringValue(&empty, c); !known {
				p.ok = false
			}
		}
		if p.ok && !fill(make([]byte, p.fixed+len(p.strings)), &empty, p.ops, make([]string, len(p.strings))) {
			p.ok = false
		}
	}
	return p
}

// planKind is how the plan writes el's value into field fd: opPut unless
// the field is of the type and length el's put writes, so that the plan
// writes the same octets.
func planKind(el *Element, fd *ipfix.Field) opKind {
	v := el.val
	if v.code == cNone {
		return opPut
	}
	ok := false
	switch v.kind {
	case valUint:
		// The field is the value's size: every value fits (put's Uint
		// never fails), and fill stores that many octets.
		ok = fd.Type >= ipfix.Unsigned8 && fd.Type <= ipfix.Unsigned64 && int(fd.Length) == int(v.width)
	case valTime:
		ok = fd.Type == ipfix.DateTimeSeconds && fd.Length == 4
	case valAddr4:
		ok = fd.Type == ipfix.IPv4Address && fd.Length == 4
	case valAddr6, valAddr6Only:
		ok = fd.Type == ipfix.IPv6Address && fd.Length == 16
	case valUID:
		ok = fd.Type == ipfix.OctetArray && fd.Length == 16
	case valString, valEgressIP:
		if fd.Type == ipfix.String && fd.Variable() {
			return opString
		}
	}
	if ok {
		return opFixed
	}
	return opPut
}

// write writes f's values for the plan's fields and returns the builder
// to continue with, or reports that it could not (nothing is written
// then, and the elements' put must write them).
func (p *writePlan) write(b ipfix.RecordBuilder, f *flow.Flow) (ipfix.RecordBuilder, bool) {
	if !p.ok {
		return b, false
	}
	var ss [maxStrings]string
	n := p.fixed
	for i, c := range p.strings {
		s, known := stringValue(f, c)
		if !known {
			return b, false
		}
		if len(s) >= 255 {
			return b, false // a 3-octet length prefix: rare, left to put
		}
		ss[i] = s
		n += 1 + len(s)
	}
	q, b := b.Reserve(len(p.ops), n)
	if q == nil {
		return b, false
	}
	fill(q, f, p.ops, ss[:len(p.strings)]) // true: newWritePlan tried its codes
	return b, true
}

// stringValue is f's value of the string field c, as its element's put
// writes it, and whether c names one.
func stringValue(f *flow.Flow, c wcode) (s string, known bool) {
	switch flow.Field(c) {
	case flow.TCPState:
		s = f.TCPState
	case flow.SourcePodNamespace:
		s = f.SourcePodNamespace
	case flow.SourcePodName:
		s = f.SourcePodName
	case flow.SourcePodLabels:
		s = f.SourcePodLabels
	case flow.SourceNodeName:
		s = f.SourceNodeName
	case flow.DestinationPodNamespace:
		s = f.DestinationPodNamespace
	case flow.DestinationPodName:
		s = f.DestinationPodName
	case flow.DestinationPodLabels:
		s = f.DestinationPodLabels
	case flow.DestinationNodeName:
		s = f.DestinationNodeName
	case flow.DestinationServicePortName:
		s = f.DestinationServicePortName
	case flow.IngressPolicyNamespace:
		s = f.Ingress.Namespace
	case flow.IngressPolicyName:
		s = f.Ingress.Name
	case flow.IngressPolicyRuleName:
		s = f.Ingress.RuleName
	case flow.EgressPolicyNamespace:
		s = f.Egress.Namespace
	case flow.EgressPolicyName:
		s = f.Egress.Name
	case flow.EgressPolicyRuleName:
		s = f.Egress.RuleName
	case flow.EgressName:
		s = f.EgressName
	case flow.EgressIP:
		// As putEgressIP writes it.
		if f.EgressIP.IsValid() {
			s = f.EgressIP.String()
		}
	case flow.EgressNodeName:
		s = f.EgressNodeName
	case flow.AppProtocolName:
		s = f.AppProtocolName
	case flow.HTTPVals:
		s = f.HTTPVals
	case flow.ClusterID:
		s = f.ClusterID
	default:
		return "", false
	}
	return s, true
}

// noAggregation stands for a record's missing Aggregation: its values are
// written as zeros (and its zero times as the epoch). Never written to.
var noAggregation flow.Aggregation

// fill writes f's values of the plan's fields into q, their octets; ss
// are the values of the string fields, in order. It reports false for a
// code it has no case for (newWritePlan tries each plan once, so a plan
// in use never meets one).
func fill(q []byte, f *flow.Flow, ops []planOp, ss []string) bool {
	a := f.Aggregation
	if a == nil {
		a = &noAggregation
	}
	be := binary.BigEndian
	c, si := 0, 0 // where the next value goes, and the next string
	for i := range ops {
		op := &ops[i]
		if op.kind == opString {
			s := ss[si]
			si++
			q[c] = byte(len(s)) // write checked: len(s) < 255
			if len(s) != 0 {
				copy(q[c+1:], s)
			}
			c += 1 + len(s)
			continue
		}
		o := q[c:]
		switch op.code {
		case wcode(flow.StartTime):
			be.PutUint32(o, seconds(f.StartTime))
		case wcode(flow.EndTime):
			be.PutUint32(o, seconds(f.EndTime))
		case wcode(flow.EndReason):
			o[0] = f.EndReason
		case wcode(flow.SourceIP):
			be.PutUint32(o, addr4(f.SourceIP))
		case wcode(flow.DestinationIP):
			be.PutUint32(o, addr4(f.DestinationIP))
		case wcode(flow.Protocol):
			o[0] = f.Protocol
		case wcode(flow.SourcePort):
			be.PutUint16(o, f.SourcePort)
		case wcode(flow.DestinationPort):
			be.PutUint16(o, f.DestinationPort)
		case wcode(flow.PacketTotalCount):
			be.PutUint64(o, f.Stats.PacketTotalCount)
		case wcode(flow.PacketDeltaCount):
			be.PutUint64(o, f.Stats.PacketDeltaCount)
		case wcode(flow.OctetTotalCount):
			be.PutUint64(o, f.Stats.OctetTotalCount)
		case wcode(flow.OctetDeltaCount):
			be.PutUint64(o, f.Stats.OctetDeltaCount)
		case wcode(flow.ReversePacketTotalCount):
			be.PutUint64(o, f.ReverseStats.PacketTotalCount)
		case wcode(flow.ReversePacketDeltaCount):
			be.PutUint64(o, f.ReverseStats.PacketDeltaCount)
		case wcode(flow.ReverseOctetTotalCount):
			be.PutUint64(o, f.ReverseStats.OctetTotalCount)
		case wcode(flow.ReverseOctetDeltaCount):
			be.PutUint64(o, f.ReverseStats.OctetDeltaCount)
		case wcode(flow.FlowType):
			o[0] = f.FlowType
		case wcode(flow.SourcePodUID):
			*(*flow.UID)(o) = f.SourcePodUID
		case wcode(flow.SourceNodeUID):
			*(*flow.UID)(o) = f.SourceNodeUID
		case wcode(flow.DestinationPodUID):
			*(*flow.UID)(o) = f.DestinationPodUID
		case wcode(flow.DestinationNodeUID):
			*(*flow.UID)(o) = f.DestinationNodeUID
		case wcode(flow.DestinationClusterIP):
			be.PutUint32(o, addr4(f.DestinationClusterIP))
		case wcode(flow.DestinationServiceIP):
			be.PutUint32(o, addr4(f.DestinationServiceIP))
		case wcode(flow.DestinationServicePort):
			be.PutUint16(o, f.DestinationServicePort)
		case wcode(flow.DestinationServiceUID):
			*(*flow.UID)(o) = f.DestinationServiceUID
		case wcode(flow.IngressPolicyType):
			o[0] = f.Ingress.Type
		case wcode(flow.IngressPolicyUID):
			*(*flow.UID)(o) = f.Ingress.UID
		case wcode(flow.IngressPolicyRuleAction):
			o[0] = f.Ingress.RuleAction
		case wcode(flow.EgressPolicyType):
			o[0] = f.Egress.Type
		case wcode(flow.EgressPolicyUID):
			*(*flow.UID)(o) = f.Egress.UID
		case wcode(flow.EgressPolicyRuleAction):
			o[0] = f.Egress.RuleAction
		case wcode(flow.EgressNodeUID):
			*(*flow.UID)(o) = f.EgressNodeUID
		case wcode(flow.EgressUID):
			*(*flow.UID)(o) = f.EgressUID
		case wcode(flow.FlowDirection):
			o[0] = f.FlowDirection
		case wcode(flow.ProxySnatIP):
			be.PutUint32(o, addr4(f.ProxySnatIP))
		case wcode(flow.ProxySnatPort):
			be.PutUint16(o, f.ProxySnatPort)

		case cSourceIPv6:
			*(*[16]byte)(o) = f.SourceIP.As16()
		case cDestinationIPv6:
			*(*[16]byte)(o) = f.DestinationIP.As16()
		case cDestinationClusterIPv6:
			*(*[16]byte)(o) = f.DestinationClusterIP.As16()
		case cDestinationServiceIPv6:
			*(*[16]byte)(o) = f.DestinationServiceIP.As16()
		case cProxySnatIPv6:
			*(*[16]byte)(o) = f.ProxySnatIP.As16()
		case cOriginDomain:
			be.PutUint32(o, f.Origin.ObservationDomainID)
		case cOriginExporter4:
			be.PutUint32(o, addr4(f.Origin.Exporter))
		case cOriginExporter6:
			*(*[16]byte)(o) = addr6Only(f.Origin.Exporter)

		case cAggPacketTotalFromSource:
			be.PutUint64(o, a.StatsFromSource.PacketTotalCount)
		case cAggOctetTotalFromSource:
			be.PutUint64(o, a.StatsFromSource.OctetTotalCount)
		case cAggPacketDeltaFromSource:
			be.PutUint64(o, a.StatsFromSource.PacketDeltaCount)
		case cAggOctetDeltaFromSource:
			be.PutUint64(o, a.StatsFromSource.OctetDeltaCount)
		case cAggReversePacketTotalFromSource:
			be.PutUint64(o, a.ReverseStatsFromSource.PacketTotalCount)
		case cAggReverseOctetTotalFromSource:
			be.PutUint64(o, a.ReverseStatsFromSource.OctetTotalCount)
		case cAggReversePacketDeltaFromSource:
			be.PutUint64(o, a.ReverseStatsFromSource.PacketDeltaCount)
		case cAggReverseOctetDeltaFromSource:
			be.PutUint64(o, a.ReverseStatsFromSource.OctetDeltaCount)
		case cAggPacketTotalFromDestination:
			be.PutUint64(o, a.StatsFromDestination.PacketTotalCount)
		case cAggOctetTotalFromDestination:
			be.PutUint64(o, a.StatsFromDestination.OctetTotalCount)
		case cAggPacketDeltaFromDestination:
			be.PutUint64(o, a.StatsFromDestination.PacketDeltaCount)
		case cAggOctetDeltaFromDestination:
			be.PutUint64(o, a.StatsFromDestination.OctetDeltaCount)
		case cAggReversePacketTotalFromDestination:
			be.PutUint64(o, a.ReverseStatsFromDestination.PacketTotalCount)
		case cAggReverseOctetTotalFromDestination:
			be.PutUint64(o, a.ReverseStatsFromDestination.OctetTotalCount)
		case cAggReversePacketDeltaFromDestination:
			be.PutUint64(o, a.ReverseStatsFromDestination.PacketDeltaCount)
		case cAggReverseOctetDeltaFromDestination:
			be.PutUint64(o, a.ReverseStatsFromDestination.OctetDeltaCount)
		case cAggThroughput:
			be.PutUint64(o, a.Throughput)
		case cAggReverseThroughput:
			be.PutUint64(o, a.ReverseThroughput)
		case cAggThroughputFromSource:
			be.PutUint64(o, a.ThroughputFromSource)
		case cAggThroughputFromDestination:
			be.PutUint64(o, a.ThroughputFromDestination)
		case cAggReverseThroughputFromSource:
			be.PutUint64(o, a.ReverseThroughputFromSource)
		case cAggReverseThroughputFromDestination:
			be.PutUint64(o, a.ReverseThroughputFromDestination)
		case cAggEndFromSource:
			be.PutUint32(o, seconds(a.EndFromSource))
		case cAggEndFromDestination:
			be.PutUint32(o, seconds(a.EndFromDestination))
		default:
			return false
		}
		c += int(op.len)
	}
	return true
}

// seconds is t in a dateTimeSeconds field: the zero Time as the epoch.
func seconds(t time.Time) uint32 {
	if t.IsZero() {
		return 0
	}
	return uint32(t.Unix())
}

// addr4 is a in an IPv4 field (familyOr(a, 4)): zeros unless IPv4, plain
// or mapped.
func addr4(a netip.Addr) uint32 {
	if !a.Is4() && !a.Is4In6() {
		return 0
	}
	b := a.As16() // mapped, for an IPv4 address
	return binary.BigEndian.Uint32(b[12:])
}

// addr6Only is a in an IPv6 field that takes no IPv4 address
// (familyOr(a, 6)): zeros for one. (As16 alone, for the other IPv6
// fields, maps an IPv4 address as flow.AddrIn does, and is zeros for the
// zero Addr.)
func addr6Only(a netip.Addr) [16]byte {
	if a = a.Unmap(); a.Is4() {
		return [16]byte{}
	}
	return a.As16()
}
