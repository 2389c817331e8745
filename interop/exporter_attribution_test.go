package interop

// End to end from Sluice's exporter: two exporters (one per Node of a
// modelled cluster, reading in-memory connection tables) attribute their
// connections with the cluster's NetworkPolicies and Egress and send them
// over IPFIX/TCP to a Sluice aggregator in Aggregate mode, whose export
// go-ipfix's collecting process decodes: the policy and Egress elements
// are checked as an independent decoder reads them.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/exporter"
	"sluice/exporter/attribution"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/source"
	"sluice/traceflow/pipeline"
)

// attributionCluster: a client on node-1, a server on node-2; the server
// takes TCP 8080 only (a K8s NetworkPolicy, so 9090 is dropped), the
// client may send anywhere (another K8s NetworkPolicy), and leaves the
// cluster through an Egress whose IP node-2 holds.
const attributionCluster = `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1}
  spec: {podCIDR: 10.10.1.0/24, podCIDRs: [10.10.1.0/24]}
  status: {addresses: [{type: InternalIP, address: 192.168.77.1}]}
- apiVersion: v1
  kind: Node
  metadata: {name: node-2}
  spec: {podCIDR: 10.10.2.0/24, podCIDRs: [10.10.2.0/24]}
  status: {addresses: [{type: InternalIP, address: 192.168.77.2}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: client, namespace: shop, labels: {app: client}, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec: {nodeName: node-1}
  status: {phase: Running, podIP: 10.10.1.2, podIPs: [{ip: 10.10.1.2}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: server, namespace: shop, labels: {app: server}, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec: {nodeName: node-2}
  status: {phase: Running, podIP: 10.10.2.2, podIPs: [{ip: 10.10.2.2}]}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: server-ingress, namespace: shop}
  spec:
    podSelector: {matchLabels: {app: server}}
    policyTypes: [Ingress]
    ingress:
    - ports: [{protocol: TCP, port: 8080}]
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: client-egress, namespace: shop}
  spec:
    podSelector: {matchLabels: {app: client}}
    policyTypes: [Egress]
    egress:
    - {}
- apiVersion: crd.antrea.io/v1beta1
  kind: Egress
  metadata: {name: shop-out, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec:
    appliedTo: {podSelector: {matchLabels: {app: client}}}
    egressIP: 192.168.77.100
  status: {egressNode: node-2, egressIP: 192.168.77.100}
`

// staticTable is a connection table that only grows its counters when
// told: a source for an exporter in process.
type staticTable struct {
	mu    sync.Mutex
	conns []source.Conn
}

func (t *staticTable) Dump(_ context.Context, dst []source.Conn) ([]source.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append(dst, t.conns...), nil
}

func (t *staticTable) Close() error { return nil }

func tcpConn(id uint32, client, server string, pkts, rpkts uint64) source.Conn {
	c, s := netip.MustParseAddrPort(client), netip.MustParseAddrPort(server)
	return source.Conn{ID: id, Proto: source.ProtoTCP, TCPState: source.TCPEstablished, OrigSrc: c, OrigDst: s, ReplySrc: s, ReplyDst: c,
		Packets: pkts, Bytes: 60 * pkts, ReversePackets: rpkts, ReverseBytes: 60 * rpkts, Start: time.Now().Add(-time.Second)}
}

// startAttributingExporter runs an exporter for node with the cluster
// file's Pods and policy model, sending IPFIX over TCP to collector.
func startAttributingExporter(t *testing.T, inv, node, podCIDR, collector string, src source.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	meta, err := enrich.OpenSource(enrich.SourceOptions{Inventory: inv, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = meta.Run(ctx) })
	select {
	case <-meta.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the inventory was not read")
	}
	a := attribution.New(attribution.Options{Log: log})
	if _, err := attribution.NewLoader(a, attribution.FileSource(inv), pipeline.DefaultConfig()).Load(ctx); err != nil {
		t.Fatal(err)
	}
	coll, err := collectoraddr.Parse(collector + ":tcp")
	if err != nil {
		t.Fatal(err)
	}
	e, err := exporter.New(exporter.Options{Node: node, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(podCIDR)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: src, Store: meta, Attributor: a,
		Collector: coll, PollInterval: time.Second, ActiveTimeout: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = e.Run(ctx) })
}

// attributionWant is what go-ipfix must read in the aggregator's record
// of one connection, by element name.
type attributionWant struct {
	name           string
	client, server string
	elems          map[string]any
}

func attributionCases() []attributionWant {
	none := map[string]any{"egressName": "", "egressIP": "", "egressNodeName": ""}
	with := func(m map[string]any, more map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}
	allowedOut := map[string]any{"egressNetworkPolicyName": "client-egress", "egressNetworkPolicyNamespace": "shop",
		"egressNetworkPolicyType": uint64(1), "egressNetworkPolicyRuleAction": uint64(1)}
	return []attributionWant{
		{"allowed, correlated from both Nodes", "10.10.1.2:45000", "10.10.2.2:8080", with(with(allowedOut, none), map[string]any{
			"ingressNetworkPolicyName": "server-ingress", "ingressNetworkPolicyNamespace": "shop",
			"ingressNetworkPolicyType": uint64(1), "ingressNetworkPolicyRuleAction": uint64(1),
			"sourcePodName": "client", "destinationPodName": "server", "flowType": uint64(2)})},
		{"denied by the server's ingress policy, unanswered", "10.10.1.2:45001", "10.10.2.2:9090", with(with(allowedOut, none), map[string]any{
			"ingressNetworkPolicyName": "server-ingress", "ingressNetworkPolicyNamespace": "shop",
			"ingressNetworkPolicyType": uint64(1), "ingressNetworkPolicyRuleAction": uint64(2), // Drop
			"sourcePodName": "client", "reversePacketTotalCount": uint64(0), "flowType": uint64(2)})},
		{"out of the cluster through the Egress", "10.10.1.2:45002", "203.0.113.5:443", with(allowedOut, map[string]any{
			"egressName": "shop-out", "egressIP": "192.168.77.100", "egressNodeName": "node-2",
			"ingressNetworkPolicyName": "", "ingressNetworkPolicyRuleAction": uint64(0),
			"sourcePodName": "client", "flowType": uint64(3)})},
	}
}

// checkAttribution compares the decoded records with the cases: at least
// one record per case's connection (the aggregator exports a connection
// again at each active timeout), every one with every listed element as
// wanted.
func checkAttribution(cases []attributionWant, recs []goIPFIXRecord) []string {
	var diffs []string
	for _, c := range cases {
		cl, sv := netip.MustParseAddrPort(c.client), netip.MustParseAddrPort(c.server)
		var found []goIPFIXRecord
		for _, r := range recs {
			if r["sourceIPv4Address"] == cl.Addr().String() && r["sourceTransportPort"] == uint64(cl.Port()) &&
				r["destinationIPv4Address"] == sv.Addr().String() && r["destinationTransportPort"] == uint64(sv.Port()) {
				found = append(found, r)
			}
		}
		if len(found) == 0 {
			diffs = append(diffs, c.name+": no record")
			continue
		}
		for i, r := range found {
			for k, want := range c.elems {
				if got, ok := r[k]; !ok || got != want {
					diffs = append(diffs, fmt.Sprintf("%s (record %d of %d): %s = %#v, want %#v", c.name, i+1, len(found), k, got, want))
				}
			}
		}
	}
	return diffs
}

// TestExporterAttributionGoIPFIX: records of Sluice's exporters carry the
// NetworkPolicy rules and the Egress that act on them, and the denied
// connection's rule with the action Drop, through the aggregator to an
// independent decoder.
func TestExporterAttributionGoIPFIX(t *testing.T) {
	inv := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(inv, []byte(attributionCluster), 0o644); err != nil {
		t.Fatal(err)
	}
	cp := startGoIPFIXCollector(t, "tcp")
	sink := collectGoIPFIX(cp)
	// One-sided records (the denied connection's) wait for the other
	// Node's at most the active timeout.
	a, stop := startAggregate(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
activeFlowRecordTimeout: 1s
inactiveFlowRecordTimeout: 10s
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`, cp.GetAddress()))

	node1 := &staticTable{conns: []source.Conn{
		tcpConn(1, "10.10.1.2:45000", "10.10.2.2:8080", 10, 8),
		tcpConn(2, "10.10.1.2:45001", "10.10.2.2:9090", 3, 0), // SYNs, no answer
		tcpConn(3, "10.10.1.2:45002", "203.0.113.5:443", 12, 9),
	}}
	node2 := &staticTable{conns: []source.Conn{tcpConn(7, "10.10.1.2:45000", "10.10.2.2:8080", 10, 8)}}
	startAttributingExporter(t, inv, "node-1", "10.10.1.0/24", a.Addrs().IPFIX, node1)
	startAttributingExporter(t, inv, "node-2", "10.10.2.0/24", a.Addrs().IPFIX, node2)

	cases := attributionCases()
	// Until every connection has a record (or the deadline): the
	// denied one waits for the other Node's record an active timeout.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		recs, _ := sink.state()
		if len(checkAttribution(cases, recs)) == 0 {
			break
		}
	}
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
	sink.mu.Unlock()
	if d := checkAttribution(cases, recs); len(d) > 0 {
		var all []string
		for _, r := range recs {
			all = append(all, fmt.Sprint(r))
		}
		t.Errorf("%s\nrecords:\n%s", strings.Join(d, "\n"), strings.Join(all, "\n"))
	}
}

// TestExporterAttributionChecksFail is the negative control: records
// without the policy, with another action or Egress, or missing, are
// reported.
func TestExporterAttributionChecksFail(t *testing.T) {
	cases := attributionCases()
	good := func() []goIPFIXRecord {
		var recs []goIPFIXRecord
		for _, c := range cases {
			cl, sv := netip.MustParseAddrPort(c.client), netip.MustParseAddrPort(c.server)
			r := goIPFIXRecord{"sourceIPv4Address": cl.Addr().String(), "sourceTransportPort": uint64(cl.Port()),
				"destinationIPv4Address": sv.Addr().String(), "destinationTransportPort": uint64(sv.Port())}
			for k, v := range c.elems {
				r[k] = v
			}
			recs = append(recs, r)
		}
		return recs
	}
	if d := checkAttribution(cases, good()); len(d) != 0 {
		t.Fatalf("the wanted records differ from themselves: %v", d)
	}
	for name, mutate := range map[string]func([]goIPFIXRecord) []goIPFIXRecord{
		"missing": func(r []goIPFIXRecord) []goIPFIXRecord { return r[1:] },
		"a-wrong-second": func(r []goIPFIXRecord) []goIPFIXRecord {
			w := goIPFIXRecord{}
			for k, v := range r[2] {
				w[k] = v
			}
			w["egressIP"] = "192.168.77.101"
			return append(r, w)
		},
		"allowed-denied": func(r []goIPFIXRecord) []goIPFIXRecord { r[1]["ingressNetworkPolicyRuleAction"] = uint64(1); return r },
		"no-egress":      func(r []goIPFIXRecord) []goIPFIXRecord { r[2]["egressName"] = ""; return r },
		"no-policy":      func(r []goIPFIXRecord) []goIPFIXRecord { delete(r[0], "ingressNetworkPolicyName"); return r },
	} {
		if d := checkAttribution(cases, mutate(good())); len(d) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}
