package record

import (
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/source"
	"sluice/flow"
)

// TestFlow checks the flow.Flow a record stands for: values and presence
// bits, only the verdict's parts that Attr names, and Full as it is.
func TestFlow(t *testing.T) {
	v := &attribution.Verdict{Egress: flow.Policy{Type: 1, Namespace: "a", Name: "out", RuleAction: flow.ActionAllow},
		Ingress:    flow.Policy{Type: 3, Name: "deny", RuleName: "r", RuleAction: flow.ActionDrop},
		EgressName: "eg", EgressIP: netip.MustParseAddr("192.168.0.9"), EgressNode: "node-2"}
	r := Record{Start: 1e18, End: 1e18 + 5e9, Src: AddrFrom(netip.MustParseAddr("10.0.0.1")), Dst: AddrFrom(netip.MustParseAddr("10.0.1.1")),
		SrcPort: 4000, DstPort: 80, Proto: source.ProtoTCP, EndReason: 2, TCPState: source.TCPEstablished, FlowType: 2,
		Counts: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8}, Meta: &Meta{Node: "node-1", SrcPod: &enrich.Pod{Namespace: "a", Name: "client"}},
		Verdict: v, Attr: AttrIngressPolicy}
	var f flow.Flow
	r.Flow(&f)
	if !f.StartTime.Equal(time.Unix(0, 1e18)) || f.EndTime.Sub(f.StartTime) != 5*time.Second || f.TCPState != "ESTABLISHED" ||
		f.Stats != (flow.Stats{PacketTotalCount: 1, OctetTotalCount: 2, PacketDeltaCount: 3, OctetDeltaCount: 4}) ||
		f.ReverseStats != (flow.Stats{PacketTotalCount: 5, OctetTotalCount: 6, PacketDeltaCount: 7, OctetDeltaCount: 8}) {
		t.Fatalf("tuple, times or counters: %+v", f)
	}
	if f.SourcePodName != "client" || f.SourceNodeName != "node-1" || f.DestinationNodeName != "" || f.Present.Has(flow.DestinationPodName) {
		t.Errorf("Pods: %q on %q, destination %q", f.SourcePodName, f.SourceNodeName, f.DestinationNodeName)
	}
	if f.Ingress != v.Ingress || !f.Present.Has(flow.IngressPolicyRuleAction) || f.Egress != (flow.Policy{}) ||
		f.Present.Has(flow.EgressPolicyName) || f.EgressName != "" || f.Present.Has(flow.EgressIP) {
		t.Errorf("only the ingress policy was to be written: %+v %+v %q", f.Ingress, f.Egress, f.EgressName)
	}
	if f.Present.Has(flow.ProxySnatIP) || f.Present.Has(flow.DestinationServicePortName) {
		t.Error("SNAT or Service fields without SNAT or Service")
	}
	if !r.Denied() {
		t.Error("a record naming a Drop rule is not Denied")
	}
	r.Attr = AttrEgressPolicy | AttrEgress
	m := *r.Meta
	m.SnatIP, m.SnatPort = netip.MustParseAddr("192.168.0.1"), 61000
	r.Meta = &m
	r.Flow(&f)
	if f.Ingress != (flow.Policy{}) || f.Egress != v.Egress || f.EgressIP != v.EgressIP || f.EgressNodeName != "node-2" ||
		f.ProxySnatIP != m.SnatIP || f.ProxySnatPort != 61000 || r.Denied() {
		t.Errorf("egress parts and SNAT: %+v", f)
	}
	if r.IsIPv6() {
		t.Error("an IPv4 record is IPv6")
	}
	m.SnatIP = netip.MustParseAddr("fd00::1")
	if !r.IsIPv6() {
		t.Error("an IPv6 SNAT address does not make the record IPv6")
	}
	full := Full(&flow.Flow{SourcePort: 9, Ingress: flow.Policy{RuleAction: flow.ActionReject}})
	full.Flow(&f)
	if f.SourcePort != 9 || !full.Denied() {
		t.Errorf("Full record: %+v", f)
	}
	if got := Flows(nil, []Record{r, full}); len(got) != 2 || got[1].SourcePort != 9 || got[0].SourcePort != 4000 {
		t.Errorf("Flows: %+v", got)
	}
}

// TestAddr checks that an Addr gives back the address it was made of,
// family included, and says its family as netip does.
func TestAddr(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "::ffff:10.1.2.3", "fd00::7", "::", "0.0.0.0", "::1"} {
		a := netip.MustParseAddr(s)
		x := AddrFrom(a)
		if x.Addr() != a || !x.IsValid() || x.Is4() != a.Unmap().Is4() || x.Real6() != real6(a) || *x.As16() != a.As16() {
			t.Errorf("%s: back as %v, Is4 %v, Real6 %v", s, x.Addr(), x.Is4(), x.Real6())
		}
		if y := AddrFrom16(a.As16(), a.Is4()); y != x {
			t.Errorf("%s: AddrFrom16 %+v, AddrFrom %+v", s, y, x)
		}
	}
	if x := AddrFrom(netip.Addr{}); x.IsValid() || x.Addr().IsValid() {
		t.Error("the zero netip.Addr is an Addr")
	}
}

// TestRecordSize keeps the record small: the exporter copies every
// record of a cycle several times.
func TestRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(Record{}); n > 144 {
		t.Errorf("a Record is %d octets", n)
	}
}

// TestSet16 checks that Set16 makes the address AddrFrom16 does, over
// an address of the other family.
func TestSet16(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "::ffff:10.1.2.3", "fd00::1", "::"} {
		a := netip.MustParseAddr(s)
		b := a.As16()
		four := a.Is4()
		for _, over := range []Addr{{}, AddrFrom(netip.MustParseAddr("fd00::9")), AddrFrom(netip.MustParseAddr("192.168.0.1"))} {
			got := over
			got.Set16(&b, four)
			if got != AddrFrom16(b, four) || got.Addr() != a {
				t.Errorf("Set16(%s) over %v: %v", s, over.Addr(), got.Addr())
			}
		}
	}
}
