package flowproto

import (
	"fmt"
	"net/netip"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/flow"
)

// AppendFlow appends f's Protobuf Flow message (without a tag or length)
// to b: the same message as FromFlow's, written straight to bytes without
// building the intermediate objects. An exporter sends tens of thousands
// of records per poll, and the flow stream every record the aggregator
// exports; FromFlow and proto.Marshal cost about a dozen allocations each.
// Records with kept unknown fields (a newer exporter's), and labels that
// are not a plain JSON object (escapes, say), take FromFlow's path, all or
// for the labels.
func AppendFlow(b []byte, f *flow.Flow) ([]byte, error) {
	has := f.Present.Has
	if len(f.ProtoUnknown) > 0 {
		p, err := FromFlow(f)
		if err != nil {
			return b, err
		}
		return proto.MarshalOptions{}.MarshalAppend(b, p)
	}
	start := len(b)
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
			// Its text form, written in place: String would allocate.
			t := len(b)
			b = beginMsg(b, 4)
			b = o.Exporter.AppendTo(b)
			b = endMsg(b, t)
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
	b, err := appendK8s(b, f)
	if err != nil {
		return b[:start], err
	}
	b = appendStats(b, 9, f, &f.Stats, flow.PacketTotalCount)
	b = appendStats(b, 10, f, &f.ReverseStats, flow.ReversePacketTotalCount)
	if has(flow.AppProtocolName) || has(flow.HTTPVals) {
		m := len(b)
		b = beginMsg(b, 11)
		if has(flow.AppProtocolName) {
			b = appendString(b, 1, f.AppProtocolName)
		}
		if has(flow.HTTPVals) {
			b = appendString(b, 2, f.HTTPVals)
		}
		b = endMsg(b, m)
	}
	if has(flow.FlowDirection) {
		b = appendVarint(b, 12, uint64(f.FlowDirection))
	}
	if a := f.Aggregation; a != nil {
		b = appendAggregation(b, 13, a)
	}
	b = appendAddr(b, 14, f, flow.ProxySnatIP, flow.AddrIn(f.ProxySnatIP, false))
	if has(flow.ProxySnatPort) {
		b = appendVarint(b, 15, uint64(f.ProxySnatPort))
	}
	return b, nil
}

// appendK8s writes the Kubernetes message as k8sFromFlow builds it; its
// error is k8sFromFlow's (labels that are not a JSON object of strings).
func appendK8s(b []byte, f *flow.Flow) ([]byte, error) {
	has := f.Present.Has
	some := has(flow.DestinationServiceIP)
	for fl := flow.FlowType; fl <= flow.EgressUID && !some; fl++ {
		some = has(fl)
	}
	if !some {
		return b, nil
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
	var err error
	if has(flow.SourcePodLabels) {
		if b, err = appendLabels(b, 5, f.SourcePodLabels, "source Pod labels"); err != nil {
			return b, err
		}
	}
	b = str(b, 6, flow.SourceNodeName, f.SourceNodeName)
	b = uid(b, 7, flow.SourceNodeUID, f.SourceNodeUID)
	b = str(b, 8, flow.DestinationPodNamespace, f.DestinationPodNamespace)
	b = str(b, 9, flow.DestinationPodName, f.DestinationPodName)
	b = uid(b, 10, flow.DestinationPodUID, f.DestinationPodUID)
	if has(flow.DestinationPodLabels) {
		if b, err = appendLabels(b, 11, f.DestinationPodLabels, "destination Pod labels"); err != nil {
			return b, err
		}
	}
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
	return endMsg(b, m), nil
}

// appendLabels writes labels (a JSON object, as flow.Flow holds them) as
// the Labels message field num, as labelsFromJSON builds it: none for "".
// A plain object (no escapes, valid UTF-8) is written as it is scanned;
// anything else goes through labelsFromJSON and proto.Marshal, which
// allocate.
func appendLabels(b []byte, num protowire.Number, s, name string) ([]byte, error) {
	if s == "" {
		return b, nil
	}
	m := len(b)
	b = beginMsg(b, num)
	body := len(b)
	if out, ok := appendPlainLabels(b, s); ok {
		return endMsg(out, m), nil
	}
	l, err := labelsFromJSON(s, name)
	if err != nil {
		return b[:m], err
	}
	b, err = proto.MarshalOptions{}.MarshalAppend(b[:body], l)
	if err != nil {
		return b[:m], fmt.Errorf("flowproto: %s: %w", name, err)
	}
	return endMsg(b, m), nil
}

// maxPlainLabels bounds the labels appendPlainLabels writes itself; more
// take the general path.
const maxPlainLabels = 256

// appendPlainLabels appends the map entries of s, a JSON object whose keys
// and values are strings without escapes or control characters, in valid
// UTF-8 (what encoding/json reads as the same octets). It reports false,
// with b's tail to be discarded, for anything else. A key given twice is
// written twice: a Protobuf reader keeps the last, as encoding/json does.
func appendPlainLabels(b []byte, s string) ([]byte, bool) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return b, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return b, skipSpace(s, i+1) == len(s)
	}
	for n := 0; n < maxPlainLabels; n++ {
		k, j, ok := plainString(s, i)
		if !ok {
			return b, false
		}
		i = skipSpace(s, j)
		if i >= len(s) || s[i] != ':' {
			return b, false
		}
		v, j, ok := plainString(s, skipSpace(s, i+1))
		if !ok {
			return b, false
		}
		e := len(b)
		b = beginMsg(b, 1)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, v)
		b = endMsg(b, e)
		i = skipSpace(s, j)
		if i >= len(s) {
			return b, false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case '}':
			return b, skipSpace(s, i+1) == len(s)
		default:
			return b, false
		}
	}
	return b, false
}

// skipSpace is the index of the first octet at or after i that is not
// JSON white space.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// plainString reads the JSON string at s[i:] if it has no escape and no
// control character and is valid UTF-8: its content and the index after
// its closing quote.
func plainString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			v := s[i+1 : j]
			return v, j + 1, utf8.ValidString(v)
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
	}
	return "", 0, false
}

// appendAggregation writes the Aggregation message as FromFlow builds it:
// the four Stats messages always, the end times when set.
func appendAggregation(b []byte, num protowire.Number, a *flow.Aggregation) []byte {
	m := len(b)
	b = beginMsg(b, num)
	if !a.EndFromSource.IsZero() {
		b = appendTime(b, 1, a.EndFromSource)
	}
	if !a.EndFromDestination.IsZero() {
		b = appendTime(b, 2, a.EndFromDestination)
	}
	for i, s := range [4]*flow.Stats{&a.StatsFromSource, &a.ReverseStatsFromSource, &a.StatsFromDestination, &a.ReverseStatsFromDestination} {
		sm := len(b)
		b = beginMsg(b, protowire.Number(3+i))
		b = appendVarint(b, 1, s.PacketTotalCount)
		b = appendVarint(b, 2, s.PacketDeltaCount)
		b = appendVarint(b, 3, s.OctetTotalCount)
		b = appendVarint(b, 4, s.OctetDeltaCount)
		b = endMsg(b, sm)
	}
	b = appendVarint(b, 7, a.ThroughputFromSource)
	b = appendVarint(b, 8, a.ReverseThroughputFromSource)
	b = appendVarint(b, 9, a.ThroughputFromDestination)
	b = appendVarint(b, 10, a.ReverseThroughputFromDestination)
	b = appendVarint(b, 11, a.Throughput)
	b = appendVarint(b, 12, a.ReverseThroughput)
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
		var err error
		if b, err = AppendFlowField(b, 1, &flows[i]); err != nil {
			bad(&flows[i], fmt.Errorf("flowproto: %w", err))
		}
	}
	return b
}

// AppendFlowField appends f's Flow message as the message field num of
// an enclosing message (num below 2048), such as the repeated flows of an
// ExportRequest or a GetFlowsResponse (1). When f has no Protobuf form, b
// is returned as it was, with the error.
func AppendFlowField(b []byte, num protowire.Number, f *flow.Flow) ([]byte, error) {
	m := len(b)
	b = beginMsg(b, num)
	b, err := AppendFlow(b, f)
	if err != nil {
		return b[:m], err
	}
	return endMsg(b, m), nil
}
