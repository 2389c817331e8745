// Package flowproto converts between Sluice's canonical flow.Flow and the
// Protobuf Flow message of Antrea's gRPC transport (package flow/flowpb),
// both ways and field by field.
//
// Presence. Proto3 fields have no presence of their own: a zero value is
// not sent, so a reader cannot tell it from an absent field. ToFlow marks a
// field present when its value is not zero, and also, for the fields whose
// zero is a real value, when the message holding them is present: the
// protocol and ports (Transport), the four counters (Stats), the TCP state
// (the TCP oneof), and the flow type, the policy types and rule actions
// and the Service port (Kubernetes: Antrea always sends them). Timestamps,
// Pod labels and the aggregation are messages, so their presence is exact.
// FromFlow writes only present fields (and a message only when one of its
// fields is present). So an unset field stays unset through a round trip,
// and a set one with a non-zero value comes back set and equal.
//
// What has no place on the other side: flow.Flow's ClusterID and its
// unknown IPFIX elements (Flow.Unknown) are not in the Protobuf message;
// the Protobuf `ipfix.exporter_ip` is ignored when it does not parse (the
// collector replaces it with the peer's address anyway).
//
// Unknown fields (a newer exporter's) are counted and kept in
// flow.Flow.ProtoUnknown, at their place in the message; FromFlow puts
// them back.
package flowproto

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"sluice/flow"
	"sluice/flow/flowpb"
)

// ToFlow fills f (which should be zero) from p. It returns the number of
// unknown fields p carried, at any depth; their bytes are kept in
// f.ProtoUnknown. A value that cannot be represented (an address that is
// neither 4 nor 16 octets, a port over 65535, a UID that is not a UUID, an
// enumeration over 255, an invalid timestamp) is an error naming the
// field; f is then partly filled and should be dropped.
func ToFlow(p *flowpb.Flow, f *flow.Flow) (unknown int, err error) {
	f.Origin.ID = p.GetId()
	if x := p.GetIpfix(); x != nil {
		if t := x.GetExportTime(); t != 0 {
			f.Origin.ExportTime = time.Unix(t, 0).UTC()
		}
		f.Origin.SequenceNumber = x.GetSequenceNumber()
		f.Origin.ObservationDomainID = x.GetObservationDomainId()
		if a, err := netip.ParseAddr(x.GetExporterIp()); err == nil {
			f.Origin.Exporter = a
		}
	}
	if err := setTime(f, flow.StartTime, &f.StartTime, p.GetStartTs(), "start_ts"); err != nil {
		return 0, err
	}
	if err := setTime(f, flow.EndTime, &f.EndTime, p.GetEndTs(), "end_ts"); err != nil {
		return 0, err
	}
	if f.EndReason, err = enum8(int32(p.GetEndReason()), "end_reason"); err != nil {
		return 0, err
	}
	setIf(f, flow.EndReason, f.EndReason != 0)

	if ip := p.GetIp(); ip != nil {
		if v := ip.GetVersion(); v != 0 {
			// Checked on the octets: a mapped address is 16 of them.
			for _, b := range [][]byte{ip.GetSource(), ip.GetDestination()} {
				if len(b) != 0 && (v == flowpb.IPVersion_IP_VERSION_4) != (len(b) == 4) {
					return 0, fmt.Errorf("flowproto: ip.version %d does not match a %d-octet address", v, len(b))
				}
			}
		}
		if err := setAddr(f, flow.SourceIP, &f.SourceIP, ip.GetSource(), "ip.source"); err != nil {
			return 0, err
		}
		if err := setAddr(f, flow.DestinationIP, &f.DestinationIP, ip.GetDestination(), "ip.destination"); err != nil {
			return 0, err
		}
	}
	if t := p.GetTransport(); t != nil {
		n := t.GetProtocolNumber()
		if n > 255 {
			return 0, fmt.Errorf("flowproto: transport.protocol_number %d is over 255", n)
		}
		f.Protocol = uint8(n)
		if f.SourcePort, err = port(t.GetSourcePort(), "transport.source_port"); err != nil {
			return 0, err
		}
		if f.DestinationPort, err = port(t.GetDestinationPort(), "transport.destination_port"); err != nil {
			return 0, err
		}
		f.Present.Set(flow.Protocol)
		f.Present.Set(flow.SourcePort)
		f.Present.Set(flow.DestinationPort)
		if tcp := t.GetTCP(); tcp != nil {
			f.TCPState = tcp.GetStateName()
			f.Present.Set(flow.TCPState)
		}
	}
	if k := p.GetK8S(); k != nil {
		if err := k8sToFlow(k, f); err != nil {
			return 0, err
		}
	}
	statsToFlow(p.GetStats(), &f.Stats, f, flow.PacketTotalCount)
	statsToFlow(p.GetReverseStats(), &f.ReverseStats, f, flow.ReversePacketTotalCount)
	if app := p.GetApp(); app != nil {
		f.AppProtocolName = app.GetProtocolName()
		f.HTTPVals = string(app.GetHttpVals())
		setIf(f, flow.AppProtocolName, f.AppProtocolName != "")
		setIf(f, flow.HTTPVals, f.HTTPVals != "")
	}
	d := p.GetFlowDirection()
	if d < 0 || d > 255 {
		return 0, fmt.Errorf("flowproto: flow_direction %d is over 255", d)
	}
	f.FlowDirection = uint8(d)
	setIf(f, flow.FlowDirection, d != 0)
	if a := p.GetAggregation(); a != nil {
		if f.Aggregation, err = aggToFlow(a); err != nil {
			return 0, err
		}
	}
	if err := setAddr(f, flow.ProxySnatIP, &f.ProxySnatIP, p.GetProxySnatIp(), "proxy_snat_ip"); err != nil {
		return 0, err
	}
	if f.ProxySnatPort, err = port(p.GetProxySnatPort(), "proxy_snat_port"); err != nil {
		return 0, err
	}
	setIf(f, flow.ProxySnatPort, f.ProxySnatPort != 0)

	f.ProtoUnknown, unknown = collectUnknown(p)
	return unknown, nil
}

func k8sToFlow(k *flowpb.Kubernetes, f *flow.Flow) error {
	var err error
	if f.FlowType, err = enum8(int32(k.GetFlowType()), "k8s.flow_type"); err != nil {
		return err
	}
	f.Present.Set(flow.FlowType)
	strs := []struct {
		field flow.Field
		dst   *string
		v     string
	}{
		{flow.SourcePodNamespace, &f.SourcePodNamespace, k.GetSourcePodNamespace()},
		{flow.SourcePodName, &f.SourcePodName, k.GetSourcePodName()},
		{flow.SourceNodeName, &f.SourceNodeName, k.GetSourceNodeName()},
		{flow.DestinationPodNamespace, &f.DestinationPodNamespace, k.GetDestinationPodNamespace()},
		{flow.DestinationPodName, &f.DestinationPodName, k.GetDestinationPodName()},
		{flow.DestinationNodeName, &f.DestinationNodeName, k.GetDestinationNodeName()},
		{flow.DestinationServicePortName, &f.DestinationServicePortName, k.GetDestinationServicePortName()},
		{flow.IngressPolicyNamespace, &f.Ingress.Namespace, k.GetIngressNetworkPolicyNamespace()},
		{flow.IngressPolicyName, &f.Ingress.Name, k.GetIngressNetworkPolicyName()},
		{flow.IngressPolicyRuleName, &f.Ingress.RuleName, k.GetIngressNetworkPolicyRuleName()},
		{flow.EgressPolicyNamespace, &f.Egress.Namespace, k.GetEgressNetworkPolicyNamespace()},
		{flow.EgressPolicyName, &f.Egress.Name, k.GetEgressNetworkPolicyName()},
		{flow.EgressPolicyRuleName, &f.Egress.RuleName, k.GetEgressNetworkPolicyRuleName()},
		{flow.EgressName, &f.EgressName, k.GetEgressName()},
		{flow.EgressNodeName, &f.EgressNodeName, k.GetEgressNodeName()},
	}
	for _, s := range strs {
		*s.dst = s.v
		setIf(f, s.field, s.v != "")
	}
	uids := []struct {
		field flow.Field
		dst   *flow.UID
		v     string
		name  string
	}{
		{flow.SourcePodUID, &f.SourcePodUID, k.GetSourcePodUid(), "k8s.source_pod_uid"},
		{flow.SourceNodeUID, &f.SourceNodeUID, k.GetSourceNodeUid(), "k8s.source_node_uid"},
		{flow.DestinationPodUID, &f.DestinationPodUID, k.GetDestinationPodUid(), "k8s.destination_pod_uid"},
		{flow.DestinationNodeUID, &f.DestinationNodeUID, k.GetDestinationNodeUid(), "k8s.destination_node_uid"},
		{flow.DestinationServiceUID, &f.DestinationServiceUID, k.GetDestinationServiceUid(), "k8s.destination_service_uid"},
		{flow.IngressPolicyUID, &f.Ingress.UID, k.GetIngressNetworkPolicyUid(), "k8s.ingress_network_policy_uid"},
		{flow.EgressPolicyUID, &f.Egress.UID, k.GetEgressNetworkPolicyUid(), "k8s.egress_network_policy_uid"},
		{flow.EgressNodeUID, &f.EgressNodeUID, k.GetEgressNodeUid(), "k8s.egress_node_uid"},
		{flow.EgressUID, &f.EgressUID, k.GetEgressUid(), "k8s.egress_uid"},
	}
	for _, u := range uids {
		if u.v == "" {
			continue
		}
		id, ok := flow.ParseUID(u.v)
		if !ok {
			return fmt.Errorf("flowproto: %s %q is not a UID", u.name, u.v)
		}
		*u.dst = id
		f.Present.Set(u.field)
	}
	var err2 error
	if f.SourcePodLabels, err2 = labelsToJSON(k.GetSourcePodLabels()); err2 != nil {
		return err2
	}
	setIf(f, flow.SourcePodLabels, k.GetSourcePodLabels() != nil)
	if f.DestinationPodLabels, err2 = labelsToJSON(k.GetDestinationPodLabels()); err2 != nil {
		return err2
	}
	setIf(f, flow.DestinationPodLabels, k.GetDestinationPodLabels() != nil)

	if err := setAddr(f, flow.DestinationClusterIP, &f.DestinationClusterIP, k.GetDestinationClusterIp(), "k8s.destination_cluster_ip"); err != nil {
		return err
	}
	if err := setAddr(f, flow.DestinationServiceIP, &f.DestinationServiceIP, k.GetDestinationServiceIp(), "k8s.destination_service_ip"); err != nil {
		return err
	}
	if err := setAddr(f, flow.EgressIP, &f.EgressIP, k.GetEgressIp(), "k8s.egress_ip"); err != nil {
		return err
	}
	if f.DestinationServicePort, err = port(k.GetDestinationServicePort(), "k8s.destination_service_port"); err != nil {
		return err
	}
	f.Present.Set(flow.DestinationServicePort)
	for _, p := range []struct {
		pol            *flow.Policy
		typ, act       int32
		fType, fRule   flow.Field
		typeName, act2 string
	}{
		{&f.Ingress, int32(k.GetIngressNetworkPolicyType()), int32(k.GetIngressNetworkPolicyRuleAction()),
			flow.IngressPolicyType, flow.IngressPolicyRuleAction, "k8s.ingress_network_policy_type", "k8s.ingress_network_policy_rule_action"},
		{&f.Egress, int32(k.GetEgressNetworkPolicyType()), int32(k.GetEgressNetworkPolicyRuleAction()),
			flow.EgressPolicyType, flow.EgressPolicyRuleAction, "k8s.egress_network_policy_type", "k8s.egress_network_policy_rule_action"},
	} {
		if p.pol.Type, err = enum8(p.typ, p.typeName); err != nil {
			return err
		}
		if p.pol.RuleAction, err = enum8(p.act, p.act2); err != nil {
			return err
		}
		f.Present.Set(p.fType)
		f.Present.Set(p.fRule)
	}
	return nil
}

func statsToFlow(s *flowpb.Stats, dst *flow.Stats, f *flow.Flow, first flow.Field) {
	if s == nil {
		return
	}
	*dst = flow.Stats{PacketTotalCount: s.GetPacketTotalCount(), PacketDeltaCount: s.GetPacketDeltaCount(),
		OctetTotalCount: s.GetOctetTotalCount(), OctetDeltaCount: s.GetOctetDeltaCount()}
	for i := range flow.Field(4) {
		f.Present.Set(first + i)
	}
}

func aggToFlow(a *flowpb.Aggregation) (*flow.Aggregation, error) {
	out := &flow.Aggregation{
		StatsFromSource:                  statsOf(a.GetStatsFromSource()),
		ReverseStatsFromSource:           statsOf(a.GetReverseStatsFromSource()),
		StatsFromDestination:             statsOf(a.GetStatsFromDestination()),
		ReverseStatsFromDestination:      statsOf(a.GetReverseStatsFromDestination()),
		Throughput:                       a.GetThroughput(),
		ReverseThroughput:                a.GetReverseThroughput(),
		ThroughputFromSource:             a.GetThroughputFromSource(),
		ReverseThroughputFromSource:      a.GetReverseThroughputFromSource(),
		ThroughputFromDestination:        a.GetThroughputFromDestination(),
		ReverseThroughputFromDestination: a.GetReverseThroughputFromDestination(),
	}
	for _, t := range []struct {
		ts   *timestamppb.Timestamp
		dst  *time.Time
		name string
	}{
		{a.GetEndTsFromSource(), &out.EndFromSource, "aggregation.end_ts_from_source"},
		{a.GetEndTsFromDestination(), &out.EndFromDestination, "aggregation.end_ts_from_destination"},
	} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return nil, fmt.Errorf("flowproto: %s: %w", t.name, err)
		}
		*t.dst = t.ts.AsTime()
	}
	return out, nil
}

func statsOf(s *flowpb.Stats) flow.Stats {
	return flow.Stats{PacketTotalCount: s.GetPacketTotalCount(), PacketDeltaCount: s.GetPacketDeltaCount(),
		OctetTotalCount: s.GetOctetTotalCount(), OctetDeltaCount: s.GetOctetDeltaCount()}
}

func setIf(f *flow.Flow, field flow.Field, ok bool) {
	if ok {
		f.Present.Set(field)
	}
}

func setTime(f *flow.Flow, field flow.Field, dst *time.Time, ts *timestamppb.Timestamp, name string) error {
	if ts == nil {
		return nil
	}
	if err := ts.CheckValid(); err != nil {
		return fmt.Errorf("flowproto: %s: %w", name, err)
	}
	*dst = ts.AsTime()
	f.Present.Set(field)
	return nil
}

func setAddr(f *flow.Flow, field flow.Field, dst *netip.Addr, b []byte, name string) error {
	if len(b) == 0 {
		return nil
	}
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return fmt.Errorf("flowproto: %s has %d octets, want 4 or 16", name, len(b))
	}
	*dst = a.Unmap() // IPv4-mapped is IPv4, as in ipfixmap
	f.Present.Set(field)
	return nil
}

func port(v uint32, name string) (uint16, error) {
	if v > 65535 {
		return 0, fmt.Errorf("flowproto: %s %d is over 65535", name, v)
	}
	return uint16(v), nil
}

func enum8(v int32, name string) (uint8, error) {
	if v < 0 || v > 255 {
		return 0, fmt.Errorf("flowproto: %s %d is out of range 0-255", name, v)
	}
	return uint8(v), nil
}

// labelsToJSON renders a Labels message as flow.Flow holds labels: "" for
// no message, otherwise a JSON object ("{}" when empty), keys sorted.
func labelsToJSON(l *flowpb.Labels) (string, error) {
	if l == nil {
		return "", nil
	}
	m := l.GetLabels()
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("flowproto: labels: %w", err)
	}
	return string(b), nil
}

// FromFlow returns the Protobuf form of f: every present field, and the
// unknown fields f.ProtoUnknown kept. Labels that are not a JSON object of
// strings are an error.
func FromFlow(f *flow.Flow) (*flowpb.Flow, error) {
	p := &flowpb.Flow{Id: f.Origin.ID}
	o := &f.Origin
	if !o.ExportTime.IsZero() || o.SequenceNumber != 0 || o.ObservationDomainID != 0 || o.Exporter.IsValid() {
		p.Ipfix = &flowpb.IPFIX{SequenceNumber: o.SequenceNumber, ObservationDomainId: o.ObservationDomainID}
		if !o.ExportTime.IsZero() {
			p.Ipfix.ExportTime = o.ExportTime.Unix()
		}
		if o.Exporter.IsValid() {
			p.Ipfix.ExporterIp = o.Exporter.String()
		}
	}
	has := f.Present.Has
	if has(flow.StartTime) {
		p.StartTs = timestamppb.New(f.StartTime)
	}
	if has(flow.EndTime) {
		p.EndTs = timestamppb.New(f.EndTime)
	}
	if has(flow.EndReason) {
		p.EndReason = flowpb.FlowEndReason(f.EndReason)
	}
	if has(flow.SourceIP) || has(flow.DestinationIP) {
		// One version covers both addresses: an IPv4 one beside an IPv6
		// one goes in the mapped form.
		six := f.IPHeaderIPv6()
		p.Ip = &flowpb.IP{Source: addrBytes(f, flow.SourceIP, flow.AddrIn(f.SourceIP, six)),
			Destination: addrBytes(f, flow.DestinationIP, flow.AddrIn(f.DestinationIP, six))}
		if len(p.Ip.Source) != 0 || len(p.Ip.Destination) != 0 {
			p.Ip.Version = flowpb.IPVersion_IP_VERSION_4
			if six {
				p.Ip.Version = flowpb.IPVersion_IP_VERSION_6
			}
		}
	}
	if has(flow.Protocol) || has(flow.SourcePort) || has(flow.DestinationPort) || has(flow.TCPState) {
		p.Transport = &flowpb.Transport{ProtocolNumber: uint32(f.Protocol), SourcePort: uint32(f.SourcePort), DestinationPort: uint32(f.DestinationPort)}
		if has(flow.TCPState) {
			p.Transport.Protocol = &flowpb.Transport_TCP{TCP: &flowpb.TCP{StateName: f.TCPState}}
		}
	}
	k, err := k8sFromFlow(f)
	if err != nil {
		return nil, err
	}
	p.K8S = k
	p.Stats = statsFromFlow(f, &f.Stats, flow.PacketTotalCount)
	p.ReverseStats = statsFromFlow(f, &f.ReverseStats, flow.ReversePacketTotalCount)
	if has(flow.AppProtocolName) || has(flow.HTTPVals) {

		p.App = &flowpb.App{}
		if has(flow.AppProtocolName) {
			p.App.ProtocolName = f.AppProtocolName
		}
		if has(flow.HTTPVals) {
			p.App.HttpVals = []byte(f.HTTPVals)
		}
	}
	if has(flow.FlowDirection) {
		p.FlowDirection = flowpb.FlowDirection(f.FlowDirection)
	}
	if a := f.Aggregation; a != nil {
		p.Aggregation = &flowpb.Aggregation{
			StatsFromSource:                  statsMsg(a.StatsFromSource),
			ReverseStatsFromSource:           statsMsg(a.ReverseStatsFromSource),
			StatsFromDestination:             statsMsg(a.StatsFromDestination),
			ReverseStatsFromDestination:      statsMsg(a.ReverseStatsFromDestination),
			Throughput:                       a.Throughput,
			ReverseThroughput:                a.ReverseThroughput,
			ThroughputFromSource:             a.ThroughputFromSource,
			ReverseThroughputFromSource:      a.ReverseThroughputFromSource,
			ThroughputFromDestination:        a.ThroughputFromDestination,
			ReverseThroughputFromDestination: a.ReverseThroughputFromDestination,
		}
		if !a.EndFromSource.IsZero() {
			p.Aggregation.EndTsFromSource = timestamppb.New(a.EndFromSource)
		}
		if !a.EndFromDestination.IsZero() {
			p.Aggregation.EndTsFromDestination = timestamppb.New(a.EndFromDestination)
		}
	}
	p.ProxySnatIp = addrBytes(f, flow.ProxySnatIP, flow.AddrIn(f.ProxySnatIP, false))
	if has(flow.ProxySnatPort) {
		p.ProxySnatPort = uint32(f.ProxySnatPort)
	}
	if len(f.ProtoUnknown) > 0 {
		// Merging the kept fields puts each back into its message as an
		// unknown field, so that it is sent on as it came.
		if err := (proto.UnmarshalOptions{Merge: true, DiscardUnknown: false}).Unmarshal(f.ProtoUnknown, p); err != nil {
			return nil, fmt.Errorf("flowproto: kept unknown fields: %w", err)
		}
	}
	return p, nil
}

func k8sFromFlow(f *flow.Flow) (*flowpb.Kubernetes, error) {
	has := f.Present.Has
	some := false
	for fl := flow.FlowType; fl <= flow.EgressUID; fl++ {
		if has(fl) {
			some = true
			break
		}
	}
	if !some && !has(flow.DestinationServiceIP) {
		return nil, nil
	}
	str := func(fl flow.Field, v string) string {
		if has(fl) {
			return v
		}
		return ""
	}
	uid := func(fl flow.Field, u flow.UID) string {
		if has(fl) && u != (flow.UID{}) {
			return FormatUID(u)
		}
		return ""
	}
	k := &flowpb.Kubernetes{
		SourcePodNamespace:            str(flow.SourcePodNamespace, f.SourcePodNamespace),
		SourcePodName:                 str(flow.SourcePodName, f.SourcePodName),
		SourcePodUid:                  uid(flow.SourcePodUID, f.SourcePodUID),
		SourceNodeName:                str(flow.SourceNodeName, f.SourceNodeName),
		SourceNodeUid:                 uid(flow.SourceNodeUID, f.SourceNodeUID),
		DestinationPodNamespace:       str(flow.DestinationPodNamespace, f.DestinationPodNamespace),
		DestinationPodName:            str(flow.DestinationPodName, f.DestinationPodName),
		DestinationPodUid:             uid(flow.DestinationPodUID, f.DestinationPodUID),
		DestinationNodeName:           str(flow.DestinationNodeName, f.DestinationNodeName),
		DestinationNodeUid:            uid(flow.DestinationNodeUID, f.DestinationNodeUID),
		DestinationServicePortName:    str(flow.DestinationServicePortName, f.DestinationServicePortName),
		DestinationServiceUid:         uid(flow.DestinationServiceUID, f.DestinationServiceUID),
		IngressNetworkPolicyNamespace: str(flow.IngressPolicyNamespace, f.Ingress.Namespace),
		IngressNetworkPolicyName:      str(flow.IngressPolicyName, f.Ingress.Name),
		IngressNetworkPolicyUid:       uid(flow.IngressPolicyUID, f.Ingress.UID),
		IngressNetworkPolicyRuleName:  str(flow.IngressPolicyRuleName, f.Ingress.RuleName),
		EgressNetworkPolicyNamespace:  str(flow.EgressPolicyNamespace, f.Egress.Namespace),
		EgressNetworkPolicyName:       str(flow.EgressPolicyName, f.Egress.Name),
		EgressNetworkPolicyUid:        uid(flow.EgressPolicyUID, f.Egress.UID),
		EgressNetworkPolicyRuleName:   str(flow.EgressPolicyRuleName, f.Egress.RuleName),
		EgressName:                    str(flow.EgressName, f.EgressName),
		EgressIp:                      addrBytes(f, flow.EgressIP, flow.AddrIn(f.EgressIP, false)),
		EgressNodeName:                str(flow.EgressNodeName, f.EgressNodeName),
		EgressNodeUid:                 uid(flow.EgressNodeUID, f.EgressNodeUID),
		EgressUid:                     uid(flow.EgressUID, f.EgressUID),
		DestinationServiceIp:          addrBytes(f, flow.DestinationServiceIP, flow.AddrIn(f.DestinationServiceIP, false)),
	}

	k.DestinationClusterIp = addrBytes(f, flow.DestinationClusterIP, flow.AddrIn(f.DestinationClusterIP, false))
	if has(flow.FlowType) {
		k.FlowType = flowpb.FlowType(f.FlowType)
	}
	if has(flow.DestinationServicePort) {
		k.DestinationServicePort = uint32(f.DestinationServicePort)
	}
	if has(flow.IngressPolicyType) {
		k.IngressNetworkPolicyType = flowpb.NetworkPolicyType(f.Ingress.Type)
	}
	if has(flow.IngressPolicyRuleAction) {
		k.IngressNetworkPolicyRuleAction = flowpb.NetworkPolicyRuleAction(f.Ingress.RuleAction)
	}
	if has(flow.EgressPolicyType) {
		k.EgressNetworkPolicyType = flowpb.NetworkPolicyType(f.Egress.Type)
	}
	if has(flow.EgressPolicyRuleAction) {
		k.EgressNetworkPolicyRuleAction = flowpb.NetworkPolicyRuleAction(f.Egress.RuleAction)
	}
	var err error
	if has(flow.SourcePodLabels) {
		if k.SourcePodLabels, err = labelsFromJSON(f.SourcePodLabels, "source Pod labels"); err != nil {
			return nil, err
		}
	}
	if has(flow.DestinationPodLabels) {
		if k.DestinationPodLabels, err = labelsFromJSON(f.DestinationPodLabels, "destination Pod labels"); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// labelsFromJSON parses labels as flow.Flow holds them. "" (known to be
// unknown) gives no message.
func labelsFromJSON(s, name string) (*flowpb.Labels, error) {
	if s == "" {
		return nil, nil
	}
	l := &flowpb.Labels{}
	if s == "{}" {
		return l, nil
	}
	if err := json.Unmarshal([]byte(s), &l.Labels); err != nil {
		return nil, fmt.Errorf("flowproto: %s are not a JSON object of strings: %w", name, err)
	}
	return l, nil
}

func statsFromFlow(f *flow.Flow, s *flow.Stats, first flow.Field) *flowpb.Stats {
	some := false
	for i := range flow.Field(4) {
		some = some || f.Present.Has(first+i)
	}
	if !some {
		return nil
	}
	return statsMsg(*s)
}

func statsMsg(s flow.Stats) *flowpb.Stats {
	return &flowpb.Stats{PacketTotalCount: s.PacketTotalCount, PacketDeltaCount: s.PacketDeltaCount,
		OctetTotalCount: s.OctetTotalCount, OctetDeltaCount: s.OctetDeltaCount}
}

func addrBytes(f *flow.Flow, field flow.Field, a netip.Addr) []byte {
	if !f.Present.Has(field) || !a.IsValid() {
		return nil
	}
	return a.AsSlice()
}

// FormatUID writes a UID in its text form.
func FormatUID(u flow.UID) string {
	var b [36]byte
	return string(appendUIDText(b[:0], u))
}

// appendUIDText appends u's 36-octet text form to b.
func appendUIDText(b []byte, u flow.UID) []byte {
	const hex = "0123456789abcdef"
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&15])
	}
	return b
}

// collectUnknown gathers the unknown fields of p and of each message in
// it, each wrapped in the fields that lead to its message, as one encoded
// Flow; and counts them.
func collectUnknown(p *flowpb.Flow) ([]byte, int) {
	var out []byte
	n := 0
	add := func(m proto.Message, path ...protowire.Number) {
		if m == nil || !m.ProtoReflect().IsValid() {
			return
		}
		u := m.ProtoReflect().GetUnknown()
		if len(u) == 0 {
			return
		}
		n += countFields(u)
		for i := len(path) - 1; i >= 0; i-- {
			var w []byte
			w = protowire.AppendTag(w, path[i], protowire.BytesType)
			u = protowire.AppendBytes(w, u)
		}
		out = append(out, u...)
	}
	add(p)
	add(p.GetIpfix(), 2)
	add(p.GetStartTs(), 3)
	add(p.GetEndTs(), 4)
	add(p.GetIp(), 6)
	if t := p.GetTransport(); t != nil {
		add(t, 7)
		add(t.GetTCP(), 7, 4)
	}
	if k := p.GetK8S(); k != nil {
		add(k, 8)
		add(k.GetSourcePodLabels(), 8, 5)
		add(k.GetDestinationPodLabels(), 8, 11)
	}
	add(p.GetStats(), 9)
	add(p.GetReverseStats(), 10)
	add(p.GetApp(), 11)
	if a := p.GetAggregation(); a != nil {
		add(a, 13)
		add(a.GetEndTsFromSource(), 13, 1)
		add(a.GetEndTsFromDestination(), 13, 2)
		add(a.GetStatsFromSource(), 13, 3)
		add(a.GetReverseStatsFromSource(), 13, 4)
		add(a.GetStatsFromDestination(), 13, 5)
		add(a.GetReverseStatsFromDestination(), 13, 6)
	}
	return out, n
}

// countFields counts the fields of an encoded message (a malformed tail
// counts as one).
func countFields(b []byte) int {
	n := 0
	for len(b) > 0 {
		_, _, l := protowire.ConsumeField(b)
		n++
		if l < 0 {
			break
		}
		b = b[l:]
	}
	return n
}
