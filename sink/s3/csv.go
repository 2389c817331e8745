package s3

import (
	"strconv"
	"time"

	"sluice/flow"
	"sluice/sink/rowtext"
)

// CSVFields is the number of comma-separated fields of a CSV row, not
// counting the commas inside the two quoted label fields.
const CSVFields = 53

// AppendCSVRow appends f's row (no newline) to b: the reference's S3 layout,
// comma-separated, no header, no quoting except the Pod labels (JSON, so
// wrapped in single quotes). Times are Unix seconds (0 when unset); rule
// actions, policy types, the protocol and the flow type are numbers;
// unset addresses and names are empty. written is the upload-side
// timestamp (the time the row is written). Per-node end times and
// throughputs come from Aggregate mode and are 0 in Proxy mode.
func AppendCSVRow(b []byte, f *flow.Flow, written time.Time) []byte {
	return appendCSVRow(b, f, written, f.ClusterID)
}

// appendCSVRow is AppendCSVRow with cluster in the clusterUUID field.
func appendCSVRow(b []byte, f *flow.Flow, written time.Time, cluster string) []byte {
	var none flow.Aggregation // zero times and throughputs when not aggregated
	agg := f.Aggregation
	if agg == nil {
		agg = &none
	}
	b = rowtext.AppendSeconds(b, f.StartTime)
	b = append(b, ',')
	b = rowtext.AppendSeconds(b, f.EndTime)
	b = append(b, ',')
	b = rowtext.AppendSeconds(b, agg.EndFromSource)
	b = append(b, ',')
	b = rowtext.AppendSeconds(b, agg.EndFromDestination)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.EndReason), 10)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.SourceIP)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationIP)
	for _, n := range [...]uint64{uint64(f.SourcePort), uint64(f.DestinationPort), uint64(f.Protocol),
		f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.Stats.PacketDeltaCount, f.Stats.OctetDeltaCount,
		f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount,
		f.ReverseStats.PacketDeltaCount, f.ReverseStats.OctetDeltaCount} {
		b = append(b, ',')
		b = strconv.AppendUint(b, n, 10)
	}
	for _, s := range [...]string{f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName,
		f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName} {
		b = append(b, ',')
		b = rowtext.AppendText(b, s)
	}
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationClusterIP)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationServiceIP)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.DestinationServicePort), 10)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.DestinationServicePortName)
	b = appendPolicy(b, &f.Ingress)
	b = appendPolicy(b, &f.Egress)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.TCPState)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.FlowType), 10)
	b = append(b, ",'"...)
	b = rowtext.AppendText(b, f.SourcePodLabels)
	b = append(b, "','"...)
	b = rowtext.AppendText(b, f.DestinationPodLabels)
	b = append(b, '\'')
	for _, n := range [...]uint64{agg.Throughput, agg.ReverseThroughput, agg.ThroughputFromSource,
		agg.ThroughputFromDestination, agg.ReverseThroughputFromSource, agg.ReverseThroughputFromDestination} {
		b = append(b, ',')
		b = strconv.AppendUint(b, n, 10)
	}
	b = append(b, ',')
	b = rowtext.AppendText(b, cluster)
	b = append(b, ',')
	b = strconv.AppendInt(b, written.Unix(), 10)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.EgressName)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.EgressIP)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.EgressNodeName)
	return b
}

// appendPolicy writes name, namespace, rule name, rule action and type.
func appendPolicy(b []byte, p *flow.Policy) []byte {
	for _, s := range [...]string{p.Name, p.Namespace, p.RuleName} {
		b = append(b, ',')
		b = rowtext.AppendText(b, s)
	}
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(p.RuleAction), 10)
	b = append(b, ',')
	return strconv.AppendUint(b, uint64(p.Type), 10)
}
