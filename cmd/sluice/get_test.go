package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

// runCLI runs the sluice command with args and returns its output.
func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// TestGetFlowRecords: a node sends three one-sided flows to an aggregator
// in Aggregate mode; `sluice get` reads them back in every format.
func TestGetFlowRecords(t *testing.T) {
	a := testagg.Start(t, `
mode: Aggregate
aggregatorTransportProtocol: tcp
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`)

	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	conn, err := net.Dial("tcp", a.Addrs().IPFIX)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(1, tmpl)
	for i := range 3 {
		f := flow.Flow{
			StartTime: time.Now().Add(-time.Minute).Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
			SourceIP: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), DestinationIP: netip.MustParseAddr("10.244.2.9"),
			SourcePort: uint16(50000 + i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeInterNode,
			SourcePodNamespace: "web", SourcePodName: fmt.Sprintf("client-%d", i), SourceNodeName: "node-a",
			DestinationServicePortName: "web/api:https",
		}
		if err := ipfixmap.WriteRecord(enc.Begin(1, tmpl), els, &f); err != nil {
			t.Fatal(err)
		}
	}
	enc.Flush()
	server := "--server=http://" + a.Addrs().API

	deadline := time.Now().Add(10 * time.Second)
	var js string
	for {
		js, _, err = runCLI(t, "get", "flowrecords", server, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var recs []map[string]any
		if err := json.Unmarshal([]byte(js), &recs); err != nil {
			t.Fatalf("-o json: %v\n%s", err, js)
		}
		if len(recs) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records, want 3", len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}

	table, _, err := runCLI(t, "get", "flowrecords", server, "--srcport", "50001")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "SRC_IP") {
		t.Fatalf("table:\n%s", table)
	}
	if got := strings.Fields(lines[1]); strings.Join(got, " ") != "10.244.1.11 10.244.2.9 50001 443 TCP client-1 web web/api:https" {
		t.Errorf("table row %q", got)
	}

	y, _, err := runCLI(t, "get", "flowrecords", server, "-o", "yaml", "--proto", "udp")
	if err != nil || strings.TrimSpace(y) != "[]" {
		t.Errorf("no UDP flows: %q %v", y, err)
	}
	y, stderr, err := runCLI(t, "get", "flowrecords", server, "-o", "yaml", "--limit", "1")
	var recs []map[string]any
	if err != nil || yaml.Unmarshal([]byte(y), &recs) != nil || len(recs) != 1 || !strings.Contains(stderr, "showing 1 of 3") {
		t.Errorf("--limit 1: %v %q %q", err, y, stderr)
	}

	m, _, err := runCLI(t, "get", "recordmetrics", server, "-o", "json")
	var rm map[string]any
	if err != nil || json.Unmarshal([]byte(m), &rm) != nil || rm["numRecordsReceived"] != float64(3) || rm["numFlows"] != float64(3) {
		t.Errorf("recordmetrics: %v %s", err, m)
	}
	m, _, err = runCLI(t, "get", "recordmetrics", server)
	if err != nil || !strings.HasPrefix(m, "RECORDS-EXPORTED") || len(strings.Split(strings.TrimSpace(m), "\n")) != 2 {
		t.Errorf("recordmetrics table: %v\n%s", err, m)
	}

	if _, _, err := runCLI(t, "get", "flowrecords", server, "--srcip", "bogus"); err == nil || !strings.Contains(err.Error(), "srcip") {
		t.Errorf("a bad filter: %v", err)
	}
	if _, _, err := runCLI(t, "get", "flowrecords", server, "-o", "xml"); err == nil {
		t.Error("-o xml accepted")
	}
}
