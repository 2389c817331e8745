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

// Record is one exported record of a connection. The zero Record with
// Full set stands for that flow.Flow, whole (records that did not come
// from the connection store, such as tests').
type Record struct {
	// Start and End are Unix nanoseconds.
	Start, End int64
	// Src and Dst are the connection's endpoints (the destination after
	// DNAT); SnatIP and SnatPort, when SnatIP is valid, the translated
	// source the reply went to.
	Src, Dst, SnatIP netip.Addr
	// ServiceIP, ServicePort and ServicePortName are the Service port a
	// DNAT'ed connection reached; ServicePortName is empty without one.
	ServiceIP netip.Addr
	// Counts are the totals and deltas, by the indexes above.
	Counts                                  [8]uint64
	SrcPort, DstPort, SnatPort, ServicePort uint16
	Proto, EndReason, TCPState, FlowType    uint8
	// Attr says which parts of Verdict the record carries.
	Attr            uint8
	ServicePortName string
	// Node is this Node's name, written with each local Pod.
	Node string
	// SrcPod and DstPod are the local Pods at either end, nil for none.
	SrcPod, DstPod *enrich.Pod
	// Verdict is the connection's attribution (read-only, shared).
	Verdict *attribution.Verdict
	// Full, when set, is the whole record and every other field is
	// ignored.
	Full *flow.Flow
}

// IsIPv6 says the record goes in an IPv6 template (flow.Flow.IsIPv6).
func (r *Record) IsIPv6() bool {
	if r.Full != nil {
		return r.Full.IsIPv6()
	}
	return real6(r.Src) || real6(r.Dst) || real6(r.ServiceIP) || real6(r.SnatIP)
}

func real6(a netip.Addr) bool { return a.Is6() && !a.Is4In6() }

// Denied says the record names a policy rule that drops or rejects: a
// denied connection's record.
func (r *Record) Denied() bool {
	if r.Full != nil {
		f := r.Full
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
	if r.Full != nil {
		*f = *r.Full
		return
	}
	*f = flow.Flow{}
	f.StartTime, f.EndTime, f.EndReason = time.Unix(0, r.Start), time.Unix(0, r.End), r.EndReason
	f.SourceIP, f.SourcePort, f.DestinationIP, f.DestinationPort, f.Protocol = r.Src, r.SrcPort, r.Dst, r.DstPort, r.Proto
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
	if r.SnatIP.IsValid() {
		f.ProxySnatIP, f.ProxySnatPort = r.SnatIP, r.SnatPort
		f.Present.Set(flow.ProxySnatIP)
		f.Present.Set(flow.ProxySnatPort)
	}
	if p := r.SrcPod; p != nil {
		f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = p.Namespace, p.Name, r.Node
		f.Present.Set(flow.SourcePodNamespace)
		f.Present.Set(flow.SourcePodName)
		f.Present.Set(flow.SourceNodeName)
	}
	if p := r.DstPod; p != nil {
		f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = p.Namespace, p.Name, r.Node
		f.Present.Set(flow.DestinationPodNamespace)
		f.Present.Set(flow.DestinationPodName)
		f.Present.Set(flow.DestinationNodeName)
	}
	f.FlowType = r.FlowType
	if r.ServicePortName != "" {
		f.DestinationClusterIP, f.DestinationServiceIP = r.ServiceIP, r.ServiceIP
		f.DestinationServicePort, f.DestinationServicePortName = r.ServicePort, r.ServicePortName
		for _, fl := range [...]flow.Field{flow.DestinationClusterIP, flow.DestinationServiceIP,
			flow.DestinationServicePort, flow.DestinationServicePortName} {
			f.Present.Set(fl)
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
