package ipfixmap_test

import (
	"bytes"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

func table(t testing.TB) *ipfixmap.Table {
	t.Helper()
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// fullFlow sets every field an agent sends, with distinct values.
func fullFlow(family int) flow.Flow {
	src, dst := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.7")
	svc, snat := netip.MustParseAddr("10.96.0.12"), netip.MustParseAddr("172.18.0.3")
	if family == 6 {
		src, dst = netip.MustParseAddr("fd00:10:244:1::5"), netip.MustParseAddr("fd00:10:244:2::7")
		svc, snat = netip.MustParseAddr("fd00:10:96::12"), netip.MustParseAddr("fd00:172:18::3")
	}
	return flow.Flow{
		StartTime: time.Unix(1767225600, 0).UTC(), EndTime: time.Unix(1767225660, 0).UTC(), EndReason: 2,
		SourceIP: src, DestinationIP: dst, Protocol: 6, SourcePort: 41000, DestinationPort: 8080,
		TCPState: "ESTABLISHED",
		Stats:    flow.Stats{PacketTotalCount: 11, PacketDeltaCount: 12, OctetTotalCount: 13, OctetDeltaCount: 14},
		ReverseStats: flow.Stats{PacketTotalCount: 21, PacketDeltaCount: 22, OctetTotalCount: 23,
			OctetDeltaCount: 24},
		FlowType:           flow.FlowTypeInterNode,
		SourcePodNamespace: "shop", SourcePodName: "cart-1", SourceNodeName: "node-a",
		DestinationPodNamespace: "shop", DestinationPodName: "db-0", DestinationNodeName: "node-b",
		DestinationClusterIP: svc, DestinationServiceIP: svc, DestinationServicePort: 5432,
		DestinationServicePortName: "shop/db:pg",
		Ingress:                    flow.Policy{Type: 1, Namespace: "shop", Name: "allow-db", RuleName: "r1", RuleAction: flow.ActionAllow},
		Egress:                     flow.Policy{Type: 3, Namespace: "", Name: "acnp-egress", RuleName: "r9", RuleAction: flow.ActionAllow},
		EgressName:                 "egress-prod", EgressIP: netip.MustParseAddr("192.0.2.10"), EgressNodeName: "node-c",
		AppProtocolName: "http", HTTPVals: "{\"0\":\"GET /\"}",
		ProxySnatIP: snat, ProxySnatPort: 61000,
	}
}

// agentMessages encodes f as an agent of the given version would send it.
func agentMessages(t *testing.T, tb *ipfixmap.Table, version string, family int, f *flow.Flow, tmplID uint16) [][]byte {
	t.Helper()
	names, err := ipfixmap.AgentElements(version, family)
	if err != nil {
		t.Fatal(err)
	}
	els, err := tb.Elements(names)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ipfixmap.TemplateOf(tmplID, els)
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	enc.AddTemplate(1, tmpl)
	if err := ipfixmap.WriteRecord(enc.Begin(1, tmpl), els, f); err != nil {
		t.Fatal(err)
	}
	enc.Flush()
	return msgs
}

func normalizeAll(t *testing.T, n *ipfixmap.Normalizer, d *ipfix.Decoder, msgs [][]byte) ([]flow.Flow, []ipfixmap.Skew) {
	t.Helper()
	var out []flow.Flow
	var skews []ipfixmap.Skew
	for _, m := range msgs {
		if err := d.Reset(m, time.Now()); err != nil {
			t.Fatal(err)
		}
		for d.Next() {
			var f flow.Flow
			skews = append(skews, n.Normalize(d.Record(), &f))
			out = append(out, f)
		}
		if err := d.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out, skews
}

func TestAgentElementCounts(t *testing.T) {
	want := map[string]int{"v1.13": 39, "v1.15": 41, "v2.0": 42, "v2.6": 40, "v2.7": 43}
	for v, n := range want {
		for _, fam := range []int{4, 6} {
			names, err := ipfixmap.AgentElements(v, fam)
			if err != nil || len(names) != n {
				t.Errorf("%s IPv%d: %d elements (%v), want %d", v, fam, len(names), err, n)
			}
		}
	}
	v20, _ := ipfixmap.AgentElements("v2.0", 4)
	if i, j := slices.Index(v20, "egressNodeName"), slices.Index(v20, "destinationClusterIPv4"); i < 0 || i > j {
		t.Errorf("v2.0: egressNodeName at %d must come before destinationClusterIPv4 at %d", i, j)
	}
	if n := len(ipfixmap.ExportElements(4, ipfixmap.ExportOptions{Names: true, Proxy: true})); n != 50 {
		t.Errorf("Proxy export has %d elements, want 50", n)
	}
	if n := len(ipfixmap.ExportElements(4, ipfixmap.ExportOptions{Names: true, Aggregate: true})); n != 70 {
		t.Errorf("Aggregate export has %d elements, want 70", n)
	}
}

// TestSkewMatrix sends each agent version's element set, reusing one
// template ID across versions in one session, and checks every element
// sent arrives with its value and the rest stays unset.
func TestSkewMatrix(t *testing.T) {
	tb := table(t)
	for _, family := range []int{4, 6} {
		n := ipfixmap.NewNormalizer(tb)
		d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
		want := fullFlow(family)
		for _, v := range ipfixmap.AgentVersions() {
			got, skews := normalizeAll(t, n, d, agentMessages(t, tb, v, family, &want, 256))
			if len(got) != 1 {
				t.Fatalf("%s: %d records", v, len(got))
			}
			names, _ := ipfixmap.AgentElements(v, family)
			newest, _ := ipfixmap.AgentElements(ipfixmap.NewestAgent, family)
			missing := 0
			for _, name := range newest {
				if !slices.Contains(names, name) {
					missing++
				}
			}
			if skews[0] != (ipfixmap.Skew{Missing: missing}) {
				t.Errorf("%s IPv%d: skew %+v, want %d missing", v, family, skews[0], missing)
			}
			f := got[0]
			for _, name := range names {
				el, _ := tb.ByName(name)
				if !f.Present.Has(el.Field) {
					t.Errorf("%s IPv%d: %s sent but not present", v, family, name)
				}
			}
			if !f.Present.Has(flow.EgressNodeName) != (v == "v1.13" || v == "v1.15") {
				t.Errorf("%s: egressNodeName presence wrong", v)
			}
			if f.Present.Has(flow.DestinationServiceIP) != (v == "v2.7") {
				t.Errorf("%s: destinationServiceIP presence wrong", v)
			}
			// Values: compare what was sent, field by field, via a
			// copy of want with unsent fields cleared.
			exp := want
			if v != "v2.7" {
				exp.DestinationServiceIP, exp.ProxySnatIP, exp.ProxySnatPort = netip.Addr{}, netip.Addr{}, 0
			}
			if v == "v1.13" || v == "v1.15" {
				exp.EgressNodeName = ""
			}
			if v != "v1.15" && v != "v2.0" {
				exp.AppProtocolName, exp.HTTPVals = "", ""
			}
			f.Present = flow.Fields{}
			if !equalFlows(f, exp) {
				t.Errorf("%s IPv%d:\n got %+v\nwant %+v", v, family, f, exp)
			}
		}
	}
}

func equalFlows(a, b flow.Flow) bool {
	a.Present, b.Present = flow.Fields{}, flow.Fields{}
	ua, ub := a.Unknown, b.Unknown
	a.Unknown, b.Unknown = nil, nil
	if len(ua) != len(ub) {
		return false
	}
	for i := range ua {
		if ua[i].EnterpriseID != ub[i].EnterpriseID || ua[i].ID != ub[i].ID || !bytes.Equal(ua[i].Value, ub[i].Value) {
			return false
		}
	}
	return reflect.DeepEqual(a, b)
}

// TestFutureExporterAndPassThrough: a newer agent sends elements the
// aggregator lacks; they are kept raw, and a proxy passes them on.
func TestFutureExporterAndPassThrough(t *testing.T) {
	tb := table(t)
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	future := []ipfix.Field{}
	for _, el := range els {
		future = append(future, ipfix.Field{IE: el.IE})
	}
	extra := []*ipfix.InfoElement{
		{Name: "antrea173", EnterpriseID: ipfix.EnterpriseAntrea, ID: 173, Type: ipfix.String},
		{Name: "antrea174", EnterpriseID: ipfix.EnterpriseAntrea, ID: 174, Type: ipfix.Unsigned32},
		{Name: "vendorX", EnterpriseID: 4242, ID: 9, Type: ipfix.OctetArray, Length: 3},
	}
	for _, ie := range extra {
		future = append(future, ipfix.Field{IE: ie})
	}
	tmpl, err := ipfix.NewTemplate(256, future)
	if err != nil {
		t.Fatal(err)
	}
	want := fullFlow(4)
	var msgs [][]byte
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	enc.AddTemplate(1, tmpl)
	b := ipfixmap.PutValues(enc.Begin(1, tmpl), els, &want) // the known part, then the extras
	if err := b.String("new-in-v2.8").Uint(77).Bytes([]byte{1, 2, 3}).End(); err != nil {
		t.Fatal(err)
	}
	enc.Flush()
	n := ipfixmap.NewNormalizer(tb)
	got, skews := normalizeAll(t, n, ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{})), msgs)
	if skews[0] != (ipfixmap.Skew{Unknown: 3}) {
		t.Fatalf("skew %+v, want 3 unknown", skews[0])
	}
	f := got[0]
	if len(f.Unknown) != 3 || string(f.Unknown[0].Value) != "new-in-v2.8" || f.Unknown[2].EnterpriseID != 4242 {
		t.Fatalf("unknown elements %+v", f.Unknown)
	}
	if f.SourcePodName != want.SourcePodName || f.ProxySnatPort != want.ProxySnatPort {
		t.Fatalf("known fields lost: %+v", f)
	}

	// Proxy export with pass-through: the extras reach the collector.
	f.Origin = flow.Origin{ObservationDomainID: 99, Exporter: netip.MustParseAddr("192.0.2.1")}
	f.FlowDirection = flow.DirectionEgress
	ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, 300)
	if err != nil {
		t.Fatal(err)
	}
	out, isNew, err := ex.Template(&f)
	if err != nil || !isNew || len(out.Fields) != 53 {
		t.Fatalf("template: %v new=%v fields=%d", err, isNew, len(out.Fields))
	}
	var outMsgs [][]byte
	oenc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { outMsgs = append(outMsgs, bytes.Clone(m)); return nil })
	for _, tt := range ex.Templates() {
		oenc.AddTemplate(7, tt)
	}
	if err := ex.Write(oenc.Begin(7, out), out, &f); err != nil {
		t.Fatal(err)
	}
	oenc.Flush()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	if err := d.Reset(outMsgs[0], time.Now()); err != nil {
		t.Fatal(err)
	}
	if !d.Next() {
		t.Fatal(d.Err())
	}
	r := d.Record()
	check := func(pen uint32, id uint16, want []byte) {
		t.Helper()
		i := r.Template.Index(pen, id)
		if i < 0 || !bytes.Equal(r.Bytes(i), want) {
			t.Errorf("element %d:%d = %x, want %x", pen, id, r.Bytes(i), want)
		}
	}
	check(ipfix.EnterpriseAntrea, 173, []byte("new-in-v2.8"))
	check(ipfix.EnterpriseAntrea, 174, []byte{0, 0, 0, 77})
	check(4242, 9, []byte{1, 2, 3})
	check(0, 405, []byte{0, 0, 0, 99})
	check(0, 403, []byte{192, 0, 2, 1})
	check(0, 404, make([]byte, 16))
	check(0, 61, []byte{1})
	check(ipfix.EnterpriseAntrea, 101, []byte("cart-1"))

	// Without pass-through the base template is used.
	ex2, _ := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, false, 300)
	if out2, _, _ := ex2.Template(&f); len(out2.Fields) != 50 {
		t.Errorf("no pass-through: %d fields", len(out2.Fields))
	}
}

func TestRoundTripAllExportFields(t *testing.T) {
	tb := table(t)
	for _, family := range []int{4, 6} {
		want := fullFlow(family)
		want.ClusterID = "c-1"
		want.SourcePodLabels, want.DestinationPodLabels = `{"app":"cart"}`, "{}"
		want.SourcePodUID = flow.UID{1, 2, 3}
		want.EgressUID = flow.UID{9}
		want.AppProtocolName, want.HTTPVals = "", ""
		want.FlowDirection = flow.DirectionIngress
		ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, UIDs: true, Proxy: true}, true, 256)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, _, _ := ex.Template(&want)
		var msgs [][]byte
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
		enc.AddTemplate(1, tmpl)
		if err := ex.Write(enc.Begin(1, tmpl), tmpl, &want); err != nil {
			t.Fatal(err)
		}
		enc.Flush()
		got, _ := normalizeAll(t, ipfixmap.NewNormalizer(tb), ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{})), msgs)
		if !equalFlows(got[0], want) {
			t.Errorf("IPv%d:\n got %+v\nwant %+v", family, got[0], want)
		}
	}
}

func TestNormalizeAllocations(t *testing.T) {
	tb := table(t)
	want := fullFlow(4)
	msgs := agentMessages(t, tb, "v2.7", 4, &want, 256)
	n := ipfixmap.NewNormalizer(tb)
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	normalizeAll(t, n, d, msgs)
	var f flow.Flow
	allocs := testing.AllocsPerRun(100, func() {
		d.Reset(msgs[0], time.Now())
		for d.Next() {
			f = flow.Flow{}
			n.Normalize(d.Record(), &f)
		}
	})
	if allocs != 0 {
		t.Errorf("normalizing a known record allocates %.1f times", allocs)
	}
}

func TestAggregateExportCarriesPerNodeView(t *testing.T) {
	tb := table(t)
	ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Aggregate: true}, false, 256)
	if err != nil {
		t.Fatal(err)
	}
	f := fullFlow(4)
	f.Aggregation = &flow.Aggregation{StatsFromSource: flow.Stats{OctetDeltaCount: 111}, ThroughputFromDestination: 222,
		EndFromSource: time.Unix(1767225700, 0).UTC()}
	tmpl, _, _ := ex.Template(&f)
	if len(tmpl.Fields) != 70 {
		t.Fatalf("%d fields", len(tmpl.Fields))
	}
	var msgs [][]byte
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	enc.AddTemplate(1, tmpl)
	if err := ex.Write(enc.Begin(1, tmpl), tmpl, &f); err != nil {
		t.Fatal(err)
	}
	f.Aggregation = nil // a record that was not aggregated writes zeros
	if err := ex.Write(enc.Begin(1, tmpl), tmpl, &f); err != nil {
		t.Fatal(err)
	}
	enc.Flush()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	d.Reset(msgs[0], time.Now())
	reg := ipfix.DefaultRegistry()
	want := []map[string]uint64{
		{"octetDeltaCountFromSourceNode": 111, "throughputFromDestinationNode": 222, "flowEndSecondsFromSourceNode": 1767225700},
		{"octetDeltaCountFromSourceNode": 0, "throughputFromDestinationNode": 0, "flowEndSecondsFromSourceNode": 0},
	}
	for n := 0; d.Next(); n++ {
		r := d.Record()
		for name, v := range want[n] {
			i := r.Template.IndexOf(reg.MustByName(name))
			var got uint64
			if r.Field(i).Type.IsTime() {
				tm, _ := r.Time(i)
				got = uint64(tm.Unix())
			} else {
				got, _ = r.Uint(i)
			}
			if got != v {
				t.Errorf("record %d %s = %d, want %d", n, name, got, v)
			}
		}
	}
}

// TestLegacyL7PassThrough: a v1.15 agent's L7 elements are no longer in
// the export template; with pass-through they still reach the collector.
func TestLegacyL7PassThrough(t *testing.T) {
	tb := table(t)
	want := fullFlow(4)
	got, _ := normalizeAll(t, ipfixmap.NewNormalizer(tb), ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{})),
		agentMessages(t, tb, "v1.15", 4, &want, 256))
	f := got[0]
	for _, pass := range []bool{true, false} {
		ex, _ := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, pass, 256)
		tmpl, _, err := ex.Template(&f)
		if err != nil {
			t.Fatal(err)
		}
		var msgs [][]byte
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
		enc.AddTemplate(1, tmpl)
		if err := ex.Write(enc.Begin(1, tmpl), tmpl, &f); err != nil {
			t.Fatal(err)
		}
		enc.Flush()
		out, _ := normalizeAll(t, ipfixmap.NewNormalizer(tb), ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{})), msgs)
		if pass && (out[0].AppProtocolName != "http" || out[0].HTTPVals != want.HTTPVals || len(tmpl.Fields) != 52) {
			t.Errorf("pass-through: %q %q, %d fields", out[0].AppProtocolName, out[0].HTTPVals, len(tmpl.Fields))
		}
		if !pass && (out[0].Present.Has(flow.AppProtocolName) || len(tmpl.Fields) != 50) {
			t.Errorf("no pass-through still carried L7 (%d fields)", len(tmpl.Fields))
		}
	}
	// A v2.7 record (no L7) keeps the plain template.
	ex, _ := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, 256)
	g := fullFlow(4)
	if tmpl, _, _ := ex.Template(&g); len(tmpl.Fields) != 50 {
		t.Errorf("record without L7: %d fields", len(tmpl.Fields))
	}
}
