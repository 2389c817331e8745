package clickhouse

import (
	"fmt"
	"strings"
	"time"
)

// Table is the name of the flows table.
const Table = "flows"

// The views, each a SummingMergeTree fed by the flows table.
const (
	PodView    = "flows_pod_view"
	NodeView   = "flows_node_view"
	PolicyView = "flows_policy_view"
)

// Column is one column of the flows table that the sink writes.
type Column struct {
	Name string
	// Type is the ClickHouse type on every server.
	Type string
	// LowCardinality marks a String column worth dictionary encoding,
	// on a server that has LowCardinality without an experimental
	// setting.
	LowCardinality bool
}

// Columns are the columns the sink inserts, in table order: the 51 the
// reference inserts, with destinationServiceIP after destinationClusterIP
// (where the reference's S3 row and flow log put it). The table also has
// timeInserted (first) and trusted (after clusterUUID), which take their
// defaults.
var columns = [...]Column{
	{Name: "flowStartSeconds", Type: "DateTime"},
	{Name: "flowEndSeconds", Type: "DateTime"},
	{Name: "flowEndSecondsFromSourceNode", Type: "DateTime"},
	{Name: "flowEndSecondsFromDestinationNode", Type: "DateTime"},
	{Name: "flowEndReason", Type: "UInt8"},
	{Name: "sourceIP", Type: "String"},
	{Name: "destinationIP", Type: "String"},
	{Name: "sourceTransportPort", Type: "UInt16"},
	{Name: "destinationTransportPort", Type: "UInt16"},
	{Name: "protocolIdentifier", Type: "UInt8"},
	{Name: "packetTotalCount", Type: "UInt64"},
	{Name: "octetTotalCount", Type: "UInt64"},
	{Name: "packetDeltaCount", Type: "UInt64"},
	{Name: "octetDeltaCount", Type: "UInt64"},
	{Name: "reversePacketTotalCount", Type: "UInt64"},
	{Name: "reverseOctetTotalCount", Type: "UInt64"},
	{Name: "reversePacketDeltaCount", Type: "UInt64"},
	{Name: "reverseOctetDeltaCount", Type: "UInt64"},
	{Name: "sourcePodName", Type: "String"},
	{Name: "sourcePodNamespace", Type: "String", LowCardinality: true},
	{Name: "sourceNodeName", Type: "String", LowCardinality: true},
	{Name: "destinationPodName", Type: "String"},
	{Name: "destinationPodNamespace", Type: "String", LowCardinality: true},
	{Name: "destinationNodeName", Type: "String", LowCardinality: true},
	{Name: "destinationClusterIP", Type: "String"},
	{Name: "destinationServiceIP", Type: "String"},
	{Name: "destinationServicePort", Type: "UInt16"},
	{Name: "destinationServicePortName", Type: "String", LowCardinality: true},
	{Name: "ingressNetworkPolicyName", Type: "String", LowCardinality: true},
	{Name: "ingressNetworkPolicyNamespace", Type: "String", LowCardinality: true},
	{Name: "ingressNetworkPolicyRuleName", Type: "String", LowCardinality: true},
	{Name: "ingressNetworkPolicyRuleAction", Type: "UInt8"},
	{Name: "ingressNetworkPolicyType", Type: "UInt8"},
	{Name: "egressNetworkPolicyName", Type: "String", LowCardinality: true},
	{Name: "egressNetworkPolicyNamespace", Type: "String", LowCardinality: true},
	{Name: "egressNetworkPolicyRuleName", Type: "String", LowCardinality: true},
	{Name: "egressNetworkPolicyRuleAction", Type: "UInt8"},
	{Name: "egressNetworkPolicyType", Type: "UInt8"},
	{Name: "tcpState", Type: "String", LowCardinality: true},
	{Name: "flowType", Type: "UInt8"},
	{Name: "sourcePodLabels", Type: "String"},
	{Name: "destinationPodLabels", Type: "String"},
	{Name: "throughput", Type: "UInt64"},
	{Name: "reverseThroughput", Type: "UInt64"},
	{Name: "throughputFromSourceNode", Type: "UInt64"},
	{Name: "throughputFromDestinationNode", Type: "UInt64"},
	{Name: "reverseThroughputFromSourceNode", Type: "UInt64"},
	{Name: "reverseThroughputFromDestinationNode", Type: "UInt64"},
	{Name: "clusterUUID", Type: "String", LowCardinality: true},
	{Name: "egressName", Type: "String", LowCardinality: true},
	{Name: "egressIP", Type: "String"},
	{Name: "egressNodeName", Type: "String", LowCardinality: true},
}

// Columns returns the columns the sink inserts, in table order.
func Columns() []Column { return columns[:] }

// sluiceOnly are the inserted columns that the reference's table lacks:
// the sink leaves them out of its INSERT when the table has not got them.
var sluiceOnly = map[string]bool{"destinationServiceIP": true}

// Version is a ClickHouse server version.
type Version struct{ Major, Minor, Patch uint64 }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// atLeast reports whether v is major.minor or later.
func (v Version) atLeast(major, minor uint64) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// ParseVersion reads "18.16", "18.16.1" or "24.8.4.13".
func ParseVersion(s string) (Version, error) {
	var v Version
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return v, fmt.Errorf("version %q: want major.minor[.patch]", s)
	}
	dst := []*uint64{&v.Major, &v.Minor, &v.Patch}
	for i := 0; i < len(parts) && i < 3; i++ {
		var n uint64
		if _, err := fmt.Sscanf(parts[i], "%d", &n); err != nil || fmt.Sprint(n) != parts[i] {
			return Version{}, fmt.Errorf("version %q: %q is not a number", s, parts[i])
		}
		*dst[i] = n
	}
	return v, nil
}

// Latest stands for a current server, which takes every feature.
var Latest = Version{Major: 999}

// SchemaOptions shape the DDL.
type SchemaOptions struct {
	// Database holds the table and the views; empty means "default".
	Database string
	// TTL, when positive, deletes rows (of the table and the views) that
	// long after they were inserted, on a server that has TTL.
	TTL time.Duration
	// Server is the server version the DDL is for; the zero Version means
	// Latest.
	Server Version
}

// Statement is one DDL statement.
type Statement struct {
	// Object is the table or view it creates.
	Object string
	SQL    string
}

// Schema is the DDL of the flows table and its views, for the server
// version of o, and what that server cannot take (left out of the DDL),
// one phrase an item.
func Schema(o SchemaOptions) (stmts []Statement, omitted []string) {
	db := o.Database
	if db == "" {
		db = "default"
	}
	srv := o.Server
	if srv == (Version{}) {
		srv = Latest
	}
	// LowCardinality is refused without an experimental setting before
	// 19.1 (18.16 does); table TTL came with 19.6.
	lowCard := srv.atLeast(19, 1)
	ttl := ""
	if o.TTL > 0 {
		if srv.atLeast(19, 6) {
			ttl = fmt.Sprintf("\nTTL timeInserted + INTERVAL %d SECOND", int64(o.TTL.Seconds()))
		} else {
			omitted = append(omitted, fmt.Sprintf("TTL (needs ClickHouse 19.6; rows are kept until deleted by hand, ttl was %s)", o.TTL))
		}
	}
	if !lowCard {
		omitted = append(omitted, "LowCardinality(String) (needs ClickHouse 19.1; plain String instead)")
	}

	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s.%s (\n", quote(db), Table)
	b.WriteString("    timeInserted DateTime DEFAULT now(),\n")
	for _, c := range columns {
		typ := c.Type
		if c.LowCardinality && lowCard {
			typ = "LowCardinality(String)"
		}
		fmt.Fprintf(&b, "    %s %s,\n", c.Name, typ)
		if c.Name == "clusterUUID" {
			b.WriteString("    trusted UInt8 DEFAULT 0,\n")
		}
	}
	s := strings.TrimSuffix(b.String(), ",\n") + "\n)"
	s += "\nENGINE = MergeTree()\nPARTITION BY toYYYYMMDD(timeInserted)\nORDER BY (timeInserted, flowEndSeconds)" + ttl
	stmts = append(stmts, Statement{Object: Table, SQL: s})

	sums := []string{"octetDeltaCount", "reverseOctetDeltaCount", "packetDeltaCount", "reversePacketDeltaCount",
		"throughput", "reverseThroughput", "throughputFromSourceNode", "throughputFromDestinationNode",
		"reverseThroughputFromSourceNode", "reverseThroughputFromDestinationNode"}
	view := func(name string, keys []string) Statement {
		keys = append([]string{"timeInserted", "flowEndSeconds"}, keys...)
		keys = append(keys, "flowType", "clusterUUID")
		var sel []string
		sel = append(sel, keys...)
		for _, c := range sums {
			sel = append(sel, fmt.Sprintf("sum(%s) AS %s", c, c))
		}
		return Statement{Object: name, SQL: fmt.Sprintf(
			"CREATE MATERIALIZED VIEW IF NOT EXISTS %s.%s\nENGINE = SummingMergeTree()\nPARTITION BY toYYYYMMDD(timeInserted)\nORDER BY (%s)%s\nAS SELECT\n    %s\nFROM %s.%s\nGROUP BY %s",
			quote(db), name, strings.Join(keys, ", "), ttl, strings.Join(sel, ",\n    "), quote(db), Table, strings.Join(keys, ", "))}
	}
	stmts = append(stmts,
		view(PodView, []string{"sourcePodNamespace", "sourcePodName", "destinationPodNamespace", "destinationPodName",
			"destinationIP", "destinationTransportPort", "protocolIdentifier", "destinationServicePortName"}),
		view(NodeView, []string{"sourceNodeName", "destinationNodeName", "sourcePodNamespace", "destinationPodNamespace"}),
		view(PolicyView, []string{"ingressNetworkPolicyNamespace", "ingressNetworkPolicyName", "ingressNetworkPolicyRuleName",
			"ingressNetworkPolicyRuleAction", "egressNetworkPolicyNamespace", "egressNetworkPolicyName",
			"egressNetworkPolicyRuleName", "egressNetworkPolicyRuleAction", "sourcePodNamespace", "destinationPodNamespace",
			"destinationServicePortName"}),
	)
	return stmts, omitted
}

// quote writes a database name as an identifier.
func quote(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "\\`") + "`"
}
