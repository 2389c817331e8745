package s3_test

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/sink/s3"
)

// TestCSVRowEveryField: a record with every field set, aggregated, gives
// the reference's row, field by field, written out here by hand.
func TestCSVRowEveryField(t *testing.T) {
	f := flowtest.Full(3, true)
	written := time.Unix(1800000000, 0)
	t0 := time.Date(2026, 11, 1, 12, 0, 3, 0, time.UTC).Unix()
	sec := func(d int64) string { return strconv.FormatInt(t0+d, 10) }
	want := strings.Join([]string{
		sec(0), sec(30), sec(29), sec(30), // start, end, end from source, end from destination
		"2", "10.10.0.3", "10.10.1.3", "40003", "8080", "6",
		"103", "10003", "13", "1003", // packetTotal, octetTotal, packetDelta, octetDelta
		"203", "20003", "23", "2003", // the same, reverse
		"client-3", "ns-a", "node-a", "server-3", "ns-b", "node-b",
		"10.96.0.10", "10.96.0.11", "80", "ns-b/server:http",
		"allow-web", "ns-b", "rule-in", "1", "2",
		"acnp-out", "ns-cluster", "rule-out", "3", "3",
		"ESTABLISHED", "2",
		`'{"app":"client"`, `"tier":"front"}'`, `'{"app":"server"}'`, // labels, quoted (their comma splits nothing)
		"17", "18", "19", "21", "20", "22", // throughput, reverse, from source, from destination, reverse from source, reverse from destination
		"cluster-1", "1800000000",
		"egress-1", "172.18.0.5", "node-c",
	}, ",")
	if got := string(s3.AppendCSVRow(nil, f, written)); got != want {
		t.Fatalf("row\n got %s\nwant %s", got, want)
	}
	if n := strings.Count(want, ",") + 1 - 1; n != s3.CSVFields { // one comma inside the labels
		t.Fatalf("the expected row has %d fields, want %d", n, s3.CSVFields)
	}
}

// TestCSVRowProxyRecord: a record that was not aggregated (Proxy mode) with
// few fields set: per-node times and throughputs are 0, unset addresses
// and names empty, labels an empty quoted field, IPv4-mapped addresses
// written as IPv4, and a line break inside a value never splits the row.
func TestCSVRowProxyRecord(t *testing.T) {
	f := &flow.Flow{StartTime: time.Unix(100, 0), EndTime: time.Unix(160, 9e8),
		SourceIP: netip.MustParseAddr("::ffff:10.0.0.1"), DestinationIP: netip.MustParseAddr("fd00::2"),
		SourcePort: 1, DestinationPort: 53, Protocol: 17, TCPState: "a\nb",
		Ingress: flow.Policy{RuleAction: flow.ActionDrop, Type: 1}}
	want := "100,160,0,0,0,10.0.0.1,fd00::2,1,53,17,0,0,0,0,0,0,0,0,,,,,,,,,0,,,,,2,1,,,,0,0,a b,0,'','',0,0,0,0,0,0,,42,,,"
	if got := string(s3.AppendCSVRow(nil, f, time.Unix(42, 0))); got != want {
		t.Fatalf("row\n got %s\nwant %s", got, want)
	}
	if n := strings.Count(want, ",") + 1; n != s3.CSVFields {
		t.Fatalf("the expected row has %d fields, want %d", n, s3.CSVFields)
	}
}
