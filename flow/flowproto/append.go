package flowproto

import (
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/flow"
)

// AppendFlow appends f's Protobuf Flow message (without a tag or length)
// to b: the same message as FromFlow's, written straight to bytes without
// building the intermediate objects. An exporter sends tens of thousands
// of records per poll; FromFlow and proto.Marshal cost about a dozen
// allocations each. Records with labels, L7 values, aggregation results
// or kept unknown fields, which exporters do not produce, take FromFlow's
// path.
func AppendFlow(b []byte, f *flow.Flow) ([]byte, error) {
	has := f.Present.Has
	if f.Aggregation != nil || len(f.ProtoUnknown) > 0 || has(flow.AppProtocolName) || has(flow.HTTPVals) ||
		(has(flow.SourcePodLabels) && f.SourcePodLabels != "") || (has(flow.DestinationPodLabels) && f.DestinationPodLabels != "") {
		p, err := FromFlow(f)
		if err != nil {
			return b, err
		}
		return proto.MarshalOptions{}.MarshalAppend(b, p)
	}
	b = appendString(b, 1, f.Origin.ID)
	if o := &f.Origin; !o.ExportTime.IsZero() || o.SequenceNumber != 0 || o.ObservationDomainID != 0 || o.Exporter.IsValid() {
		m := len(b)
		b = beginMsg(b, 2)
		if !o.ExportTime.IsZero() {
			b = appendVarint(b, 1, uint64(o.ExportTime.Unix()))
		}
		b = appendVarint(b, 2, uint64(o.SequenceNumber))
		b = appendVarint(b, 3, uint64(o.ObservationDomainID))
		if o.Exporter.IsValid() {
			b = appendString(b, 4, o.Exporter.String())
		}
		b = endMsg(b, m)
	}
	if has(flow.StartTime) {
		b = appendTime(b, 3, f.StartTime)
	}
	if has(flow.EndTime) {
		b = appendTime(b, 4, f.EndTime)
	}
	if has(flow.EndReason) {
		b = appendVarint(b, 5, uint64(f.EndReason))
	}
	if has(flow.SourceIP) || has(flow.DestinationIP) {
		m := len(b)
		b = beginMsg(b, 6)
		// As FromFlow: one version for both, IPv4 mapped beside IPv6.
		six := f.IPHeaderIPv6()
		src, dst := flow.AddrIn(f.SourceIP, six), flow.AddrIn(f.DestinationIP, six)
		if (has(flow.SourceIP) && src.IsValid()) || (has(flow.DestinationIP) && dst.IsValid()) {
			if six {
				b = appendVarint(b, 1, 6)
			} else {
				b = appendVarint(b, 1, 4)
			}
		}
		b = appendAddr(b, 2, f, flow.SourceIP, src)
		b = appendAddr(b, 3, f, flow.DestinationIP, dst)
		b = endMsg(b, m)
	}
	if has(flow.Protocol) || has(flow.SourcePort) || has(flow.DestinationPort) || has(flow.TCPState) {
		m := len(b)
		b = beginMsg(b, 7)
		b = appendVarint(b, 1, uint64(f.Protocol))
		b = appendVarint(b, 2, uint64(f.SourcePort))
		b = appendVarint(b, 3, uint64(f.DestinationPort))
		if has(flow.TCPState) { // a set oneof is sent even when empty
			t := len(b)
			b = beginMsg(b, 4)
			b = appendString(b, 1, f.TCPState)
			b = endMsg(b, t)
		}
		b = endMsg(b, m)
	}
	b = appendK8s(b, f)
	b = appendStats(b, 9, f, &f.Stats, flow.PacketTotalCount)
	b = appendStats(b, 10, f, &f.ReverseStats, flow.ReversePacketTotalCount)
	if has(flow.FlowDirection) {
		b = appendVarint(b, 12, uint64(f.FlowDirection))
	}
	b = appendAddr(b, 14, f, flow.ProxySnatIP, flow.AddrIn(f.ProxySnatIP, false))
	if has(flow.ProxySnatPort) {
		b = appendVarint(b, 15, uint64(f.ProxySnatPort))
	}
	return b, nil
}

// appendK8s writes the Kubernetes message as k8sFromFlow builds it
// (labels aside: AppendFlow leaves records with labels to FromFlow).
func appendK8s(b []byte, f *flow.Flow) []byte {
	has := f.Present.Has
	some := has(flow.DestinationServiceIP)
	for fl := flow.FlowType; fl <= flow.EgressUID && !some; fl++ {
		some = has(fl)
	}
	if !some {
		return b
	}
	str := func(b []byte, num protowire.Number, fl flow.Field, v string) []byte {
		if has(fl) {
			return appendString(b, num, v)
		}
		return b
	}
	uid := func(b []byte, num protowire.Number, fl flow.Field, u flow.UID) []byte {
		if has(fl) && u != (flow.UID{}) {
			return appendUID(b, num, u)
		}
		return b
	}
	enum := func(b []byte, num protowire.Number, fl flow.Field, v uint8) []byte {
		if has(fl) {
			return appendVarint(b, num, uint64(v))
		}
		return b
	}
	m := len(b)
	b = beginMsg(b, 8)
	b = enum(b, 1, flow.FlowType, f.FlowType)
	b = str(b, 2, flow.SourcePodNamespace, f.SourcePodNamespace)
	b = str(b, 3, flow.SourcePodName, f.SourcePodName)
	b = uid(b, 4, flow.SourcePodUID, f.SourcePodUID)
	b = str(b, 6, flow.SourceNodeName, f.SourceNodeName)
	b = uid(b, 7, flow.SourceNodeUID, f.SourceNodeUID)
	b = str(b, 8, flow.DestinationPodNamespace, f.DestinationPodNamespace)
	b = str(b, 9, flow.DestinationPodName, f.DestinationPodName)
	b = uid(b, 10, flow.DestinationPodUID, f.DestinationPodUID)
	b = str(b, 12, flow.DestinationNodeName, f.DestinationNodeName)
	b = uid(b, 13, flow.DestinationNodeUID, f.DestinationNodeUID)
	b = appendAddr(b, 14, f, flow.DestinationClusterIP, flow.AddrIn(f.DestinationClusterIP, false))
	if has(flow.DestinationServicePort) {
		b = appendVarint(b, 15, uint64(f.DestinationServicePort))
	}
	b = str(b, 16, flow.DestinationServicePortName, f.DestinationServicePortName)
	b = uid(b, 17, flow.DestinationServiceUID, f.DestinationServiceUID)
	b = enum(b, 18, flow.IngressPolicyType, f.Ingress.Type)
	b = str(b, 19, flow.IngressPolicyNamespace, f.Ingress.Namespace)
	b = str(b, 20, flow.IngressPolicyName, f.Ingress.Name)
	b = uid(b, 21, flow.IngressPolicyUID, f.Ingress.UID)
	b = str(b, 22, flow.IngressPolicyRuleName, f.Ingress.RuleName)
	b = enum(b, 23, flow.IngressPolicyRuleAction, f.Ingress.RuleAction)
	b = enum(b, 24, flow.EgressPolicyType, f.Egress.Type)
	b = str(b, 25, flow.EgressPolicyNamespace, f.Egress.Namespace)
	b = str(b, 26, flow.EgressPolicyName, f.Egress.Name)
	b = uid(b, 27, flow.EgressPolicyUID, f.Egress.UID)
	b = str(b, 28, flow.EgressPolicyRuleName, f.Egress.RuleName)
	b = enum(b, 29, flow.EgressPolicyRuleAction, f.Egress.RuleAction)
	b = str(b, 30, flow.EgressName, f.EgressName)
	b = appendAddr(b, 31, f, flow.EgressIP, flow.AddrIn(f.EgressIP, false))
	b = str(b, 32, flow.EgressNodeName, f.EgressNodeName)
	b = uid(b, 33, flow.EgressNodeUID, f.EgressNodeUID)
	b = uid(b, 34, flow.EgressUID, f.EgressUID)
	b = appendAddr(b, 35, f, flow.DestinationServiceIP, flow.AddrIn(f.DestinationServiceIP, false))
	return endMsg(b, m)
}

func appendStats(b []byte, num protowire.Number, f *flow.Flow, s *flow.Stats, first flow.Field) []byte {
	some := false
	for i := range flow.Field(4) {
		some = some || f.Present.Has(first+i)
	}
	if !some {
		return b
	}
	m := len(b)
	b = beginMsg(b, num)
	b = appendVarint(b, 1, s.PacketTotalCount)
	b = appendVarint(b, 2, s.PacketDeltaCount)
	b = appendVarint(b, 3, s.OctetTotalCount)
	b = appendVarint(b, 4, s.OctetDeltaCount)
	return endMsg(b, m)
}

// The append helpers leave out zero values, as proto3 marshalling does.

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendAddr(b []byte, num protowire.Number, f *flow.Flow, field flow.Field, a netip.Addr) []byte {
	if !f.Present.Has(field) || !a.IsValid() {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	if a.Is4() {
		v := a.As4()
		return protowire.AppendBytes(b, v[:])
	}
	v := a.As16()
	return protowire.AppendBytes(b, v[:])
}

func appendUID(b []byte, num protowire.Number, u flow.UID) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, 36)
	return appendUIDText(b, u)
}

func appendTime(b []byte, num protowire.Number, t time.Time) []byte {
	m := len(b)
	b = beginMsg(b, num)
	b = appendVarint(b, 1, uint64(t.Unix()))
	b = appendVarint(b, 2, uint64(int64(t.Nanosecond())))
	return endMsg(b, m)
}

// beginMsg starts an embedded message field: its tag and a one-octet
// length that endMsg fixes.
func beginMsg(b []byte, num protowire.Number) []byte {
	return append(protowire.AppendTag(b, num, protowire.BytesType), 0)
}

// endMsg sets the length of the message begun at m (where its tag
// starts), moving the body when the length needs more than one octet.
func endMsg(b []byte, m int) []byte {
	// The tags of these fields are one octet (numbers below 16) or two.
	start := m + 2
	if b[m]&0x80 != 0 {
		start = m + 3
	}
	n := len(b) - start
	if n < 0x80 {
		b[start-1] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[start+k-1:], b[start:start+n])
	protowire.AppendVarint(b[:start-1], uint64(n))
	return b
}

// AppendExportRequest appends an ExportRequest holding flows to b. A
// record that has no Protobuf form is left out and handed to bad.
func AppendExportRequest(b []byte, flows []flow.Flow, bad func(*flow.Flow, error)) []byte {
	for i := range flows {
		m := len(b)
		b = beginMsg(b, 1)
		var err error
		if b, err = AppendFlow(b, &flows[i]); err != nil {
			b = b[:m]
			bad(&flows[i], fmt.Errorf("flowproto: %w", err))
			continue
		}
		b = endMsg(b, m)
	}
	return b
}
