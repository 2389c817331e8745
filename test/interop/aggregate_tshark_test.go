package interop_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

// aggNodes are the two emulated Nodes of the Aggregate-mode test.
var aggNodes = [2]string{"node-a", "node-b"}

// aggConn is one inter-Node connection of the Aggregate-mode test: the
// record each Node exports about it. The half with the later end time
// also has the larger counters, so the common counters and throughput
// are that half's whatever the arrival order.
type aggConn struct {
	src, dst       flow.Flow // the source Node's and the destination Node's records
	srcNode        int       // index in aggNodes
	srcDur, dstDur uint64    // seconds from start to each half's end
	dstIsLater     bool
}

// newAggConn derives connection i: its own 5-tuple, Pods, counters and
// durations (so that every throughput differs).
func newAggConn(i int) aggConn {
	c := aggConn{dstIsLater: i%2 == 1}
	if i%3 == 2 { // some connections go from node-b to node-a
		c.srcNode = 1
	}
	start := time.Date(2026, 2, 1, 8, 0, 0, 0, time.UTC).Add(time.Duration(5*i) * time.Second)
	proto, dport, state := uint8(6), uint16(8080), "ESTABLISHED"
	if i%4 == 3 {
		proto, dport, state = 17, 53, ""
	}
	base := flow.Flow{
		StartTime: start, EndReason: 2, FlowType: flow.FlowTypeInterNode, TCPState: state,
		SourceIP:      netip.AddrFrom4([4]byte{10, 244, byte(1 + c.srcNode), byte(10 + i)}),
		DestinationIP: netip.AddrFrom4([4]byte{10, 244, byte(2 - c.srcNode), byte(100 + i)}),
		SourcePort:    uint16(40000 + 11*i), DestinationPort: dport, Protocol: proto,
	}
	c.src, c.dst = base, base
	c.src.SourcePodNamespace, c.src.SourcePodName, c.src.SourceNodeName = "web", fmt.Sprintf("client-%02d", i), aggNodes[c.srcNode]
	c.dst.DestinationPodNamespace, c.dst.DestinationPodName, c.dst.DestinationNodeName = "db", fmt.Sprintf("server-%02d", i), aggNodes[1-c.srcNode]

	durL, durO := uint64(20+i), uint64(17+i-i%3)
	later := flow.Stats{PacketTotalCount: uint64(100 + 7*i), OctetTotalCount: uint64(10_000 + 1_234*i)}
	later.PacketDeltaCount, later.OctetDeltaCount = later.PacketTotalCount/2, later.OctetTotalCount/2
	laterRev := flow.Stats{PacketTotalCount: uint64(60 + 5*i), OctetTotalCount: uint64(4_000 + 777*i)}
	laterRev.PacketDeltaCount, laterRev.OctetDeltaCount = laterRev.PacketTotalCount/2, laterRev.OctetTotalCount/2
	less := func(s flow.Stats, by uint64) flow.Stats {
		s.PacketTotalCount -= 1 + by%3
		s.OctetTotalCount -= 64 * (1 + by)
		s.PacketDeltaCount, s.OctetDeltaCount = s.PacketTotalCount/3, s.OctetTotalCount/3
		return s
	}
	l, o := &c.src, &c.dst
	c.srcDur, c.dstDur = durL, durO
	if c.dstIsLater {
		l, o = o, l
		c.srcDur, c.dstDur = durO, durL
	}
	l.EndTime, l.Stats, l.ReverseStats = start.Add(time.Duration(durL)*time.Second), later, laterRev
	o.EndTime, o.Stats, o.ReverseStats = start.Add(time.Duration(durO)*time.Second), less(later, uint64(i)), less(laterRev, uint64(i+1))
	return c
}

func (c *aggConn) half(node int) *flow.Flow {
	if node == c.srcNode {
		return &c.src
	}
	return &c.dst
}

func (c *aggConn) key() string {
	return fmt.Sprintf("%s:%d>%s:%d/%d", c.src.SourceIP, c.src.SourcePort, c.src.DestinationIP, c.src.DestinationPort, c.src.Protocol)
}

// aggTsharkFields are the IANA fields read from tshark's dissection of
// each record. The counters occur twice per record: forward, then reverse
// (RFC 5103, PEN 29305). tshark has no names for Antrea's elements; those
// are read raw (enterprise private entries).
var aggTsharkFields = []string{
	"cflow.srcaddr", "cflow.dstaddr", "cflow.srcport", "cflow.dstport", "cflow.protocol",
	"cflow.abstimestart", "cflow.abstimeend",
	"cflow.permanent_packets", "cflow.permanent_octets", // packetTotalCount, octetTotalCount
	"cflow.packets", "cflow.octets", // packetDeltaCount, octetDeltaCount
}

// aggTsharkMaxFields lifts tshark's limit on the number of elements of a
// template (60 by default, past which it ignores the template): the
// Aggregate-mode template has 70.
const aggTsharkMaxFields = "cflow.max_template_fields:100"

// TestAggregateToTshark: two emulated Nodes, each over its own TCP
// session, send the source-Node and destination-Node records of inter-Node
// connections to the aggregator in Aggregate mode, which exports over UDP
// to a socket of the test. The datagrams go into a capture dissected by
// tshark, which must show exactly one record per connection with its
// 5-tuple and times, both Pods and Nodes, and the per-Node octet and
// packet totals, end times and throughputs (Antrea elements, read raw).
func TestAggregateToTshark(t *testing.T) {
	tshark := requirePeer(t, "tshark")
	ctx := testContext(t, 60*time.Second)
	const n = 12
	conns := make([]aggConn, n)
	for i := range conns {
		conns[i] = newAggConn(i)
	}
	coll := proxyStartUDPCollector(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
clusterID: tshark-aggregate
flowCollector: {enable: true, address: "127.0.0.1:%d:udp", observationDomainID: 4321}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
`, coll.port()))

	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	names, err := ipfixmap.AgentElements("v2.7", 4)
	if err != nil {
		t.Fatal(err)
	}
	els, err := tb.Elements(names)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ipfixmap.TemplateOf(256, els)
	if err != nil {
		t.Fatal(err)
	}
	var encs [2]*ipfix.Encoder
	for node := range encs {
		conn, err := net.Dial("tcp", a.Addrs().IPFIX)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if encs[node], err = ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err }); err != nil {
			t.Fatal(err)
		}
		if err := encs[node].AddTemplate(uint32(node+1), tmpl); err != nil {
			t.Fatal(err)
		}
	}
	// Round r: node-a sends its records of the connections with i%2 ==
	// r, node-b those of the others, both at once. So the source Node's
	// record comes first for some connections and second for others, and
	// so does the later half (whose end time and counters win).
	round := func(r int) {
		var wg sync.WaitGroup
		errs := make([]error, len(encs))
		for node, enc := range encs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range conns {
					if (i%2 == r) == (node == 0) {
						if errs[node] = ipfixmap.WriteRecord(enc.Begin(uint32(node+1), tmpl), els, conns[i].half(node)); errs[node] != nil {
							return
						}
					}
				}
				errs[node] = enc.Flush()
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	round(0)
	proxyWait(t, 10*time.Second, "one record of every connection in the aggregator", func() bool {
		return aggRecordMetrics(t, a.Addrs().API)["numFlows"] == n
	})
	round(1)
	proxyWait(t, 10*time.Second, fmt.Sprintf("%d records from the aggregator", n), func() bool { _, r, _ := coll.state(); return r >= n })
	// Stopping the aggregator sends anything still pending (nothing should
	// be); what the socket has then is all there is.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // loopback datagrams already sent are in the socket by now
	msgs, recs, errs := coll.state()
	if len(errs) > 0 {
		t.Fatalf("decoding the datagrams: %v", errs)
	}
	if recs != n {
		// tshark will tell which connections are wrong.
		t.Errorf("received %d records in %d datagrams, want %d", recs, len(msgs), n)
	}

	const port = 4739
	pcap := filepath.Join(t.TempDir(), "aggregate.pcap")
	writeUDPPcap(t, pcap, port, msgs)
	env := []string{"TZ=UTC", "LC_ALL=C"}
	decodeAs := fmt.Sprintf("udp.port==%d,cflow", port)

	// The whole dissection: no malformed packet or expert warning; the
	// IANA fields by name, the Antrea elements by ID.
	out, err := run(ctx, env, tshark, "-o", aggTsharkMaxFields, "-r", pcap, "-d", decodeAs, "-T", "pdml")
	if err != nil {
		t.Fatal(err)
	}
	frames, err := parsePDML(out)
	if err != nil {
		t.Error(err)
	}
	var flows []pdmlFlow
	for _, fr := range frames {
		flows = append(flows, fr...)
	}
	// One row of aggTsharkFields per record, each field's occurrences
	// joined with ';'.
	rows := make([][]string, len(flows))
	for j, fl := range flows {
		for _, name := range aggTsharkFields {
			rows[j] = append(rows[j], strings.Join(fl.fields[name], ";"))
		}
	}
	rowKey := func(row []string) string {
		return fmt.Sprintf("%s:%s>%s:%s/%s", row[0], row[2], row[1], row[3], row[4])
	}
	byKey := map[string][][]string{}
	for _, row := range rows {
		byKey[rowKey(row)] = append(byKey[rowKey(row)], row)
	}
	if len(rows) != n {
		t.Errorf("tshark dissected %d flow records, want %d", len(rows), n)
	}
	tsTime := func(tm time.Time) string { return tm.UTC().Format(tsharkTimeLayout) }
	known := map[string]*aggConn{}
	for i := range conns {
		c := &conns[i]
		known[c.key()] = c
		rs := byKey[c.key()]
		if len(rs) != 1 {
			t.Errorf("connection %d (%s): tshark shows %d records, want 1", i, c.key(), len(rs))
			continue
		}
		// The common end time, totals and deltas are the later half's.
		l := &c.src
		if c.dstIsLater {
			l = &c.dst
		}
		want := []string{tsTime(c.src.StartTime), tsTime(l.EndTime),
			fmt.Sprintf("%d;%d", l.Stats.PacketTotalCount, l.ReverseStats.PacketTotalCount),
			fmt.Sprintf("%d;%d", l.Stats.OctetTotalCount, l.ReverseStats.OctetTotalCount),
			fmt.Sprintf("%d;%d", l.Stats.PacketDeltaCount, l.ReverseStats.PacketDeltaCount),
			fmt.Sprintf("%d;%d", l.Stats.OctetDeltaCount, l.ReverseStats.OctetDeltaCount)}
		for k, w := range want {
			if got := rs[0][5+k]; got != w {
				t.Errorf("connection %d (%s): %s = %q, want %q", i, c.key(), aggTsharkFields[5+k], got, w)
			}
		}
	}
	for k := range byKey {
		if known[k] == nil {
			t.Errorf("tshark shows a record of an unknown connection %s", k)
		}
	}

	reg := ipfix.DefaultRegistry()
	u64 := func(v uint64) string { return string(binary.BigEndian.AppendUint64(nil, v)) }
	u32 := func(v uint32) string { return string(binary.BigEndian.AppendUint32(nil, v)) }
	for j, fl := range flows {
		k := rowKey(rows[j])
		c := known[k]
		if c == nil {
			continue // reported above
		}
		s, d := &c.src, &c.dst
		l, lDur := s, c.srcDur
		if c.dstIsLater {
			l, lDur = d, c.dstDur
		}
		// Each Pod and Node from the Node that knows it; the per-Node
		// counters and end times as each Node sent them; throughputs in
		// bits per second over each Node's first record (reference §3.3,
		// §3.5), the common one the later half's.
		want := map[string]string{
			"sourcePodName": s.SourcePodName, "sourcePodNamespace": s.SourcePodNamespace, "sourceNodeName": s.SourceNodeName,
			"destinationPodName": d.DestinationPodName, "destinationPodNamespace": d.DestinationPodNamespace, "destinationNodeName": d.DestinationNodeName,
			"flowType":                                  string([]byte{flow.FlowTypeInterNode}),
			"packetTotalCountFromSourceNode":            u64(s.Stats.PacketTotalCount),
			"packetTotalCountFromDestinationNode":       u64(d.Stats.PacketTotalCount),
			"octetTotalCountFromSourceNode":             u64(s.Stats.OctetTotalCount),
			"octetTotalCountFromDestinationNode":        u64(d.Stats.OctetTotalCount),
			"octetDeltaCountFromSourceNode":             u64(s.Stats.OctetDeltaCount),
			"octetDeltaCountFromDestinationNode":        u64(d.Stats.OctetDeltaCount),
			"reverseOctetTotalCountFromSourceNode":      u64(s.ReverseStats.OctetTotalCount),
			"reverseOctetTotalCountFromDestinationNode": u64(d.ReverseStats.OctetTotalCount),
			"flowEndSecondsFromSourceNode":              u32(uint32(s.EndTime.Unix())),
			"flowEndSecondsFromDestinationNode":         u32(uint32(d.EndTime.Unix())),
			"throughput":                                u64(l.Stats.OctetTotalCount * 8 / lDur),
			"throughputFromSourceNode":                  u64(s.Stats.OctetTotalCount * 8 / c.srcDur),
			"throughputFromDestinationNode":             u64(d.Stats.OctetTotalCount * 8 / c.dstDur),
			"reverseThroughputFromSourceNode":           u64(s.ReverseStats.OctetTotalCount * 8 / c.srcDur),
			"reverseThroughputFromDestinationNode":      u64(d.ReverseStats.OctetTotalCount * 8 / c.dstDur),
			"clusterId":                                 "tshark-aggregate",
		}
		for name, w := range want {
			ie := reg.MustByName(name)
			if ie.EnterpriseID != 56506 {
				t.Fatalf("%s is not an Antrea element", name)
			}
			if got := fl.antrea[int(ie.ID)]; got != w {
				t.Errorf("connection %s: %s (Antrea element %d) = %x, want %x", k, name, ie.ID, got, w)
			}
		}
	}
}

// aggRecordMetrics reads the aggregator's GET /recordmetrics.
func aggRecordMetrics(t testing.TB, api string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + api + "/recordmetrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range m {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}
