package aggregate

import (
	"net/netip"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
)

// t0 is the start of every test flow.
var t0 = time.Unix(1_750_000_000, 0).UTC()

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// The connection of most tests: Pod client (node-1) to Pod server (node-2)
// through Service ns-b/web; the 5-tuple's destination is the endpoint
// (the reply tuple's source), as agents report it.
var (
	clientIP   = netip.MustParseAddr("10.0.1.5")
	serverIP   = netip.MustParseAddr("10.0.2.7")
	clusterIP  = netip.MustParseAddr("10.96.0.10")
	externalIP = netip.MustParseAddr("203.0.113.9")
	snatIP     = netip.MustParseAddr("10.0.0.1")
)

const (
	clientUID = "11111111-1111-1111-1111-111111111111"
	serverUID = "22222222-2222-2222-2222-222222222222"
	node1UID  = "33333333-3333-3333-3333-333333333333"
	node2UID  = "44444444-4444-4444-4444-444444444444"
	svcUID    = "55555555-5555-5555-5555-555555555555"
)

// counts are a record's counters: totals and deltas, forward and reverse.
type counts struct{ pkts, octets, dpkts, doctets, rpkts, roctets, rdpkts, rdoctets uint64 }

func (c counts) apply(f *flow.Flow) {
	f.Stats = flow.Stats{PacketTotalCount: c.pkts, OctetTotalCount: c.octets, PacketDeltaCount: c.dpkts, OctetDeltaCount: c.doctets}
	f.ReverseStats = flow.Stats{PacketTotalCount: c.rpkts, OctetTotalCount: c.roctets, PacketDeltaCount: c.rdpkts, OctetDeltaCount: c.rdoctets}
}

// base is a record of the test connection with the given times and counters,
// no Kubernetes fields.
func base(start, end int, c counts) *flow.Flow {
	f := &flow.Flow{
		StartTime: at(start), EndTime: at(end), EndReason: 2,
		SourceIP: clientIP, DestinationIP: serverIP, Protocol: 6, SourcePort: 40000, DestinationPort: 8080,
		TCPState: "ESTABLISHED", FlowType: flow.FlowTypeInterNode,
	}
	c.apply(f)
	return f
}

// srcRec is the source Node's record: the client Pod, the Service, the
// egress policy.
func srcRec(start, end int, c counts) *flow.Flow {
	f := base(start, end, c)
	f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = "ns-a", "client", "node-1"
	f.DestinationClusterIP, f.DestinationServiceIP = clusterIP, clusterIP
	f.DestinationServicePort, f.DestinationServicePortName = 80, "ns-b/web:http"
	f.Egress = flow.Policy{Type: 2, Namespace: "ns-a", Name: "allow-out", RuleName: "r1", RuleAction: flow.ActionAllow}
	return mark(f)
}

// dstRec is the destination Node's record: the server Pod, the ingress
// policy.
func dstRec(start, end int, c counts) *flow.Flow {
	f := base(start, end, c)
	f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "ns-b", "server", "node-2"
	f.Ingress = flow.Policy{Type: 3, Name: "allow-in", RuleName: "r2", RuleAction: flow.ActionAllow}
	return mark(f)
}

// mark sets the presence bit of every field with a non-zero value, as the
// normalizer does for the elements a record carries, plus the counters.
func mark(f *flow.Flow) *flow.Flow {
	set := func(fl flow.Field, ok bool) {
		if ok {
			f.Present.Set(fl)
		}
	}
	set(flow.StartTime, !f.StartTime.IsZero())
	set(flow.EndTime, !f.EndTime.IsZero())
	set(flow.EndReason, f.EndReason != 0)
	set(flow.SourceIP, f.SourceIP.IsValid())
	set(flow.DestinationIP, f.DestinationIP.IsValid())
	for _, fl := range []flow.Field{flow.Protocol, flow.SourcePort, flow.DestinationPort, flow.FlowType,
		flow.PacketTotalCount, flow.PacketDeltaCount, flow.OctetTotalCount, flow.OctetDeltaCount,
		flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount, flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount} {
		f.Present.Set(fl)
	}
	set(flow.TCPState, f.TCPState != "")
	set(flow.SourcePodNamespace, f.SourcePodNamespace != "")
	set(flow.SourcePodName, f.SourcePodName != "")
	set(flow.SourceNodeName, f.SourceNodeName != "")
	set(flow.DestinationPodNamespace, f.DestinationPodNamespace != "")
	set(flow.DestinationPodName, f.DestinationPodName != "")
	set(flow.DestinationNodeName, f.DestinationNodeName != "")
	set(flow.DestinationClusterIP, f.DestinationClusterIP.IsValid())
	set(flow.DestinationServiceIP, f.DestinationServiceIP.IsValid())
	set(flow.DestinationServicePort, f.DestinationServicePort != 0)
	set(flow.DestinationServicePortName, f.DestinationServicePortName != "")
	set(flow.IngressPolicyName, f.Ingress.Name != "")
	set(flow.IngressPolicyNamespace, f.Ingress.Namespace != "")
	set(flow.IngressPolicyType, f.Ingress.Type != 0)
	set(flow.IngressPolicyRuleName, f.Ingress.RuleName != "")
	set(flow.IngressPolicyRuleAction, f.Ingress.RuleAction != 0)
	set(flow.EgressPolicyName, f.Egress.Name != "")
	set(flow.EgressPolicyNamespace, f.Egress.Namespace != "")
	set(flow.EgressPolicyType, f.Egress.Type != 0)
	set(flow.EgressPolicyRuleName, f.Egress.RuleName != "")
	set(flow.EgressPolicyRuleAction, f.Egress.RuleAction != 0)
	set(flow.EgressName, f.EgressName != "")
	set(flow.EgressIP, f.EgressIP.IsValid())
	set(flow.ProxySnatIP, f.ProxySnatIP.IsValid())
	set(flow.ProxySnatPort, f.ProxySnatPort != 0)
	return f
}

// pods is an enrich store knowing both Pods, their Nodes and the Service.
func pods() enrich.Store {
	return enrich.NewStatic([]enrich.Pod{
		{Namespace: "ns-a", Name: "client", UID: clientUID, NodeName: "node-1", Labels: map[string]string{"app": "client"},
			IPs: []netip.Addr{clientIP}, Created: t0.Add(-time.Hour)},
		{Namespace: "ns-b", Name: "server", UID: serverUID, NodeName: "node-2",
			IPs: []netip.Addr{serverIP}, Created: t0.Add(-time.Hour)},
	}, []enrich.Node{{Name: "node-1", UID: node1UID}, {Name: "node-2", UID: node2UID}},
		[]enrich.Service{{Namespace: "ns-b", Name: "web", UID: svcUID, ClusterIPs: []netip.Addr{clusterIP}}})
}

// sink collects exported records.
type sink struct{ got []*flow.Flow }

func (k *sink) emit(f *flow.Flow) { k.got = append(k.got, f) }

// take returns and forgets what was collected.
func (k *sink) take() []*flow.Flow {
	g := k.got
	k.got = nil
	return g
}

// one expects exactly one exported record.
func one(t *testing.T, got []*flow.Flow) *flow.Flow {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("exported %d records, want 1: %+v", len(got), got)
	}
	if got[0].Aggregation == nil {
		t.Fatal("exported record has no Aggregation")
	}
	return got[0]
}

func none(t *testing.T, got []*flow.Flow) {
	t.Helper()
	if len(got) != 0 {
		t.Fatalf("exported %d records, want none: first %+v", len(got), *got[0])
	}
}

// testStore is a Store with the default timeouts and a sink.
func testStore(o Options) (*Store, *sink) {
	if o.ActiveTimeout == 0 {
		o.ActiveTimeout = 60 * time.Second
	}
	if o.InactiveTimeout == 0 {
		o.InactiveTimeout = 90 * time.Second
	}
	return New(o), &sink{}
}

func stats(s flow.Stats) [4]uint64 {
	return [4]uint64{s.PacketTotalCount, s.OctetTotalCount, s.PacketDeltaCount, s.OctetDeltaCount}
}

func checkStats(t *testing.T, what string, got flow.Stats, want [4]uint64) {
	t.Helper()
	if g := stats(got); g != want {
		t.Errorf("%s: got {total pkts %d, octets %d; delta pkts %d, octets %d}, want %v", what, g[0], g[1], g[2], g[3], want)
	}
}
