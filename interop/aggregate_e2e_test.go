package interop

// End to end in Aggregate mode: two go-ipfix exporters play an Antrea
// agent each (a source Node and a destination Node, each with its own TCP
// session), and send their halves of many inter-Node connections to a
// Sluice aggregator, which correlates them and exports to go-ipfix's
// collecting process (the decoder Antrea's own Flow Aggregator used) and
// to its flow log.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/collector"
	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"

	"sluice/aggregator"
	"sluice/config"
)

const (
	e2eConns     = 200
	e2eClusterID = "e2e-cluster"
	e2eDomain    = 77
)

// e2eNodes are the two emulated Nodes. A connection's Pods are on
// different Nodes; which Node is its source varies (see e2eConn).
var e2eNodes = [2]string{"node-a", "node-b"}

// e2eConnection is one inter-Node connection: the record each Node
// exports about it, which Node is which, and which of the two records is
// the later one (its end time is later and its counters are larger, so
// that the expected common values do not depend on arrival order).
type e2eConnection struct {
	src, dst       antreaFlow // the source Node's and the destination Node's halves
	srcNode        int        // index in e2eNodes of the source Node
	dstIsLater     bool
	srcDur, dstDur uint64 // seconds from start to each half's end
}

// e2eConn derives connection i. Every connection has its own 5-tuple,
// Pods, counters and durations, so every throughput differs.
func e2eConn(i int) e2eConnection {
	c := e2eConnection{srcNode: 0, dstIsLater: i%2 == 1}
	if i%3 == 2 { // some connections go the other way
		c.srcNode = 1
	}
	start := time.Unix(1_767_225_600, 0).UTC().Add(time.Duration(3*i) * time.Second)
	proto, tcpState, reason := uint8(6), "ESTABLISHED", uint8(2) // active timeout
	dstPort := []uint16{80, 443, 5432, 8080}[i%4]
	if i%6 == 0 {
		tcpState, reason = "TIME_WAIT", 3 // end of flow
	}
	if i%5 == 4 {
		proto, tcpState, dstPort = 17, "", 53
	}
	srcNet, dstNet := byte(1+c.srcNode), byte(2-c.srcNode) // 10.244.1/24 on node-a, 10.244.2/24 on node-b
	base := antreaFlow{
		FlowStart: start, FlowEndReason: reason,
		SrcPort: uint16(30000 + 13*i), DstPort: dstPort, Proto: proto,
		Src:      netip.AddrFrom4([4]byte{10, 244, srcNet, byte(2 + i%100)}),
		Dst:      netip.AddrFrom4([4]byte{10, 244, dstNet, byte(2 + (7*i)%50)}),
		TCPState: tcpState, FlowType: 2, // InterNode
		ClusterIP: netip.IPv4Unspecified(), ProxySnatIP: netip.IPv4Unspecified(), ServiceIP: netip.IPv4Unspecified(),
	}
	// The later half's duration and counters, and how much less the
	// other half saw.
	durL := uint64(10 + i%37)
	durO := durL - 1 - uint64(i%3)
	pktL, octL := uint64(20+3*i), uint64(5_000+7_919*i)
	rpktL, roctL := uint64(10+2*i), uint64(2_000+3_571*i)
	later := func(f *antreaFlow, dur uint64) {
		f.FlowEnd = start.Add(time.Duration(dur) * time.Second)
		f.Packets, f.Octets, f.RevPackets, f.RevOctets = pktL, octL, rpktL, roctL
		f.DeltaPackets, f.DeltaOctets, f.RevDeltaPkts, f.RevDeltaOct = pktL/2, octL/2, rpktL/2, roctL/2
	}
	earlier := func(f *antreaFlow, dur uint64) {
		f.FlowEnd = start.Add(time.Duration(dur) * time.Second)
		f.Packets, f.Octets = pktL-1-uint64(i%3), octL-40*(1+uint64(i%5))
		f.RevPackets, f.RevOctets = rpktL-1, roctL-20*(1+uint64(i%4))
		f.DeltaPackets, f.DeltaOctets, f.RevDeltaPkts, f.RevDeltaOct = f.Packets/3, f.Octets/3, f.RevPackets/3, f.RevOctets/3
	}

	// The source Node knows the client Pod, the Service and the egress
	// policy; the destination Node the server Pod and the ingress policy.
	c.src, c.dst = base, base
	c.src.SrcPod, c.src.SrcNamespace, c.src.SrcNode = fmt.Sprintf("client-%03d", i), []string{"web", "batch", "jobs"}[i%3], e2eNodes[c.srcNode]
	if i%2 == 0 {
		c.src.DstSvcPort, c.src.DstSvcPortName = uint16(9000+i%10), fmt.Sprintf("backend/svc-%d:port-%d", i%10, 9000+i%10)
		c.src.ClusterIP = netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i%50)})
		c.src.ServiceIP = c.src.ClusterIP
	}
	if i%5 == 1 {
		c.src.EgPolicy, c.src.EgPolicyNamespace, c.src.EgPolicyType, c.src.EgRule, c.src.EgRuleAction = "egress-allow", c.src.SrcNamespace, 2, "to-backend", 1
	}
	c.dst.DstPod, c.dst.DstNamespace, c.dst.DstNode = fmt.Sprintf("server-%02d", (7*i)%50), "backend", e2eNodes[1-c.srcNode]
	if i%4 != 2 {
		c.dst.InPolicy, c.dst.InPolicyNamespace, c.dst.InPolicyType, c.dst.InRule, c.dst.InRuleAction = fmt.Sprintf("allow-%d", i%7), "backend", 1, "ingress-0", 1
	}
	if c.dstIsLater {
		c.srcDur, c.dstDur = durO, durL
		earlier(&c.src, durO)
		later(&c.dst, durL)
	} else {
		c.srcDur, c.dstDur = durL, durO
		later(&c.src, durL)
		earlier(&c.dst, durO)
	}
	for _, f := range []*antreaFlow{&c.src, &c.dst} {
		f.srcIP, f.dstIP = net.IP(f.Src.AsSlice()), net.IP(f.Dst.AsSlice())
		f.clusterIP, f.snatIP, f.serviceIP = net.IP(f.ClusterIP.AsSlice()), net.IP(f.ProxySnatIP.AsSlice()), net.IP(f.ServiceIP.AsSlice())
	}
	return c
}

// half returns the record that node (an index in e2eNodes) sends about c.
func (c *e2eConnection) half(node int) *antreaFlow {
	if node == c.srcNode {
		return &c.src
	}
	return &c.dst
}

// key is the 5-tuple of c as the records' decoders print it.
func (c *e2eConnection) key() string {
	return e2eKey(c.src.Src.String(), c.src.Dst.String(), uint64(c.src.SrcPort), uint64(c.src.DstPort), uint64(c.src.Proto))
}

func e2eKey(src, dst string, sport, dport, proto uint64) string {
	return fmt.Sprintf("%s:%d>%s:%d/%d", src, sport, dst, dport, proto)
}

// expected is every element value the correlated record of c must carry,
// derived from the two halves with the rules of Antrea's Aggregate mode:
// Kubernetes fields from the side that knows them, per-Node counters as
// each Node sent them, per-Node throughput = octet total × 8 / (end −
// start) (first record of each Node), common counters and throughput from
// the later half.
func (c *e2eConnection) expected() map[string]any {
	s, d := &c.src, &c.dst
	l, lDur := s, c.srcDur
	if c.dstIsLater {
		l, lDur = d, c.dstDur
	}
	u := func(v uint64) any { return v }
	secs := func(t time.Time) any { return uint64(t.Unix()) }
	return map[string]any{
		"flowStartSeconds":         secs(s.FlowStart),
		"flowEndSeconds":           secs(l.FlowEnd),
		"flowEndReason":            u(uint64(s.FlowEndReason)),
		"sourceIPv4Address":        s.Src.String(),
		"destinationIPv4Address":   s.Dst.String(),
		"sourceTransportPort":      u(uint64(s.SrcPort)),
		"destinationTransportPort": u(uint64(s.DstPort)),
		"protocolIdentifier":       u(uint64(s.Proto)),
		"tcpState":                 s.TCPState,
		"flowType":                 u(uint64(s.FlowType)),

		"packetTotalCount":        l.Packets,
		"octetTotalCount":         l.Octets,
		"packetDeltaCount":        l.DeltaPackets,
		"octetDeltaCount":         l.DeltaOctets,
		"reversePacketTotalCount": l.RevPackets,
		"reverseOctetTotalCount":  l.RevOctets,
		"reversePacketDeltaCount": l.RevDeltaPkts,
		"reverseOctetDeltaCount":  l.RevDeltaOct,

		"sourcePodName":                  s.SrcPod,
		"sourcePodNamespace":             s.SrcNamespace,
		"sourceNodeName":                 s.SrcNode,
		"destinationPodName":             d.DstPod,
		"destinationPodNamespace":        d.DstNamespace,
		"destinationNodeName":            d.DstNode,
		"destinationServicePort":         u(uint64(s.DstSvcPort)),
		"destinationServicePortName":     s.DstSvcPortName,
		"destinationClusterIPv4":         s.ClusterIP.String(),
		"destinationServiceIPv4":         s.ServiceIP.String(),
		"ingressNetworkPolicyName":       d.InPolicy,
		"ingressNetworkPolicyNamespace":  d.InPolicyNamespace,
		"ingressNetworkPolicyType":       u(uint64(d.InPolicyType)),
		"ingressNetworkPolicyRuleName":   d.InRule,
		"ingressNetworkPolicyRuleAction": u(uint64(d.InRuleAction)),
		"egressNetworkPolicyName":        s.EgPolicy,
		"egressNetworkPolicyNamespace":   s.EgPolicyNamespace,
		"egressNetworkPolicyType":        u(uint64(s.EgPolicyType)),
		"egressNetworkPolicyRuleName":    s.EgRule,
		"egressNetworkPolicyRuleAction":  u(uint64(s.EgRuleAction)),

		"packetTotalCountFromSourceNode":             s.Packets,
		"octetTotalCountFromSourceNode":              s.Octets,
		"packetDeltaCountFromSourceNode":             s.DeltaPackets,
		"octetDeltaCountFromSourceNode":              s.DeltaOctets,
		"reversePacketTotalCountFromSourceNode":      s.RevPackets,
		"reverseOctetTotalCountFromSourceNode":       s.RevOctets,
		"reversePacketDeltaCountFromSourceNode":      s.RevDeltaPkts,
		"reverseOctetDeltaCountFromSourceNode":       s.RevDeltaOct,
		"packetTotalCountFromDestinationNode":        d.Packets,
		"octetTotalCountFromDestinationNode":         d.Octets,
		"packetDeltaCountFromDestinationNode":        d.DeltaPackets,
		"octetDeltaCountFromDestinationNode":         d.DeltaOctets,
		"reversePacketTotalCountFromDestinationNode": d.RevPackets,
		"reverseOctetTotalCountFromDestinationNode":  d.RevOctets,
		"reversePacketDeltaCountFromDestinationNode": d.RevDeltaPkts,
		"reverseOctetDeltaCountFromDestinationNode":  d.RevDeltaOct,
		"flowEndSecondsFromSourceNode":               secs(s.FlowEnd),
		"flowEndSecondsFromDestinationNode":          secs(d.FlowEnd),

		"throughput":                           l.Octets * 8 / lDur,
		"reverseThroughput":                    l.RevOctets * 8 / lDur,
		"throughputFromSourceNode":             s.Octets * 8 / c.srcDur,
		"reverseThroughputFromSourceNode":      s.RevOctets * 8 / c.srcDur,
		"throughputFromDestinationNode":        d.Octets * 8 / c.dstDur,
		"reverseThroughputFromDestinationNode": d.RevOctets * 8 / c.dstDur,

		"clusterId": e2eClusterID,
	}
}

// goIPFIXRecord is a data record as go-ipfix decoded it: every element by
// name, unsigned integers and times as uint64, strings as strings and
// addresses in their text form.
type goIPFIXRecord map[string]any

func decodeGoIPFIXRecord(rec entities.Record) (goIPFIXRecord, error) {
	out := goIPFIXRecord{}
	for _, e := range rec.GetOrderedElementList() {
		var v any
		switch e.GetDataType() {
		case entities.Unsigned8:
			v = uint64(e.GetUnsigned8Value())
		case entities.Unsigned16:
			v = uint64(e.GetUnsigned16Value())
		case entities.Unsigned32, entities.DateTimeSeconds:
			v = uint64(e.GetUnsigned32Value())
		case entities.Unsigned64:
			v = e.GetUnsigned64Value()
		case entities.String:
			v = e.GetStringValue()
		case entities.Ipv4Address, entities.Ipv6Address:
			a, ok := netip.AddrFromSlice(e.GetIPAddressValue())
			if !ok {
				return nil, fmt.Errorf("%s: bad address %v", e.GetName(), e.GetIPAddressValue())
			}
			v = a.String()
		default:
			return nil, fmt.Errorf("%s: unexpected type %d", e.GetName(), e.GetDataType())
		}
		if _, dup := out[e.GetName()]; dup {
			return nil, fmt.Errorf("element %s twice in one record", e.GetName())
		}
		out[e.GetName()] = v
	}
	return out, nil
}

// checkCorrelated compares the records a collector decoded with the
// connections: exactly one record per connection, each carrying
// everything expected() lists. It returns every difference, at most
// about 30.
func checkCorrelated(conns []e2eConnection, recs []goIPFIXRecord) []string {
	var diffs []string
	add := func(format string, args ...any) {
		if len(diffs) < 30 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	if len(recs) != len(conns) {
		add("%d records for %d connections", len(recs), len(conns))
	}
	byKey := map[string][]goIPFIXRecord{}
	for _, r := range recs {
		sport, _ := r["sourceTransportPort"].(uint64)
		dport, _ := r["destinationTransportPort"].(uint64)
		proto, _ := r["protocolIdentifier"].(uint64)
		src, _ := r["sourceIPv4Address"].(string)
		dst, _ := r["destinationIPv4Address"].(string)
		k := e2eKey(src, dst, sport, dport, proto)
		byKey[k] = append(byKey[k], r)
	}
	known := map[string]bool{}
	for i := range conns {
		c := &conns[i]
		k := c.key()
		known[k] = true
		rs := byKey[k]
		if len(rs) != 1 {
			add("connection %d (%s): %d records, want 1", i, k, len(rs))
			if len(rs) == 0 {
				continue
			}
		}
		want := c.expected()
		names := make([]string, 0, len(want))
		for n := range want {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, r := range rs {
			for _, n := range names {
				got, ok := r[n]
				if !ok {
					add("connection %d (%s): no element %s", i, k, n)
				} else if got != want[n] {
					add("connection %d (%s): %s = %#v, want %#v", i, k, n, got, want[n])
				}
			}
		}
	}
	for k, rs := range byKey {
		if !known[k] {
			add("%d records of an unknown connection %s", len(rs), k)
		}
	}
	return diffs
}

// checkFlowLog compares the aggregator's flow log with the connections:
// one line per connection, of Antrea's 30 fields (prettyPrint on).
func checkFlowLog(conns []e2eConnection, log string) []string {
	var diffs []string
	add := func(format string, args ...any) {
		if len(diffs) < 30 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if log == "" {
		lines = nil
	}
	if len(lines) != len(conns) {
		add("%d flow-log lines for %d connections", len(lines), len(conns))
	}
	byKey := map[string][][]string{}
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) != 30 {
			add("line %q: %d fields, want 30", l, len(f))
			continue
		}
		sport, _ := strconv.ParseUint(f[4], 10, 16)
		dport, _ := strconv.ParseUint(f[5], 10, 16)
		proto := map[string]uint64{"TCP": 6, "UDP": 17}[f[6]]
		k := e2eKey(f[2], f[3], sport, dport, proto)
		byKey[k] = append(byKey[k], f)
	}
	// Antrea's prettyPrint names (reference §6.4).
	action := map[uint8]string{0: "", 1: "Allow"}
	policyType := map[uint8]string{0: "", 1: "K8sNetworkPolicy", 2: "AntreaNetworkPolicy"}
	addr := func(a netip.Addr) string {
		if a.IsUnspecified() {
			return "" // unset
		}
		return a.String()
	}
	for i := range conns {
		c := &conns[i]
		s, d := &c.src, &c.dst
		end := s.FlowEnd
		if c.dstIsLater {
			end = d.FlowEnd
		}
		want := []string{
			fmt.Sprint(s.FlowStart.Unix()), fmt.Sprint(end.Unix()),
			s.Src.String(), s.Dst.String(), fmt.Sprint(s.SrcPort), fmt.Sprint(s.DstPort),
			map[uint8]string{6: "TCP", 17: "UDP"}[s.Proto],
			s.SrcPod, s.SrcNamespace, s.SrcNode, d.DstPod, d.DstNamespace, d.DstNode,
			addr(s.ClusterIP), addr(s.ServiceIP), fmt.Sprint(s.DstSvcPort), s.DstSvcPortName,
			d.InPolicy, d.InPolicyNamespace, d.InRule, action[d.InRuleAction], policyType[d.InPolicyType],
			s.EgPolicy, s.EgPolicyNamespace, s.EgRule, action[s.EgRuleAction], policyType[s.EgPolicyType],
			"", "", "", // no Egress
		}
		ls := byKey[c.key()]
		if len(ls) != 1 {
			add("connection %d (%s): %d flow-log lines, want 1", i, c.key(), len(ls))
		}
		for _, f := range ls {
			for j := range want {
				if f[j] != want[j] {
					add("connection %d (%s): flow-log field %d is %q, want %q", i, c.key(), j+1, f[j], want[j])
				}
			}
		}
	}
	return diffs
}

// goIPFIXNode is an emulated Node's flow exporter: go-ipfix's exporting
// process over TCP with the buffered exporter and one reused record, as
// the Antrea agent drives it.
type goIPFIXNode struct {
	ep    *exporter.ExportingProcess
	bep   *exporter.BufferedIPFIXExporter
	elems []entities.InfoElementWithValue
	rec   entities.Record
}

func newGoIPFIXNode(addr string, domain uint32) (*goIPFIXNode, error) {
	ep, err := exporter.InitExportingProcess(exporter.ExporterInput{CollectorAddress: addr, CollectorProtocol: "tcp", ObservationDomainID: domain})
	if err != nil {
		return nil, err
	}
	n := &goIPFIXNode{ep: ep, bep: exporter.NewBufferedIPFIXExporter(ep)}
	tmplElems, err := goIPFIXElements(false)
	if err == nil {
		n.elems, err = goIPFIXElements(false)
	}
	if err != nil {
		ep.CloseConnToCollector()
		return nil, err
	}
	tid := ep.NewTemplateID()
	tmpl := entities.NewTemplateRecordFromElements(tid, tmplElems)
	if err = tmpl.PrepareRecord(); err == nil {
		err = n.bep.AddRecord(tmpl)
	}
	if err != nil {
		ep.CloseConnToCollector()
		return nil, err
	}
	n.rec = entities.NewDataRecordFromElements(tid, n.elems)
	return n, nil
}

// send exports flows and flushes them out.
func (n *goIPFIXNode) send(flows []*antreaFlow) error {
	for _, f := range flows {
		setGoIPFIX(n.elems, f)
		if err := n.bep.AddRecord(n.rec); err != nil {
			return err
		}
	}
	return n.bep.Flush()
}

// startAggregate runs a Sluice aggregator in Aggregate mode in process
// with the given YAML; stop cancels it and returns Run's error (later
// calls return nil).
func startAggregate(tb testing.TB, yaml string) (a *aggregator.Aggregator, stop func() error) {
	tb.Helper()
	cfg, err := config.Parse([]byte(yaml), "aggregate.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	// The gRPC collector always runs: a free port and its own certificates.
	cfg.Sluice.GRPCAddress = "127.0.0.1:0"
	cfg.Sluice.TLS.CertDir = tb.TempDir()
	a, err = aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() error {
		var err error
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(aggregator.DrainTimeout + 5*time.Second):
				err = errors.New("Run did not return after cancel")
			}
		})
		return err
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Error(err)
		}
	})
	return a, stop
}

// recordMetrics reads the aggregator's GET /recordmetrics.
func recordMetrics(tb testing.TB, api string) map[string]float64 {
	tb.Helper()
	resp, err := http.Get("http://" + api + "/recordmetrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range m {
		if f, ok := v.(float64); ok {
			out[k] = f
		}
	}
	return out
}

func waitUntil(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// goIPFIXSink keeps what a go-ipfix collecting process hands over.
type goIPFIXSink struct {
	mu      sync.Mutex
	recs    []goIPFIXRecord
	msgs    int64
	domains map[uint32]bool
	errs    []error
}

func collectGoIPFIX(cp *collector.CollectingProcess) *goIPFIXSink {
	s := &goIPFIXSink{domains: map[uint32]bool{}}
	go func() {
		for msg := range cp.GetMsgChan() {
			var recs []goIPFIXRecord
			var errs []error
			if set := msg.GetSet(); set.GetSetType() == entities.Data {
				for _, r := range set.GetRecords() {
					d, err := decodeGoIPFIXRecord(r)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					recs = append(recs, d)
				}
			}
			s.mu.Lock()
			s.recs = append(s.recs, recs...)
			s.errs = append(s.errs, errs...)
			s.domains[msg.GetObsDomainID()] = true
			s.msgs++
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *goIPFIXSink) state() (recs []goIPFIXRecord, msgs int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]goIPFIXRecord(nil), s.recs...), s.msgs
}

// TestAggregateEndToEndGoIPFIX: two go-ipfix exporters (a source Node and
// a destination Node, one TCP session each) send the halves of 200
// inter-Node connections to Sluice in Aggregate mode; go-ipfix's collector
// must decode exactly one correlated record per connection, with both
// Pods, the per-Node counters, end times and throughputs, and the flow
// log must hold one line per connection. The Nodes send in two rounds, so
// that some connections' source-Node record arrives first and others'
// destination-Node record, and the later half (whose end time and counters
// win) arrives first for some and second for others.
func TestAggregateEndToEndGoIPFIX(t *testing.T) {
	cp := startGoIPFIXCollector(t, "tcp")
	sink := collectGoIPFIX(cp)
	logPath := filepath.Join(t.TempDir(), "flows.log")
	a, stop := startAggregate(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
clusterID: %s
flowCollector: {enable: true, address: "%s:tcp", observationDomainID: %d}
flowLogger: {enable: true, path: %q}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`, e2eClusterID, cp.GetAddress(), e2eDomain, logPath))

	conns := make([]e2eConnection, e2eConns)
	for i := range conns {
		conns[i] = e2eConn(i)
	}
	var nodes [2]*goIPFIXNode
	for n := range nodes {
		var err error
		if nodes[n], err = newGoIPFIXNode(a.Addrs().IPFIX, uint32(n+1)); err != nil {
			t.Fatal(err)
		}
		defer nodes[n].ep.CloseConnToCollector()
	}
	// Phase p: each Node sends its halves of the connections with i%2
	// == p (node-a) or != p (node-b), both at once. After phase 0 every
	// connection has exactly one half in the aggregator: the source
	// Node's for some, the destination Node's for others, and the later
	// half (whose end time and counters win) for some but not all.
	phase := func(p int) {
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for n := range nodes {
			var flows []*antreaFlow
			for i := range conns {
				if (i%2 == p) == (n == 0) {
					flows = append(flows, conns[i].half(n))
				}
			}
			wg.Add(1)
			go func() { defer wg.Done(); errs[n] = nodes[n].send(flows) }()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	phase(0)
	waitUntil(t, 10*time.Second, "one half of every connection in the aggregator", func() bool {
		return recordMetrics(t, a.Addrs().API)["numFlows"] == e2eConns
	})
	phase(1)
	waitUntil(t, 10*time.Second, "a record per connection at the collector", func() bool {
		return cp.GetNumRecordsReceived() >= e2eConns
	})
	t.Logf("%d connections correlated and exported in %v", e2eConns, time.Since(start).Round(time.Millisecond))
	rm := recordMetrics(t, a.Addrs().API)
	if rm["numRecordsReceived"] != 2*e2eConns || rm["numFlows"] != e2eConns || rm["numRecordsExported"] != e2eConns || rm["numConnToCollector"] != 2 {
		t.Errorf("/recordmetrics: %v", rm)
	}

	// Stopping exports what is still pending (nothing should be), flushes
	// the sinks and closes the session to the collector: after that the
	// collector has everything there will ever be.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the aggregator's session to end and its messages to be read", func() bool {
		_, msgs := sink.state()
		return cp.GetNumConnToCollector() == 0 && msgs == cp.GetNumMessagesReceived()
	})
	recs, _ := sink.state()
	sink.mu.Lock()
	if len(sink.errs) > 0 {
		t.Errorf("decoding go-ipfix's records: %v", errors.Join(sink.errs...))
	}
	if len(sink.domains) != 1 || !sink.domains[e2eDomain] {
		t.Errorf("observation domains %v, want only %d", sink.domains, e2eDomain)
	}
	sink.mu.Unlock()
	for _, d := range checkCorrelated(conns, recs) {
		t.Error(d)
	}

	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range checkFlowLog(conns, string(b)) {
		t.Error(d)
	}
}

// TestAggregateEndToEndChecksFail is the negative control of the end-to-
// end checks: records or log lines that are uncorrelated, doubled,
// missing, or carry another connection's or the wrong Node's values must
// be reported.
func TestAggregateEndToEndChecksFail(t *testing.T) {
	conns := []e2eConnection{e2eConn(0), e2eConn(1), e2eConn(3), e2eConn(4)}
	good := func() []goIPFIXRecord {
		recs := make([]goIPFIXRecord, len(conns))
		for i := range conns {
			recs[i] = goIPFIXRecord(conns[i].expected())
		}
		return recs
	}
	if d := checkCorrelated(conns, good()); len(d) != 0 {
		t.Fatalf("the expected records differ from themselves: %v", d)
	}
	for name, mutate := range map[string]func([]goIPFIXRecord) []goIPFIXRecord{
		"doubled":  func(r []goIPFIXRecord) []goIPFIXRecord { return append(r, r[2]) },
		"missing":  func(r []goIPFIXRecord) []goIPFIXRecord { return r[1:] },
		"one-side": func(r []goIPFIXRecord) []goIPFIXRecord { r[1]["destinationPodName"] = ""; return r },
		"uncorrelated": func(r []goIPFIXRecord) []goIPFIXRecord {
			// Both halves exported as they came, each one-sided.
			s, d := goIPFIXRecord{}, goIPFIXRecord{}
			for k, v := range r[0] {
				s[k], d[k] = v, v
			}
			s["destinationPodName"], d["sourcePodName"] = "", ""
			return append(r[1:], s, d)
		},
		"sides-swapped": func(r []goIPFIXRecord) []goIPFIXRecord {
			r[3]["octetTotalCountFromSourceNode"], r[3]["octetTotalCountFromDestinationNode"] =
				r[3]["octetTotalCountFromDestinationNode"], r[3]["octetTotalCountFromSourceNode"]
			return r
		},
		"throughput": func(r []goIPFIXRecord) []goIPFIXRecord {
			r[0]["throughputFromDestinationNode"] = r[0]["throughputFromDestinationNode"].(uint64) + 1
			return r
		},
		"end-time": func(r []goIPFIXRecord) []goIPFIXRecord {
			r[2]["flowEndSecondsFromSourceNode"] = r[2]["flowEndSecondsFromDestinationNode"]
			return r
		},
	} {
		if d := checkCorrelated(conns, mutate(good())); len(d) == 0 {
			t.Errorf("%s: checkCorrelated found nothing wrong", name)
		}
	}

	// The flow log: a line made from the expected values passes; the
	// same mutations of it fail.
	line := func(c *e2eConnection) string {
		r := c.expected()
		f := []string{fmt.Sprint(r["flowStartSeconds"]), fmt.Sprint(r["flowEndSeconds"]),
			c.src.Src.String(), c.src.Dst.String(), fmt.Sprint(c.src.SrcPort), fmt.Sprint(c.src.DstPort),
			map[uint8]string{6: "TCP", 17: "UDP"}[c.src.Proto],
			c.src.SrcPod, c.src.SrcNamespace, c.src.SrcNode, c.dst.DstPod, c.dst.DstNamespace, c.dst.DstNode}
		svc := []string{"", "", "0", ""}
		if c.src.DstSvcPortName != "" {
			svc = []string{c.src.ClusterIP.String(), c.src.ServiceIP.String(), fmt.Sprint(c.src.DstSvcPort), c.src.DstSvcPortName}
		}
		f = append(f, svc...)
		in := []string{"", "", "", "", ""}
		if c.dst.InPolicy != "" {
			in = []string{c.dst.InPolicy, c.dst.InPolicyNamespace, c.dst.InRule, "Allow", "K8sNetworkPolicy"}
		}
		eg := []string{"", "", "", "", ""}
		if c.src.EgPolicy != "" {
			eg = []string{c.src.EgPolicy, c.src.EgPolicyNamespace, c.src.EgRule, "Allow", "AntreaNetworkPolicy"}
		}
		f = append(append(append(f, in...), eg...), "", "", "")
		return strings.Join(f, ",")
	}
	var lines []string
	for i := range conns {
		lines = append(lines, line(&conns[i]))
	}
	if d := checkFlowLog(conns, strings.Join(lines, "\n")+"\n"); len(d) != 0 {
		t.Fatalf("the expected flow log differs from itself: %v", d)
	}
	for name, mutate := range map[string]func([]string) []string{
		"doubled": func(l []string) []string { return append(l, l[1]) },
		"missing": func(l []string) []string { return l[:3] },
		"empty":   func(l []string) []string { return nil },
		"one-side": func(l []string) []string {
			f := strings.Split(l[2], ",")
			f[10] = "" // no destination Pod
			l[2] = strings.Join(f, ",")
			return l
		},
		"short": func(l []string) []string { l[0] = l[0][:strings.LastIndexByte(l[0], ',')]; return l },
	} {
		text := strings.Join(mutate(append([]string(nil), lines...)), "\n")
		if text != "" {
			text += "\n"
		}
		if d := checkFlowLog(conns, text); len(d) == 0 {
			t.Errorf("flow log %s: checkFlowLog found nothing wrong", name)
		}
	}
}
