package s3

import (
	"net/netip"
	"strings"
	"time"

	"sluice/flow"
	"sluice/sink/rowtext"
)

// ParquetRow is one row of a Parquet file (recordFormat: Parquet): the
// fields of the CSV row in the same order, typed, named as the columns of
// the reference's ClickHouse `flows` table (so that the same queries work
// on both), with timeInserted for the upload-side timestamp. Times are
// UTC timestamps in milliseconds (0, the epoch, when unset); counters and
// throughputs are signed 64-bit integers and small enumerations and ports
// signed 32-bit ones, the types every Parquet reader (DuckDB, Spark, Athena,
// Arrow) maps without an unsigned extension; unset addresses and names
// are empty strings. Every column is required (never null).
type ParquetRow struct {
	FlowStartSeconds                     int64  `parquet:"flowStartSeconds,timestamp(millisecond:utc)"`
	FlowEndSeconds                       int64  `parquet:"flowEndSeconds,timestamp(millisecond:utc)"`
	FlowEndSecondsFromSourceNode         int64  `parquet:"flowEndSecondsFromSourceNode,timestamp(millisecond:utc)"`
	FlowEndSecondsFromDestinationNode    int64  `parquet:"flowEndSecondsFromDestinationNode,timestamp(millisecond:utc)"`
	FlowEndReason                        int32  `parquet:"flowEndReason"`
	SourceIP                             string `parquet:"sourceIP"`
	DestinationIP                        string `parquet:"destinationIP"`
	SourceTransportPort                  int32  `parquet:"sourceTransportPort"`
	DestinationTransportPort             int32  `parquet:"destinationTransportPort"`
	ProtocolIdentifier                   int32  `parquet:"protocolIdentifier"`
	PacketTotalCount                     int64  `parquet:"packetTotalCount"`
	OctetTotalCount                      int64  `parquet:"octetTotalCount"`
	PacketDeltaCount                     int64  `parquet:"packetDeltaCount"`
	OctetDeltaCount                      int64  `parquet:"octetDeltaCount"`
	ReversePacketTotalCount              int64  `parquet:"reversePacketTotalCount"`
	ReverseOctetTotalCount               int64  `parquet:"reverseOctetTotalCount"`
	ReversePacketDeltaCount              int64  `parquet:"reversePacketDeltaCount"`
	ReverseOctetDeltaCount               int64  `parquet:"reverseOctetDeltaCount"`
	SourcePodName                        string `parquet:"sourcePodName,dict"`
	SourcePodNamespace                   string `parquet:"sourcePodNamespace,dict"`
	SourceNodeName                       string `parquet:"sourceNodeName,dict"`
	DestinationPodName                   string `parquet:"destinationPodName,dict"`
	DestinationPodNamespace              string `parquet:"destinationPodNamespace,dict"`
	DestinationNodeName                  string `parquet:"destinationNodeName,dict"`
	DestinationClusterIP                 string `parquet:"destinationClusterIP,dict"`
	DestinationServiceIP                 string `parquet:"destinationServiceIP,dict"`
	DestinationServicePort               int32  `parquet:"destinationServicePort"`
	DestinationServicePortName           string `parquet:"destinationServicePortName,dict"`
	IngressNetworkPolicyName             string `parquet:"ingressNetworkPolicyName,dict"`
	IngressNetworkPolicyNamespace        string `parquet:"ingressNetworkPolicyNamespace,dict"`
	IngressNetworkPolicyRuleName         string `parquet:"ingressNetworkPolicyRuleName,dict"`
	IngressNetworkPolicyRuleAction       int32  `parquet:"ingressNetworkPolicyRuleAction"`
	IngressNetworkPolicyType             int32  `parquet:"ingressNetworkPolicyType"`
	EgressNetworkPolicyName              string `parquet:"egressNetworkPolicyName,dict"`
	EgressNetworkPolicyNamespace         string `parquet:"egressNetworkPolicyNamespace,dict"`
	EgressNetworkPolicyRuleName          string `parquet:"egressNetworkPolicyRuleName,dict"`
	EgressNetworkPolicyRuleAction        int32  `parquet:"egressNetworkPolicyRuleAction"`
	EgressNetworkPolicyType              int32  `parquet:"egressNetworkPolicyType"`
	TCPState                             string `parquet:"tcpState,dict"`
	FlowType                             int32  `parquet:"flowType"`
	SourcePodLabels                      string `parquet:"sourcePodLabels,dict"`
	DestinationPodLabels                 string `parquet:"destinationPodLabels,dict"`
	Throughput                           int64  `parquet:"throughput"`
	ReverseThroughput                    int64  `parquet:"reverseThroughput"`
	ThroughputFromSourceNode             int64  `parquet:"throughputFromSourceNode"`
	ThroughputFromDestinationNode        int64  `parquet:"throughputFromDestinationNode"`
	ReverseThroughputFromSourceNode      int64  `parquet:"reverseThroughputFromSourceNode"`
	ReverseThroughputFromDestinationNode int64  `parquet:"reverseThroughputFromDestinationNode"`
	ClusterUUID                          string `parquet:"clusterUUID,dict"`
	TimeInserted                         int64  `parquet:"timeInserted,timestamp(millisecond:utc)"`
	EgressName                           string `parquet:"egressName,dict"`
	EgressIP                             string `parquet:"egressIP,dict"`
	EgressNodeName                       string `parquet:"egressNodeName,dict"`
}

// ParquetColumns is the number of columns of a Parquet file.
const ParquetColumns = 53

// MakeParquetRow fills r from f, written being the upload-side timestamp.
// Strings are those of the CSV row (addresses unmapped, CR and LF made
// spaces), without the quotes around the labels.
func MakeParquetRow(r *ParquetRow, f *flow.Flow, written time.Time) {
	makeParquetRow(r, f, written, nil)
}

// makeParquetRow is MakeParquetRow taking address texts from addrs.
func makeParquetRow(r *ParquetRow, f *flow.Flow, written time.Time, addrs addrTexts) {
	var none flow.Aggregation
	agg := f.Aggregation
	if agg == nil {
		agg = &none
	}
	*r = ParquetRow{
		FlowStartSeconds:                     millis(f.StartTime),
		FlowEndSeconds:                       millis(f.EndTime),
		FlowEndSecondsFromSourceNode:         millis(agg.EndFromSource),
		FlowEndSecondsFromDestinationNode:    millis(agg.EndFromDestination),
		FlowEndReason:                        int32(f.EndReason),
		SourceIP:                             addrs.text(f.SourceIP),
		DestinationIP:                        addrs.text(f.DestinationIP),
		SourceTransportPort:                  int32(f.SourcePort),
		DestinationTransportPort:             int32(f.DestinationPort),
		ProtocolIdentifier:                   int32(f.Protocol),
		PacketTotalCount:                     int64(f.Stats.PacketTotalCount),
		OctetTotalCount:                      int64(f.Stats.OctetTotalCount),
		PacketDeltaCount:                     int64(f.Stats.PacketDeltaCount),
		OctetDeltaCount:                      int64(f.Stats.OctetDeltaCount),
		ReversePacketTotalCount:              int64(f.ReverseStats.PacketTotalCount),
		ReverseOctetTotalCount:               int64(f.ReverseStats.OctetTotalCount),
		ReversePacketDeltaCount:              int64(f.ReverseStats.PacketDeltaCount),
		ReverseOctetDeltaCount:               int64(f.ReverseStats.OctetDeltaCount),
		SourcePodName:                        text(f.SourcePodName),
		SourcePodNamespace:                   text(f.SourcePodNamespace),
		SourceNodeName:                       text(f.SourceNodeName),
		DestinationPodName:                   text(f.DestinationPodName),
		DestinationPodNamespace:              text(f.DestinationPodNamespace),
		DestinationNodeName:                  text(f.DestinationNodeName),
		DestinationClusterIP:                 addrs.text(f.DestinationClusterIP),
		DestinationServiceIP:                 addrs.text(f.DestinationServiceIP),
		DestinationServicePort:               int32(f.DestinationServicePort),
		DestinationServicePortName:           text(f.DestinationServicePortName),
		IngressNetworkPolicyName:             text(f.Ingress.Name),
		IngressNetworkPolicyNamespace:        text(f.Ingress.Namespace),
		IngressNetworkPolicyRuleName:         text(f.Ingress.RuleName),
		IngressNetworkPolicyRuleAction:       int32(f.Ingress.RuleAction),
		IngressNetworkPolicyType:             int32(f.Ingress.Type),
		EgressNetworkPolicyName:              text(f.Egress.Name),
		EgressNetworkPolicyNamespace:         text(f.Egress.Namespace),
		EgressNetworkPolicyRuleName:          text(f.Egress.RuleName),
		EgressNetworkPolicyRuleAction:        int32(f.Egress.RuleAction),
		EgressNetworkPolicyType:              int32(f.Egress.Type),
		TCPState:                             text(f.TCPState),
		FlowType:                             int32(f.FlowType),
		SourcePodLabels:                      text(f.SourcePodLabels),
		DestinationPodLabels:                 text(f.DestinationPodLabels),
		Throughput:                           int64(agg.Throughput),
		ReverseThroughput:                    int64(agg.ReverseThroughput),
		ThroughputFromSourceNode:             int64(agg.ThroughputFromSource),
		ThroughputFromDestinationNode:        int64(agg.ThroughputFromDestination),
		ReverseThroughputFromSourceNode:      int64(agg.ReverseThroughputFromSource),
		ReverseThroughputFromDestinationNode: int64(agg.ReverseThroughputFromDestination),
		ClusterUUID:                          text(f.ClusterID),
		TimeInserted:                         written.UnixMilli(),
		EgressName:                           text(f.EgressName),
		EgressIP:                             addrs.text(f.EgressIP),
		EgressNodeName:                       text(f.EgressNodeName),
	}
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// addrTexts caches the text forms of addresses: each costs an
// allocation, and the records of one Pod or Service share them. Nil
// caches nothing.
type addrTexts map[netip.Addr]string

// maxAddrTexts bounds an addrTexts: when full it is cleared.
const maxAddrTexts = 16384

func (m addrTexts) text(a netip.Addr) string {
	if m == nil || !a.IsValid() {
		return addrText(a)
	}
	if s, ok := m[a]; ok {
		return s
	}
	s := addrText(a)
	if len(m) >= maxAddrTexts {
		clear(m)
	}
	m[a] = s
	return s
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.Unmap().String()
}

// text is s as the CSV row writes it (CR and LF made spaces); s itself
// when it has neither, which is nearly always.
func text(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return string(rowtext.AppendText(nil, s))
}
