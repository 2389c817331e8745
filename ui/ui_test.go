package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/ring"
)

func TestHistorySince(t *testing.T) {
	h := newHistory(8)
	add := func(from, to int) {
		var es []entry
		for i := from; i <= to; i++ {
			es = append(es, entry{row: Row{Seq: uint64(i)}})
		}
		h.add(es)
	}
	add(1, 5)
	rows, lost, skipped, next := h.since(0, 100)
	if len(rows) != 5 || lost != 0 || skipped != 0 || next != 5 || rows[0].Seq != 1 {
		t.Fatalf("rows %v lost %d skipped %d next %d", rows, lost, skipped, next)
	}
	add(6, 20) // 5 read, 6..12 overwritten before they were read
	rows, lost, skipped, next = h.since(5, 100)
	if lost != 7 || skipped != 0 || len(rows) != 8 || rows[0].Seq != 13 || next != 20 {
		t.Fatalf("rows %v lost %d skipped %d next %d", rows, lost, skipped, next)
	}
	add(21, 28)
	rows, lost, skipped, next = h.since(20, 3) // a sample of 3 of 8, spread out
	if lost != 0 || skipped != 5 || len(rows) != 3 || next != 28 || rows[0].Seq != 21 || rows[2].Seq <= 25 {
		t.Fatalf("rows %v lost %d skipped %d next %d", rows, lost, skipped, next)
	}
	if f, ok := h.record(12); ok || f != nil {
		t.Error("record 12 is no longer held")
	}
	last, newest := h.last(2)
	if len(last) != 2 || last[0].Seq != 27 || newest != 28 {
		t.Errorf("last %v newest %d", last, newest)
	}
}

// testServer runs a UI on a buffer, served over HTTP.
func testServer(t *testing.T, o Options) (*Server, *httptest.Server) {
	t.Helper()
	if o.Registerer == nil {
		reg := prometheus.NewRegistry()
		o.Registerer, o.Gatherer = reg, reg
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	hs := httptest.NewUnstartedServer(s.Handler())
	hs.Config.BaseContext = nil
	hs.Start()
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); cancel(); <-done })
	return s, hs
}

// waitSeen polls until the tap has read n records.
func waitSeen(t *testing.T, s *Server, n float64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(s.m.Seen) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the tap read %v records, want %v", testutil.ToFloat64(s.m.Seen), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamSamplesHonestly: a page that cannot be sent everything gets
// a sample, told how many records it left out; records it was sent, left
// out and lost add up to what passed, and the metrics agree.
func TestStreamSamplesHonestly(t *testing.T) {
	buf := ring.New[*flow.Flow](1 << 14)
	s, hs := testServer(t, Options{Buffer: buf, MaxPerSecond: 400, History: 1 << 14})
	resp, err := http.Get(hs.URL + "/api/flows/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := make(chan Event, 1024)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<22)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev Event
				if json.Unmarshal([]byte(d), &ev) == nil {
					events <- ev
				}
			}
		}
		close(events)
	}()
	first := <-events // the backlog: nothing yet
	if len(first.Rows) != 0 {
		t.Fatalf("backlog of an empty history: %d rows", len(first.Rows))
	}
	const n = 5000
	for i := range n {
		buf.Produce(flowtest.Full(i%250, true))
	}
	waitSeen(t, s, n)
	var sent, skipped, lost uint64
	deadline := time.After(30 * time.Second)
	for sent+skipped+lost < n {
		select {
		case ev := <-events:
			if len(ev.Rows) > 100 { // 400 a second, 4 events a second
				t.Fatalf("an event carries %d rows, more than 100", len(ev.Rows))
			}
			sent += uint64(len(ev.Rows))
			skipped += ev.Skipped
			lost += ev.Lost
			for _, r := range ev.Rows {
				if r.SrcPod == "" || r.DstPod == "" || r.Seq == 0 {
					t.Fatalf("row %+v", r)
				}
			}
		case <-deadline:
			t.Fatalf("sent %d, skipped %d, lost %d of %d", sent, skipped, lost, n)
		}
	}
	if sent+skipped+lost != n || skipped == 0 {
		t.Errorf("sent %d, skipped %d, lost %d of %d", sent, skipped, lost, n)
	}
	if got := testutil.ToFloat64(s.m.Dropped.WithLabelValues(ReasonSampled)); uint64(got) != skipped {
		t.Errorf("sampled metric %v, events said %d", got, skipped)
	}
	if got := testutil.ToFloat64(s.m.Sent); uint64(got) != sent {
		t.Errorf("sent metric %v, events carried %d", got, sent)
	}
}

// TestTapNeverHoldsThePipeline: at the end of a run the pipeline's buffer
// waits for its sinks' consumers (ProduceWait), never for the UI.
func TestTapNeverHoldsThePipeline(t *testing.T) {
	buf := ring.New[*flow.Flow](64)
	s, _ := testServer(t, Options{Buffer: buf, History: 64})
	buf.Produce(flowtest.Full(0, true))
	waitSeen(t, s, 1)
	buf.Flushing()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := flowtest.Full(1, true)
	for range 100000 {
		buf.ProduceWait(ctx, f)
	}
	if ctx.Err() != nil {
		t.Fatal("producing waited for the UI")
	}
}

func TestFlowsAndDetail(t *testing.T) {
	buf := ring.New[*flow.Flow](64)
	s, hs := testServer(t, Options{Buffer: buf, History: 4})
	for i := range 6 {
		buf.Produce(flowtest.Full(i, true))
	}
	waitSeen(t, s, 6)
	var page FlowsPage
	getJSON(t, hs.URL+"/api/flows?limit=10", http.StatusOK, &page)
	if len(page.Rows) != 4 || page.Seq != 6 || page.Rows[3].SrcPod != "client-5" || page.Rows[3].DstPod != "server-5" {
		t.Fatalf("%+v", page)
	}
	r := page.Rows[3]
	if r.Proto != "TCP" || r.Service != "ns-b/server:http" || r.Action != "Reject" || r.Policy != "ns-cluster/acnp-out rule-out" || r.SrcWL != "client" || r.Egress == "" {
		t.Errorf("row %+v", r)
	}
	var detail map[string]any
	getJSON(t, hs.URL+"/api/flows/6", http.StatusOK, &detail)
	if detail["SourcePodName"] != "client-5" {
		t.Errorf("detail %v", detail)
	}
	getJSON(t, hs.URL+"/api/flows/1", http.StatusNotFound, &detail)
	var g Graph
	getJSON(t, hs.URL+"/api/map", http.StatusOK, &g)
	var egress, denied bool
	for _, e := range g.Endpoints {
		egress = egress || e.Kind == KindEgress
	}
	for _, e := range g.Edges {
		denied = denied || e.Denied > 0
	}
	if !egress || !denied || len(g.Edges) != 12 { // each record: Pod → Egress → Pod
		t.Errorf("graph %+v", g)
	}
}

func TestMapIsBounded(t *testing.T) {
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	g := newEdges(10, dropped)
	now := time.Now()
	for i := range 25 {
		r := newRow(uint64(i), flowtest.Full(i, true), nil)
		r.Egress, r.EgressIP = "", ""
		g.add(&r, now.Add(time.Duration(i)*time.Millisecond))
	}
	gr := g.graph(now)
	if len(gr.Edges) != 10 || gr.Evicted != 15 || testutil.ToFloat64(dropped) != 15 || len(gr.Endpoints) != 20 {
		t.Errorf("%d edges, %d evicted, %d endpoints", len(gr.Edges), gr.Evicted, len(gr.Endpoints))
	}
	for _, e := range gr.Edges {
		if e.From < "pod:ns-a/client-15" && e.From != "pod:ns-a/client-2" {
			t.Errorf("an old edge was kept: %s", e.From)
		}
	}
}

func TestHealthReport(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricReceived}, []string{"transport", "exporter"})
	unk := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricUnknown}, []string{"exporter"})
	mis := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricMissing}, []string{"exporter"})
	exp := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricExported}, []string{"sink"})
	drop := prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricSinkDrop}, []string{"sink", "reason"})
	conn := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricConnected}, []string{"sink"})
	reg.MustRegister(rec, unk, mis, exp, drop, conn)
	s := newSampler(reg)
	t0 := time.Now()
	s.sample(t0)
	rec.WithLabelValues("tls", "127.0.0.2").Add(100)
	mis.WithLabelValues("127.0.0.2").Add(400)
	rec.WithLabelValues("tls", "127.0.0.4").Add(50)
	unk.WithLabelValues("127.0.0.4").Add(100)
	exp.WithLabelValues("flowCollector").Add(120)
	drop.WithLabelValues("flowCollector", "send-error").Add(3)
	conn.WithLabelValues("flowCollector").Set(1)
	h := s.report(t0.Add(2*time.Second), "Aggregate", []string{"flowCollector"})
	if len(h.Exporters) != 2 || h.In != 75 || h.Out != 60 {
		t.Fatalf("%+v", h)
	}
	e := h.Exporters[0]
	if e.Address != "127.0.0.2" || !e.Active || e.Rate != 50 || e.Profile != "older than the newest agent: 4.0 missing elements a record" {
		t.Errorf("%+v", e)
	}
	if p := h.Exporters[1].Profile; p != "newer than the aggregator: 2.0 unknown elements a record" {
		t.Errorf("profile %q", p)
	}
	if len(h.Sinks) != 1 || !h.Sinks[0].Connected || h.Sinks[0].Exported != 120 || h.Sinks[0].Dropped != 3 {
		t.Errorf("%+v", h.Sinks)
	}
	if len(h.Drops) != 1 || h.Drops[0].Total != 3 || h.Drops[0].Labels["reason"] != "send-error" {
		t.Errorf("%+v", h.Drops)
	}
}

func getJSON(t *testing.T, url string, status int, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("%s: HTTP %d, want %d", url, resp.StatusCode, status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func TestWorkload(t *testing.T) {
	for _, c := range []struct{ pod, labels, want string }{
		{"frontend-1", `{"app":"frontend"}`, "frontend"},
		{"web-7d9f8b6c5d-x2k9p", "", "web"},
		// A suffix without a digit: only the pod-template-hash label tells
		// it (the cluster's metadata names the Deployment; see
		// Options.PodWorkload).
		{"server-564c497b9d-hhbdl", `{"pod-template-hash":"564c497b9d"}`, "server"},
		{"postgres-0", "{}", "postgres"},
		{"coredns", "", "coredns"},
		{"api-server", "", "api-server"},
	} {
		if got := workload(c.pod, c.labels); got != c.want {
			t.Errorf("workload(%q, %q) = %q, want %q", c.pod, c.labels, got, c.want)
		}
	}
}

func TestURL(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:8080": "http://127.0.0.1:8080/", "[::]:80": "http://127.0.0.1:80/", "0.0.0.0:1": "http://127.0.0.1:1/", "[::1]:9": "http://[::1]:9/"} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestWorkloadFromPodWorkload: a Pod whose controller PodWorkload knows is
// shown under that workload, with its kind, in the rows and on the map,
// whatever its name; one it does not know keeps the guess from its name.
func TestWorkloadFromPodWorkload(t *testing.T) {
	buf := ring.New[*flow.Flow](64)
	server := netip.MustParseAddr("10.244.2.7")
	var asked atomic.Int64
	known := func(ns, pod string, ip netip.Addr, at time.Time) (string, string, bool) {
		asked.Add(1)
		if ns == "shop" && pod == "server-564c497b9d-hhbdl" && ip == server && !at.IsZero() {
			return "Deployment", "server", true
		}
		return "", "", false
	}
	s, hs := testServer(t, Options{Buffer: buf, PodWorkload: known})
	f := flowtest.Full(1, true)
	f.SourcePodNamespace, f.SourcePodName, f.SourcePodLabels = "shop", "client-7", ""
	f.DestinationPodNamespace, f.DestinationPodName, f.DestinationPodLabels = "shop", "server-564c497b9d-hhbdl", ""
	f.DestinationIP = server
	buf.Produce(f)
	waitSeen(t, s, 1)
	var page FlowsPage
	getJSON(t, hs.URL+"/api/flows", http.StatusOK, &page)
	if len(page.Rows) != 1 {
		t.Fatalf("%d rows", len(page.Rows))
	}
	r := page.Rows[0]
	if r.DstWL != "server" || r.DstWLKind != "Deployment" || r.SrcWL != "client" || r.SrcWLKind != "" {
		t.Errorf("workloads: source %q (%q), destination %q (%q); want client (guessed), server (Deployment)",
			r.SrcWL, r.SrcWLKind, r.DstWL, r.DstWLKind)
	}
	var g Graph
	getJSON(t, hs.URL+"/api/map", http.StatusOK, &g)
	var wl []string
	for _, e := range g.Endpoints {
		if e.Kind == KindPod {
			wl = append(wl, e.Pod+"="+e.WorkloadKind+"/"+e.Workload)
		}
	}
	slices.Sort(wl)
	if want := []string{"client-7=/client", "server-564c497b9d-hhbdl=Deployment/server"}; !slices.Equal(wl, want) {
		t.Errorf("map endpoints %q, want %q", wl, want)
	}
	if asked.Load() == 0 {
		t.Error("PodWorkload was never asked")
	}
}
