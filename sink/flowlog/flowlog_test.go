package flowlog_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/flowlog"
)

func sample() *flow.Flow {
	return &flow.Flow{
		StartTime: time.Unix(1700000000, 5e8), EndTime: time.Unix(1700000042, 0),
		SourceIP: netip.MustParseAddr("10.10.1.5"), DestinationIP: netip.MustParseAddr("10.10.2.7"),
		SourcePort: 43512, DestinationPort: 8080, Protocol: 6,
		SourcePodName: "client-7d9", SourcePodNamespace: "shop", SourceNodeName: "node-a",
		DestinationPodName: "cart-0", DestinationPodNamespace: "shop", DestinationNodeName: "node-b",
		DestinationClusterIP: netip.MustParseAddr("10.96.0.20"), DestinationServiceIP: netip.MustParseAddr("10.96.0.20"),
		DestinationServicePort: 80, DestinationServicePortName: "shop/cart:http",
		Ingress:    flow.Policy{Type: 2, Namespace: "shop", Name: "allow-web", RuleName: "r1", RuleAction: flow.ActionAllow},
		Egress:     flow.Policy{Type: 4, Namespace: "", Name: "cnp", RuleName: "line\nbreak", RuleAction: flow.ActionReject},
		EgressName: "eg1", EgressIP: netip.MustParseAddr("172.18.0.100"), EgressNodeName: "node-c",
	}
}

func TestAppendLinePretty(t *testing.T) {
	got := strings.Split(string(flowlog.AppendLine(nil, sample(), true)), ",")
	want := []string{"1700000000", "1700000042", "10.10.1.5", "10.10.2.7", "43512", "8080", "TCP",
		"client-7d9", "shop", "node-a", "cart-0", "shop", "node-b", "10.96.0.20", "10.96.0.20", "80", "shop/cart:http",
		"allow-web", "shop", "r1", "Allow", "AntreaNetworkPolicy",
		"cnp", "", "line break", "Reject", "K8sClusterNetworkPolicy",
		"eg1", "172.18.0.100", "node-c"}
	if len(got) != flowlog.Fields || len(want) != flowlog.Fields {
		t.Fatalf("got %d fields, want %d: %q", len(got), flowlog.Fields, got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d = %q, want %q", i+1, got[i], want[i])
		}
	}
}

func TestAppendLineNumbersAndUnset(t *testing.T) {
	f := &flow.Flow{StartTime: time.Unix(10, 0), EndTime: time.Unix(20, 0),
		SourceIP: netip.MustParseAddr("fd00::1"), DestinationIP: netip.MustParseAddr("fd00::2"), Protocol: 17,
		Ingress: flow.Policy{RuleAction: flow.ActionDrop, Type: 1}}
	got := strings.Split(string(flowlog.AppendLine(nil, f, false)), ",")
	if len(got) != flowlog.Fields {
		t.Fatalf("%d fields", len(got))
	}
	checks := map[int]string{1: "10", 3: "fd00::1", 7: "17", 14: "", 15: "", 16: "0", 21: "2", 22: "1", 26: "0", 27: "0", 29: ""}
	for n, w := range checks {
		if got[n-1] != w {
			t.Errorf("field %d = %q, want %q", n, got[n-1], w)
		}
	}
	if flowlog.ProtocolName(200) != "200" || flowlog.ActionName(9) != "Invalid" || flowlog.PolicyTypeName(9) != "Invalid" {
		t.Error("unknown values are not rendered as the reference does")
	}
}

func TestFilters(t *testing.T) {
	drop, _ := flowlog.ParseAction("Drop")
	allow, _ := flowlog.ParseAction("allow")
	none, _ := flowlog.ParseAction("None")
	if _, err := flowlog.ParseAction("Deny"); err == nil {
		t.Error("Deny accepted")
	}
	f := &flow.Flow{Ingress: flow.Policy{RuleAction: allow}, Egress: flow.Policy{RuleAction: drop}}
	cases := []struct {
		x    flowlog.Filter
		want bool
	}{
		{flowlog.Filter{}, true},
		{flowlog.Filter{IngressActions: []uint8{allow}}, true},
		{flowlog.Filter{IngressActions: []uint8{drop}}, false},
		{flowlog.Filter{IngressActions: []uint8{allow}, EgressActions: []uint8{none}}, false},
		{flowlog.Filter{IngressActions: []uint8{none, allow}, EgressActions: []uint8{drop}}, true},
	}
	for i, c := range cases {
		if got := c.x.Matches(f); got != c.want {
			t.Errorf("case %d: %v, want %v", i, got, c.want)
		}
	}
}

// run starts a sink on a fresh buffer and returns the buffer and a
// function that closes it and waits for the sink to end.
func run(t *testing.T, o flowlog.Options) (*ring.Buffer[*flow.Flow], func()) {
	t.Helper()
	s, err := flowlog.New(o)
	if err != nil {
		t.Fatal(err)
	}
	buf := ring.New[*flow.Flow](1 << 16)
	c := buf.Consumer()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	return buf, func() {
		buf.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestSinkFlushesOnTheClockAndAtTheEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "flows.log")
	reg := prometheus.NewRegistry()
	m := sink.NewMetrics(reg)
	drop := flow.ActionDrop
	buf, stop := run(t, flowlog.Options{Path: path, PrettyPrint: true, FlushInterval: 100 * time.Millisecond, Metrics: m,
		Filters: []flowlog.Filter{{IngressActions: []uint8{drop}}, {EgressActions: []uint8{drop}}}})
	var want []string
	for i := range 10 {
		f := sample()
		f.SourcePort = uint16(1000 + i)
		switch i % 3 {
		case 0:
			f.Ingress.RuleAction = drop
		case 1:
			f.Egress.RuleAction = drop
		}
		if i%3 != 2 {
			want = append(want, string(flowlog.AppendLine(nil, f, true)))
		}
		buf.Produce(f)
	}
	// The lines reach the file on the clock, while the sink still runs.
	deadline := time.Now().Add(5 * time.Second)
	for len(readLines(t, path)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := readLines(t, path); len(got) != len(want) {
		t.Fatalf("%d lines before close, want %d", len(got), len(want))
	}
	// Records still buffered when the pipeline closes are written too.
	last := sample()
	last.Egress.RuleAction = drop
	buf.Produce(last)
	stop()
	want = append(want, string(flowlog.AppendLine(nil, last, true)))
	got := readLines(t, path)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v := testutil.ToFloat64(m.Exported.WithLabelValues("flowLogger")); v != float64(len(want)) {
		t.Errorf("exported metric %v, want %d", v, len(want))
	}
	if v := testutil.ToFloat64(m.Filtered.WithLabelValues("flowLogger")); v != 3 {
		t.Errorf("filtered metric %v, want 3", v)
	}
}

func TestSinkRotatesAndCompresses(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flows.log")
	buf, stop := run(t, flowlog.Options{Path: path, MaxSizeMB: 1, MaxBackups: 10, Compress: true})
	// About 2.5 MB of lines: the file is rotated twice.
	const n = 12000
	for i := range n {
		f := sample()
		f.SourcePodName = strings.Repeat("p", 60) + strconv.Itoa(i)
		buf.Produce(f)
		if i%1000 == 999 {
			time.Sleep(10 * time.Millisecond) // let the sink keep up with the 64k-slot buffer
		}
	}
	stop()
	// Rotated files are compressed in the background; wait for them.
	var gz []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		gz, _ = filepath.Glob(filepath.Join(dir, "flows-*.log.gz"))
		plain, _ := filepath.Glob(filepath.Join(dir, "flows-*.log"))
		if len(gz) >= 2 && len(plain) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(gz) < 2 {
		t.Fatalf("rotated files %v, want at least 2 gzipped backups", gz)
	}
	seen := map[string]bool{}
	count := func(r io.Reader) {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ",")
			if len(fields) != flowlog.Fields {
				t.Fatalf("a line with %d fields: %q", len(fields), sc.Text())
			}
			seen[fields[7]] = true
		}
	}
	for _, g := range gz {
		fh, err := os.Open(g)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(fh)
		if err != nil {
			t.Fatal(err)
		}
		count(zr)
		fh.Close()
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	count(fh)
	fh.Close()
	if len(seen) != n {
		t.Fatalf("%d distinct records across the files, want %d", len(seen), n)
	}
}

func TestSinkCountsWriteErrors(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	m := sink.NewMetrics(nil)
	buf, stop := run(t, flowlog.Options{Path: "/dev/full", Metrics: m, MaxSizeMB: 1 << 20})
	for range 5 {
		buf.Produce(sample())
	}
	stop()
	if v := testutil.ToFloat64(m.Dropped.WithLabelValues("flowLogger", sink.ReasonSendError)); v != 5 {
		t.Errorf("send-error drops %v, want 5", v)
	}
	if v := testutil.ToFloat64(m.Exported.WithLabelValues("flowLogger")); v != 0 {
		t.Errorf("exported %v, want 0", v)
	}
}

func TestNewRefusesAnUnwritablePath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := flowlog.New(flowlog.Options{Path: filepath.Join(file, "flows.log")}); err == nil {
		t.Fatal("a path under a regular file was accepted")
	}
}
