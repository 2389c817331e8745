package flowsrc

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/sink/flowlog"
)

func sampleFlows() []flow.Flow {
	t0 := time.Unix(1_790_000_000, 0).UTC()
	return []flow.Flow{
		{StartTime: t0, EndTime: t0.Add(time.Minute), SourceIP: netip.MustParseAddr("10.10.1.5"),
			DestinationIP: netip.MustParseAddr("10.10.2.6"), SourcePort: 40000, DestinationPort: 8080, Protocol: 6,
			SourcePodName: "frontend-1", SourcePodNamespace: "web", SourceNodeName: "n1",
			DestinationPodName: "cart-1", DestinationPodNamespace: "web", DestinationNodeName: "n2",
			DestinationClusterIP: netip.MustParseAddr("10.96.10.10"), DestinationServicePort: 8080,
			DestinationServicePortName: "web/cart:http",
			Ingress:                    flow.Policy{Name: "cart-in", Namespace: "web", RuleName: "r1", RuleAction: flow.ActionAllow, Type: 1}},
		{StartTime: t0.Add(time.Hour), EndTime: t0.Add(time.Hour + time.Second), SourceIP: netip.MustParseAddr("fd00::5"),
			DestinationIP: netip.MustParseAddr("fd00::9"), SourcePort: 5353, DestinationPort: 53, Protocol: 17,
			SourcePodName: "a", SourcePodNamespace: "b",
			Egress: flow.Policy{Name: "quarantine", RuleName: "drop", RuleAction: flow.ActionDrop, Type: 3}},
		{StartTime: t0, EndTime: t0, SourceIP: netip.MustParseAddr("10.10.1.5"),
			DestinationIP: netip.MustParseAddr("203.0.113.9"), Protocol: 1},
	}
}

func toRecord(f *flow.Flow) Record {
	return Record{Start: f.StartTime, End: f.EndTime, Src: f.SourceIP, Dst: f.DestinationIP, SrcPort: f.SourcePort,
		DstPort: f.DestinationPort, Proto: f.Protocol, SrcNamespace: f.SourcePodNamespace, SrcPod: f.SourcePodName,
		DstNamespace: f.DestinationPodNamespace, DstPod: f.DestinationPodName, ClusterIP: f.DestinationClusterIP,
		ServicePortName: f.DestinationServicePortName, Ingress: f.Ingress, Egress: f.Egress}
}

// TestParseLineRoundTrip: lines the flowLogger sink writes, in both
// spellings, read back as the records they came from.
func TestParseLineRoundTrip(t *testing.T) {
	for _, pretty := range []bool{false, true} {
		for i, f := range sampleFlows() {
			line := flowlog.AppendLine(nil, &f, pretty)
			var got Record
			if err := ParseLine(line, &got); err != nil {
				t.Fatalf("pretty=%v flow %d: %v\n%s", pretty, i, err, line)
			}
			if want := toRecord(&f); got != want {
				t.Errorf("pretty=%v flow %d:\n got %+v\nwant %+v", pretty, i, got, want)
			}
		}
	}
	var r Record
	f := sampleFlows()[1]
	if err := ParseLine(flowlog.AppendLine(nil, &f, true), &r); err != nil || !r.Denied() {
		t.Errorf("a Drop record: denied=%v err=%v", r.Denied(), err)
	}
}

func TestParseLineErrors(t *testing.T) {
	f := sampleFlows()[0]
	good := string(flowlog.AppendLine(nil, &f, true))
	fields := strings.Split(good, ",")
	set := func(i int, v string) string {
		g := append([]string(nil), fields...)
		g[i] = v
		return strings.Join(g, ",")
	}
	for _, c := range []struct{ line, want string }{
		{"", "1 comma-separated fields"},
		{good + ",x", "more than 30"},
		{strings.Join(fields[:29], ","), "29 comma-separated fields"},
		{set(0, "yesterday"), "flowStartSeconds"},
		{set(2, "10.10.1"), "sourceIP"},
		{set(3, ""), "destinationIP"},
		{set(5, "65536"), "destinationTransportPort"},
		{set(6, "tcpx"), "protocolIdentifier"},
		{set(13, "nope"), "destinationClusterIP"},
		{set(20, "Maybe"), "ingress policy: rule action"},
		{set(26, "Weird"), "egress policy: policy type"},
	} {
		var r Record
		err := ParseLine([]byte(c.line), &r)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one with %q", c.line, err, c.want)
		}
	}
}

// TestFileSource: a plain and a gzipped log, with --since, and a bad line
// named by its number.
func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	flows := sampleFlows()
	for i := range flows {
		buf.Write(flowlog.AppendLine(nil, &flows[i], i%2 == 0))
		buf.WriteString("\n")
	}
	plain := filepath.Join(dir, "flows.log")
	if err := os.WriteFile(plain, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(buf.Bytes())
	w.Close()
	zipped := filepath.Join(dir, "flows-2026.log.gz")
	if err := os.WriteFile(zipped, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{plain, zipped} {
		src, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		var got []Record
		if err := src.Read(context.Background(), time.Time{}, func(r *Record) error { got = append(got, *r); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 || got[1] != toRecord(&flows[1]) {
			t.Errorf("%s: %d records, second %+v", p, len(got), got)
		}
		n := 0
		since := flows[0].EndTime.Add(time.Second)
		if err := src.Read(context.Background(), since, func(*Record) error { n++; return nil }); err != nil || n != 1 {
			t.Errorf("%s since %s: %d records (%v), want 1", p, since, n, err)
		}
	}
	bad := filepath.Join(dir, "bad.log")
	os.WriteFile(bad, append(buf.Bytes(), "1,2,3\n"...), 0o600)
	err := (&File{Path: bad}).Read(context.Background(), time.Time{}, func(*Record) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("bad line: %v", err)
	}
	stop := errors.New("stop")
	if err := (&File{Path: plain}).Read(context.Background(), time.Time{}, func(*Record) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback error: %v", err)
	}
	if err := (&File{Path: filepath.Join(dir, "missing")}).Read(context.Background(), time.Time{}, nil); err == nil {
		t.Error("a missing file read without error")
	}
}

func TestOpen(t *testing.T) {
	for spec, want := range map[string]string{
		"http://127.0.0.1:10348": "*flowsrc.API", "https://agg:10348": "*flowsrc.API",
		"127.0.0.1:10348": "*flowsrc.API", "/tmp/flows.log": "*flowsrc.File", "flows.log": "*flowsrc.File",
		"tcp://ch:9000/default": "*flowsrc.ClickHouse", "tls://ch:9440/flows": "*flowsrc.ClickHouse",
	} {
		s, err := Open(spec)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if got := typeName(s); got != want {
			t.Errorf("%s: %s, want %s", spec, got, want)
		}
	}
	for _, bad := range []string{""} {
		if _, err := Open(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func typeName(s Source) string {
	switch s.(type) {
	case *API:
		return "*flowsrc.API"
	case *File:
		return "*flowsrc.File"
	case *ClickHouse:
		return "*flowsrc.ClickHouse"
	}
	return "?"
}

func FuzzParseLine(f *testing.F) {
	for _, fl := range sampleFlows() {
		f.Add(flowlog.AppendLine(nil, &fl, true))
		f.Add(flowlog.AppendLine(nil, &fl, false))
	}
	f.Add([]byte(",,,,,,,,,,,,,,,,,,,,,,,,,,,,,"))
	f.Fuzz(func(t *testing.T, line []byte) {
		var r Record
		if err := ParseLine(line, &r); err != nil {
			return
		}
		if !r.Src.IsValid() || !r.Dst.IsValid() {
			t.Fatalf("accepted a line without addresses: %q", line)
		}
	})
}

func TestFromFlow(t *testing.T) {
	for _, f := range sampleFlows() {
		var r Record
		FromFlow(&f, &r)
		if want := toRecord(&f); r != want {
			t.Errorf("\n got %+v\nwant %+v", r, want)
		}
	}
}

// FuzzFromElements: any JSON object the API could answer is read or
// refused, never a panic; an accepted one has both addresses.
func FuzzFromElements(f *testing.F) {
	f.Add([]byte(`{"sourceIPv4Address":"10.0.0.1","destinationIPv4Address":"10.0.0.2","protocolIdentifier":6,"destinationTransportPort":80,"flowEndSeconds":"2026-12-04T22:00:00Z","ingressNetworkPolicyRuleAction":2}`))
	f.Add([]byte(`{"sourceIPv6Address":"fd00::1","destinationIPv6Address":"fd00::2","sourceTransportPort":70000}`))
	f.Add([]byte(`{"sourceIPv4Address":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		var m map[string]any
		if d.Decode(&m) != nil {
			return
		}
		var r Record
		if FromElements(m, &r) == nil && (!r.Src.IsValid() || !r.Dst.IsValid()) {
			t.Fatalf("accepted %s without addresses", data)
		}
	})
}
