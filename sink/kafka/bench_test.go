package kafka

import (
	"net/netip"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// agentRecord is an exporter's record: every field of flowtest.Full but
// what agents do not send (labels, L7 values, the aggregation).
func agentRecord(i int) *flow.Flow {
	f := flowtest.Full(i, false)
	for _, fl := range []flow.Field{flow.SourcePodLabels, flow.DestinationPodLabels, flow.AppProtocolName, flow.HTTPVals, flow.ClusterID} {
		f.Present.Clear(fl)
	}
	f.SourcePodLabels, f.DestinationPodLabels, f.AppProtocolName, f.HTTPVals, f.ClusterID = "", "", "", "", ""
	f.Unknown = nil
	return f
}

// BenchmarkRecord is the sink's work per record (key and value, as
// handed to the client) and its size on the topic.
func BenchmarkRecord(b *testing.B) {
	recs := make([]*flow.Flow, 1024)
	for i := range recs {
		recs[i] = agentRecord(i)
	}
	var bytes int
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f := recs[i%len(recs)]
		v, err := flowproto.AppendFlow(nil, f)
		if err != nil {
			b.Fatal(err)
		}
		k := flowkey.Append(make([]byte, 0, flowkey.Size), f)
		bytes += len(v) + len(k)
	}
	b.ReportMetric(float64(bytes)/float64(b.N), "B/record")
}

// TestKeySpread compares how evenly the flow key and a key of the sorted
// address pair (netobserv's) spread connections over 12 partitions when
// one pair of Pods carries a third of the connections: the flow key
// spreads the busy pair, the pair key puts it on one partition.
func TestKeySpread(t *testing.T) {
	const parts, n = 12, 12000
	part := kgo.StickyKeyPartitioner(nil).ForTopic("flows")
	load := func(key func(*flow.Flow) []byte) (maxShare float64) {
		counts := make([]int, parts)
		for i := range n {
			f := &flow.Flow{Protocol: 6, SourcePort: uint16(30000 + i%30000), DestinationPort: 443}
			if i%3 == 0 { // the busy pair
				f.SourceIP, f.DestinationIP = netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.9")
			} else {
				f.SourceIP = netip.AddrFrom4([4]byte{10, 244, 3, byte(i % 200)})
				f.DestinationIP = netip.AddrFrom4([4]byte{10, 244, 4, byte(i / 200 % 50)})
			}
			counts[part.Partition(&kgo.Record{Key: key(f)}, parts)]++
		}
		m := 0
		for _, c := range counts {
			m = max(m, c)
		}
		return float64(m) / (float64(n) / parts)
	}
	flowKey := load(func(f *flow.Flow) []byte { return flowkey.Append(nil, f) })
	pairKey := load(func(f *flow.Flow) []byte {
		a, b := f.SourceIP.As16(), f.DestinationIP.As16()
		if f.DestinationIP.Less(f.SourceIP) {
			a, b = b, a
		}
		return append(a[:], b[:]...)
	})
	t.Logf("busiest partition over the mean, 12 partitions, one pair with 1/3 of the connections: flow key %.2f, address-pair key %.2f", flowKey, pairKey)
	if flowKey >= pairKey || flowKey > 1.3 {
		t.Errorf("the flow key spreads no better than the pair key: %.2f vs %.2f", flowKey, pairKey)
	}
}
