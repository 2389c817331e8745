// Package flowtest builds flow records for tests: one with every field of
// flow.Flow set to a distinct non-zero value.
package flowtest

import (
	"net/netip"
	"strconv"
	"time"

	"sluice/flow"
)

// Full returns a record with every field present and non-zero (IPv4
// addresses), distinct from the records of other values of i. Origin
// carries only an ID; Aggregation is set when agg is true.
func Full(i int, agg bool) *flow.Flow {
	n := uint64(i)
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second)
	u := func(b byte) flow.UID {
		var x flow.UID
		for j := range x {
			x[j] = b + byte(j) + byte(i)
		}
		x[6] = 0x40 | x[6]&0x0f
		return x
	}
	f := &flow.Flow{
		Origin:          flow.Origin{ID: "flow-" + itoa(i)},
		StartTime:       t0,
		EndTime:         t0.Add(30*time.Second + 500*time.Millisecond),
		EndReason:       2,
		SourceIP:        netip.AddrFrom4([4]byte{10, 10, 0, byte(i)}),
		DestinationIP:   netip.AddrFrom4([4]byte{10, 10, 1, byte(i)}),
		Protocol:        6,
		SourcePort:      uint16(40000 + i),
		DestinationPort: 8080,
		TCPState:        "ESTABLISHED",
		Stats:           flow.Stats{PacketTotalCount: 100 + n, PacketDeltaCount: 10 + n, OctetTotalCount: 10000 + n, OctetDeltaCount: 1000 + n},
		ReverseStats:    flow.Stats{PacketTotalCount: 200 + n, PacketDeltaCount: 20 + n, OctetTotalCount: 20000 + n, OctetDeltaCount: 2000 + n},

		FlowType:                   flow.FlowTypeInterNode,
		SourcePodNamespace:         "ns-a",
		SourcePodName:              "client-" + itoa(i),
		SourcePodUID:               u(0x10),
		SourcePodLabels:            `{"app":"client","tier":"front"}`,
		SourceNodeName:             "node-a",
		SourceNodeUID:              u(0x20),
		DestinationPodNamespace:    "ns-b",
		DestinationPodName:         "server-" + itoa(i),
		DestinationPodUID:          u(0x30),
		DestinationPodLabels:       `{"app":"server"}`,
		DestinationNodeName:        "node-b",
		DestinationNodeUID:         u(0x40),
		DestinationClusterIP:       netip.AddrFrom4([4]byte{10, 96, 0, 10}),
		DestinationServiceIP:       netip.AddrFrom4([4]byte{10, 96, 0, 11}),
		DestinationServicePort:     80,
		DestinationServicePortName: "ns-b/server:http",
		DestinationServiceUID:      u(0x50),
		Ingress:                    flow.Policy{Type: 2, Namespace: "ns-b", Name: "allow-web", UID: u(0x60), RuleName: "rule-in", RuleAction: flow.ActionAllow},
		Egress:                     flow.Policy{Type: 3, Namespace: "", Name: "acnp-out", UID: u(0x70), RuleName: "rule-out", RuleAction: flow.ActionReject},
		EgressName:                 "egress-1",
		EgressIP:                   netip.AddrFrom4([4]byte{172, 18, 0, 5}),
		EgressNodeName:             "node-c",
		EgressNodeUID:              u(0x80),
		EgressUID:                  u(0x90),
		AppProtocolName:            "http",
		HTTPVals:                   "GET /",
		FlowDirection:              flow.DirectionEgress,
		ProxySnatIP:                netip.AddrFrom4([4]byte{192, 168, 0, 7}),
		ProxySnatPort:              31000,
		ClusterID:                  "cluster-1",
	}
	f.Egress.Namespace = "ns-cluster"
	for fl := range flow.ClusterID + 1 {
		f.Present.Set(fl)
	}
	if agg {
		f.Aggregation = &flow.Aggregation{
			EndFromSource: t0.Add(29 * time.Second), EndFromDestination: t0.Add(30 * time.Second),
			StatsFromSource:             flow.Stats{PacketTotalCount: 1, PacketDeltaCount: 2, OctetTotalCount: 3, OctetDeltaCount: 4},
			ReverseStatsFromSource:      flow.Stats{PacketTotalCount: 5, PacketDeltaCount: 6, OctetTotalCount: 7, OctetDeltaCount: 8},
			StatsFromDestination:        flow.Stats{PacketTotalCount: 9, PacketDeltaCount: 10, OctetTotalCount: 11, OctetDeltaCount: 12},
			ReverseStatsFromDestination: flow.Stats{PacketTotalCount: 13, PacketDeltaCount: 14, OctetTotalCount: 15, OctetDeltaCount: 16},
			Throughput:                  17, ReverseThroughput: 18, ThroughputFromSource: 19, ReverseThroughputFromSource: 20,
			ThroughputFromDestination: 21, ReverseThroughputFromDestination: 22,
		}
	}
	return f
}

func itoa(i int) string { return strconv.Itoa(i) }
