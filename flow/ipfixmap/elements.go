// Package ipfixmap maps IPFIX records to flow records and back, by
// (enterprise, element ID), never by position. One table of element
// descriptors drives both directions, so a template and the values written
// against it come from the same ordered list.
package ipfixmap

import (
	"net/netip"
	"time"

	"sluice/flow"
	"sluice/ipfix"
)

// Element binds an Information Element to a field of flow.Flow.
type Element struct {
	IE    *ipfix.InfoElement
	Field flow.Field
	// Family is 4 or 6 for address elements of one IP family, else 0.
	Family int
	get    func(r *ipfix.Record, i int, f *flow.Flow, in *Interner) bool
	put    func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder
	// val is where the Exporter's write plan finds the value put writes
	// (see writeplan.go); its kind is valNone when only put can.
	val valRef
}

// Name is the element's name.
func (e *Element) Name() string { return e.IE.Name }

// Table is the set of elements Sluice maps, indexed for both directions.
// It is immutable and safe for concurrent use.
type Table struct {
	reg    *ipfix.Registry
	byKey  map[ipfix.ElementKey]*Element
	byName map[string]*Element
}

// Registry is the registry the table's elements come from.
func (t *Table) Registry() *ipfix.Registry { return t.reg }

// Lookup finds the element for a wire identity.
func (t *Table) Lookup(k ipfix.ElementKey) (*Element, bool) {
	e, ok := t.byKey[k]
	return e, ok
}

// ByName finds an element by its IPFIX name.
func (t *Table) ByName(name string) (*Element, bool) {
	e, ok := t.byName[name]
	return e, ok
}

// NewTable builds the mapping table over reg, which must hold every
// element named here (the default registry does; a test checks it).
func NewTable(reg *ipfix.Registry) (*Table, error) {
	t := &Table{reg: reg, byKey: map[ipfix.ElementKey]*Element{}, byName: map[string]*Element{}}
	for _, d := range descriptors() {
		ie, ok := reg.ByName(d.name)
		if !ok {
			return nil, &missingElementError{d.name}
		}
		e := &Element{IE: ie, Field: d.field, Family: d.family, get: d.get, put: d.put, val: d.val}
		t.byKey[ipfix.ElementKey{EnterpriseID: ie.EnterpriseID, ID: ie.ID}] = e
		t.byName[d.name] = e
	}
	return t, nil
}

type missingElementError struct{ name string }

func (e *missingElementError) Error() string {
	return "ipfixmap: the registry has no element " + e.name
}

type descriptor struct {
	name   string
	field  flow.Field
	family int
	get    func(r *ipfix.Record, i int, f *flow.Flow, in *Interner) bool
	put    func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder
	val    valRef
}

// Descriptor builders, one per value kind. Each get stores the value and
// reports whether the field counts as present; each put writes the value,
// zero when unset, as Antrea does; val says the same to the write plan.

func u8d(name string, field flow.Field, p func(*flow.Flow) *uint8) descriptor {
	return descriptor{name: name, field: field, val: valRef{valUint, 1, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			v, err := r.Uint(i)
			*p(f) = uint8(v)
			return err == nil
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder { return b.Uint(uint64(*p(f))) },
	}
}

func u16d(name string, field flow.Field, p func(*flow.Flow) *uint16) descriptor {
	return descriptor{name: name, field: field, val: valRef{valUint, 2, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			v, err := r.Uint(i)
			*p(f) = uint16(v)
			return err == nil
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder { return b.Uint(uint64(*p(f))) },
	}
}

func u64d(name string, field flow.Field, p func(*flow.Flow) *uint64) descriptor {
	return descriptor{name: name, field: field, val: valRef{valUint, 8, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			v, err := r.Uint(i)
			*p(f) = v
			return err == nil
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder { return b.Uint(*p(f)) },
	}
}

func strd(name string, field flow.Field, p func(*flow.Flow) *string) descriptor {
	return descriptor{name: name, field: field, val: valRef{valString, 0, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, in *Interner) bool {
			b, err := r.StringBytes(i)
			*p(f) = in.Field(i, b)
			return err == nil
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder { return b.String(*p(f)) },
	}
}

func timed(name string, field flow.Field, p func(*flow.Flow) *time.Time) descriptor {
	return descriptor{name: name, field: field, val: valRef{valTime, 0, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			v, err := r.Time(i)
			*p(f) = v
			return err == nil
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
			t := *p(f)
			if t.IsZero() {
				t = time.Unix(0, 0)
			}
			return b.Time(t)
		},
	}
}

// addrd maps an address element of one family. When zeroUnset, an
// all-zero address reads as unset: Antrea sends 0.0.0.0 or :: for "no
// Service" or "no SNAT" in these fixed-size fields.
func addrd(name string, field flow.Field, family int, zeroUnset bool, p func(*flow.Flow) *netip.Addr) descriptor {
	val := valRef{valAddr4, 0, addrCode(field, family)}
	if family == 6 {
		val.kind = valAddr6
	}
	return descriptor{name: name, field: field, family: family, val: val,
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			v, err := r.Addr(i)
			// An IPv4-mapped address is an IPv4 address: kept as one,
			// it correlates, enriches and exports as the same address
			// sent in an IPv4 field would.
			v = v.Unmap()
			if err != nil || (zeroUnset && v.IsUnspecified()) {
				return false
			}
			*p(f) = v
			return true
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
			if family == 6 {
				// An IPv4 address in an IPv6 record (one that mixes
				// the families, see flow.Flow.IsIPv6) goes mapped.
				return b.Addr(flow.AddrIn(*p(f), true))
			}
			// No address goes out as zeros; an IPv6 one cannot be in
			// an IPv4 record (IsIPv6 chose the IPv6 template).
			return b.Addr(familyOr(*p(f), family))
		},
	}
}

func uidd(name string, field flow.Field, p func(*flow.Flow) *flow.UID) descriptor {
	return descriptor{name: name, field: field, val: valRef{valUID, 0, wcode(field)},
		get: func(r *ipfix.Record, i int, f *flow.Flow, _ *Interner) bool {
			b := r.Bytes(i)
			if len(b) != 16 {
				return false
			}
			*p(f) = flow.UID(b)
			return *p(f) != flow.UID{}
		},
		put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
			u := *p(f)
			return b.Bytes(u[:])
		},
	}
}

// descriptors lists every element Sluice maps: the IANA and reverse
// elements Antrea agents and common exporters send, and Antrea's own.
func descriptors() []descriptor {
	type F = flow.Flow
	return []descriptor{
		timed("flowStartSeconds", flow.StartTime, func(f *F) *time.Time { return &f.StartTime }),
		timed("flowStartMilliseconds", flow.StartTime, func(f *F) *time.Time { return &f.StartTime }),
		timed("flowEndSeconds", flow.EndTime, func(f *F) *time.Time { return &f.EndTime }),
		timed("flowEndMilliseconds", flow.EndTime, func(f *F) *time.Time { return &f.EndTime }),
		u8d("flowEndReason", flow.EndReason, func(f *F) *uint8 { return &f.EndReason }),
		u16d("sourceTransportPort", flow.SourcePort, func(f *F) *uint16 { return &f.SourcePort }),
		u16d("destinationTransportPort", flow.DestinationPort, func(f *F) *uint16 { return &f.DestinationPort }),
		u8d("protocolIdentifier", flow.Protocol, func(f *F) *uint8 { return &f.Protocol }),
		u64d("packetTotalCount", flow.PacketTotalCount, func(f *F) *uint64 { return &f.Stats.PacketTotalCount }),
		u64d("octetTotalCount", flow.OctetTotalCount, func(f *F) *uint64 { return &f.Stats.OctetTotalCount }),
		u64d("packetDeltaCount", flow.PacketDeltaCount, func(f *F) *uint64 { return &f.Stats.PacketDeltaCount }),
		u64d("octetDeltaCount", flow.OctetDeltaCount, func(f *F) *uint64 { return &f.Stats.OctetDeltaCount }),
		addrd("sourceIPv4Address", flow.SourceIP, 4, false, func(f *F) *netip.Addr { return &f.SourceIP }),
		addrd("destinationIPv4Address", flow.DestinationIP, 4, false, func(f *F) *netip.Addr { return &f.DestinationIP }),
		addrd("sourceIPv6Address", flow.SourceIP, 6, false, func(f *F) *netip.Addr { return &f.SourceIP }),
		addrd("destinationIPv6Address", flow.DestinationIP, 6, false, func(f *F) *netip.Addr { return &f.DestinationIP }),
		u64d("reversePacketTotalCount", flow.ReversePacketTotalCount, func(f *F) *uint64 { return &f.ReverseStats.PacketTotalCount }),
		u64d("reverseOctetTotalCount", flow.ReverseOctetTotalCount, func(f *F) *uint64 { return &f.ReverseStats.OctetTotalCount }),
		u64d("reversePacketDeltaCount", flow.ReversePacketDeltaCount, func(f *F) *uint64 { return &f.ReverseStats.PacketDeltaCount }),
		u64d("reverseOctetDeltaCount", flow.ReverseOctetDeltaCount, func(f *F) *uint64 { return &f.ReverseStats.OctetDeltaCount }),
		strd("sourcePodNamespace", flow.SourcePodNamespace, func(f *F) *string { return &f.SourcePodNamespace }),
		strd("sourcePodName", flow.SourcePodName, func(f *F) *string { return &f.SourcePodName }),
		strd("sourceNodeName", flow.SourceNodeName, func(f *F) *string { return &f.SourceNodeName }),
		strd("destinationPodNamespace", flow.DestinationPodNamespace, func(f *F) *string { return &f.DestinationPodNamespace }),
		strd("destinationPodName", flow.DestinationPodName, func(f *F) *string { return &f.DestinationPodName }),
		strd("destinationNodeName", flow.DestinationNodeName, func(f *F) *string { return &f.DestinationNodeName }),
		addrd("destinationClusterIPv4", flow.DestinationClusterIP, 4, true, func(f *F) *netip.Addr { return &f.DestinationClusterIP }),
		addrd("destinationClusterIPv6", flow.DestinationClusterIP, 6, true, func(f *F) *netip.Addr { return &f.DestinationClusterIP }),
		u16d("destinationServicePort", flow.DestinationServicePort, func(f *F) *uint16 { return &f.DestinationServicePort }),
		strd("destinationServicePortName", flow.DestinationServicePortName, func(f *F) *string { return &f.DestinationServicePortName }),
		strd("ingressNetworkPolicyName", flow.IngressPolicyName, func(f *F) *string { return &f.Ingress.Name }),
		strd("ingressNetworkPolicyNamespace", flow.IngressPolicyNamespace, func(f *F) *string { return &f.Ingress.Namespace }),
		u8d("ingressNetworkPolicyType", flow.IngressPolicyType, func(f *F) *uint8 { return &f.Ingress.Type }),
		strd("ingressNetworkPolicyRuleName", flow.IngressPolicyRuleName, func(f *F) *string { return &f.Ingress.RuleName }),
		u8d("ingressNetworkPolicyRuleAction", flow.IngressPolicyRuleAction, func(f *F) *uint8 { return &f.Ingress.RuleAction }),
		strd("egressNetworkPolicyName", flow.EgressPolicyName, func(f *F) *string { return &f.Egress.Name }),
		strd("egressNetworkPolicyNamespace", flow.EgressPolicyNamespace, func(f *F) *string { return &f.Egress.Namespace }),
		u8d("egressNetworkPolicyType", flow.EgressPolicyType, func(f *F) *uint8 { return &f.Egress.Type }),
		strd("egressNetworkPolicyRuleName", flow.EgressPolicyRuleName, func(f *F) *string { return &f.Egress.RuleName }),
		u8d("egressNetworkPolicyRuleAction", flow.EgressPolicyRuleAction, func(f *F) *uint8 { return &f.Egress.RuleAction }),
		strd("tcpState", flow.TCPState, func(f *F) *string { return &f.TCPState }),
		u8d("flowType", flow.FlowType, func(f *F) *uint8 { return &f.FlowType }),
		strd("sourcePodLabels", flow.SourcePodLabels, func(f *F) *string { return &f.SourcePodLabels }),
		strd("destinationPodLabels", flow.DestinationPodLabels, func(f *F) *string { return &f.DestinationPodLabels }),
		strd("egressName", flow.EgressName, func(f *F) *string { return &f.EgressName }),
		{name: "egressIP", field: flow.EgressIP, get: getEgressIP, put: putEgressIP, val: valRef{valEgressIP, 0, wcode(flow.EgressIP)}},
		strd("appProtocolName", flow.AppProtocolName, func(f *F) *string { return &f.AppProtocolName }),
		strd("httpVals", flow.HTTPVals, func(f *F) *string { return &f.HTTPVals }),
		strd("egressNodeName", flow.EgressNodeName, func(f *F) *string { return &f.EgressNodeName }),
		strd("clusterId", flow.ClusterID, func(f *F) *string { return &f.ClusterID }),
		uidd("sourcePodUUID", flow.SourcePodUID, func(f *F) *flow.UID { return &f.SourcePodUID }),
		uidd("destinationPodUUID", flow.DestinationPodUID, func(f *F) *flow.UID { return &f.DestinationPodUID }),
		uidd("sourceNodeUUID", flow.SourceNodeUID, func(f *F) *flow.UID { return &f.SourceNodeUID }),
		uidd("destinationNodeUUID", flow.DestinationNodeUID, func(f *F) *flow.UID { return &f.DestinationNodeUID }),
		uidd("destinationServiceUUID", flow.DestinationServiceUID, func(f *F) *flow.UID { return &f.DestinationServiceUID }),
		uidd("ingressNetworkPolicyUUID", flow.IngressPolicyUID, func(f *F) *flow.UID { return &f.Ingress.UID }),
		uidd("egressNetworkPolicyUUID", flow.EgressPolicyUID, func(f *F) *flow.UID { return &f.Egress.UID }),
		uidd("egressUUID", flow.EgressUID, func(f *F) *flow.UID { return &f.EgressUID }),
		uidd("egressNodeUUID", flow.EgressNodeUID, func(f *F) *flow.UID { return &f.EgressNodeUID }),
		addrd("destinationServiceIPv4", flow.DestinationServiceIP, 4, true, func(f *F) *netip.Addr { return &f.DestinationServiceIP }),
		addrd("destinationServiceIPv6", flow.DestinationServiceIP, 6, true, func(f *F) *netip.Addr { return &f.DestinationServiceIP }),
		addrd("proxySnatIPv4", flow.ProxySnatIP, 4, true, func(f *F) *netip.Addr { return &f.ProxySnatIP }),
		addrd("proxySnatIPv6", flow.ProxySnatIP, 6, true, func(f *F) *netip.Addr { return &f.ProxySnatIP }),
		u16d("proxySnatPort", flow.ProxySnatPort, func(f *F) *uint16 { return &f.ProxySnatPort }),
		u8d("flowDirection", flow.FlowDirection, func(f *F) *uint8 { return &f.FlowDirection }),

		// Export only: Aggregate mode's per-node view (zero when absent).
		aggU64("packetTotalCountFromSourceNode", cAggPacketTotalFromSource, func(a *flow.Aggregation) uint64 { return a.StatsFromSource.PacketTotalCount }),
		aggU64("octetTotalCountFromSourceNode", cAggOctetTotalFromSource, func(a *flow.Aggregation) uint64 { return a.StatsFromSource.OctetTotalCount }),
		aggU64("packetDeltaCountFromSourceNode", cAggPacketDeltaFromSource, func(a *flow.Aggregation) uint64 { return a.StatsFromSource.PacketDeltaCount }),
		aggU64("octetDeltaCountFromSourceNode", cAggOctetDeltaFromSource, func(a *flow.Aggregation) uint64 { return a.StatsFromSource.OctetDeltaCount }),
		aggU64("reversePacketTotalCountFromSourceNode", cAggReversePacketTotalFromSource, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromSource.PacketTotalCount }),
		aggU64("reverseOctetTotalCountFromSourceNode", cAggReverseOctetTotalFromSource, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromSource.OctetTotalCount }),
		aggU64("reversePacketDeltaCountFromSourceNode", cAggReversePacketDeltaFromSource, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromSource.PacketDeltaCount }),
		aggU64("reverseOctetDeltaCountFromSourceNode", cAggReverseOctetDeltaFromSource, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromSource.OctetDeltaCount }),
		aggU64("packetTotalCountFromDestinationNode", cAggPacketTotalFromDestination, func(a *flow.Aggregation) uint64 { return a.StatsFromDestination.PacketTotalCount }),
		aggU64("octetTotalCountFromDestinationNode", cAggOctetTotalFromDestination, func(a *flow.Aggregation) uint64 { return a.StatsFromDestination.OctetTotalCount }),
		aggU64("packetDeltaCountFromDestinationNode", cAggPacketDeltaFromDestination, func(a *flow.Aggregation) uint64 { return a.StatsFromDestination.PacketDeltaCount }),
		aggU64("octetDeltaCountFromDestinationNode", cAggOctetDeltaFromDestination, func(a *flow.Aggregation) uint64 { return a.StatsFromDestination.OctetDeltaCount }),
		aggU64("reversePacketTotalCountFromDestinationNode", cAggReversePacketTotalFromDestination, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromDestination.PacketTotalCount }),
		aggU64("reverseOctetTotalCountFromDestinationNode", cAggReverseOctetTotalFromDestination, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromDestination.OctetTotalCount }),
		aggU64("reversePacketDeltaCountFromDestinationNode", cAggReversePacketDeltaFromDestination, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromDestination.PacketDeltaCount }),
		aggU64("reverseOctetDeltaCountFromDestinationNode", cAggReverseOctetDeltaFromDestination, func(a *flow.Aggregation) uint64 { return a.ReverseStatsFromDestination.OctetDeltaCount }),
		aggU64("throughput", cAggThroughput, func(a *flow.Aggregation) uint64 { return a.Throughput }),
		aggU64("reverseThroughput", cAggReverseThroughput, func(a *flow.Aggregation) uint64 { return a.ReverseThroughput }),
		aggU64("throughputFromSourceNode", cAggThroughputFromSource, func(a *flow.Aggregation) uint64 { return a.ThroughputFromSource }),
		aggU64("throughputFromDestinationNode", cAggThroughputFromDestination, func(a *flow.Aggregation) uint64 { return a.ThroughputFromDestination }),
		aggU64("reverseThroughputFromSourceNode", cAggReverseThroughputFromSource, func(a *flow.Aggregation) uint64 { return a.ReverseThroughputFromSource }),
		aggU64("reverseThroughputFromDestinationNode", cAggReverseThroughputFromDestination, func(a *flow.Aggregation) uint64 { return a.ReverseThroughputFromDestination }),
		aggTime("flowEndSecondsFromSourceNode", cAggEndFromSource, func(a *flow.Aggregation) time.Time { return a.EndFromSource }),
		aggTime("flowEndSecondsFromDestinationNode", cAggEndFromDestination, func(a *flow.Aggregation) time.Time { return a.EndFromDestination }),

		// Export only: what a proxy says about where a record came from.
		// Received, they are known but not mapped.
		{name: "originalObservationDomainId", val: valRef{valUint, 4, cOriginDomain}, put: func(b ipfix.RecordBuilder, f *F) ipfix.RecordBuilder {
			return b.Uint(uint64(f.Origin.ObservationDomainID))
		}},
		{name: "originalExporterIPv4Address", val: valRef{valAddr4, 0, cOriginExporter4},
			put: func(b ipfix.RecordBuilder, f *F) ipfix.RecordBuilder { return b.Addr(familyOr(f.Origin.Exporter, 4)) }},
		{name: "originalExporterIPv6Address", val: valRef{valAddr6Only, 0, cOriginExporter6},
			put: func(b ipfix.RecordBuilder, f *F) ipfix.RecordBuilder { return b.Addr(familyOr(f.Origin.Exporter, 6)) }},
	}
}

// aggU64 and aggTime export a field of the Aggregation, zero without one.
func aggU64(name string, code wcode, v func(*flow.Aggregation) uint64) descriptor {
	return descriptor{name: name, val: valRef{valUint, 8, code}, put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
		if f.Aggregation == nil {
			return b.Uint(0)
		}
		return b.Uint(v(f.Aggregation))
	}}
}

func aggTime(name string, code wcode, v func(*flow.Aggregation) time.Time) descriptor {
	return descriptor{name: name, val: valRef{valTime, 0, code}, put: func(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
		t := time.Unix(0, 0)
		if f.Aggregation != nil && !v(f.Aggregation).IsZero() {
			t = v(f.Aggregation)
		}
		return b.Time(t)
	}}
}

// familyOr returns a if it is of the family, else the zero Addr (written
// as all zeros).
func familyOr(a netip.Addr, family int) netip.Addr {
	a = a.Unmap()
	if (family == 4) == a.Is4() {
		return a
	}
	return netip.Addr{}
}

// egressIP travels as a string in Antrea's IPFIX.
func getEgressIP(r *ipfix.Record, i int, f *flow.Flow, in *Interner) bool {
	b, err := r.StringBytes(i)
	if err != nil || len(b) == 0 {
		return false
	}
	a, err := netip.ParseAddr(in.Bytes(b)) // interned: Egress IPs repeat
	if err != nil {
		return false
	}
	f.EgressIP = a
	return true
}

func putEgressIP(b ipfix.RecordBuilder, f *flow.Flow) ipfix.RecordBuilder {
	if f.EgressIP.IsValid() {
		return b.String(f.EgressIP.String())
	}
	return b.String("")
}
