package interop_test

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

// proxyScenario is a kind of flow record, chosen so that the Proxy-mode
// flowDirection rule gives each of its answers: egress when the reporting
// Node holds only the source Pod of an inter-Node flow or the flow leaves
// the cluster, ingress when it holds only the destination Pod or the flow
// enters the cluster, unknown otherwise.
type proxyScenario struct {
	name     string
	flowType uint8
	srcPod   bool // the record names the source Pod
	dstPod   bool // the record names the destination Pod
	dir      uint8
}

var proxyScenarios = []proxyScenario{
	{"inter-node, both Pods", flow.FlowTypeInterNode, true, true, flow.DirectionUnknown},
	{"inter-node, source Node's half", flow.FlowTypeInterNode, true, false, flow.DirectionEgress},
	{"inter-node, destination Node's half", flow.FlowTypeInterNode, false, true, flow.DirectionIngress},
	{"to external", flow.FlowTypeToExternal, true, false, flow.DirectionEgress},
	{"from external", flow.FlowTypeFromExternal, false, true, flow.DirectionIngress},
	{"intra-node", flow.FlowTypeIntraNode, true, true, flow.DirectionUnknown},
}

// proxyFutureVersion is an exporter newer than any the aggregator knows:
// the v2.7 element set plus proxyFutureExtras.
const proxyFutureVersion = "future"

// proxyFutureExtras are the elements the future exporter adds: two Antrea
// elements the registry lacks and one of an enterprise nobody knows.
var proxyFutureExtras = []*ipfix.InfoElement{
	{Name: "antreaFuture173", EnterpriseID: ipfix.EnterpriseAntrea, ID: 173, Type: ipfix.String},
	{Name: "antreaFuture174", EnterpriseID: ipfix.EnterpriseAntrea, ID: 174, Type: ipfix.Unsigned32},
	{Name: "vendor4242e9", EnterpriseID: 4242, ID: 9, Type: ipfix.OctetArray, Length: 3},
}

// proxyAddedNames are the elements the aggregator itself fills in Proxy
// mode; no agent sends them.
var proxyAddedNames = []string{
	"sourcePodLabels", "destinationPodLabels", "clusterId",
	"originalObservationDomainId", "originalExporterIPv4Address", "originalExporterIPv6Address", "flowDirection",
}

// proxySkewFlow is a record with every field an agent of any version
// sends set to a distinct, non-zero value, so that a value lost on the
// way cannot pass for an unset one.
func proxySkewFlow(family int, port uint16, sc proxyScenario) flow.Flow {
	n := byte(port)
	src, dst := netip.AddrFrom4([4]byte{10, 244, 1, n}), netip.AddrFrom4([4]byte{10, 244, 2, n})
	svc, clusterIP := netip.MustParseAddr("10.96.0.12"), netip.MustParseAddr("10.96.0.13")
	snat, egressIP := netip.MustParseAddr("172.18.0.3"), netip.MustParseAddr("192.0.2.10")
	if family == 6 {
		src = netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0, 0x2, 0x44, 0, 1, 14: 0, 15: n})
		dst = netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0, 0x2, 0x44, 0, 2, 14: 0, 15: n})
		svc, clusterIP = netip.MustParseAddr("fd00:10:96::12"), netip.MustParseAddr("fd00:10:96::13")
		snat, egressIP = netip.MustParseAddr("fd00:172:18::3"), netip.MustParseAddr("2001:db8::10")
	}
	u := uint64(port)
	f := flow.Flow{
		StartTime: time.Unix(1767225600+int64(port), 0).UTC(), EndTime: time.Unix(1767225660+int64(port), 0).UTC(),
		EndReason: 2, SourceIP: src, DestinationIP: dst, Protocol: 6, SourcePort: port, DestinationPort: 8080,
		TCPState:             "ESTABLISHED",
		Stats:                flow.Stats{PacketTotalCount: 1100 + u, PacketDeltaCount: 1200 + u, OctetTotalCount: 1300 + u, OctetDeltaCount: 1400 + u},
		ReverseStats:         flow.Stats{PacketTotalCount: 2100 + u, PacketDeltaCount: 2200 + u, OctetTotalCount: 2300 + u, OctetDeltaCount: 2400 + u},
		FlowType:             sc.flowType,
		DestinationClusterIP: clusterIP, DestinationServiceIP: svc, DestinationServicePort: 5432,
		DestinationServicePortName: "shop/db:pg",
		Ingress:                    flow.Policy{Type: 1, Namespace: "shop", Name: "allow-db", RuleName: "r1", RuleAction: flow.ActionAllow},
		Egress:                     flow.Policy{Type: 3, Namespace: "ops", Name: "acnp-egress", RuleName: "r9", RuleAction: flow.ActionDrop},
		EgressName:                 "egress-prod", EgressIP: egressIP, EgressNodeName: "node-c",
		AppProtocolName: "http", HTTPVals: `{"0":{"url":"/"}}`,
		ProxySnatIP: snat, ProxySnatPort: 61000,
	}
	if sc.srcPod {
		f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = "shop", fmt.Sprintf("cart-%d", port), "node-a"
	}
	if sc.dstPod {
		f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "shop", fmt.Sprintf("db-%d", port), "node-b"
	}
	return f
}

// proxyExporterTemplate is what one emulated exporter sends for one IP
// family: its template, and the known elements it holds, in order.
type proxyExporterTemplate struct {
	version string
	family  int
	names   []string // known elements, in template order
	els     []*ipfixmap.Element
	tmpl    *ipfix.Template
}

func proxyVersionTemplate(t *testing.T, tb *ipfixmap.Table, version string, family int, id uint16) *proxyExporterTemplate {
	t.Helper()
	base := version
	if version == proxyFutureVersion {
		base = ipfixmap.NewestAgent
	}
	names, err := ipfixmap.AgentElements(base, family)
	if err != nil {
		t.Fatal(err)
	}
	els, err := tb.Elements(names)
	if err != nil {
		t.Fatal(err)
	}
	var fields []ipfix.Field
	for _, el := range els {
		fields = append(fields, ipfix.Field{IE: el.IE})
	}
	if version == proxyFutureVersion {
		for _, ie := range proxyFutureExtras {
			if _, known := ipfix.DefaultRegistry().Lookup(ie.EnterpriseID, ie.ID); known {
				t.Fatalf("element %d:%d is in the registry now; the future exporter needs elements it lacks", ie.EnterpriseID, ie.ID)
			}
			fields = append(fields, ipfix.Field{IE: ie})
		}
	}
	tmpl, err := ipfix.NewTemplate(id, fields)
	if err != nil {
		t.Fatal(err)
	}
	return &proxyExporterTemplate{version: version, family: family, names: names, els: els, tmpl: tmpl}
}

// proxyFutureValues are the values of proxyFutureExtras in the record of
// the given source port.
func proxyFutureValues(port uint16) (s string, u uint32, b []byte) {
	return fmt.Sprintf("new-in-v2.8/%d", port), uint32(port) * 7, []byte{0xf0, byte(port >> 8), byte(port)}
}

// write writes f as a record of the exporter's template.
func (x *proxyExporterTemplate) write(enc *ipfix.Encoder, domain uint32, f *flow.Flow) error {
	b := ipfixmap.PutValues(enc.Begin(domain, x.tmpl), x.els, f)
	if x.version == proxyFutureVersion {
		s, u, o := proxyFutureValues(f.SourcePort)
		b = b.String(s).Uint(uint64(u)).Bytes(o)
	}
	return b.End()
}

// rawValues encodes f alone as the exporter would and decodes it again:
// the raw octets of every element the exporter sends, keyed "pen:id".
func (x *proxyExporterTemplate) rawValues(t *testing.T, f *flow.Flow) map[string][]byte {
	t.Helper()
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	enc.AddTemplate(1, x.tmpl)
	if err := x.write(enc, 1, f); err != nil {
		t.Fatal(err)
	}
	enc.Flush()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	if len(msgs) != 1 || d.Reset(msgs[0], time.Now()) != nil || !d.Next() {
		t.Fatalf("re-decoding a %s record: %d messages, %v", x.version, len(msgs), d.Err())
	}
	return proxyCopyRecord(1, d.Record()).Raw
}

// proxySent is one record an emulated exporter sent, with what the
// collector behind the aggregator must receive for it.
type proxySent struct {
	x    *proxyExporterTemplate
	sc   proxyScenario
	f    flow.Flow
	raw  map[string][]byte // as sent
	port uint16
}

// TestProxySkewMatrix runs, for each collector transport, one exporter
// session that emulates every Antrea agent version in turn (v1.13 to
// v2.7, then a "future" agent with three elements the aggregator does not
// know), all reusing template IDs 256 (IPv4) and 257 (IPv6) with each
// version's definition. The aggregator runs in Proxy mode and forwards
// to a TCP collector stub. Every record must arrive once with the values
// of every element its version sent, zero or empty for the elements it
// did not send, the future elements passed through unchanged, and the
// Proxy-mode elements filled in; the skew metrics must add up to what
// the element lists say.
func TestProxySkewMatrix(t *testing.T) {
	for _, transport := range []string{"tcp", "udp", "tls"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			proxyRunSkewMatrix(t, transport)
		})
	}
}

func proxyRunSkewMatrix(t *testing.T, transport string) {
	const (
		exporterDomain   = 0x00c0ffee
		aggregatorDomain = 77
		clusterID        = "skew-cluster"
	)
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	coll := proxyStartCollector(t)
	dir := t.TempDir()
	tlsKeys := ""
	if transport == "tls" {
		tlsKeys = fmt.Sprintf("\n  tls: {certDir: %s}", filepath.Join(dir, "certs"))
	}
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: %s
clusterID: %s
flowCollector: {enable: true, address: "%s:tcp", observationDomainID: %d}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"%s
`, transport, clusterID, coll.addr, aggregatorDomain, tlsKeys))

	// One transport session for every version.
	var conn net.Conn
	maxMsg := 0
	switch transport {
	case "tcp":
		conn, err = net.Dial("tcp", a.Addrs().IPFIX)
	case "udp":
		conn, err = net.Dial("udp", a.Addrs().UDP)
		maxMsg = 1400
	case "tls":
		var b *certs.Bundle
		if b, err = certs.Ensure(filepath.Join(dir, "certs"), certs.Options{}); err != nil {
			t.Fatal(err)
		}
		conn, err = tls.Dial("tcp", a.Addrs().IPFIX, b.ClientTLS("localhost"))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: maxMsg}, func(m []byte) error {
		_, err := conn.Write(m)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	versions := append(ipfixmap.AgentVersions(), proxyFutureVersion)
	sent := map[uint16]*proxySent{}
	var order []uint16
	wantMissing, futureRecords := 0, 0
	for vi, v := range versions {
		for _, family := range []int{4, 6} {
			id := uint16(256)
			if family == 6 {
				id = 257
			}
			x := proxyVersionTemplate(t, tb, v, family, id)
			if err := enc.AddTemplate(exporterDomain, x.tmpl); err != nil {
				t.Fatal(err)
			}
			newest, _ := ipfixmap.AgentElements(ipfixmap.NewestAgent, family)
			missing := 0
			for _, name := range newest {
				if !slices.Contains(x.names, name) {
					missing++
				}
			}
			for si, sc := range proxyScenarios {
				port := uint16(20000 + 100*vi + 10*family + si)
				s := &proxySent{x: x, sc: sc, f: proxySkewFlow(family, port, sc), port: port}
				s.raw = x.rawValues(t, &s.f)
				if err := x.write(enc, exporterDomain, &s.f); err != nil {
					t.Fatalf("%s IPv%d: %v", v, family, err)
				}
				sent[port] = s
				order = append(order, port)
				wantMissing += missing
				if v == proxyFutureVersion {
					futureRecords++
				}
			}
			// One version's records, then the next version's template
			// under the same ID.
			if err := enc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := len(order)
	t.Logf("sent %d records of %d versions over %s", total, len(versions), transport)

	proxyWait(t, 15*time.Second, fmt.Sprintf("%d records at the collector", total), func() bool { return coll.count() >= total })
	time.Sleep(100 * time.Millisecond) // anything extra would come with them
	if errs := coll.errList(); len(errs) > 0 {
		t.Errorf("collector stub: %v", errs)
	}
	recs := coll.records()
	if len(recs) != total {
		t.Errorf("collector received %d records, want %d", len(recs), total)
	}

	srcPortKey := proxyKey(t, "sourceTransportPort")
	got := map[uint16]int{}
	for i, r := range recs {
		p, ok := r.Raw[srcPortKey]
		if !ok || len(p) != 2 {
			t.Errorf("record %d has no sourceTransportPort: %v", i, r.Keys)
			continue
		}
		port := binary.BigEndian.Uint16(p)
		got[port]++
		s := sent[port]
		if s == nil {
			t.Errorf("record %d: source port %d was never sent", i, port)
			continue
		}
		if got[port] > 1 {
			t.Errorf("record of source port %d (%s IPv%d) arrived %d times", port, s.x.version, s.x.family, got[port])
			continue
		}
		proxyCheckSkewRecord(t, s, r, aggregatorDomain, exporterDomain, clusterID)
	}
	for _, port := range order {
		if got[port] == 0 {
			s := sent[port]
			t.Errorf("no record for %s IPv%d %s (source port %d)", s.x.version, s.x.family, s.sc.name, port)
		}
	}

	// The aggregator's own account.
	exp := `exporter="127.0.0.1"`
	tr := fmt.Sprintf("transport=%q", transport)
	want := map[string]float64{
		"sluice_collector_records_received_total " + exp + " " + tr: float64(total),
		"sluice_skew_unknown_elements_total " + exp:                 float64(len(proxyFutureExtras) * futureRecords),
		"sluice_skew_missing_elements_total " + exp:                 float64(wantMissing),
		// Two families: each ID added once, then replaced by every
		// later version's definition.
		`sluice_collector_templates_total event="added" ` + tr:    2,
		`sluice_collector_templates_total event="replaced" ` + tr: float64(2 * (len(versions) - 1)),
		"sluice_collector_decode_errors_total":                    0,
		"sluice_collector_unknown_template_sets_total":            0,
		"sluice_collector_records_dropped_total":                  0,
		`sluice_sink_records_exported_total sink="flowCollector"`: float64(total),
		`sluice_sink_records_dropped_total sink="flowCollector"`:  0,
	}
	check := func() (bad []string) {
		m := proxyMetrics(t, a.Addrs().API)
		for q, w := range want {
			f := strings.Fields(q)
			if g := proxyMetricSum(m, f[0], f[1:]...); g != w {
				bad = append(bad, fmt.Sprintf("%s = %v, want %v", q, g, w))
			}
		}
		slices.Sort(bad)
		return bad
	}
	// The sink counts a message as exported once its write returns,
	// which can be a moment after the collector has read it.
	bad := check()
	for deadline := time.Now().Add(3 * time.Second); len(bad) > 0 && time.Now().Before(deadline); bad = check() {
		time.Sleep(50 * time.Millisecond)
	}
	for _, b := range bad {
		t.Error(b)
	}
	if wantMissing == 0 {
		t.Error("no version lacks any element of the newest set: the skew matrix tests nothing")
	}
}

// proxyCheckSkewRecord checks one forwarded record against what was sent
// and returns the names of known elements the sender included that the
// export does not carry.
func proxyCheckSkewRecord(t *testing.T, s *proxySent, r proxyRecord, aggDomain, expDomain uint32, clusterID string) {
	t.Helper()
	what := fmt.Sprintf("%s IPv%d %s (port %d)", s.x.version, s.x.family, s.sc.name, s.port)
	reg := ipfix.DefaultRegistry()
	if r.Domain != aggDomain {
		t.Errorf("%s: observation domain %d, want the aggregator's %d", what, r.Domain, aggDomain)
	}

	// The export's template: the Proxy elements for the family, then the
	// L7 elements of the agents that still sent them (passed through so
	// their values are not lost), then, for the future exporter, its
	// unknown elements as they came.
	outNames := ipfixmap.ExportElements(s.x.family, ipfixmap.ExportOptions{Names: true, Proxy: true})
	for _, l7 := range []string{"appProtocolName", "httpVals"} {
		if slices.Contains(s.x.names, l7) {
			outNames = append(outNames, l7)
		}
	}
	var wantKeys []string
	keyName := map[string]string{}
	for _, n := range outNames {
		k := proxyKey(t, n)
		wantKeys = append(wantKeys, k)
		keyName[k] = n
	}
	if s.x.version == proxyFutureVersion {
		for _, ie := range proxyFutureExtras {
			wantKeys = append(wantKeys, fmt.Sprintf("%d:%d", ie.EnterpriseID, ie.ID))
		}
	}
	if !slices.Equal(r.Keys, wantKeys) {
		t.Errorf("%s: exported template\n got %v\nwant %v", what, r.Keys, wantKeys)
	}

	for _, name := range s.x.names {
		if !slices.Contains(outNames, name) {
			t.Errorf("%s: element %s was sent but is not exported", what, name)
		}
	}

	exporter4 := []byte{127, 0, 0, 1}
	for _, k := range wantKeys {
		got, ok := r.Raw[k]
		if !ok {
			continue // reported with the template
		}
		name, known := keyName[k]
		var want []byte
		switch {
		case !known: // a future element, passed through
			want = s.raw[k]
		case name == "flowDirection":
			want = []byte{s.sc.dir}
		case name == "originalObservationDomainId":
			want = binary.BigEndian.AppendUint32(nil, expDomain)
		case name == "originalExporterIPv4Address":
			want = exporter4
		case name == "originalExporterIPv6Address":
			want = make([]byte, 16)
		case name == "clusterId":
			want = []byte(clusterID)
		case slices.Contains(proxyAddedNames, name): // labels: not asked for
			want = []byte{}
		case slices.Contains(s.x.names, name):
			want = s.raw[k]
			if want == nil {
				t.Fatalf("%s: no sent value for %s", what, name)
			}
		default: // not sent: unset, written as zeros or empty
			ie, _ := reg.ByName(name)
			if r.Lens[k] == ipfix.VariableLength {
				want = []byte{}
			} else {
				want = make([]byte, ie.DefaultLength())
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %s (%s) = %x, want %x", what, k, proxyName(k, keyName), got, want)
		}
	}
}

func proxyName(k string, keyName map[string]string) string {
	if n, ok := keyName[k]; ok {
		return n
	}
	return "unknown element"
}
