package flowproto_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// roundTrip sends f through FromFlow, the wire and ToFlow.
func roundTrip(t *testing.T, f *flow.Flow) (*flow.Flow, int) {
	t.Helper()
	p, err := flowproto.FromFlow(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q flowpb.Flow
	if err := proto.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	var g flow.Flow
	n, err := flowproto.ToFlow(&q, &g)
	if err != nil {
		t.Fatal(err)
	}
	return &g, n
}

// withoutClusterID is f as it comes back: the Protobuf Flow has no
// cluster ID.
func withoutClusterID(f *flow.Flow) *flow.Flow {
	g := *f
	g.ClusterID = ""
	g.Present.Clear(flow.ClusterID)
	return &g
}

func TestRoundTripEveryField(t *testing.T) {
	for _, agg := range []bool{false, true} {
		f := flowtest.Full(7, agg)
		f.Origin.ExportTime = time.Unix(1_790_000_000, 0).UTC()
		f.Origin.SequenceNumber = 42
		f.Origin.ObservationDomainID = 0xabcdef
		f.Origin.Exporter = netip.MustParseAddr("192.0.2.9")
		g, n := roundTrip(t, f)
		if n != 0 {
			t.Errorf("unknown fields: %d", n)
		}
		if want := withoutClusterID(f); !reflect.DeepEqual(g, want) {
			t.Errorf("agg=%v: round trip changed the record:\n got %+v\nwant %+v", agg, g, want)
		}
	}
}

func TestRoundTripIPv6(t *testing.T) {
	f := flowtest.Full(1, false)
	f.SourceIP = netip.MustParseAddr("fd00::1")
	f.DestinationIP = netip.MustParseAddr("fd00::2")
	f.DestinationClusterIP = netip.MustParseAddr("fd00:96::10")
	f.DestinationServiceIP = netip.MustParseAddr("fd00:96::11")
	f.EgressIP = netip.MustParseAddr("fd00:18::5")
	f.ProxySnatIP = netip.MustParseAddr("fd00:168::7")
	g, _ := roundTrip(t, f)
	if want := withoutClusterID(f); !reflect.DeepEqual(g, want) {
		t.Errorf("round trip changed the record:\n got %+v\nwant %+v", g, want)
	}
	p, _ := flowproto.FromFlow(f)
	if p.GetIp().GetVersion() != flowpb.IPVersion_IP_VERSION_6 {
		t.Errorf("ip.version %v", p.GetIp().GetVersion())
	}
}

// groups are the fields that come back set with any one of them, because
// their zero is a value and their message is present (see the package
// documentation).
var groups = [][]flow.Field{
	{flow.Protocol, flow.SourcePort, flow.DestinationPort},
	{flow.PacketTotalCount, flow.PacketDeltaCount, flow.OctetTotalCount, flow.OctetDeltaCount},
	{flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount, flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount},
}

var k8sImplied = []flow.Field{flow.FlowType, flow.DestinationServicePort, flow.IngressPolicyType,
	flow.IngressPolicyRuleAction, flow.EgressPolicyType, flow.EgressPolicyRuleAction}

func TestUnsetStaysUnset(t *testing.T) {
	if g, _ := roundTrip(t, &flow.Flow{}); !reflect.DeepEqual(g, &flow.Flow{}) {
		t.Fatalf("an empty record came back as %+v", g)
	}
	full := flowtest.Full(3, false)
	for fl := range flow.ClusterID {
		f := *full
		f.Present = flow.Fields{}
		f.Present.Set(fl)
		g, _ := roundTrip(t, &f)
		if !g.Present.Has(fl) {
			t.Errorf("field %d: lost", fl)
		}
		allowed := flow.Fields{}
		allowed.Set(fl)
		for _, grp := range groups {
			if contains(grp, fl) || (fl == flow.TCPState && contains(grp, flow.Protocol)) {
				for _, x := range grp {
					allowed.Set(x)
				}
			}
		}
		if fl >= flow.FlowType && fl <= flow.EgressUID || fl == flow.DestinationServiceIP {
			for _, x := range k8sImplied {
				allowed.Set(x)
			}
		}
		for x := range flow.ClusterID + 1 {
			if g.Present.Has(x) && !allowed.Has(x) {
				t.Errorf("field %d alone: field %d came back set", fl, x)
			}
		}
	}
}

func contains(s []flow.Field, f flow.Field) bool {
	for _, x := range s {
		if x == f {
			return true
		}
	}
	return false
}

// appendField appends a length-delimited field.
func appendMsg(b []byte, num protowire.Number, inner []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, inner)
}

func TestUnknownFieldsAreCountedAndKept(t *testing.T) {
	p, err := flowproto.FromFlow(flowtest.Full(2, true))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := proto.Marshal(p)
	// A newer exporter: a top-level field 99, a field 200 in k8s, a field 50
	// in aggregation.stats_from_source.
	b = protowire.AppendTag(b, 99, protowire.VarintType)
	b = protowire.AppendVarint(b, 12345)
	b = appendMsg(b, 8, protowire.AppendString(protowire.AppendTag(nil, 200, protowire.BytesType), "new-k8s-thing"))
	b = appendMsg(b, 13, appendMsg(nil, 3, protowire.AppendVarint(protowire.AppendTag(nil, 50, protowire.VarintType), 7)))
	var q flowpb.Flow
	if err := proto.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	var f flow.Flow
	n, err := flowproto.ToFlow(&q, &f)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("counted %d unknown fields, want 3", n)
	}
	if f.SourcePodName != "client-2" || f.Aggregation.StatsFromSource.OctetDeltaCount != 4 {
		t.Errorf("known fields misread: %+v", f)
	}
	// Sent on, they are where they were.
	p2, err := flowproto.FromFlow(&f)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := proto.Marshal(p2)
	var r flowpb.Flow
	if err := proto.Unmarshal(b2, &r); err != nil {
		t.Fatal(err)
	}
	if u := r.ProtoReflect().GetUnknown(); len(u) == 0 {
		t.Error("top-level unknown field lost")
	}
	if u := r.GetK8S().ProtoReflect().GetUnknown(); !strings.Contains(string(u), "new-k8s-thing") {
		t.Errorf("k8s unknown field lost: %q", u)
	}
	if u := r.GetAggregation().GetStatsFromSource().ProtoReflect().GetUnknown(); len(u) == 0 {
		t.Error("aggregation.stats_from_source unknown field lost")
	}
	var f2 flow.Flow
	if n, _ := flowproto.ToFlow(&r, &f2); n != 3 {
		t.Errorf("second hop counted %d unknown fields, want 3", n)
	}
}

func TestBadValuesAreErrors(t *testing.T) {
	for name, mod := range map[string]func(p *flowpb.Flow){
		"short address":   func(p *flowpb.Flow) { p.Ip.Source = []byte{1, 2, 3} },
		"version":         func(p *flowpb.Flow) { p.Ip.Version = flowpb.IPVersion_IP_VERSION_6 },
		"port":            func(p *flowpb.Flow) { p.Transport.SourcePort = 70000 },
		"protocol":        func(p *flowpb.Flow) { p.Transport.ProtocolNumber = 300 },
		"uid":             func(p *flowpb.Flow) { p.K8S.SourcePodUid = "not-a-uid" },
		"timestamp":       func(p *flowpb.Flow) { p.StartTs.Nanos = 2e9 },
		"enum":            func(p *flowpb.Flow) { p.K8S.FlowType = 1000 },
		"direction":       func(p *flowpb.Flow) { p.FlowDirection = -1 },
		"service ip":      func(p *flowpb.Flow) { p.K8S.DestinationServiceIp = make([]byte, 5) },
		"aggregation end": func(p *flowpb.Flow) { p.Aggregation.EndTsFromSource.Seconds = 1 << 62 },
	} {
		p, err := flowproto.FromFlow(flowtest.Full(1, true))
		if err != nil {
			t.Fatal(err)
		}
		mod(p)
		var f flow.Flow
		if _, err := flowproto.ToFlow(p, &f); err == nil || !strings.HasPrefix(err.Error(), "flowproto: ") {
			t.Errorf("%s: err %v", name, err)
		}
	}
	f := flowtest.Full(1, false)
	f.SourcePodLabels = "[1,2]"
	if _, err := flowproto.FromFlow(f); err == nil {
		t.Error("labels that are not an object: no error")
	}
}

func TestLabels(t *testing.T) {
	f := flowtest.Full(1, false)
	f.SourcePodLabels = "{}"
	f.Present.Clear(flow.DestinationPodLabels)
	f.DestinationPodLabels = ""
	g, _ := roundTrip(t, f)
	if g.SourcePodLabels != "{}" || !g.Present.Has(flow.SourcePodLabels) {
		t.Errorf("empty labels: %q", g.SourcePodLabels)
	}
	if g.DestinationPodLabels != "" || g.Present.Has(flow.DestinationPodLabels) {
		t.Errorf("unknown labels: %q", g.DestinationPodLabels)
	}
}

func TestFormatUID(t *testing.T) {
	const s = "0123abcd-4567-89ef-0a1b-2c3d4e5f6789"
	u, ok := flow.ParseUID(s)
	if !ok || flowproto.FormatUID(u) != s {
		t.Fatalf("%q → %v → %q", s, u, flowproto.FormatUID(u))
	}
}

// TestWireCompatibility decodes a Flow encoded by hand with the field
// numbers of the reference (flowtest.Wire uses protowire, not the
// generated code).
func TestWireCompatibility(t *testing.T) {
	for _, agg := range []bool{false, true} {
		f := flowtest.Full(5, agg)
		f.Origin.ExportTime = time.Unix(1_790_000_000, 0).UTC()
		f.Origin.SequenceNumber = 9
		f.Origin.ObservationDomainID = 77
		f.Origin.Exporter = netip.MustParseAddr("192.0.2.1")
		src, dst := flowtest.FullLabels()
		var p flowpb.Flow
		if err := proto.Unmarshal(flowtest.Wire(f, src, dst), &p); err != nil {
			t.Fatal(err)
		}
		var g flow.Flow
		n, err := flowproto.ToFlow(&p, &g)
		if err != nil || n != 0 {
			t.Fatalf("unknown %d, err %v", n, err)
		}
		if want := withoutClusterID(f); !reflect.DeepEqual(&g, want) {
			t.Errorf("agg=%v:\n got %+v\nwant %+v", agg, &g, want)
		}
	}
}

// An IPv4-mapped address is an IPv4 address: it arrives as one, and it
// leaves as 4 octets unless the other header address is IPv6, when it
// leaves mapped under version 6 (one version covers both).
func TestIPv4Mapped(t *testing.T) {
	m := func(s string) netip.Addr { return netip.AddrFrom16(netip.MustParseAddr(s).As16()) }
	type tc struct {
		name             string
		src, dst         netip.Addr
		version          flowpb.IPVersion
		srcLen, dstLen   int
		wantSrc, wantDst netip.Addr
	}
	for _, c := range []tc{
		{"both mapped", m("10.0.0.1"), m("10.0.0.2"), flowpb.IPVersion_IP_VERSION_4, 4, 4,
			netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")},
		{"mapped and IPv4", m("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), flowpb.IPVersion_IP_VERSION_4, 4, 4,
			netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")},
		{"IPv6 and mapped", netip.MustParseAddr("fd00::1"), m("10.0.0.2"), flowpb.IPVersion_IP_VERSION_6, 16, 16,
			netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.2")},
		{"IPv4 and IPv6", netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::2"), flowpb.IPVersion_IP_VERSION_6, 16, 16,
			netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::2")},
	} {
		f := flowtest.Full(3, false)
		f.SourceIP, f.DestinationIP = c.src, c.dst
		f.DestinationClusterIP = m("10.96.0.10")
		p, err := flowproto.FromFlow(f)
		if err != nil {
			t.Fatal(err)
		}
		ip := p.GetIp()
		if ip.GetVersion() != c.version || len(ip.GetSource()) != c.srcLen || len(ip.GetDestination()) != c.dstLen {
			t.Errorf("%s: version %v, %d and %d octets", c.name, ip.GetVersion(), len(ip.GetSource()), len(ip.GetDestination()))
		}
		if n := len(p.GetK8S().GetDestinationClusterIp()); n != 4 {
			t.Errorf("%s: ClusterIP in %d octets", c.name, n)
		}
		g, _ := roundTrip(t, f)
		if g.SourceIP != c.wantSrc || g.DestinationIP != c.wantDst || g.DestinationClusterIP != netip.MustParseAddr("10.96.0.10") {
			t.Errorf("%s: got %v → %v (ClusterIP %v), want %v → %v", c.name, g.SourceIP, g.DestinationIP, g.DestinationClusterIP, c.wantSrc, c.wantDst)
		}
		b, err := flowproto.AppendFlow(nil, f)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := proto.Marshal(p); len(b) != len(want) {
			t.Errorf("%s: AppendFlow wrote %d octets, FromFlow %d", c.name, len(b), len(want))
		}
	}
}
