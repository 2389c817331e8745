package ipfixmap_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// BenchmarkExportWrite re-encodes records as the proxy does a gRPC
// agent's: bench/race's record shape (addresses, ports, TCP state, both
// directions' counters, one Pod's name, namespace and Node), written
// with Exporter.Write in Proxy mode into an Encoder whose messages are
// dropped. ns/record is per record.
func BenchmarkExportWrite(b *testing.B) {
	ex, err := ipfixmap.NewExporter(table(b), ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		b.Fatal(err)
	}
	end := time.Unix(1_790_000_000, 0)
	fs := make([]flow.Flow, 4096)
	for i := range fs {
		f := &fs[i]
		f.Origin = flow.Origin{ObservationDomainID: 7, Exporter: netip.MustParseAddr("192.0.2.1")}
		f.StartTime, f.EndTime, f.EndReason = end.Add(-10*time.Second), end, 2
		f.SourceIP = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		f.DestinationIP = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
		f.SourcePort, f.DestinationPort, f.Protocol, f.TCPState = uint16(1024+i%60000), 8080, 6, "ESTABLISHED"
		f.FlowType = flow.FlowTypeInterNode
		f.Stats = flow.Stats{PacketTotalCount: 100, PacketDeltaCount: 100, OctetTotalCount: 10000, OctetDeltaCount: 10000}
		f.ReverseStats = flow.Stats{PacketTotalCount: 50, PacketDeltaCount: 50, OctetTotalCount: 5000, OctetDeltaCount: 5000}
		if i%2 == 0 {
			f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName = fmt.Sprintf("client-%d", i%500), "team-a", fmt.Sprintf("node-%d", i%4)
		} else {
			f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = fmt.Sprintf("server-%d", i%200), "team-b", fmt.Sprintf("node-%d", (i+1)%4)
		}
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range ex.Templates() {
		enc.AddTemplate(7, t)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for i := range fs {
			t, isNew, err := ex.Template(&fs[i])
			if err != nil {
				b.Fatal(err)
			}
			if isNew {
				enc.AddTemplate(7, t)
			}
			if err := ex.Write(enc.Begin(7, t), t, &fs[i]); err != nil {
				b.Fatal(err)
			}
		}
		n += len(fs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
}
