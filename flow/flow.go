// Package flow defines Sluice's one canonical flow record: the content of
// Antrea's Protobuf Flow message as a plain Go struct, with field presence
// kept apart from values, so that an element an exporter did not send is
// "unset" rather than zero.
package flow

import (
	"net/netip"
	"time"
)

// Field names one field of a Flow for presence tracking.
type Field uint8

// The fields of a Flow. The order is not a wire order; wire orders live
// with the codecs.
const (
	StartTime Field = iota
	EndTime
	EndReason
	SourceIP
	DestinationIP
	Protocol
	SourcePort
	DestinationPort
	TCPState
	PacketTotalCount
	PacketDeltaCount
	OctetTotalCount
	OctetDeltaCount
	ReversePacketTotalCount
	ReversePacketDeltaCount
	ReverseOctetTotalCount
	ReverseOctetDeltaCount
	FlowType
	SourcePodNamespace
	SourcePodName
	SourcePodUID
	SourcePodLabels
	SourceNodeName
	SourceNodeUID
	DestinationPodNamespace
	DestinationPodName
	DestinationPodUID
	DestinationPodLabels
	DestinationNodeName
	DestinationNodeUID
	DestinationClusterIP
	DestinationServiceIP
	DestinationServicePort
	DestinationServicePortName
	DestinationServiceUID
	IngressPolicyType
	IngressPolicyNamespace
	IngressPolicyName
	IngressPolicyUID
	IngressPolicyRuleName
	IngressPolicyRuleAction
	EgressPolicyType
	EgressPolicyNamespace
	EgressPolicyName
	EgressPolicyUID
	EgressPolicyRuleName
	EgressPolicyRuleAction
	EgressName
	EgressIP
	EgressNodeName
	EgressNodeUID
	EgressUID
	AppProtocolName
	HTTPVals
	FlowDirection
	ProxySnatIP
	ProxySnatPort
	ClusterID
	numFields
)

// Fields is a set of Fields.
type Fields [2]uint64

// Has reports whether f is in the set.
func (s *Fields) Has(f Field) bool { return s[f>>6]&(1<<(f&63)) != 0 }

// Set adds f to the set.
func (s *Fields) Set(f Field) { s[f>>6] |= 1 << (f & 63) }

// Clear removes f from the set.
func (s *Fields) Clear(f Field) { s[f>>6] &^= 1 << (f & 63) }

// Stats are a direction's counters.
type Stats struct {
	PacketTotalCount uint64
	PacketDeltaCount uint64
	OctetTotalCount  uint64
	OctetDeltaCount  uint64
}

// Policy is the NetworkPolicy that decided a direction of the flow.
type Policy struct {
	Type       uint8 // 1 K8s NP, 2 Antrea NP, 3 Antrea CNP, 4 K8s CNP
	Namespace  string
	Name       string
	UID        UID
	RuleName   string
	RuleAction uint8 // 0 none, 1 Allow, 2 Drop, 3 Reject
}

// UID is a Kubernetes object UID in its 16-octet form; the zero UID is
// unset.
type UID [16]byte

// Element is an Information Element the record model does not know (a
// newer exporter's), kept with its raw value so that it can be passed on.
type Element struct {
	EnterpriseID uint32
	ID           uint16
	// Length is the field length from the template (or VariableLength).
	Length uint16
	Value  []byte
}

// Origin says where a record came from.
type Origin struct {
	// ExportTime is the export time of the message the record came in.
	ExportTime time.Time
	// SequenceNumber is the message's sequence number plus the record's
	// index in the message.
	SequenceNumber      uint32
	ObservationDomainID uint32
	// Exporter is the address of the exporter as the collector saw it.
	Exporter netip.Addr
	// Transport is "tcp", "udp", "tls" or "grpc".
	Transport string
	// ID is the exporter's identifier of the record (Protobuf Flow.id);
	// empty when it sent none (IPFIX never does).
	ID string
}

// Flow is one flow record. Values of fields absent from Present are
// meaningless (zero) and sinks render them empty.
type Flow struct {
	Present Fields
	Origin  Origin

	StartTime, EndTime time.Time
	EndReason          uint8 // 1 idle, 2 active, 3 end of flow, 4 forced end, 5 lack of resources
	SourceIP           netip.Addr
	DestinationIP      netip.Addr
	Protocol           uint8
	SourcePort         uint16
	DestinationPort    uint16
	TCPState           string

	Stats, ReverseStats Stats

	FlowType                   uint8 // 1 intra-node, 2 inter-node, 3 to external, 4 from external
	SourcePodNamespace         string
	SourcePodName              string
	SourcePodUID               UID
	SourcePodLabels            string // JSON object; "" unknown, "{}" none
	SourceNodeName             string
	SourceNodeUID              UID
	DestinationPodNamespace    string
	DestinationPodName         string
	DestinationPodUID          UID
	DestinationPodLabels       string
	DestinationNodeName        string
	DestinationNodeUID         UID
	DestinationClusterIP       netip.Addr
	DestinationServiceIP       netip.Addr
	DestinationServicePort     uint16
	DestinationServicePortName string // "namespace/service:port"
	DestinationServiceUID      UID
	Ingress, Egress            Policy
	EgressName                 string
	EgressIP                   netip.Addr
	EgressNodeName             string
	EgressNodeUID              UID
	EgressUID                  UID
	AppProtocolName            string
	HTTPVals                   string
	FlowDirection              uint8 // 0 ingress, 1 egress, 255 unknown
	ProxySnatIP                netip.Addr
	ProxySnatPort              uint16
	ClusterID                  string

	// Unknown holds the elements of the incoming record that no field
	// maps, in the order they came.
	Unknown []Element
	// ProtoUnknown holds the Protobuf fields of the incoming record that
	// this version does not know (a newer exporter's), as an encoded Flow
	// message carrying only them at their place in the message, so that
	// appending it to an encoded Flow restores them (see flow/flowproto).
	ProtoUnknown []byte

	// Aggregation holds the per-node view Aggregate mode adds; nil for
	// records that were not aggregated.
	Aggregation *Aggregation
}

// Aggregation is what Aggregate mode knows of each side of a correlated
// flow: the counters and end time each node last reported, and
// throughputs in bits per second since the previous export.
type Aggregation struct {
	EndFromSource, EndFromDestination time.Time
	StatsFromSource                   Stats
	ReverseStatsFromSource            Stats
	StatsFromDestination              Stats
	ReverseStatsFromDestination       Stats
	Throughput, ReverseThroughput     uint64
	ThroughputFromSource              uint64
	ReverseThroughputFromSource       uint64
	ThroughputFromDestination         uint64
	ReverseThroughputFromDestination  uint64
}

// Enumerations shared with Antrea (same values in IPFIX and Protobuf).
const (
	FlowTypeIntraNode    uint8 = 1
	FlowTypeInterNode    uint8 = 2
	FlowTypeToExternal   uint8 = 3
	FlowTypeFromExternal uint8 = 4

	DirectionIngress uint8 = 0
	DirectionEgress  uint8 = 1
	DirectionUnknown uint8 = 0xff

	ActionNone   uint8 = 0
	ActionAllow  uint8 = 1
	ActionDrop   uint8 = 2
	ActionReject uint8 = 3
)

// IsIPv6 reports whether the record must be exported as IPv6: one of
// its addresses of a fixed family (source, destination, ClusterIP,
// Service IP, SNAT IP) is an IPv6 address that is not IPv4-mapped. A
// record whose addresses are all IPv4, plain or mapped, goes as IPv4, the
// way an Antrea agent sends it; a record that mixes the families goes as
// IPv6 with its IPv4 addresses in the mapped form (AddrIn), since an IPv4
// template cannot hold an IPv6 address.
func (f *Flow) IsIPv6() bool {
	return real6(f.SourceIP) || real6(f.DestinationIP) || real6(f.DestinationClusterIP) ||
		real6(f.DestinationServiceIP) || real6(f.ProxySnatIP)
}

// IPHeaderIPv6 is IsIPv6 for the source and destination alone (the IP
// header of Antrea's Protobuf Flow, whose version covers both).
func (f *Flow) IPHeaderIPv6() bool { return real6(f.SourceIP) || real6(f.DestinationIP) }

func real6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// AddrIn returns a as written in a field of one family: IPv4 addresses,
// plain or mapped, as 4 octets when six is false and in the IPv4-mapped
// form when it is true. The zero Addr stays zero.
func AddrIn(a netip.Addr, six bool) netip.Addr {
	a = a.Unmap()
	if six && a.Is4() {
		return netip.AddrFrom16(a.As16())
	}
	return a
}

// ParseUID reads a Kubernetes UID in its text form
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).
func ParseUID(s string) (UID, bool) {
	var u UID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	// One table look-up a digit, and one test for all: a dash or anything
	// else that is not a hex digit reads as 0xff.
	var bad byte
	for j := range u {
		i := int(uidDigits[j])
		hi, lo := hexDigits[s[i]], hexDigits[s[i+1]]
		bad |= hi | lo
		u[j] = hi<<4 | lo&0xf
	}
	if bad&0x80 != 0 {
		return UID{}, false
	}
	return u, true
}

// uidDigits is where each octet's two hex digits start in a UID's text.
const uidDigits = "\x00\x02\x04\x06\x09\x0b\x0e\x10\x13\x15\x18\x1a\x1c\x1e\x20\x22"

// hexDigits is each octet's value as a hex digit, 0xff for a non-digit.
const hexDigits = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\xff\xff\xff\xff\xff\xff\xff\x0a\x0b\x0c\x0d\x0e\x0f\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x0a\x0b\x0c\x0d\x0e\x0f\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
