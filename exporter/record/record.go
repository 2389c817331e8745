// Package record is the exporter's flow record: what the connection store
// produces, the queue holds and the transports send. It is a compact form
// (about a quarter of a flow.Flow) that refers to the connection's
// metadata instead of copying it: the local Pods, the Service port and the
// policy verdict are shared by every record of a connection (and the
// verdict by every connection with the same key), so a record carries
// pointers to them and a few bits saying which parts apply.
//
// Flow writes a record as the flow.Flow it stands for; the IPFIX
// transport encodes records directly with the same values (its tests
// compare the octets with those of Flow's result).
package record

import (
	"net/netip"
	"time"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/source"
	"sluice/flow"
)

// Counter indexes of Record.Counts.
const (
	PacketTotal = iota
	OctetTotal
	PacketDelta
	OctetDelta
	ReversePacketTotal
	ReverseOctetTotal
	ReversePacketDelta
	ReverseOctetDelta
)

// Attr bits: which parts of the verdict a record carries.
const (
	AttrEgressPolicy  uint8 = 1 << iota // Verdict.Egress, as egressNetworkPolicy…
	AttrIngressPolicy                   // Verdict.Ingress, as ingressNetworkPolicy…
	AttrEgress                          // the Egress (egressName, egressIP, egressNodeName)
)

// Record is one exported record of a connection. A Record whose Meta
// has Full set stands for that flow.Flow, whole (records that did not
// come from the connection store, such as tests').
//
// It is kept small (144 octets) because the exporter copies every record
// of a cycle several times (the store's batch, the queue's ring, the
// transport's batch): what is the same for many records (Pods, Node,
// Service port, SNAT) is behind one pointer, Meta, and the addresses are
// pointer-free.
type Record struct {
	// Start and End are Unix nanoseconds.
	Start, End int64
	// Counts are the totals and deltas, by the indexes above.
	Counts [8]uint64
	// Src and Dst are the connection's endpoints (the destination after
	// DNAT).
	Src, Dst                             Addr
	SrcPort, DstPort                     uint16
	Proto, EndReason, TCPState, FlowType uint8
	// Attr says which parts of Verdict the record carries.
	Attr uint8
	// Meta is the connection's metadata (read-only, shared by every
	// record of the connection and, when equal, by other connections);
	// nil for none.
	Meta *Meta
	// Verdict is the connection's attribution (read-only, shared).
	Verdict *attribution.Verdict
}

// Meta is the part of a record that is the same for every record of a
// connection, and mostly for many connections: it is resolved once per
// connection and shared (read-only) by its records.
type Meta struct {
	// SrcPod and DstPod are the local Pods at either end, nil for none.
	SrcPod, DstPod *enrich.Pod
	// Node is this Node's name, written with each local Pod.
	Node string
	// ServiceIP, ServicePort and ServicePortName are the Service port a
	// DNAT'ed connection reached; ServicePortName is empty without one
	// (then the other two are not written).
	ServiceIP   netip.Addr
	ServicePort uint16
	// SnatPort and SnatIP, when SnatIP is valid, are the translated
	// source the reply went to.
	SnatPort        uint16
	SnatIP          netip.Addr
	ServicePortName string
	// Full, when set, is the whole record, and every other field of the
	// record and of the Meta is ignored.
	Full *flow.Flow
}

// Addr is an IP address without a pointer (a netip.Addr holds one): its
// 16-octet form (IPv4 addresses mapped) and whether it is IPv4 rather
// than an IPv4-mapped IPv6 address, so that the address comes back as it
// was given. The zero Addr is no address.
type Addr struct {
	b16  [16]byte
	kind uint8 // 0: none, 4, 6
}

// AddrFrom is a as an Addr.
func AddrFrom(a netip.Addr) Addr {
	switch {
	case a.Is4():
		return Addr{b16: a.As16(), kind: 4}
	case a.Is6():
		if a.Zone() != "" {
			a = a.WithZone("")
		}
		return Addr{b16: a.As16(), kind: 6}
	}
	return Addr{}
}

// AddrFrom16 is the address of 16 octets b: IPv4 (b must then be the
// IPv4-mapped form) when four is set.
func AddrFrom16(b [16]byte, four bool) Addr {
	if four {
		return Addr{b16: b, kind: 4}
	}
	return Addr{b16: b, kind: 6}
}

// Set16 makes a the address AddrFrom16(*b, four), in place.
func (a *Addr) Set16(b *[16]byte, four bool) {
	a.b16 = *b
	a.kind = 6
	if four {
		a.kind = 4
	}
}

// Addr is the address as a netip.Addr.
func (a Addr) Addr() netip.Addr {
	switch a.kind {
	case 4:
		return netip.AddrFrom4([4]byte(a.b16[12:]))
	case 6:
		return netip.AddrFrom16(a.b16)
	}
	return netip.Addr{}
}

// As16 is the address's 16-octet form, IPv4 addresses mapped; zeros for
// none.
func (a *Addr) As16() *[16]byte { return &a.b16 }

// IsValid says a is an address.
func (a *Addr) IsValid() bool { return a.kind != 0 }

// Is4 says a is an IPv4 address or an IPv4-mapped IPv6 one.
func (a *Addr) Is4() bool {
	return a.kind == 4 || a.kind == 6 && [12]byte(a.b16[:12]) == [12]byte{10: 0xff, 11: 0xff}
}

// Real6 says a is an IPv6 address, not an IPv4-mapped one.
func (a *Addr) Real6() bool { return a.kind == 6 && !a.Is4() }

// Full is a record standing for f, whole.
func Full(f *flow.Flow) Record { return Record{Meta: &Meta{Full: f}} }

// full is the whole flow the record stands for, nil for none.
func (r *Record) full() *flow.Flow {
	if r.Meta == nil {
		return nil
	}
	return r.Meta.Full
}

// IsIPv6 says the record goes in an IPv6 template (flow.Flow.IsIPv6).
func (r *Record) IsIPv6() bool {
	m := r.Meta
	if m != nil && m.Full != nil {
		return m.Full.IsIPv6()
	}
	if r.Src.Real6() || r.Dst.Real6() {
		return true
	}
	return m != nil && (real6(m.ServiceIP) || real6(m.SnatIP))
}

func real6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// Denied says the record names a policy rule that drops or rejects: a
// denied connection's record.
func (r *Record) Denied() bool {
	if f := r.full(); f != nil {
		return deny(&f.Egress) || deny(&f.Ingress)
	}
	v := r.Verdict
	return v != nil && (r.Attr&AttrEgressPolicy != 0 && deny(&v.Egress) || r.Attr&AttrIngressPolicy != 0 && deny(&v.Ingress))
}

func deny(p *flow.Policy) bool {
	return p.RuleAction == flow.ActionDrop || p.RuleAction == flow.ActionReject
}

// TCPStateName is the tcpState element's value, "" for protocols other
// than TCP.
func (r *Record) TCPStateName() string {
	if r.Proto != source.ProtoTCP {
		return ""
	}
	return source.TCPStateName(r.TCPState)
}

var dynamicFields = [...]flow.Field{flow.StartTime, flow.EndTime, flow.EndReason, flow.SourceIP, flow.SourcePort,
	flow.DestinationIP, flow.DestinationPort, flow.Protocol, flow.PacketTotalCount, flow.PacketDeltaCount,
	flow.OctetTotalCount, flow.OctetDeltaCount, flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount,
	flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount, flow.FlowType}

// Flow writes the record into f as a flow.Flow, every field and presence
// bit (f is overwritten).
func (r *Record) Flow(f *flow.Flow) {
	m := r.Meta
	if m != nil && m.Full != nil {
		*f = *m.Full
		return
	}
	*f = flow.Flow{}
	f.StartTime, f.EndTime, f.EndReason = time.Unix(0, r.Start), time.Unix(0, r.End), r.EndReason
	f.SourceIP, f.SourcePort, f.DestinationIP, f.DestinationPort, f.Protocol = r.Src.Addr(), r.SrcPort, r.Dst.Addr(), r.DstPort, r.Proto
	for _, fl := range dynamicFields {
		f.Present.Set(fl)
	}
	c := &r.Counts
	f.Stats = flow.Stats{PacketTotalCount: c[PacketTotal], OctetTotalCount: c[OctetTotal],
		PacketDeltaCount: c[PacketDelta], OctetDeltaCount: c[OctetDelta]}
	f.ReverseStats = flow.Stats{PacketTotalCount: c[ReversePacketTotal], OctetTotalCount: c[ReverseOctetTotal],
		PacketDeltaCount: c[ReversePacketDelta], OctetDeltaCount: c[ReverseOctetDelta]}
	if r.Proto == source.ProtoTCP {
		f.TCPState = source.TCPStateName(r.TCPState)
		f.Present.Set(flow.TCPState)
	}
	f.FlowType = r.FlowType
	if m != nil {
		if m.SnatIP.IsValid() {
			f.ProxySnatIP, f.ProxySnatPort = m.SnatIP, m.SnatPort
			f.Present.Set(flow.ProxySnatIP)
			f.Present.Set(flow.ProxySnatPort)
		}
		if p := m.SrcPod; p != nil {
			f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = p.Namespace, p.Name, m.Node
			f.Present.Set(flow.SourcePodNamespace)
			f.Present.Set(flow.SourcePodName)
			f.Present.Set(flow.SourceNodeName)
		}
		if p := m.DstPod; p != nil {
			f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = p.Namespace, p.Name, m.Node
			f.Present.Set(flow.DestinationPodNamespace)
			f.Present.Set(flow.DestinationPodName)
			f.Present.Set(flow.DestinationNodeName)
		}
		if m.ServicePortName != "" {
			f.DestinationClusterIP, f.DestinationServiceIP = m.ServiceIP, m.ServiceIP
			f.DestinationServicePort, f.DestinationServicePortName = m.ServicePort, m.ServicePortName
			for _, fl := range [...]flow.Field{flow.DestinationClusterIP, flow.DestinationServiceIP,
				flow.DestinationServicePort, flow.DestinationServicePortName} {
				f.Present.Set(fl)
			}
		}
	}
	v := r.Verdict
	if v == nil {
		return
	}
	if r.Attr&AttrEgressPolicy != 0 {
		f.Egress = v.Egress
		for _, fl := range [...]flow.Field{flow.EgressPolicyType, flow.EgressPolicyNamespace, flow.EgressPolicyName,
			flow.EgressPolicyRuleName, flow.EgressPolicyRuleAction} {
			f.Present.Set(fl)
		}
	}
	if r.Attr&AttrIngressPolicy != 0 {
		f.Ingress = v.Ingress
		for _, fl := range [...]flow.Field{flow.IngressPolicyType, flow.IngressPolicyNamespace, flow.IngressPolicyName,
			flow.IngressPolicyRuleName, flow.IngressPolicyRuleAction} {
			f.Present.Set(fl)
		}
	}
	if r.Attr&AttrEgress != 0 {
		f.EgressName, f.EgressIP, f.EgressNodeName = v.EgressName, v.EgressIP, v.EgressNode
		f.Present.Set(flow.EgressName)
		f.Present.Set(flow.EgressIP)
		f.Present.Set(flow.EgressNodeName)
	}
}

// Flows converts records to flow.Flows, appended to dst.
func Flows(dst []flow.Flow, recs []Record) []flow.Flow {
	for i := range recs {
		dst = append(dst, flow.Flow{})
		recs[i].Flow(&dst[len(dst)-1])
	}
	return dst
}
