package clickhouse_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/chserver"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/sink/clickhouse"
)

const inventory = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: server, namespace: web, uid: 11111111-2222-4333-8444-555555555555, creationTimestamp: "2025-01-01T00:00:00Z", labels: {app: server, tier: "1"}}
  spec: {nodeName: node-b}
  status: {podIP: 10.244.2.9, podIPs: [{ip: 10.244.2.9}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: client-0, namespace: web, uid: 11111111-2222-4333-8444-666666666666, creationTimestamp: "2025-01-01T00:00:00Z", labels: {app: client}}
  spec: {nodeName: node-a}
  status: {podIP: 10.244.1.2, podIPs: [{ip: 10.244.1.2}]}
`

// sendHalves sends n connections from one node over its own IPFIX/TCP
// session; half fills what that node knows.
func sendHalves(t *testing.T, addr string, domain uint32, n int, half func(i int, f *flow.Flow)) {
	t.Helper()
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(domain, tmpl)
	now := time.Now().Truncate(time.Second)
	for i := range n {
		f := flow.Flow{
			StartTime: now.Add(-10 * time.Second), EndTime: now, EndReason: 2,
			SourceIP: netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
			SourcePort: uint16(40000 + i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeInterNode,
			TCPState: "ESTABLISHED",
			Stats:    flow.Stats{OctetTotalCount: 1000 + uint64(i), PacketTotalCount: 10, OctetDeltaCount: 1000, PacketDeltaCount: 10},
			ReverseStats: flow.Stats{OctetTotalCount: 5000, PacketTotalCount: 7, OctetDeltaCount: 500 + uint64(i),
				PacketDeltaCount: 3},
			DestinationClusterIP: netip.MustParseAddr("10.96.0.20"), DestinationServiceIP: netip.MustParseAddr("10.96.0.21"),
			DestinationServicePort: 443, DestinationServicePortName: "web/server:https",
		}
		half(i, &f)
		if err := ipfixmap.WriteRecord(enc.Begin(domain, tmpl), els, &f); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func sourceHalf(i int, f *flow.Flow) {
	f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = "web", fmt.Sprintf("client-%d", i), "node-a"
	f.Egress = flow.Policy{Type: 2, Namespace: "web", Name: "egress-ok", RuleName: "e1", RuleAction: flow.ActionAllow}
	f.EgressName, f.EgressIP, f.EgressNodeName = "eg-1", netip.MustParseAddr("172.18.0.100"), "node-c"
}

func destinationHalf(i int, f *flow.Flow) {
	f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "web", "server", "node-b"
	f.Ingress = flow.Policy{Type: 3, Name: "acnp-deny", RuleName: "i1", RuleAction: flow.ActionDrop}
	f.Stats.OctetTotalCount -= 10 // the destination saw a little less
}

// ipfixName is the IPFIX element of a column (IPv4 records).
func ipfixName(col string) string {
	switch col {
	case "sourceIP":
		return "sourceIPv4Address"
	case "destinationIP":
		return "destinationIPv4Address"
	case "destinationClusterIP":
		return "destinationClusterIPv4"
	case "destinationServiceIP":
		return "destinationServiceIPv4"
	case "clusterUUID":
		return "clusterId"
	}
	return col
}

// expected renders the element behind col from an IPFIX record as the
// column's text; an element the record lacks is the column's zero.
func expected(c clickhouse.Column, byName map[string][]byte) string {
	v, ok := byName[ipfixName(c.Name)]
	switch c.Type {
	case "DateTime":
		if !ok {
			return "0"
		}
		return strconv.FormatUint(uint64(binary.BigEndian.Uint32(v)), 10)
	case "UInt8", "UInt16", "UInt64":
		var n uint64
		for _, b := range v {
			n = n<<8 | uint64(b)
		}
		return strconv.FormatUint(n, 10)
	}
	if strings.HasSuffix(ipfixName(c.Name), "IPv4") || strings.HasSuffix(ipfixName(c.Name), "IPv4Address") {
		if !ok || len(v) != 4 || [4]byte(v) == [4]byte{} {
			return ""
		}
		return netip.AddrFrom4([4]byte(v)).String()
	}
	return string(v)
}

// readRows reads every inserted column of the flows table as text, by
// source port.
func readRows(t *testing.T, c driver.Conn) map[uint16]map[string]string {
	t.Helper()
	var names []string
	for _, col := range clickhouse.Columns() {
		names = append(names, col.Name)
	}
	rows, err := c.Query(context.Background(), "SELECT "+strings.Join(names, ", ")+" FROM flows")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uint16]map[string]string{}
	for rows.Next() {
		dst := make([]any, len(names))
		for i, col := range clickhouse.Columns() {
			switch col.Type {
			case "DateTime":
				dst[i] = new(time.Time)
			case "UInt8":
				dst[i] = new(uint8)
			case "UInt16":
				dst[i] = new(uint16)
			case "UInt64":
				dst[i] = new(uint64)
			default:
				dst[i] = new(string)
			}
		}
		if err := rows.Scan(dst...); err != nil {
			t.Fatal(err)
		}
		row := map[string]string{}
		for i, name := range names {
			switch v := dst[i].(type) {
			case *time.Time:
				row[name] = strconv.FormatInt(v.Unix(), 10)
			case *uint8:
				row[name] = strconv.Itoa(int(*v))
			case *uint16:
				row[name] = strconv.Itoa(int(*v))
			case *uint64:
				row[name] = strconv.FormatUint(*v, 10)
			case *string:
				row[name] = *v
			}
		}
		p, _ := strconv.Atoi(row["sourceTransportPort"])
		if _, dup := out[uint16(p)]; dup {
			t.Errorf("two rows for source port %d", p)
		}
		out[uint16(p)] = row
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRowsMatchTheExport: records go through a real aggregator (its IPFIX
// collector, the mode, enrichment) to both an IPFIX collector and
// ClickHouse; every column of every row equals the element the IPFIX
// export carries, in Aggregate mode (two nodes' halves correlated) and in
// Proxy mode (one row per record, correlation columns zero).
func TestRowsMatchTheExport(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{})
	conn := srv.Conn()
	for _, mode := range []string{"Aggregate", "Proxy"} {
		t.Run(mode, func(t *testing.T) {
			if err := conn.Exec(context.Background(), "DROP TABLE IF EXISTS flows"); err != nil {
				t.Fatal(err)
			}
			for _, v := range []string{clickhouse.PodView, clickhouse.NodeView, clickhouse.PolicyView} {
				conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+v)
			}
			inv := filepath.Join(t.TempDir(), "inventory.yaml")
			os.WriteFile(inv, []byte(inventory), 0o644)
			coll := stubcollector.New(t)
			a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
clusterID: test-cluster
recordContents: {podLabels: true}
flowCollector: {enable: true, address: "%s:tcp"}
clickHouse: {enable: true, databaseURL: "tcp://%s", commitInterval: 1s, createSchema: true, compress: true}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", inventory: %s}
`, mode, coll.Addr(), srv.Addr, inv))
			const n = 20
			sendHalves(t, a.Addrs().IPFIX, 1, n, sourceHalf)
			want := n
			if mode == "Aggregate" {
				sendHalves(t, a.Addrs().IPFIX, 2, n, destinationHalf)
			} else {
				sendHalves(t, a.Addrs().IPFIX, 2, n, func(i int, f *flow.Flow) {
					f.SourcePort += 1000
					destinationHalf(i, f)
				})
				want = 2 * n
			}
			testkit.WaitFor(t, "the records at the collector", func() bool { return coll.Len() >= want })
			testkit.WaitFor(t, "the rows in ClickHouse", func() bool { return srv.Count(conn, "flows") >= int64(want) })
			if err := a.Stop(); err != nil {
				t.Fatal(err)
			}
			recs := coll.Records()
			rows := readRows(t, conn)
			if len(recs) != want || len(rows) != want {
				t.Fatalf("%d records exported, %d rows, want %d", len(recs), len(rows), want)
			}
			nonZero := map[string]bool{}
			for _, r := range recs {
				row, ok := rows[r.Flow.SourcePort]
				if !ok {
					t.Errorf("no row for source port %d", r.Flow.SourcePort)
					continue
				}
				for _, c := range clickhouse.Columns() {
					w := expected(c, r.ByName)
					if row[c.Name] != w {
						t.Errorf("port %d: %s = %q, want %q", r.Flow.SourcePort, c.Name, row[c.Name], w)
					}
					if w != "" && w != "0" {
						nonZero[c.Name] = true
					}
				}
			}
			// The comparison means something only if the columns carry values.
			for _, c := range clickhouse.Columns() {
				corr := strings.Contains(c.Name, "FromSourceNode") || strings.Contains(c.Name, "FromDestinationNode") ||
					strings.Contains(c.Name, "hroughput")
				switch {
				case mode == "Proxy" && corr:
					if nonZero[c.Name] {
						t.Errorf("Proxy mode filled correlation column %s", c.Name)
					}
				case c.Name == "ingressNetworkPolicyNamespace" || c.Name == "destinationPodLabels" && mode == "Proxy" ||
					strings.Contains(c.Name, "hroughput") && !strings.Contains(c.Name, "Node"):
					// empty by design of the records (a cluster policy has no namespace), or
					// zero throughput on a flow's first export
				default:
					if !nonZero[c.Name] {
						t.Errorf("column %s is empty in every row: the test does not exercise it", c.Name)
					}
				}
			}
			// The queries docs/sinks.md shows run on this server and find rows.
			for _, q := range docQueries(t) {
				rows, err := conn.Query(context.Background(), q)
				if err != nil {
					t.Errorf("docs/sinks.md query fails: %v\n%s", err, q)
					continue
				}
				n := 0
				for rows.Next() {
					n++
				}
				rows.Close()
				if n == 0 {
					t.Errorf("docs/sinks.md query finds nothing:\n%s", q)
				}
			}
			// The views were fed.
			for _, v := range []string{clickhouse.PodView, clickhouse.NodeView, clickhouse.PolicyView} {
				if srv.Count(conn, v) < 1 {
					t.Errorf("view %s has no rows", v)
				}
			}
		})
	}
}

// docQueries are the SQL blocks of docs/sinks.md's ClickHouse section
// (the S3 section's are DuckDB's and Athena's).
func docQueries(t *testing.T) []string {
	b, err := os.ReadFile("../../docs/sinks.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## ClickHouse")
	if start < 0 {
		t.Fatal("docs/sinks.md has no ClickHouse section")
	}
	doc = doc[start:]
	if end := strings.Index(doc[1:], "\n## "); end >= 0 {
		doc = doc[:end+1]
	}
	var out []string
	for _, part := range strings.Split(doc, "```sql\n")[1:] {
		out = append(out, strings.Split(part, "```")[0])
	}
	if len(out) < 4 {
		t.Fatalf("docs/sinks.md has %d SQL blocks", len(out))
	}
	return out
}
