package flowtest

import (
	"net/netip"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
)

// Wire encodes f as Antrea's Protobuf Flow message by hand, field number by
// field number as the reference (§2.7) gives them, without the generated
// code, so that a test can check the generated code against the facts.
// Every field of f is written whatever its presence bit, the Pod labels
// from the maps given (FullLabels for a record from Full). Field 2 (ipfix)
// is written from f.Origin.
func Wire(f *flow.Flow, srcLabels, dstLabels map[string]string) []byte {
	var b []byte
	b = str(b, 1, f.Origin.ID)
	var ipfix []byte
	ipfix = varint(ipfix, 1, uint64(f.Origin.ExportTime.Unix()))
	ipfix = varint(ipfix, 2, uint64(f.Origin.SequenceNumber))
	ipfix = varint(ipfix, 3, uint64(f.Origin.ObservationDomainID))
	ipfix = str(ipfix, 4, f.Origin.Exporter.String())
	b = msg(b, 2, ipfix)
	b = msg(b, 3, ts(f.StartTime))
	b = msg(b, 4, ts(f.EndTime))
	b = varint(b, 5, uint64(f.EndReason))
	var ip []byte
	ver := uint64(4)
	if f.SourceIP.Is6() {
		ver = 6
	}
	ip = varint(ip, 1, ver)
	ip = addr(ip, 2, f.SourceIP)
	ip = addr(ip, 3, f.DestinationIP)
	b = msg(b, 6, ip)
	var tr []byte
	tr = varint(tr, 1, uint64(f.Protocol))
	tr = varint(tr, 2, uint64(f.SourcePort))
	tr = varint(tr, 3, uint64(f.DestinationPort))
	tr = msg(tr, 4, str(nil, 1, f.TCPState))
	b = msg(b, 7, tr)

	var k []byte
	k = varint(k, 1, uint64(f.FlowType))
	k = str(k, 2, f.SourcePodNamespace)
	k = str(k, 3, f.SourcePodName)
	k = str(k, 4, uidText(f.SourcePodUID))
	k = msg(k, 5, labelsMsg(srcLabels))
	k = str(k, 6, f.SourceNodeName)
	k = str(k, 7, uidText(f.SourceNodeUID))
	k = str(k, 8, f.DestinationPodNamespace)
	k = str(k, 9, f.DestinationPodName)
	k = str(k, 10, uidText(f.DestinationPodUID))
	k = msg(k, 11, labelsMsg(dstLabels))
	k = str(k, 12, f.DestinationNodeName)
	k = str(k, 13, uidText(f.DestinationNodeUID))
	k = addr(k, 14, f.DestinationClusterIP)
	k = varint(k, 15, uint64(f.DestinationServicePort))
	k = str(k, 16, f.DestinationServicePortName)
	k = str(k, 17, uidText(f.DestinationServiceUID))
	for i, p := range []flow.Policy{f.Ingress, f.Egress} {
		base := protowire.Number(18 + 6*i)
		k = varint(k, base, uint64(p.Type))
		k = str(k, base+1, p.Namespace)
		k = str(k, base+2, p.Name)
		k = str(k, base+3, uidText(p.UID))
		k = str(k, base+4, p.RuleName)
		k = varint(k, base+5, uint64(p.RuleAction))
	}
	k = str(k, 30, f.EgressName)
	k = addr(k, 31, f.EgressIP)
	k = str(k, 32, f.EgressNodeName)
	k = str(k, 33, uidText(f.EgressNodeUID))
	k = str(k, 34, uidText(f.EgressUID))
	k = addr(k, 35, f.DestinationServiceIP)
	b = msg(b, 8, k)
	b = msg(b, 9, stats(f.Stats))
	b = msg(b, 10, stats(f.ReverseStats))
	b = msg(b, 11, str(str(nil, 1, f.AppProtocolName), 2, f.HTTPVals))
	b = varint(b, 12, uint64(f.FlowDirection))
	if a := f.Aggregation; a != nil {
		var g []byte
		g = msg(g, 1, ts(a.EndFromSource))
		g = msg(g, 2, ts(a.EndFromDestination))
		g = msg(g, 3, stats(a.StatsFromSource))
		g = msg(g, 4, stats(a.ReverseStatsFromSource))
		g = msg(g, 5, stats(a.StatsFromDestination))
		g = msg(g, 6, stats(a.ReverseStatsFromDestination))
		for i, v := range []uint64{a.ThroughputFromSource, a.ReverseThroughputFromSource, a.ThroughputFromDestination,
			a.ReverseThroughputFromDestination, a.Throughput, a.ReverseThroughput} {
			g = varint(g, protowire.Number(7+i), v)
		}
		b = msg(b, 13, g)
	}
	b = addr(b, 14, f.ProxySnatIP)
	b = varint(b, 15, uint64(f.ProxySnatPort))
	return b
}

func varint(b []byte, n protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func str(b []byte, n protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func msg(b []byte, n protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

func addr(b []byte, n protowire.Number, a netip.Addr) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, a.AsSlice())
}

// ts is google.protobuf.Timestamp: seconds = 1, nanos = 2.
func ts(t time.Time) []byte {
	b := varint(nil, 1, uint64(t.Unix()))
	return varint(b, 2, uint64(t.Nanosecond()))
}

func stats(s flow.Stats) []byte {
	b := varint(nil, 1, s.PacketTotalCount)
	b = varint(b, 2, s.PacketDeltaCount)
	b = varint(b, 3, s.OctetTotalCount)
	return varint(b, 4, s.OctetDeltaCount)
}

// labelsMsg is Labels{map<string,string> labels = 1}: each entry a
// message {key = 1, value = 2}.
func labelsMsg(m map[string]string) []byte {
	var b []byte
	for k, v := range m {
		b = msg(b, 1, str(str(nil, 1, k), 2, v))
	}
	return b
}

func uidText(u flow.UID) string {
	const hex = "0123456789abcdef"
	var b []byte
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&15])
	}
	return string(b)
}

// FullLabels returns the Pod labels Full sets, as maps, for Wire.
func FullLabels() (src, dst map[string]string) {
	return map[string]string{"app": "client", "tier": "front"}, map[string]string{"app": "server"}
}
