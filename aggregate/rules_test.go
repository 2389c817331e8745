package aggregate

import (
	"net/netip"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
)

// Both Nodes report the same connection: the source Node's record brings
// the client Pod, the Service and the egress policy, the destination
// Node's the server Pod and the ingress policy. Either may come first.
func TestCorrelationBothOrders(t *testing.T) {
	srcC := counts{100, 10000, 100, 10000, 50, 5000, 50, 5000}
	dstC := counts{98, 9800, 98, 9800, 50, 5000, 50, 5000}
	for _, tc := range []struct {
		name        string
		first, then *flow.Flow
		// The common deltas and throughput are those of the record
		// that came last (both have the same end time, so both are
		// "latest"); totals are the larger.
		wantCommon [4]uint64
		wantTput   uint64
	}{
		{"source first", srcRec(0, 10, srcC), dstRec(0, 10, dstC), [4]uint64{100, 10000, 98, 9800}, 7840},
		{"destination first", dstRec(0, 10, dstC), srcRec(0, 10, srcC), [4]uint64{100, 10000, 100, 10000}, 8000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, k := testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
			s.Add(at(10), tc.first, k.emit)
			s.Tick(at(11), k.emit)
			none(t, k.take()) // waiting for the other side
			s.Add(at(11), tc.then, k.emit)
			if s.Len() != 1 {
				t.Fatalf("%d flows, want 1", s.Len())
			}
			s.Tick(at(12), k.emit) // complete: exported on the next tick
			f := one(t, k.take())

			if f.SourceIP != clientIP || f.DestinationIP != serverIP || f.SourcePort != 40000 || f.DestinationPort != 8080 || f.Protocol != 6 {
				t.Errorf("tuple %v:%d -> %v:%d/%d", f.SourceIP, f.SourcePort, f.DestinationIP, f.DestinationPort, f.Protocol)
			}
			if f.SourcePodNamespace != "ns-a" || f.SourcePodName != "client" || f.SourceNodeName != "node-1" {
				t.Errorf("source %q/%q on %q", f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName)
			}
			if f.DestinationPodNamespace != "ns-b" || f.DestinationPodName != "server" || f.DestinationNodeName != "node-2" {
				t.Errorf("destination %q/%q on %q", f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName)
			}
			if f.DestinationServicePortName != "ns-b/web:http" || f.DestinationServicePort != 80 ||
				f.DestinationClusterIP != clusterIP || f.DestinationServiceIP != clusterIP {
				t.Errorf("service %q %d %v %v", f.DestinationServicePortName, f.DestinationServicePort, f.DestinationClusterIP, f.DestinationServiceIP)
			}
			if f.Ingress.Name != "allow-in" || f.Ingress.Type != 3 || f.Ingress.RuleName != "r2" || f.Ingress.RuleAction != flow.ActionAllow {
				t.Errorf("ingress policy %+v", f.Ingress)
			}
			if f.Egress.Name != "allow-out" || f.Egress.Namespace != "ns-a" || f.Egress.Type != 2 || f.Egress.RuleAction != flow.ActionAllow {
				t.Errorf("egress policy %+v", f.Egress)
			}
			for _, p := range []flow.Field{flow.SourcePodName, flow.DestinationPodName, flow.IngressPolicyName,
				flow.EgressPolicyName, flow.DestinationServicePortName, flow.OctetDeltaCount} {
				if !f.Present.Has(p) {
					t.Errorf("field %d not marked present", p)
				}
			}
			if f.Present.Has(flow.FlowDirection) || f.FlowType != flow.FlowTypeInterNode {
				t.Errorf("flow type %d, direction present %v", f.FlowType, f.Present.Has(flow.FlowDirection))
			}
			a := f.Aggregation
			checkStats(t, "common", f.Stats, tc.wantCommon)
			checkStats(t, "common reverse", f.ReverseStats, [4]uint64{50, 5000, 50, 5000})
			checkStats(t, "from source", a.StatsFromSource, [4]uint64{100, 10000, 100, 10000})
			checkStats(t, "reverse from source", a.ReverseStatsFromSource, [4]uint64{50, 5000, 50, 5000})
			checkStats(t, "from destination", a.StatsFromDestination, [4]uint64{98, 9800, 98, 9800})
			checkStats(t, "reverse from destination", a.ReverseStatsFromDestination, [4]uint64{50, 5000, 50, 5000})
			if !a.EndFromSource.Equal(at(10)) || !a.EndFromDestination.Equal(at(10)) || !f.EndTime.Equal(at(10)) || !f.StartTime.Equal(at(0)) {
				t.Errorf("times: start %v end %v, from source %v, from destination %v", f.StartTime, f.EndTime, a.EndFromSource, a.EndFromDestination)
			}
			// 10000 and 9800 octets over 10 s; 5000 reverse.
			if a.ThroughputFromSource != 8000 || a.ThroughputFromDestination != 7840 || a.Throughput != tc.wantTput ||
				a.ReverseThroughputFromSource != 4000 || a.ReverseThroughputFromDestination != 4000 || a.ReverseThroughput != 4000 {
				t.Errorf("throughputs %+v", *a)
			}
			st := s.Stats()
			if st.Correlated != 1 || st.Exported != 1 || st.Flows != 1 || st.RecordsIn != 2 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// Agents report Service traffic with the endpoint as destination (the
// reply tuple's source), so both Nodes' records have the same key; the
// Service itself is only in the source Node's record.
func TestServiceTrafficKeyedOnEndpoint(t *testing.T) {
	s, k := testStore(Options{})
	src := srcRec(0, 10, counts{pkts: 1})
	if src.DestinationIP != serverIP || src.DestinationClusterIP != clusterIP {
		t.Fatal("test record is not post-DNAT")
	}
	s.Add(at(10), src, k.emit)
	s.Add(at(10), dstRec(0, 10, counts{pkts: 1}), k.emit)
	s.Tick(at(11), k.emit)
	f := one(t, k.take())
	if f.DestinationIP != serverIP || f.DestinationServicePortName != "ns-b/web:http" || f.DestinationPodName != "server" {
		t.Errorf("got destination %v (%q), service %q", f.DestinationIP, f.DestinationPodName, f.DestinationServicePortName)
	}

	// Keyed on the ClusterIP, the source half would never meet the other.
	s, k = testStore(Options{})
	pre := srcRec(0, 10, counts{})
	pre.DestinationIP = clusterIP
	s.Add(at(20), pre, k.emit)
	s.Add(at(20), dstRec(0, 10, counts{}), k.emit)
	s.Tick(at(21), k.emit)
	none(t, k.take())
	if s.Len() != 2 || s.Stats().Correlated != 0 {
		t.Errorf("%d flows, %d correlated; want 2 and 0 (different keys do not correlate)", s.Len(), s.Stats().Correlated)
	}
}

// Denied flows: an egress Drop or Reject (source Node) and an ingress
// Reject (destination Node) leave only one record, so they are not
// correlated: exported on the next tick with the missing Pod looked up.
// An ingress Drop still goes through correlation.
func TestDeniedFlows(t *testing.T) {
	c := counts{3, 180, 3, 180, 0, 0, 0, 0}
	deny := func(f *flow.Flow, ingress bool, action uint8) *flow.Flow {
		if ingress {
			f.Ingress.RuleAction = action
		} else {
			f.Egress.RuleAction = action
		}
		return f
	}
	for _, tc := range []struct {
		name string
		rec  *flow.Flow
	}{
		{"egress drop", deny(srcRec(0, 10, c), false, flow.ActionDrop)},
		{"egress reject", deny(srcRec(0, 10, c), false, flow.ActionReject)},
		{"ingress reject", deny(dstRec(0, 10, c), true, flow.ActionReject)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, k := testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
			s.Add(at(10), tc.rec, k.emit)
			s.Tick(at(11), k.emit)
			f := one(t, k.take())
			// The other side's Pod comes from the store.
			if f.SourcePodName != "client" || f.SourcePodNamespace != "ns-a" || f.SourceNodeName != "node-1" ||
				f.DestinationPodName != "server" || f.DestinationPodNamespace != "ns-b" || f.DestinationNodeName != "node-2" {
				t.Errorf("pods %s/%s@%s -> %s/%s@%s", f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName,
					f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName)
			}
			if !f.Present.Has(flow.SourcePodName) || !f.Present.Has(flow.DestinationNodeName) {
				t.Error("looked-up fields not marked present")
			}
			// One record fills both sides.
			a := f.Aggregation
			checkStats(t, "from source", a.StatsFromSource, [4]uint64{3, 180, 3, 180})
			checkStats(t, "from destination", a.StatsFromDestination, [4]uint64{3, 180, 3, 180})
			if !a.EndFromSource.Equal(at(10)) || !a.EndFromDestination.Equal(at(10)) {
				t.Errorf("ends %v %v", a.EndFromSource, a.EndFromDestination)
			}
			if st := s.Stats(); st.Correlated != 0 || st.Exported != 1 {
				t.Errorf("stats %+v", st)
			}
		})
	}
	t.Run("ingress drop", func(t *testing.T) {
		s, k := testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
		s.Add(at(10), deny(dstRec(0, 10, c), true, flow.ActionDrop), k.emit)
		s.Tick(at(11), k.emit)
		none(t, k.take())
		s.Add(at(11), srcRec(0, 10, c), k.emit)
		s.Tick(at(12), k.emit)
		f := one(t, k.take())
		if f.Ingress.RuleAction != flow.ActionDrop || f.SourcePodName != "client" || f.DestinationPodName != "server" {
			t.Errorf("got %+v", f)
		}
		if s.Stats().Correlated != 1 {
			t.Error("not correlated")
		}
	})
}

// Flows one Node sees whole need no correlation: ready at once, both
// sides' counters filled from the one record.
func TestSingleNodeFlows(t *testing.T) {
	intra := base(0, 4, counts{10, 1000, 10, 1000, 8, 800, 8, 800})
	intra.FlowType = flow.FlowTypeIntraNode
	intra.SourcePodNamespace, intra.SourcePodName = "ns-a", "client"
	intra.DestinationPodNamespace, intra.DestinationPodName = "ns-a", "peer"
	intra.SourceNodeName, intra.DestinationNodeName = "node-1", "node-1"

	toExt := base(0, 4, counts{10, 1000, 10, 1000, 8, 800, 8, 800})
	toExt.FlowType = flow.FlowTypeToExternal
	toExt.DestinationIP = externalIP
	toExt.SourcePodNamespace, toExt.SourcePodName, toExt.SourceNodeName = "ns-a", "client", "node-1"
	toExt.EgressName, toExt.EgressIP, toExt.EgressNodeName = "egress-a", netip.MustParseAddr("192.0.2.1"), "node-3"

	fromExt := base(0, 4, counts{10, 1000, 10, 1000, 8, 800, 8, 800})
	fromExt.FlowType = flow.FlowTypeFromExternal
	fromExt.SourceIP = externalIP
	fromExt.DestinationPodNamespace, fromExt.DestinationPodName, fromExt.DestinationNodeName = "ns-b", "server", "node-2"
	fromExt.ProxySnatIP, fromExt.ProxySnatPort = snatIP, 61000 // the Pod is local: no second Node

	for _, tc := range []struct {
		name string
		rec  *flow.Flow
	}{{"intra-node", intra}, {"to external", toExt}, {"from external, one node", fromExt}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := mark(tc.rec)
			s, k := testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
			s.Add(at(4), rec, k.emit)
			s.Tick(at(5), k.emit)
			f := one(t, k.take())
			a := f.Aggregation
			checkStats(t, "common", f.Stats, [4]uint64{10, 1000, 10, 1000})
			checkStats(t, "from source", a.StatsFromSource, [4]uint64{10, 1000, 10, 1000})
			checkStats(t, "from destination", a.StatsFromDestination, [4]uint64{10, 1000, 10, 1000})
			checkStats(t, "reverse from destination", a.ReverseStatsFromDestination, [4]uint64{8, 800, 8, 800})
			if a.Throughput != 2000 || a.ThroughputFromSource != 2000 || a.ThroughputFromDestination != 2000 || a.ReverseThroughput != 1600 {
				t.Errorf("throughputs %+v", *a)
			}
			if f.SourceIP != rec.SourceIP || f.DestinationIP != rec.DestinationIP || f.FlowType != rec.FlowType ||
				f.SourcePodName != rec.SourcePodName || f.DestinationPodName != rec.DestinationPodName ||
				f.EgressName != rec.EgressName || f.EgressIP != rec.EgressIP || f.EgressNodeName != rec.EgressNodeName ||
				f.ProxySnatIP != rec.ProxySnatIP || f.ProxySnatPort != rec.ProxySnatPort {
				t.Errorf("got %+v\nwant %+v", f, rec)
			}
			if s.Stats().Correlated != 0 {
				t.Error("correlated")
			}
		})
	}
}

// The two halves of a from-external flow whose Pod is on another Node:
// the ingress Node's half (FromExternal, no destination Pod, SNAT by the
// proxy) is keyed on the SNAT address and port, which the destination
// Node reports as the source of an inter-Node flow.
func TestFromExternalTwoNodes(t *testing.T) {
	ingressHalf := func() *flow.Flow {
		f := base(0, 10, counts{20, 2000, 20, 2000, 10, 1000, 10, 1000})
		f.FlowType = flow.FlowTypeFromExternal
		f.SourceIP, f.SourcePort = externalIP, 5555
		f.ProxySnatIP, f.ProxySnatPort = snatIP, 61000
		f.DestinationServicePort, f.DestinationServicePortName = 80, "ns-b/web:http"
		return mark(f)
	}
	destHalf := func() *flow.Flow {
		f := base(0, 10, counts{20, 2000, 20, 2000, 10, 1000, 10, 1000})
		f.SourceIP, f.SourcePort = snatIP, 61000
		f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "ns-b", "server", "node-2"
		return mark(f)
	}
	for _, tc := range []struct {
		name        string
		first, then *flow.Flow
	}{
		{"ingress node first", ingressHalf(), destHalf()},
		{"destination node first", destHalf(), ingressHalf()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, k := testStore(Options{})
			s.Add(at(10), tc.first, k.emit)
			s.Tick(at(11), k.emit)
			none(t, k.take())
			s.Add(at(11), tc.then, k.emit)
			s.Tick(at(12), k.emit)
			f := one(t, k.take())
			if f.SourceIP != externalIP || f.SourcePort != 5555 || f.DestinationIP != serverIP || f.DestinationPort != 8080 {
				t.Errorf("tuple %v:%d -> %v:%d", f.SourceIP, f.SourcePort, f.DestinationIP, f.DestinationPort)
			}
			if f.FlowType != flow.FlowTypeFromExternal || f.ProxySnatIP != snatIP || f.ProxySnatPort != 61000 {
				t.Errorf("type %d snat %v:%d", f.FlowType, f.ProxySnatIP, f.ProxySnatPort)
			}
			if f.DestinationPodName != "server" || f.DestinationNodeName != "node-2" || f.DestinationServicePortName != "ns-b/web:http" {
				t.Errorf("destination %q on %q, service %q", f.DestinationPodName, f.DestinationNodeName, f.DestinationServicePortName)
			}
			// The ingress Node's half counts as the source side.
			checkStats(t, "from source", f.Aggregation.StatsFromSource, [4]uint64{20, 2000, 20, 2000})
			checkStats(t, "from destination", f.Aggregation.StatsFromDestination, [4]uint64{20, 2000, 20, 2000})
			if s.Stats().Correlated != 1 {
				t.Error("not correlated")
			}
		})
	}
}

// An inter-Node flow only one Node reports is given MaxRetries more
// active timeouts, then exported one-sided (with the other Pod looked up)
// or dropped.
func TestOneSided(t *testing.T) {
	for _, export := range []bool{true, false} {
		name := map[bool]string{true: "exported", false: "dropped"}[export]
		t.Run(name, func(t *testing.T) {
			s, k := testStore(Options{ExportOneSided: export, Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
			s.Add(at(10), srcRec(0, 10, counts{5, 500, 5, 500, 0, 0, 0, 0}), k.emit)
			// Records from the same Node do not complete it.
			s.Add(at(20), srcRec(0, 20, counts{7, 700, 2, 200, 0, 0, 0, 0}), k.emit)
			// Created at 10: retries at 70 and 130, given up at 190.
			for sec := 11; sec < 190; sec++ {
				s.Tick(at(sec), k.emit)
				none(t, k.take())
			}
			if s.Len() != 1 {
				t.Fatalf("flow forgotten before its retries: %d flows", s.Len())
			}
			s.Tick(at(190), k.emit)
			got := k.take()
			st := s.Stats()
			if s.Len() != 0 || st.Flows != 0 {
				t.Errorf("%d flows left", s.Len())
			}
			if !export {
				none(t, got)
				if st.OneSidedDropped != 1 || st.OneSidedExported != 0 || st.Exported != 0 {
					t.Errorf("stats %+v", st)
				}
				return
			}
			f := one(t, got)
			if st.OneSidedExported != 1 || st.OneSidedDropped != 0 || st.Exported != 1 {
				t.Errorf("stats %+v", st)
			}
			if f.SourcePodName != "client" || f.DestinationPodName != "server" || f.DestinationNodeName != "node-2" {
				t.Errorf("pods %q -> %q (%q)", f.SourcePodName, f.DestinationPodName, f.DestinationNodeName)
			}
			a := f.Aggregation
			checkStats(t, "from source", a.StatsFromSource, [4]uint64{7, 700, 7, 700})
			checkStats(t, "from destination", a.StatsFromDestination, [4]uint64{})
			if !a.EndFromDestination.IsZero() || !a.EndFromSource.Equal(at(20)) {
				t.Errorf("ends %v %v", a.EndFromSource, a.EndFromDestination)
			}
		})
	}
}

// A record whose end time is not newer than the last one from its Node
// changes no counter (it still counts as an update for export).
func TestStaleRecords(t *testing.T) {
	t.Run("single node", func(t *testing.T) {
		s, k := testStore(Options{})
		intra := func(end int, c counts) *flow.Flow {
			f := srcRec(0, end, c)
			f.FlowType = flow.FlowTypeIntraNode
			return f
		}
		s.Add(at(10), intra(10, counts{10, 1000, 10, 1000, 1, 100, 1, 100}), k.emit)
		s.Tick(at(11), k.emit)
		one(t, k.take())
		s.Add(at(12), intra(10, counts{20, 2000, 10, 1000, 2, 200, 1, 100}), k.emit) // same end
		s.Add(at(13), intra(8, counts{30, 3000, 10, 1000, 3, 300, 1, 100}), k.emit)  // older
		if got := s.Stats().RecordsStale; got != 2 {
			t.Errorf("%d stale records, want 2", got)
		}
		s.Tick(at(71), k.emit)
		f := one(t, k.take())
		checkStats(t, "common", f.Stats, [4]uint64{10, 1000, 0, 0})
		checkStats(t, "from source", f.Aggregation.StatsFromSource, [4]uint64{10, 1000, 0, 0})
		checkStats(t, "common reverse", f.ReverseStats, [4]uint64{1, 100, 0, 0})
		if f.Aggregation.Throughput != 0 || !f.EndTime.Equal(at(10)) {
			t.Errorf("throughput %d end %v", f.Aggregation.Throughput, f.EndTime)
		}
	})
	t.Run("per node", func(t *testing.T) {
		// The destination Node lags; a repeated source record is stale
		// for the source Node even though it is the latest overall.
		s, k := testStore(Options{})
		s.Add(at(10), srcRec(0, 10, counts{10, 1000, 10, 1000, 0, 0, 0, 0}), k.emit)
		s.Add(at(10), dstRec(0, 5, counts{4, 400, 4, 400, 0, 0, 0, 0}), k.emit)
		s.Add(at(11), srcRec(0, 10, counts{50, 5000, 40, 4000, 0, 0, 0, 0}), k.emit)
		if got := s.Stats().RecordsStale; got != 1 {
			t.Errorf("%d stale records, want 1", got)
		}
		s.Tick(at(12), k.emit)
		f := one(t, k.take())
		checkStats(t, "from source", f.Aggregation.StatsFromSource, [4]uint64{10, 1000, 10, 1000})
		checkStats(t, "from destination", f.Aggregation.StatsFromDestination, [4]uint64{4, 400, 4, 400})
		// The destination record was not the latest (5 < 10): common
		// counters are the source's.
		checkStats(t, "common", f.Stats, [4]uint64{10, 1000, 10, 1000})
		if f.Aggregation.Throughput != 800 || f.Aggregation.ThroughputFromDestination != 640 {
			t.Errorf("throughputs %+v", *f.Aggregation)
		}
	})
	t.Run("first record within one second", func(t *testing.T) {
		// A short connection: the destination Node's first record starts
		// and ends in the same second, and arrives second. It is not
		// stale (Antrea drops its counters here); its throughput is 0.
		s, k := testStore(Options{})
		s.Add(at(10), srcRec(10, 10, counts{3, 300, 3, 300, 2, 200, 2, 200}), k.emit)
		s.Add(at(10), dstRec(10, 10, counts{3, 290, 3, 290, 2, 190, 2, 190}), k.emit)
		if got := s.Stats().RecordsStale; got != 0 {
			t.Errorf("%d stale records, want 0", got)
		}
		s.Tick(at(11), k.emit)
		f := one(t, k.take())
		checkStats(t, "from source", f.Aggregation.StatsFromSource, [4]uint64{3, 300, 3, 300})
		checkStats(t, "from destination", f.Aggregation.StatsFromDestination, [4]uint64{3, 290, 3, 290})
		checkStats(t, "reverse from destination", f.Aggregation.ReverseStatsFromDestination, [4]uint64{2, 190, 2, 190})
		if f.DestinationPodName != "server" || f.Aggregation.Throughput != 0 || f.Aggregation.ThroughputFromDestination != 0 {
			t.Errorf("record %+v %+v", f, *f.Aggregation)
		}
		// A later record of the same second from the same Node is stale.
		s.Add(at(11), dstRec(10, 10, counts{9, 900, 6, 600, 0, 0, 0, 0}), k.emit)
		if got := s.Stats().RecordsStale; got != 1 {
			t.Errorf("%d stale records after a repeat, want 1", got)
		}
	})
}

// END_OF_FLOW, once reported, stays; other end reasons follow the last
// record.
func TestEndOfFlowSticky(t *testing.T) {
	rec := func(end int, reason uint8) *flow.Flow {
		f := srcRec(0, end, counts{pkts: uint64(end)})
		f.FlowType = flow.FlowTypeIntraNode
		f.EndReason = reason
		return f
	}
	for _, tc := range []struct {
		name    string
		reasons []uint8
		want    uint8
	}{
		{"end then active", []uint8{3, 2}, 3},
		{"active then end", []uint8{2, 3}, 3},
		{"active then idle", []uint8{2, 1}, 1},
		{"end, idle, active", []uint8{3, 1, 2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, k := testStore(Options{})
			for i, r := range tc.reasons {
				s.Add(at(10*(i+1)), rec(10*(i+1), r), k.emit)
			}
			s.Flush(k.emit)
			if f := one(t, k.take()); f.EndReason != tc.want {
				t.Errorf("end reason %d, want %d", f.EndReason, tc.want)
			}
		})
	}
}

// The TCP state is the one of the record with the latest end time.
func TestTCPStateFromLatest(t *testing.T) {
	s, k := testStore(Options{})
	s.Add(at(10), srcRec(0, 10, counts{}), k.emit)
	late := dstRec(0, 8, counts{})
	late.TCPState = "SYN_RECV"
	s.Add(at(10), late, k.emit)
	s.Tick(at(11), k.emit)
	if f := one(t, k.take()); f.TCPState != "ESTABLISHED" {
		t.Errorf("state %q after an older record", f.TCPState)
	}
	end := dstRec(0, 12, counts{})
	end.TCPState = "TIME_WAIT"
	s.Add(at(12), end, k.emit)
	s.Flush(k.emit)
	if f := one(t, k.take()); f.TCPState != "TIME_WAIT" {
		t.Errorf("state %q after the latest record", f.TCPState)
	}
}

// Throughput is the change of the octet total times 8 over the change of
// end time, in bit/s, per Node; the common one follows the latest record.
func TestThroughput(t *testing.T) {
	t.Run("single node", func(t *testing.T) {
		s, k := testStore(Options{})
		rec := func(end int, octets, roctets uint64) *flow.Flow {
			f := srcRec(0, end, counts{1, octets, 1, octets, 1, roctets, 1, roctets})
			f.FlowType = flow.FlowTypeIntraNode
			return f
		}
		want := func(tp, rtp uint64) {
			t.Helper()
			a := one(t, k.take()).Aggregation
			if a.Throughput != tp || a.ThroughputFromSource != tp || a.ThroughputFromDestination != tp ||
				a.ReverseThroughput != rtp || a.ReverseThroughputFromSource != rtp || a.ReverseThroughputFromDestination != rtp {
				t.Errorf("throughputs %+v, want %d and %d", *a, tp, rtp)
			}
		}
		s.Add(at(5), rec(5, 5000, 1000), k.emit) // first record: total over (end - start)
		s.Tick(at(6), k.emit)
		want(8000, 1600)
		s.Add(at(10), rec(10, 15000, 1500), k.emit) // 10000 octets, 500 reverse, in 5 s
		s.Tick(at(66), k.emit)
		want(16000, 800)
		s.Add(at(13), rec(13, 16001, 1500), k.emit) // 1001 octets in 3 s: 2669.33
		s.Tick(at(126), k.emit)
		want(2669, 0)
	})
	t.Run("per node", func(t *testing.T) {
		s, k := testStore(Options{})
		s.Add(at(10), srcRec(0, 10, counts{100, 10000, 100, 10000, 0, 0, 0, 0}), k.emit)
		s.Add(at(10), dstRec(0, 10, counts{98, 9800, 98, 9800, 0, 0, 0, 0}), k.emit)
		s.Tick(at(11), k.emit)
		one(t, k.take())
		// Destination at 20 (+5000 octets in 10 s), then source at 15
		// (+2000 in 5 s): the source record is not the latest.
		s.Add(at(20), dstRec(0, 20, counts{148, 14800, 50, 5000, 0, 0, 0, 0}), k.emit)
		s.Add(at(21), srcRec(0, 15, counts{120, 12000, 20, 2000, 0, 0, 0, 0}), k.emit)
		s.Tick(at(71), k.emit)
		f := one(t, k.take())
		a := f.Aggregation
		if a.ThroughputFromDestination != 4000 || a.ThroughputFromSource != 3200 || a.Throughput != 4000 {
			t.Errorf("throughputs %+v", *a)
		}
		checkStats(t, "common", f.Stats, [4]uint64{148, 14800, 50, 5000})
		checkStats(t, "from source", a.StatsFromSource, [4]uint64{120, 12000, 20, 2000})
		checkStats(t, "from destination", a.StatsFromDestination, [4]uint64{148, 14800, 50, 5000})
		if !f.EndTime.Equal(at(20)) || !a.EndFromSource.Equal(at(15)) || !a.EndFromDestination.Equal(at(20)) {
			t.Errorf("ends %v, %v, %v", f.EndTime, a.EndFromSource, a.EndFromDestination)
		}
	})
}

// Deltas add up per side between exports and restart at zero after each
// export; totals stay.
func TestDeltasResetTotalsKept(t *testing.T) {
	s, k := testStore(Options{})
	rec := func(end int, total, delta uint64) *flow.Flow {
		f := srcRec(0, end, counts{total, total * 100, delta, delta * 100, total, total * 10, delta, delta * 10})
		f.FlowType = flow.FlowTypeIntraNode
		return f
	}
	s.Add(at(10), rec(10, 10, 10), k.emit)
	s.Tick(at(11), k.emit)
	f := one(t, k.take())
	checkStats(t, "first export", f.Stats, [4]uint64{10, 1000, 10, 1000})

	s.Add(at(20), rec(20, 30, 20), k.emit)
	s.Add(at(30), rec(30, 60, 30), k.emit)
	s.Tick(at(71), k.emit)
	f = one(t, k.take())
	checkStats(t, "second export", f.Stats, [4]uint64{60, 6000, 50, 5000})
	checkStats(t, "second export reverse", f.ReverseStats, [4]uint64{60, 600, 50, 500})
	checkStats(t, "second export, source", f.Aggregation.StatsFromSource, [4]uint64{60, 6000, 50, 5000})
	checkStats(t, "second export, destination", f.Aggregation.StatsFromDestination, [4]uint64{60, 6000, 50, 5000})
	if f.Aggregation.Throughput != 2400 { // (6000-3000)*8/10
		t.Errorf("throughput %d", f.Aggregation.Throughput)
	}

	s.Add(at(80), rec(80, 61, 1), k.emit)
	s.Tick(at(131), k.emit)
	f = one(t, k.take())
	checkStats(t, "third export", f.Stats, [4]uint64{61, 6100, 1, 100})
	checkStats(t, "third export, destination", f.Aggregation.StatsFromDestination, [4]uint64{61, 6100, 1, 100})
	if f.Aggregation.Throughput != 16 { // 100*8/50
		t.Errorf("throughput %d", f.Aggregation.Throughput)
	}
}

// First export on the tick after completion, then at most one per active
// timeout and only when a record arrived; forgotten InactiveTimeout after
// the last record, after which a record starts a new flow.
func TestExportCadenceAndInactiveExpiry(t *testing.T) {
	s, k := testStore(Options{ActiveTimeout: 10 * time.Second, InactiveTimeout: 30 * time.Second})
	rec := func(end int) *flow.Flow {
		f := srcRec(0, end, counts{uint64(end), uint64(end) * 100, 1, 100, 0, 0, 0, 0})
		f.FlowType = flow.FlowTypeIntraNode
		return f
	}
	s.Add(at(10), rec(10), k.emit)
	s.Tick(at(10).Add(500*time.Millisecond), k.emit)
	one(t, k.take())
	s.Add(at(12), rec(12), k.emit)
	for sec := 11; sec < 21; sec++ { // at most once per active timeout
		s.Tick(at(sec), k.emit)
		none(t, k.take())
	}
	s.Tick(at(21), k.emit)
	if f := one(t, k.take()); !f.EndTime.Equal(at(12)) {
		t.Errorf("end %v", f.EndTime)
	}
	for sec := 22; sec < 42; sec++ { // nothing new: no export
		s.Tick(at(sec), k.emit)
		none(t, k.take())
		if s.Len() != 1 {
			t.Fatalf("forgotten at %d s", sec)
		}
	}
	s.Tick(at(42), k.emit) // 30 s after the last record
	none(t, k.take())
	if s.Len() != 0 || s.Stats().Expired != 1 {
		t.Fatalf("not forgotten: %d flows, %+v", s.Len(), s.Stats())
	}
	// A new record starts over: first-record throughput, both deltas.
	s.Add(at(50), rec(50), k.emit)
	s.Tick(at(51), k.emit)
	f := one(t, k.take())
	checkStats(t, "new flow", f.Stats, [4]uint64{50, 5000, 1, 100})
	if f.Aggregation.Throughput != 800 { // 5000*8/50
		t.Errorf("throughput %d", f.Aggregation.Throughput)
	}
}

// An updated flow reaching its inactive timeout is exported before it is
// forgotten.
func TestInactiveExportsPending(t *testing.T) {
	s, k := testStore(Options{ActiveTimeout: 60 * time.Second, InactiveTimeout: 20 * time.Second})
	f := srcRec(0, 10, counts{pkts: 1})
	f.FlowType = flow.FlowTypeIntraNode
	s.Add(at(10), f, k.emit)
	s.Tick(at(11), k.emit)
	one(t, k.take())
	f = srcRec(0, 15, counts{pkts: 2})
	f.FlowType = flow.FlowTypeIntraNode
	s.Add(at(15), f, k.emit)
	s.Tick(at(34), k.emit)
	none(t, k.take())
	s.Tick(at(35), k.emit)
	if g := one(t, k.take()); g.Stats.PacketTotalCount != 2 || s.Len() != 0 {
		t.Errorf("got %d packets, %d flows", g.Stats.PacketTotalCount, s.Len())
	}
}

// Past MaxFlows the flow idle the longest is exported early and forgotten.
func TestMaxFlowsEviction(t *testing.T) {
	s, k := testStore(Options{MaxFlows: 2, ExportOneSided: true})
	rec := func(port uint16, end int) *flow.Flow {
		f := srcRec(0, end, counts{pkts: uint64(end)})
		f.FlowType = flow.FlowTypeIntraNode
		f.SourcePort = port
		return f
	}
	s.Add(at(1), rec(1, 1), k.emit)
	s.Add(at(2), rec(2, 2), k.emit)
	s.Add(at(3), rec(1, 3), k.emit) // flow 1 is now the more recent
	none(t, k.take())
	s.Add(at(4), rec(3, 4), k.emit)
	if f := one(t, k.take()); f.SourcePort != 2 {
		t.Errorf("evicted port %d, want 2 (idle the longest)", f.SourcePort)
	}
	if st := s.Stats(); st.Evicted != 1 || st.Flows != 2 || s.Len() != 2 {
		t.Errorf("stats %+v", st)
	}
	s.Tick(at(5), k.emit)
	if got := k.take(); len(got) != 2 {
		t.Errorf("tick exported %d, want 2", len(got))
	}

	// A flow still waiting for its other side is evicted one-sided.
	s2, k2 := testStore(Options{MaxFlows: 1, ExportOneSided: true, Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
	s2.Add(at(1), srcRec(0, 1, counts{pkts: 1}), k2.emit)
	s2.Add(at(2), rec(9, 2), k2.emit)
	if f := one(t, k2.take()); f.SourcePodName != "client" || f.DestinationPodName != "server" {
		t.Errorf("evicted %+v", f)
	}
	if st := s2.Stats(); st.Evicted != 1 || st.OneSidedExported != 1 {
		t.Errorf("stats %+v", st)
	}
}

// Flush exports everything not exported yet and forgets every flow.
func TestFlush(t *testing.T) {
	for _, export := range []bool{true, false} {
		s, k := testStore(Options{ExportOneSided: export})
		exported := srcRec(0, 5, counts{pkts: 1})
		exported.FlowType = flow.FlowTypeIntraNode
		exported.SourcePort = 1
		s.Add(at(5), exported, k.emit)
		s.Tick(at(6), k.emit)
		one(t, k.take())
		pending := srcRec(0, 5, counts{pkts: 1})
		pending.FlowType = flow.FlowTypeIntraNode
		pending.SourcePort = 2
		s.Add(at(7), pending, k.emit)
		s.Add(at(7), srcRec(0, 7, counts{pkts: 1}), k.emit) // waiting for its other side
		s.Flush(k.emit)
		want := map[bool]int{true: 2, false: 1}[export]
		if got := k.take(); len(got) != want {
			t.Errorf("ExportOneSided %v: flushed %d records, want %d", export, len(got), want)
		}
		if st := s.Stats(); s.Len() != 0 || st.Flows != 0 || st.OneSidedExported+st.OneSidedDropped != 1 {
			t.Errorf("after flush: %d flows, %+v", s.Len(), st)
		}
		if n := s.strs.live(); n != 0 {
			t.Errorf("%d interned values still held", n)
		}
	}
}

// Exported records are snapshots: the Store's later changes do not show.
func TestExportIsSnapshot(t *testing.T) {
	s, k := testStore(Options{})
	s.Add(at(10), srcRec(0, 10, counts{10, 1000, 10, 1000, 0, 0, 0, 0}), k.emit)
	s.Add(at(10), dstRec(0, 10, counts{10, 1000, 10, 1000, 0, 0, 0, 0}), k.emit)
	s.Tick(at(11), k.emit)
	f := one(t, k.take())
	before, agg := *f, *f.Aggregation
	next := dstRec(0, 20, counts{20, 2000, 10, 1000, 0, 0, 0, 0})
	next.TCPState = "TIME_WAIT"
	s.Add(at(20), next, k.emit)
	s.Flush(k.emit)
	g := one(t, k.take())
	if f.Stats != before.Stats || f.TCPState != before.TCPState || *f.Aggregation != agg || !f.EndTime.Equal(before.EndTime) {
		t.Error("an exported record changed after export")
	}
	if g == f || g.Aggregation == f.Aggregation || g.TCPState != "TIME_WAIT" {
		t.Error("second export shares the first's memory or lacks the update")
	}
}

// Records without start or end time are dropped and counted.
func TestInvalidRecords(t *testing.T) {
	s, k := testStore(Options{})
	f := srcRec(0, 10, counts{})
	f.Present.Clear(flow.EndTime)
	s.Add(at(10), f, k.emit)
	g := srcRec(0, 10, counts{})
	g.StartTime = time.Time{}
	s.Add(at(10), g, k.emit)
	if st := s.Stats(); st.RecordsInvalid != 2 || st.RecordsIn != 2 || s.Len() != 0 {
		t.Errorf("stats %+v, %d flows", st, s.Len())
	}
}

// Labels, UIDs and the cluster ID are added at export.
func TestExportEnrichment(t *testing.T) {
	s, k := testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods(), PodLabels: true, UIDs: true, ClusterID: "c1"})})
	s.Add(at(10), srcRec(0, 10, counts{}), k.emit)
	s.Add(at(10), dstRec(0, 10, counts{}), k.emit)
	s.Tick(at(11), k.emit)
	f := one(t, k.take())
	if f.SourcePodLabels != `{"app":"client"}` || f.DestinationPodLabels != "{}" ||
		!f.Present.Has(flow.SourcePodLabels) || !f.Present.Has(flow.DestinationPodLabels) {
		t.Errorf("labels %q %q", f.SourcePodLabels, f.DestinationPodLabels)
	}
	uid := func(s string) flow.UID { u, _ := flow.ParseUID(s); return u }
	if f.SourcePodUID != uid(clientUID) || f.DestinationPodUID != uid(serverUID) || f.SourceNodeUID != uid(node1UID) ||
		f.DestinationNodeUID != uid(node2UID) || f.DestinationServiceUID != uid(svcUID) {
		t.Errorf("UIDs %x %x %x %x %x", f.SourcePodUID, f.DestinationPodUID, f.SourceNodeUID, f.DestinationNodeUID, f.DestinationServiceUID)
	}
	if f.ClusterID != "c1" || !f.Present.Has(flow.ClusterID) {
		t.Errorf("cluster ID %q", f.ClusterID)
	}

	// Without the switches, nothing is added.
	s, k = testStore(Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: pods()})})
	s.Add(at(10), srcRec(0, 10, counts{}), k.emit)
	s.Add(at(10), dstRec(0, 10, counts{}), k.emit)
	s.Tick(at(11), k.emit)
	f = one(t, k.take())
	if f.SourcePodLabels != "" || f.Present.Has(flow.SourcePodLabels) || f.SourcePodUID != (flow.UID{}) || f.Present.Has(flow.ClusterID) {
		t.Errorf("enriched without being asked: %+v", f)
	}
}

// UIDs the records carry (gRPC exporters) survive correlation.
func TestRecordUIDsKept(t *testing.T) {
	s, k := testStore(Options{})
	src := srcRec(0, 10, counts{})
	src.SourcePodUID, _ = flow.ParseUID(clientUID)
	src.Present.Set(flow.SourcePodUID)
	dst := dstRec(0, 10, counts{})
	dst.DestinationPodUID, _ = flow.ParseUID(serverUID)
	dst.Present.Set(flow.DestinationPodUID)
	s.Add(at(10), dst, k.emit)
	s.Add(at(10), src, k.emit)
	s.Tick(at(11), k.emit)
	f := one(t, k.take())
	if f.SourcePodUID != src.SourcePodUID || f.DestinationPodUID != dst.DestinationPodUID ||
		!f.Present.Has(flow.SourcePodUID) || !f.Present.Has(flow.DestinationPodUID) {
		t.Errorf("UIDs %x %x", f.SourcePodUID, f.DestinationPodUID)
	}
}

// IPv6 flows, and IPv4 and IPv4-mapped IPv6 addresses kept apart.
func TestAddressFamilies(t *testing.T) {
	s, k := testStore(Options{})
	v6 := srcRec(0, 10, counts{})
	v6.SourceIP, v6.DestinationIP = netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fd00::7")
	v6.DestinationClusterIP, v6.DestinationServiceIP = netip.MustParseAddr("fd00:96::10"), netip.Addr{}
	v6.FlowType = flow.FlowTypeIntraNode
	mapped := srcRec(0, 10, counts{})
	mapped.SourceIP, mapped.DestinationIP = netip.AddrFrom16(clientIP.As16()), netip.AddrFrom16(serverIP.As16())
	mapped.FlowType = flow.FlowTypeIntraNode
	v4 := srcRec(0, 10, counts{})
	v4.FlowType = flow.FlowTypeIntraNode
	for _, f := range []*flow.Flow{v6, mapped, v4} {
		s.Add(at(10), f, k.emit)
	}
	if s.Len() != 3 {
		t.Fatalf("%d flows, want 3", s.Len())
	}
	s.Tick(at(11), k.emit)
	got := map[netip.Addr]*flow.Flow{}
	for _, f := range k.take() {
		got[f.SourceIP] = f
	}
	for _, want := range []*flow.Flow{v6, mapped, v4} {
		f := got[want.SourceIP]
		if f == nil || f.DestinationIP != want.DestinationIP || f.DestinationClusterIP != want.DestinationClusterIP ||
			f.DestinationServiceIP != want.DestinationServiceIP || f.IsIPv6() != want.IsIPv6() {
			t.Errorf("%v: got %+v", want.SourceIP, f)
		}
	}
}
