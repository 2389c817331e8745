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
// the metadata cache of its meta run, nil without one; and its block plan,
// nil unless the template is the head run, the meta run, the TCP state,
// the flow type and elements of tailOps (then a record without SNAT is
// written in blocks).
func recordPlan(els []*ipfixmap.Element, t *ipfix.Template, six bool) ([]fieldOp, *metaCache, *blockPlan, error) {
	ops := elementOps(els)
	if ops == nil {
		return nil, nil, nil, nil
	}
	var mc *metaCache
	metaAt := -1
	// Replace the runs.
	out := ops[:0:0]
next:
	for i := 0; i < len(ops); {
		if mc == nil && len(ops)-i >= len(meta) && slices.Equal(ops[i:i+len(meta)], meta) {
			var err error
			if mc, err = newMetaCache(t.Fields[i : i+len(meta)]); err != nil {
				return nil, nil, nil, err
			}
			out = append(out, opMetaRun)
			metaAt = i
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
	var rp *blockPlan
	if metaAt == len(runs[0].seq) && len(out) >= 2 && out[0] == opHeadRun && out[1] == opMetaRun {
		rest := ops[metaAt+len(meta):]
		ok := len(rest) >= 2 && rest[0] == opTCPState && rest[1] == opFlowType
		for _, op := range rest[min(2, len(rest)):] {
			ok = ok && tailOps[op]
		}
		if ok {
			rp = &blockPlan{}
			if tail := slices.Clone(rest[2:]); len(tail) > 0 {
				at := metaAt + len(meta) + 2
				var err error
				rp.tail, err = newRunCache(t.Fields[at:at+len(tail)], func(b ipfix.RecordBuilder, k *tailKey) ipfix.RecordBuilder {
					return writeTail(b, k, tail, six)
				})
				if err != nil {
					return nil, nil, nil, err
				}
			}
		}
	}
	return out, mc, rp, nil
}

// metaKey is what the meta run's values are made of.
type metaKey struct {
	src, dst      *enrich.Pod
	v             *attribution.Verdict
	node, svcName string
	svcPort       uint16
	attr          uint8
}

// runCache holds the encoding of a run of elements whose values are all
// made of a key K (the Pods, the Service port, the policies, ...), for the
// keys of recent connections, in a direct-mapped table: the records of one
// Pod pair, Service and verdict share it, so a record copies its octets
// instead of writing each value. Bounded: a slot holds one key.
type runCache[K comparable] struct {
	t     *ipfix.Template
	enc   *ipfix.Encoder
	n     int
	slots []runSlot[K]
	write func(ipfix.RecordBuilder, *K) ipfix.RecordBuilder
}

type runSlot[K comparable] struct {
	k      K
	octets []byte
}

// metaCache is the cache of the meta run (the Pods, the Service port and
// both policies: 18 elements).
type metaCache = runCache[metaKey]

const metaSlotBits = 10 // 1,024 slots

func newRunCache[K comparable](fields []ipfix.Field, write func(ipfix.RecordBuilder, *K) ipfix.RecordBuilder) (*runCache[K], error) {
	t, err := ipfix.NewTemplate(256, slices.Clone(fields))
	if err != nil {
		return nil, err
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		return nil, err
	}
	return &runCache[K]{t: t, enc: enc, n: len(fields), slots: make([]runSlot[K], 1<<metaSlotBits), write: write}, nil
}

func newMetaCache(fields []ipfix.Field) (*metaCache, error) { return newRunCache(fields, writeMeta) }

func ptrHash[T any](p *T) uint64 { return uint64(uintptr(unsafe.Pointer(p))) }

func (k *metaKey) hash() uint64 {
	return ptrHash(k.src)*0x9e3779b97f4a7c15 ^ ptrHash(k.dst)*0xc2b2ae3d27d4eb4f ^ ptrHash(k.v)*0x165667b19e3779f9 ^
		uint64(k.svcPort)<<16 ^ uint64(k.attr)<<8 ^ uint64(len(k.svcName))
}

// octets returns the run's encoding for k, whose hash is h.
func (c *runCache[K]) octets(k *K, h uint64) ([]byte, error) {
	// The top bits of a multiplicative hash: the low bits of pointers
	// (aligned) and of the products above do not spread.
	h ^= h >> 29
	sl := &c.slots[(h*0xbf58476d1ce4e5b9)>>(64-metaSlotBits)]
	if sl.octets != nil && sl.k == *k {
		return sl.octets, nil
	}
	// Encoded from the slot's copy of the key: the closure must not
	// capture k, or every caller's key would move to the heap.
	buf := sl.octets[:0]
	sl.k, sl.octets = *k, nil
	b, err := c.enc.EncodeRecord(c.t, func(b ipfix.RecordBuilder) error { return c.write(b, &sl.k).End() })
	if err != nil {
		return nil, err
	}
	sl.octets = append(buf, b...)
	return sl.octets, nil
}

// tailOps are the elements that may follow the meta run, the TCP state
// and the flow type in a tail run: those whose values a tailKey holds (a
// record without SNAT).
var tailOps = map[fieldOp]bool{opEgressName: true, opEgressIP: true, opEgressNodeName: true, opEmptyString: true,
	opSnatPort: true, opClusterIP: true, opSnatIP: true, opServiceIP: true}

// tailKey is what the tail run's values are made of: the Egress and the
// Service's address. A record with SNAT has none (its SNAT address and
// port are its connection's own).
type tailKey struct {
	// ev is the verdict whose Egress the record carries, nil for none.
	ev    *attribution.Verdict
	svcIP netip.Addr
}

func (k *tailKey) hash() uint64 {
	h := ptrHash(k.ev) * 0x9e3779b97f4a7c15
	if k.svcIP.IsValid() {
		b := k.svcIP.As16()
		h ^= binary.LittleEndian.Uint64(b[8:]) * 0xc2b2ae3d27d4eb4f
	}
	return h
}

// writeTail writes the tail run's values.
func writeTail(b ipfix.RecordBuilder, k *tailKey, tail []fieldOp, six bool) ipfix.RecordBuilder {
	var egName, egIP, egNode string
	if v := k.ev; v != nil {
		egName, egIP, egNode = v.EgressName, egressIP(v), v.EgressNode
	}
	for _, op := range tail {
		switch op {
		case opEgressName:
			b = b.String(egName)
		case opEgressIP:
			b = b.String(egIP)
		case opEgressNodeName:
			b = b.String(egNode)
		case opEmptyString:
			b = b.String("")
		case opSnatPort:
			b = b.Uint(0)
		case opClusterIP, opServiceIP:
			b = b.Addr(addrIn(k.svcIP, six))
		case opSnatIP:
			b = b.Addr(addrIn(netip.Addr{}, six))
		}
	}
	return b
}

// egressIP is the egressIP element's value.
func egressIP(v *attribution.Verdict) string {
	if v.EgressIPText == "" && v.EgressIP.IsValid() {
		return v.EgressIP.String()
	}
	return v.EgressIPText
}

// blockPlan writes a record without SNAT in a few blocks: the head run,
// the meta run from its cache, the TCP state and the flow type, and the
// elements after them from a cache of their encoding (tail, nil for none).
type blockPlan struct {
	tail *runCache[tailKey]
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

// noMeta stands for a record's nil Meta (read-only).
var noMeta record.Meta

// writeRecord encodes r with the profile's template: the same values as
// ipfixmap.PutValues writes for r.Flow's result, read from the record and
// the metadata it refers to, without building the flow.Flow.
func (s *Sender) writeRecord(r *record.Record) error {
	m := r.Meta
	if m == nil {
		m = &noMeta
	} else if m.Full != nil {
		return s.write(m.Full)
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
	if bp := s.blocks[i]; bp != nil && !m.SnatIP.IsValid() {
		return s.writeBlocks(r, m, i, bp)
	}
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
			egName, egIP, egNode = v.EgressName, egressIP(v), v.EgressNode
		}
	}
	var srcNS, srcName, srcNode, dstNS, dstName, dstNode string
	if p := m.SrcPod; p != nil {
		srcNS, srcName, srcNode = p.Namespace, p.Name, m.Node
	}
	if p := m.DstPod; p != nil {
		dstNS, dstName, dstNode = p.Namespace, p.Name, m.Node
	}
	var svcIP netip.Addr
	var svcPort uint16
	if m.ServicePortName != "" {
		svcIP, svcPort = m.ServiceIP, m.ServicePort
	}
	var snatIP netip.Addr
	var snatPort uint16
	if m.SnatIP.IsValid() {
		snatIP, snatPort = m.SnatIP, m.SnatPort
	}
	b := s.enc.Begin(s.o.ObservationDomainID, s.tmpl[i])
	for _, op := range ops {
		switch op {
		case opHeadRun:
			var p []byte
			if p, b = b.Fixed(16); len(p) != 0 {
				putHead(p, r, six)
			}
		case opMetaRun:
			k := metaKey{src: m.SrcPod, dst: m.DstPod, node: m.Node, svcName: m.ServicePortName, svcPort: svcPort}
			if r.Verdict != nil && r.Attr&(record.AttrIngressPolicy|record.AttrEgressPolicy) != 0 {
				k.v, k.attr = r.Verdict, r.Attr&(record.AttrIngressPolicy|record.AttrEgressPolicy)
			}
			mc := s.meta[i]
			octets, err := mc.octets(&k, k.hash())
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
			b = b.Addr(addrIn(r.Src.Addr(), six))
		case opDstAddr:
			b = b.Addr(addrIn(r.Dst.Addr(), six))
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
			b = b.String(m.ServicePortName)
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

// writeBlocks writes r (without SNAT; m is its Meta) with block plan bp: the head run,
// the meta run from its cache, the TCP state and the flow type, and the
// tail from its cache.
func (s *Sender) writeBlocks(r *record.Record, m *record.Meta, i int, bp *blockPlan) error {
	mk := metaKey{src: m.SrcPod, dst: m.DstPod, node: m.Node, svcName: m.ServicePortName}
	var tk tailKey
	if m.ServicePortName != "" {
		mk.svcPort, tk.svcIP = m.ServicePort, m.ServiceIP
	}
	if v := r.Verdict; v != nil {
		if a := r.Attr & (record.AttrIngressPolicy | record.AttrEgressPolicy); a != 0 {
			mk.v, mk.attr = v, a
		}
		if r.Attr&record.AttrEgress != 0 {
			tk.ev = v
		}
	}
	mc := s.meta[i]
	meta, err := mc.octets(&mk, mk.hash())
	if err != nil {
		return err
	}
	var tail []byte
	if bp.tail != nil {
		if tail, err = bp.tail.octets(&tk, tk.hash()); err != nil {
			return err
		}
	}
	// The head is written on the stack and copied as one block: cheaper
	// than RecordBuilder.Fixed's walk over the 16 fields' lengths.
	var head [len(headLayout) * 8]byte
	n := putHead(head[:], r, i == 1)
	b := s.enc.Begin(s.o.ObservationDomainID, s.tmpl[i]).Encoded(len(headLayout), head[:n]).Encoded(mc.n, meta).
		String(r.TCPStateName()).Uint(uint64(r.FlowType))
	if bp.tail != nil {
		b = b.Encoded(bp.tail.n, tail)
	}
	for _, x := range s.o.Extra {
		b = b.Bytes(x.Value)
	}
	return b.End()
}

// putHead writes the head run's values into its octets p and returns
// their length.
func putHead(p []byte, r *record.Record, six bool) int {
	c := &r.Counts
	be := binary.BigEndian
	_ = p[45]
	be.PutUint32(p[0:], uint32(unixSeconds(r.Start)))
	be.PutUint32(p[4:], uint32(unixSeconds(r.End)))
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
		// IPv4 addresses in their mapped form (flow.AddrIn): an Addr's
		// 16 octets.
		copy(p[n:], r.Src.As16()[:])
		copy(p[n+16:], r.Dst.As16()[:])
		n += 32
	} else {
		be.PutUint32(p[n:], uint32v4(&r.Src))
		be.PutUint32(p[n+4:], uint32v4(&r.Dst))
		n += 8
	}
	be.PutUint64(p[n:], c[record.ReversePacketTotal])
	be.PutUint64(p[n+8:], c[record.ReverseOctetTotal])
	be.PutUint64(p[n+16:], c[record.ReversePacketDelta])
	be.PutUint64(p[n+24:], c[record.ReverseOctetDelta])
	return n + 32
}

// unixSeconds is time.Unix(0, ns).Unix(): the seconds, rounded down
// (also before 1970), without making a time.Time.
func unixSeconds(ns int64) int64 {
	s := ns / 1e9
	if ns%1e9 < 0 {
		s--
	}
	return s
}

// uint32v4 is an IPv4 address, plain or mapped, as a number; zero for
// any other (as addrIn writes it in an IPv4 field).
func uint32v4(a *record.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	return binary.BigEndian.Uint32(a.As16()[12:])
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
