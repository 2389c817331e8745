package flowproto_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// raceMessages are encoded Flows as bench/race's agent emulator sends them
// over gRPC (one side of an inter-Node connection: addresses, ports, TCP
// state, both directions' counters, one Pod's name, namespace and Node),
// for n connections: Pod names cycle through 500 and 200 values, Nodes
// through 4, as there.
func raceMessages(t testing.TB, n int) [][]byte {
	end := time.Unix(1_790_000_000, 0)
	fs := make([]flow.Flow, n)
	for i := range fs {
		f := &fs[i]
		f.StartTime, f.EndTime, f.EndReason = end.Add(-10*time.Second), end, 2
		f.SourceIP = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		f.DestinationIP = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
		f.SourcePort, f.DestinationPort, f.Protocol, f.TCPState = uint16(1024+i%60000), 8080, 6, "ESTABLISHED"
		f.FlowType = flow.FlowTypeInterNode
		f.Stats = flow.Stats{PacketTotalCount: 100, PacketDeltaCount: 100, OctetTotalCount: 10000, OctetDeltaCount: 10000}
		f.ReverseStats = flow.Stats{PacketTotalCount: 50, PacketDeltaCount: 50, OctetTotalCount: 5000, OctetDeltaCount: 5000}
		present := []flow.Field{flow.StartTime, flow.EndTime, flow.EndReason, flow.SourceIP, flow.DestinationIP,
			flow.Protocol, flow.SourcePort, flow.DestinationPort, flow.TCPState, flow.FlowType,
			flow.PacketTotalCount, flow.PacketDeltaCount, flow.OctetTotalCount, flow.OctetDeltaCount,
			flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount, flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount}
		if i%2 == 0 {
			f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName = fmt.Sprintf("client-%d", i%500), "team-a", fmt.Sprintf("node-%d", i%4)
			present = append(present, flow.SourcePodName, flow.SourcePodNamespace, flow.SourceNodeName)
		} else {
			f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = fmt.Sprintf("server-%d", i%200), "team-b", fmt.Sprintf("node-%d", (i+1)%4)
			present = append(present, flow.DestinationPodName, flow.DestinationPodNamespace, flow.DestinationNodeName)
		}
		for _, p := range present {
			f.Present.Set(p)
		}
	}
	return encodeFlows(t, fs)
}

// fullMessages are n records with every field the fast path covers
// (flowtest.Full less its L7 values, which take the generated path: both
// Pods with UIDs and labels, Service, policies, Egress), the Pod names
// cycling as in raceMessages.
func fullMessages(t testing.TB, n int) [][]byte {
	fs := make([]flow.Flow, n)
	for i := range fs {
		fs[i] = *flowtest.Full(i%4, false)
		fs[i].SourcePodName = fmt.Sprintf("client-%d", i%500)
		fs[i].DestinationPodName = fmt.Sprintf("server-%d", i%200)
		fs[i].AppProtocolName, fs[i].HTTPVals = "", ""
		fs[i].Present.Clear(flow.AppProtocolName)
		fs[i].Present.Clear(flow.HTTPVals)
	}
	return encodeFlows(t, fs)
}

func encodeFlows(t testing.TB, fs []flow.Flow) [][]byte {
	var bad error
	req := flowproto.AppendExportRequest(nil, fs, func(_ *flow.Flow, err error) { bad = err })
	if bad != nil {
		t.Fatal(bad)
	}
	msgs, err := flowproto.RequestFlows(req, nil)
	if err != nil || len(msgs) != len(fs) {
		t.Fatalf("%d flows of %d: %v", len(msgs), len(fs), err)
	}
	return msgs
}

// BenchmarkDecodeStream decodes a stream of distinct records, as the gRPC
// collector does (one reused Decoder, one zeroed flow.Flow a record), so
// that the interning tables see the Pod names change from record to
// record. ns/record is per Flow message.
func BenchmarkDecodeStream(b *testing.B) {
	for _, c := range []struct {
		name string
		msgs func(testing.TB, int) [][]byte
	}{{"race", raceMessages}, {"full", fullMessages}} {
		b.Run(c.name, func(b *testing.B) {
			msgs := c.msgs(b, 4096)
			d := flowproto.NewDecoder()
			f := new(flow.Flow)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				for _, m := range msgs {
					*f = flow.Flow{}
					if _, err := d.Decode(m, f); err != nil {
						b.Fatal(err)
					}
				}
				n += len(msgs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
		})
	}
}
