package ipfixsend

import (
	"net/netip"
	"time"

	"sluice/exporter/record"
	"sluice/flow"
	"sluice/flow/ipfixmap"
)

// fieldOp is how writeRecord fills one element of a profile's template
// from a record.Record.
type fieldOp uint8

const (
	opNone fieldOp = iota // not from a record: the template takes the flow.Flow path
	opStart
	opEnd
	opEndReason
	opSrcPort
	opDstPort
	opProto
	opCount // + counter index (8 ops)
	_
	_
	_
	_
	_
	_
	_
	opSrcAddr
	opDstAddr
	opSrcPodName
	opSrcPodNamespace
	opSrcNodeName
	opDstPodName
	opDstPodNamespace
	opDstNodeName
	opServicePort
	opServicePortName
	opIngressName
	opIngressNamespace
	opIngressType
	opIngressRuleName
	opIngressRuleAction
	opEgressPolicyName
	opEgressPolicyNamespace
	opEgressPolicyType
	opEgressPolicyRuleName
	opEgressPolicyRuleAction
	opTCPState
	opFlowType
	opEgressName
	opEgressIP
	opEgressNodeName
	opEmptyString // elements an exporter record never has (L7 values)
	opSnatPort
	opClusterIP
	opSnatIP
	opServiceIP
)

// recordOps maps element names to their ops; the address elements of
// both families share one.
var recordOps = map[string]fieldOp{
	"flowStartSeconds": opStart, "flowStartMilliseconds": opStart,
	"flowEndSeconds": opEnd, "flowEndMilliseconds": opEnd, "flowEndReason": opEndReason,
	"sourceTransportPort": opSrcPort, "destinationTransportPort": opDstPort, "protocolIdentifier": opProto,
	"packetTotalCount": opCount + record.PacketTotal, "octetTotalCount": opCount + record.OctetTotal,
	"packetDeltaCount": opCount + record.PacketDelta, "octetDeltaCount": opCount + record.OctetDelta,
	"reversePacketTotalCount": opCount + record.ReversePacketTotal, "reverseOctetTotalCount": opCount + record.ReverseOctetTotal,
	"reversePacketDeltaCount": opCount + record.ReversePacketDelta, "reverseOctetDeltaCount": opCount + record.ReverseOctetDelta,
	"sourceIPv4Address": opSrcAddr, "sourceIPv6Address": opSrcAddr,
	"destinationIPv4Address": opDstAddr, "destinationIPv6Address": opDstAddr,
	"sourcePodName": opSrcPodName, "sourcePodNamespace": opSrcPodNamespace, "sourceNodeName": opSrcNodeName,
	"destinationPodName": opDstPodName, "destinationPodNamespace": opDstPodNamespace, "destinationNodeName": opDstNodeName,
	"destinationServicePort": opServicePort, "destinationServicePortName": opServicePortName,
	"ingressNetworkPolicyName": opIngressName, "ingressNetworkPolicyNamespace": opIngressNamespace,
	"ingressNetworkPolicyType": opIngressType, "ingressNetworkPolicyRuleName": opIngressRuleName,
	"ingressNetworkPolicyRuleAction": opIngressRuleAction,
	"egressNetworkPolicyName":        opEgressPolicyName, "egressNetworkPolicyNamespace": opEgressPolicyNamespace,
	"egressNetworkPolicyType": opEgressPolicyType, "egressNetworkPolicyRuleName": opEgressPolicyRuleName,
	"egressNetworkPolicyRuleAction": opEgressPolicyRuleAction,
	"tcpState":                      opTCPState, "flowType": opFlowType,
	"egressName": opEgressName, "egressIP": opEgressIP, "egressNodeName": opEgressNodeName,
	"appProtocolName": opEmptyString, "httpVals": opEmptyString,
	"proxySnatPort":          opSnatPort,
	"destinationClusterIPv4": opClusterIP, "destinationClusterIPv6": opClusterIP,
	"proxySnatIPv4": opSnatIP, "proxySnatIPv6": opSnatIP,
	"destinationServiceIPv4": opServiceIP, "destinationServiceIPv6": opServiceIP,
}

// recordPlan is the ops of a template's elements, or nil when one of them
// does not come from a record.Record (then records go through flow.Flow).
func recordPlan(els []*ipfixmap.Element) []fieldOp {
	ops := make([]fieldOp, len(els))
	for i, el := range els {
		op, ok := recordOps[el.Name()]
		if !ok {
			return nil
		}
		ops[i] = op
	}
	return ops
}

var noPolicy flow.Policy

// writeRecord encodes r with the profile's template: the same values as
// ipfixmap.PutValues writes for r.Flow's result, read from the record and
// the metadata it refers to, without building the flow.Flow.
func (s *Sender) writeRecord(r *record.Record) error {
	if r.Full != nil {
		return s.write(r.Full)
	}
	i := 0
	if r.IsIPv6() {
		i = 1
	}
	ops := s.plan[i]
	if ops == nil {
		r.Flow(&s.scratch)
		return s.write(&s.scratch)
	}
	six := i == 1
	in, eg := &noPolicy, &noPolicy
	var egName, egIP, egNode string
	if v := r.Verdict; v != nil {
		if r.Attr&record.AttrIngressPolicy != 0 {
			in = &v.Ingress
		}
		if r.Attr&record.AttrEgressPolicy != 0 {
			eg = &v.Egress
		}
		if r.Attr&record.AttrEgress != 0 {
			egName, egNode = v.EgressName, v.EgressNode
			if egIP = v.EgressIPText; egIP == "" && v.EgressIP.IsValid() {
				egIP = v.EgressIP.String()
			}
		}
	}
	var srcNS, srcName, srcNode, dstNS, dstName, dstNode string
	if p := r.SrcPod; p != nil {
		srcNS, srcName, srcNode = p.Namespace, p.Name, r.Node
	}
	if p := r.DstPod; p != nil {
		dstNS, dstName, dstNode = p.Namespace, p.Name, r.Node
	}
	var svcIP netip.Addr
	var svcPort uint16
	if r.ServicePortName != "" {
		svcIP, svcPort = r.ServiceIP, r.ServicePort
	}
	var snatIP netip.Addr
	var snatPort uint16
	if r.SnatIP.IsValid() {
		snatIP, snatPort = r.SnatIP, r.SnatPort
	}
	b := s.enc.Begin(s.o.ObservationDomainID, s.tmpl[i])
	for _, op := range ops {
		switch op {
		case opStart:
			b = b.Time(time.Unix(0, r.Start))
		case opEnd:
			b = b.Time(time.Unix(0, r.End))
		case opEndReason:
			b = b.Uint(uint64(r.EndReason))
		case opSrcPort:
			b = b.Uint(uint64(r.SrcPort))
		case opDstPort:
			b = b.Uint(uint64(r.DstPort))
		case opProto:
			b = b.Uint(uint64(r.Proto))
		case opCount, opCount + 1, opCount + 2, opCount + 3, opCount + 4, opCount + 5, opCount + 6, opCount + 7:
			b = b.Uint(r.Counts[op-opCount])
		case opSrcAddr:
			b = b.Addr(addrIn(r.Src, six))
		case opDstAddr:
			b = b.Addr(addrIn(r.Dst, six))
		case opSrcPodName:
			b = b.String(srcName)
		case opSrcPodNamespace:
			b = b.String(srcNS)
		case opSrcNodeName:
			b = b.String(srcNode)
		case opDstPodName:
			b = b.String(dstName)
		case opDstPodNamespace:
			b = b.String(dstNS)
		case opDstNodeName:
			b = b.String(dstNode)
		case opServicePort:
			b = b.Uint(uint64(svcPort))
		case opServicePortName:
			b = b.String(r.ServicePortName)
		case opIngressName:
			b = b.String(in.Name)
		case opIngressNamespace:
			b = b.String(in.Namespace)
		case opIngressType:
			b = b.Uint(uint64(in.Type))
		case opIngressRuleName:
			b = b.String(in.RuleName)
		case opIngressRuleAction:
			b = b.Uint(uint64(in.RuleAction))
		case opEgressPolicyName:
			b = b.String(eg.Name)
		case opEgressPolicyNamespace:
			b = b.String(eg.Namespace)
		case opEgressPolicyType:
			b = b.Uint(uint64(eg.Type))
		case opEgressPolicyRuleName:
			b = b.String(eg.RuleName)
		case opEgressPolicyRuleAction:
			b = b.Uint(uint64(eg.RuleAction))
		case opTCPState:
			b = b.String(r.TCPStateName())
		case opFlowType:
			b = b.Uint(uint64(r.FlowType))
		case opEgressName:
			b = b.String(egName)
		case opEgressIP:
			b = b.String(egIP)
		case opEgressNodeName:
			b = b.String(egNode)
		case opEmptyString:
			b = b.String("")
		case opSnatPort:
			b = b.Uint(uint64(snatPort))
		case opClusterIP, opServiceIP:
			b = b.Addr(addrIn(svcIP, six))
		case opSnatIP:
			b = b.Addr(addrIn(snatIP, six))
		}
	}
	for _, x := range s.o.Extra {
		b = b.Bytes(x.Value)
	}
	return b.End()
}

// addrIn is an address as ipfixmap writes it in a field of one family:
// IPv4 addresses mapped in IPv6 fields; in IPv4 fields, an address of the
// other family (or none) as zeros.
func addrIn(a netip.Addr, six bool) netip.Addr {
	if six {
		return flow.AddrIn(a, true)
	}
	if a = a.Unmap(); !a.Is4() {
		return netip.Addr{}
	}
	return a
}
