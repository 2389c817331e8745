package aggregator_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/ui"
)

// TestWebUI: with sluice.ui.address the aggregator serves the web UI,
// whose Flows rows are the records it exports and whose Health page
// names its exporter and its sink; the Traceflow page says it cannot
// trace without the cluster's state.
func TestWebUI(t *testing.T) {
	coll := stubcollector.New(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", ui: {address: "127.0.0.1:0"}, proxy: {fastPath: false}}
`, coll.Addr()))
	base := "http://" + a.Addrs().UI
	if a.Addrs().UI == "" || a.UIURL() != base+"/" {
		t.Fatalf("UI address %q, URL %q", a.Addrs().UI, a.UIURL())
	}
	sendUIRecords(t, a.Addrs().IPFIX, 5)
	var page ui.FlowsPage
	testkit.WaitFor(t, "5 rows in the UI", func() bool {
		getJSON(t, base+"/api/flows", &page)
		return len(page.Rows) == 5
	})
	for _, r := range page.Rows {
		if !strings.HasPrefix(r.SrcPod, "client-") || r.DstPod != "server" || r.SrcNS != "web" || r.Proto != "TCP" || r.DstPort != 443 {
			t.Errorf("row %+v", r)
		}
	}
	// A row's every field, as the flow-record API renders them.
	var detail map[string]any
	getJSON(t, fmt.Sprintf("%s/api/flows/%d", base, page.Rows[0].Seq), &detail)
	if detail["destinationPodName"] != "server" || detail["destinationTransportPort"] != float64(443) {
		t.Errorf("detail %v", detail)
	}
	var h ui.Health
	testkit.WaitFor(t, "the exporter and the sink on the Health page", func() bool {
		getJSON(t, base+"/api/health", &h)
		return len(h.Exporters) == 1 && h.Exporters[0].Records == 5 && len(h.Sinks) == 1 && h.Sinks[0].Exported == 5
	})
	if h.Mode != "Proxy" || h.Sinks[0].Name != "flowCollector" || h.Exporters[0].Transport != "tcp" {
		t.Errorf("health %+v", h)
	}
	var info ui.Info
	getJSON(t, base+"/api/info", &info)
	if info.Traceflow || info.Notice != "" {
		t.Errorf("info %+v", info)
	}
	resp, err := http.Post(base+"/api/traceflow", "application/json", bytes.NewReader([]byte(`{"source":"web/client-0","destination":"web/server"}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a trace without the cluster's state: HTTP %d", resp.StatusCode)
	}
	// The pages themselves.
	resp, err = http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(body.String(), `<nav aria-label="Pages">`) || resp.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("GET /: HTTP %d, %q", resp.StatusCode, body.String())
	}
}

// TestWebUIFastPathNotice: with a fast path on (Proxy mode's, or
// Aggregate mode's with flowCollector the only sink), records reach the
// sink already encoded; the UI says it shows a sample, naming the key that
// turns the fast path off, and still gets the records (all of them at this
// rate), enriched as exported, as the collector does.
func TestWebUIFastPathNotice(t *testing.T) {
	for _, c := range []struct{ mode, extra, key string }{
		{"Proxy", "", "sluice.proxy.fastPath"},
		{"Aggregate", "activeFlowRecordTimeout: 1s\n", "sluice.aggregate.fastPath"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			coll := stubcollector.New(t)
			a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
%sflowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", ui: {address: "127.0.0.1:0"}}
`, c.mode, c.extra, coll.Addr()))
			var info ui.Info
			getJSON(t, "http://"+a.Addrs().UI+"/api/info", &info)
			if !strings.Contains(info.Notice, c.key) || !strings.Contains(info.Notice, "sample") {
				t.Errorf("info %+v", info)
			}
			sendUIRecords(t, a.Addrs().IPFIX, 5)
			var page ui.FlowsPage
			testkit.WaitFor(t, "5 sampled rows in the UI", func() bool {
				getJSON(t, "http://"+a.Addrs().UI+"/api/flows", &page)
				return len(page.Rows) == 5
			})
			for _, r := range page.Rows {
				if !strings.HasPrefix(r.SrcPod, "client-") || r.DstPod != "server" || r.SrcNS != "web" || r.Proto != "TCP" || r.DstPort != 443 {
					t.Errorf("row %+v", r)
				}
			}
			testkit.WaitFor(t, "the 5 records at the collector", func() bool { return coll.Len() == 5 })
			for _, f := range coll.FlowsSince(0) {
				if !strings.HasPrefix(f.SourcePodName, "client-") || f.DestinationPodName != "server" || f.DestinationPort != 443 {
					t.Errorf("at the collector: %+v", f)
				}
			}
		})
	}
}

// TestWebUIHosts: the aggregator's UI answers loopback and the names of
// sluice.ui.allowedHosts, refuses any other Host (DNS rebinding) with
// 421, and a cross-origin POST with 403.
func TestWebUIHosts(t *testing.T) {
	coll := stubcollector.New(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", ui: {address: "127.0.0.1:0", allowedHosts: [sluice.example.com]}}
`, coll.Addr()))
	base := "http://" + a.Addrs().UI
	_, port, _ := net.SplitHostPort(a.Addrs().UI)
	send := func(method, host, origin string) int {
		t.Helper()
		req, err := http.NewRequest(method, base+"/api/info", nil)
		if method == http.MethodPost {
			req, err = http.NewRequest(method, base+"/api/traceflow", strings.NewReader(`{"source":"a","destination":"b"}`))
			req.Header.Set("Content-Type", "application/json")
		}
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, host, origin string
		want                 int
	}{
		{http.MethodGet, "localhost:" + port, "", http.StatusOK},
		{http.MethodGet, "sluice.example.com", "", http.StatusOK},
		{http.MethodGet, "rebind.example:" + port, "", http.StatusMisdirectedRequest},
		{http.MethodPost, "localhost:" + port, "http://evil.example", http.StatusForbidden},
		// Same origin reaches the handler, which has no cluster to trace on.
		{http.MethodPost, "localhost:" + port, "http://localhost:" + port, http.StatusServiceUnavailable},
	} {
		if got := send(c.method, c.host, c.origin); got != c.want {
			t.Errorf("%s Host %q Origin %q: HTTP %d, want %d", c.method, c.host, c.origin, got, c.want)
		}
	}
}

// TestWebUIWorkloadFromOwner: with Pod metadata (here an inventory, as
// `kubectl get pods -o yaml` prints it), the UI groups a Deployment's Pod
// under the Deployment, read from the Pod's controller, though its name's
// random suffix has no digit (which name parsing took for part of the
// name); Pods the metadata does not place keep the guess from their name.
func TestWebUIWorkloadFromOwner(t *testing.T) {
	dir := t.TempDir()
	inv := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: server-564c497b9d-hhbdl
    namespace: web
    uid: 0b5b9d1e-0000-4000-8000-000000000001
    creationTimestamp: "2025-01-01T00:00:00Z"
    labels: {pod-template-hash: 564c497b9d, tier: backend}
    ownerReferences:
    - {apiVersion: apps/v1, kind: ReplicaSet, name: server-564c497b9d, uid: 0b5b9d1e-0000-4000-8000-000000000002, controller: true}
  spec: {nodeName: node-a}
  status: {podIP: 10.244.1.9}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	coll := stubcollector.New(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", inventory: %s, ui: {address: "127.0.0.1:0"}, proxy: {fastPath: false}}
`, coll.Addr(), inv))
	base := "http://" + a.Addrs().UI
	sendUIRecordsTo(t, a.Addrs().IPFIX, 2, "server-564c497b9d-hhbdl")
	var page ui.FlowsPage
	testkit.WaitFor(t, "2 rows in the UI", func() bool {
		getJSON(t, base+"/api/flows", &page)
		return len(page.Rows) == 2
	})
	for _, r := range page.Rows {
		if r.DstWL != "server" || r.DstWLKind != "Deployment" || r.SrcWL != "client" || r.SrcWLKind != "" {
			t.Errorf("row workloads: source %q (%q), destination %q (%q); want client (guessed), server (Deployment)",
				r.SrcWL, r.SrcWLKind, r.DstWL, r.DstWLKind)
		}
	}
	var g ui.Graph
	getJSON(t, base+"/api/map", &g)
	found := false
	for _, e := range g.Endpoints {
		if e.Pod == "server-564c497b9d-hhbdl" {
			found = true
			if e.Workload != "server" || e.WorkloadKind != "Deployment" {
				t.Errorf("map endpoint %+v: want workload server (Deployment)", e)
			}
		}
	}
	if !found {
		t.Errorf("no endpoint for the server Pod on the map: %+v", g.Endpoints)
	}
}

// sendUIRecords sends n records of web/client-i to web/server over IPFIX
// (TCP) to addr, as an Antrea v2.7 agent would.
func sendUIRecords(t *testing.T, addr string, n int) {
	t.Helper()
	sendUIRecordsTo(t, addr, n, "server")
}

// sendUIRecordsTo is sendUIRecords to the Pod web/dstPod (10.244.1.9).
func sendUIRecordsTo(t *testing.T, addr string, n int, dstPod string) {
	t.Helper()
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(1, tmpl)
	for i := range n {
		f := flow.Flow{
			StartTime: time.Now().Add(-10 * time.Second).Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
			SourceIP: netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)}), DestinationIP: netip.MustParseAddr("10.244.1.9"),
			SourcePort: uint16(40000 + i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeIntraNode,
			Stats:              flow.Stats{OctetTotalCount: 1000, PacketTotalCount: 10, OctetDeltaCount: 1000, PacketDeltaCount: 10},
			SourcePodNamespace: "web", SourcePodName: fmt.Sprintf("client-%d", i), SourceNodeName: "node-a",
			DestinationPodNamespace: "web", DestinationPodName: dstPod, DestinationNodeName: "node-a",
		}
		if err := ipfixmap.WriteRecord(enc.Begin(1, tmpl), els, &f); err != nil {
			t.Fatal(err)
		}
	}
	enc.Flush()
}
