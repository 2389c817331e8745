package ipfixsend

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"time"
	"unsafe"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/record"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
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
	// Runs of elements in the order every agent profile has them, written
	// by one case each (one dispatch instead of one per element).
	opHeadRun
	opTailRun
	opMetaRun // the Pods, Service port and policies, from the metadata cache
)

var runs = []struct {
	op  fieldOp
	seq []fieldOp
}{
	{opHeadRun, []fieldOp{opStart, opEnd, opEndReason, opSrcPort, opDstPort, opProto, opCount + record.PacketTotal,
		opCount + record.OctetTotal, opCount + record.PacketDelta, opCount + record.OctetDelta, opSrcAddr, opDstAddr,
		opCount + record.ReversePacketTotal, opCount + record.ReverseOctetTotal, opCount + record.ReversePacketDelta,
		opCount + record.ReverseOctetDelta}},
	{opTailRun, []fieldOp{opTCPState, opFlowType, opEgressName, opEgressIP}},
}

// meta is the meta run: the Pods, the Service port and both policies.
var meta = []fieldOp{opSrcPodName, opSrcPodNamespace, opSrcNodeName, opDstPodName, opDstPodNamespace, opDstNodeName,
	opServicePort, opServicePortName, opIngressName, opIngressNamespace, opIngressType, opIngressRuleName,
	opIngressRuleAction, opEgressPolicyName, opEgressPolicyNamespace, opEgressPolicyType, opEgressPolicyRuleName,
	opEgressPolicyRuleAction}

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

// headLayout is the lengths and types of the head run's fields (a
// family's address length for the two addresses): with them, the run is
// written as one block of octets.
var headLayout = [16]struct {
	length uint16
	typ    ipfix.DataType
}{{4, ipfix.DateTimeSeconds}, {4, ipfix.DateTimeSeconds}, {1, ipfix.Unsigned8}, {2, ipfix.Unsigned16}, {2, ipfix.Unsigned16},
	{1, ipfix.Unsigned8}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64},
	{0, 0}, {0, 0}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64}, {8, ipfix.Unsigned64}}

// headFits says the template's fields from i on have the head run's
// layout.
func headFits(fs []ipfix.Field, i int, six bool) bool {
	if len(fs)-i < len(headLayout) {
		return false
	}
	for j, l := range headLayout {
		f := &fs[i+j]
		if l.length == 0 { // an address
			l.length, l.typ = 4, ipfix.IPv4Address
			if six {
				l.length, l.typ = 16, ipfix.IPv6Address
			}
		}
		if f.Length != l.length || f.Type != l.typ {
			return false
		}
	}
	return true
}

// elementOps is the op of each element, or nil when one of them does not
// come from a record.Record.
func elementOps(els []*ipfixmap.Element) []fieldOp {
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

// recordPlan is the ops of a template's elements, or nil when one of them
// does not come from a record.Record (then records go through flow.Flow);
// and the metadata cache of its meta run, nil without one.
func recordPlan(els []*ipfixmap.Element, t *ipfix.Template, six bool) ([]fieldOp, *metaCache, error) {
	ops := elementOps(els)
	if ops == nil {
		return nil, nil, nil
	}
	var mc *metaCache
	// Replace the runs.
	out := ops[:0:0]
next:
	for i := 0; i < len(ops); {
		if mc == nil && len(ops)-i >= len(meta) && slices.Equal(ops[i:i+len(meta)], meta) {
			var err error
			if mc, err = newMetaCache(t.Fields[i : i+len(meta)]); err != nil {
				return nil, nil, err
			}
			out = append(out, opMetaRun)
			i += len(meta)
			continue
		}
		for _, r := range runs {
			if len(ops)-i >= len(r.seq) && slices.Equal(ops[i:i+len(r.seq)], r.seq) &&
				(r.op != opHeadRun || headFits(t.Fields, i, six)) {
				out = append(out, r.op)
				i += len(r.seq)
				continue next
			}
		}
		out = append(out, ops[i])
		i++
	}
	return out, mc, nil
}

// metaKey is what the meta run's values are made of.
type metaKey struct {
	src, dst      *enrich.Pod
	v             *attribution.Verdict
	node, svcName string
	svcPort       uint16
	attr          uint8
}

// metaCache holds the encoding of the meta run (the Pods, the Service
// port and both policies: 18 elements) for the metadata of recent
// connections, in a direct-mapped table: the records of one Pod pair,
// Service and verdict share it, so a record copies its octets instead of
// writing 18 values. Bounded: a slot holds one key.
type metaCache struct {
	t     *ipfix.Template
	enc   *ipfix.Encoder
	n     int
	slots []metaSlot
}

type metaSlot struct {
	k      metaKey
	octets []byte
}

const metaSlots = 1024

func newMetaCache(fields []ipfix.Field) (*metaCache, error) {
	t, err := ipfix.NewTemplate(256, slices.Clone(fields))
	if err != nil {
		return nil, err
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		return nil, err
	}
	return &metaCache{t: t, enc: enc, n: len(fields), slots: make([]metaSlot, metaSlots)}, nil
}

func ptrHash[T any](p *T) uint64 { return uint64(uintptr(unsafe.Pointer(p))) }

// octets returns the meta run's encoding for k.
func (c *metaCache) octets(k *metaKey) ([]byte, error) {
	h := ptrHash(k.src)*0x9e3779b97f4a7c15 ^ ptrHash(k.dst)*0xc2b2ae3d27d4eb4f ^ ptrHash(k.v)*0x165667b19e3779f9 ^
		uint64(k.svcPort)<<16 ^ uint64(k.attr)<<8 ^ uint64(len(k.svcName))
	sl := &c.slots[(h^h>>32^h>>17)%metaSlots]
	if sl.octets != nil && sl.k == *k {
		return sl.octets, nil
	}
	b, err := c.enc.EncodeRecord(c.t, func(b ipfix.RecordBuilder) error { return writeMeta(b, k).End() })
	if err != nil {
		return nil, err
	}
	sl.k, sl.octets = *k, append(sl.octets[:0], b...)
	return sl.octets, nil
}

// writeMeta writes the meta run's values.
func writeMeta(b ipfix.RecordBuilder, k *metaKey) ipfix.RecordBuilder {
	in, eg := &noPolicy, &noPolicy
	if v := k.v; v != nil {
		if k.attr&record.AttrIngressPolicy != 0 {
			in = &v.Ingress
		}
		if k.attr&record.AttrEgressPolicy != 0 {
			eg = &v.Egress
		}
	}
	var srcNS, srcName, srcNode, dstNS, dstName, dstNode string
	if p := k.src; p != nil {
		srcNS, srcName, srcNode = p.Namespace, p.Name, k.node
	}
	if p := k.dst; p != nil {
		dstNS, dstName, dstNode = p.Namespace, p.Name, k.node
	}
	return b.String(srcName).String(srcNS).String(srcNode).String(dstName).String(dstNS).String(dstNode).
		Uint(uint64(k.svcPort)).String(k.svcName).
		String(in.Name).String(in.Namespace).Uint(uint64(in.Type)).String(in.RuleName).Uint(uint64(in.RuleAction)).
		String(eg.Name).String(eg.Namespace).Uint(uint64(eg.Type)).String(eg.RuleName).Uint(uint64(eg.RuleAction))
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
		case opHeadRun:
			var p []byte
			if p, b = b.Fixed(16); len(p) == 0 {
				break
			}
			c := &r.Counts
			be := binary.BigEndian
			be.PutUint32(p[0:], uint32(time.Unix(0, r.Start).Unix()))
			be.PutUint32(p[4:], uint32(time.Unix(0, r.End).Unix()))
			p[8] = r.EndReason
			be.PutUint16(p[9:], r.SrcPort)
			be.PutUint16(p[11:], r.DstPort)
			p[13] = r.Proto
			be.PutUint64(p[14:], c[record.PacketTotal])
			be.PutUint64(p[22:], c[record.OctetTotal])
			be.PutUint64(p[30:], c[record.PacketDelta])
			be.PutUint64(p[38:], c[record.OctetDelta])
			n := 46
			if six {
				src, dst := addrIn(r.Src, true).As16(), addrIn(r.Dst, true).As16()
				copy(p[n:], src[:])
				copy(p[n+16:], dst[:])
				n += 32
			} else {
				src, dst := addrIn(r.Src, false), addrIn(r.Dst, false)
				be.PutUint32(p[n:], uint32v4(src))
				be.PutUint32(p[n+4:], uint32v4(dst))
				n += 8
			}
			be.PutUint64(p[n:], c[record.ReversePacketTotal])
			be.PutUint64(p[n+8:], c[record.ReverseOctetTotal])
			be.PutUint64(p[n+16:], c[record.ReversePacketDelta])
			be.PutUint64(p[n+24:], c[record.ReverseOctetDelta])
		case opMetaRun:
			k := metaKey{src: r.SrcPod, dst: r.DstPod, node: r.Node, svcName: r.ServicePortName, svcPort: svcPort}
			if r.Verdict != nil && r.Attr&(record.AttrIngressPolicy|record.AttrEgressPolicy) != 0 {
				k.v, k.attr = r.Verdict, r.Attr&(record.AttrIngressPolicy|record.AttrEgressPolicy)
			}
			mc := s.meta[i]
			octets, err := mc.octets(&k)
			if err != nil {
				return err
			}
			b = b.Encoded(mc.n, octets)
		case opTailRun:
			b = b.String(r.TCPStateName()).Uint(uint64(r.FlowType)).String(egName).String(egIP)
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

// uint32v4 is an IPv4 address as a number; zero for any other.
func uint32v4(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
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
