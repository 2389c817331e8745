package ui

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/ring"
	"sluice/traceflow/cluster"
)

// guardServer serves a UI tracing on the test cluster, configured as
// listening on listen with the extra allowed hosts, over real HTTP.
func guardServer(t *testing.T, listen string, allowed []string) (*Server, string) {
	t.Helper()
	objs, err := cluster.ReadPath(context.Background(), "../traceflow/testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	s, hs := testServer(t, Options{Buffer: ring.New[*flow.Flow](16), Address: listen, AllowedHosts: allowed,
		Cluster: func(context.Context) ([]cluster.Object, error) { return objs, nil }})
	return s, hs.URL
}

// do sends a request to base (the real server) naming host in its Host
// header, with the given headers; it returns the status and body.
func do(t *testing.T, method, base, path, host string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestHostGuard: requests naming loopback, the listen address's host or
// an allowed host are served; any other Host (a DNS-rebinding page's
// name) is refused with 421 and a message saying why, pages and API
// alike, and counted.
func TestHostGuard(t *testing.T) {
	s, base := guardServer(t, "10.1.2.3:8080", []string{"Sluice.Example.COM", "proxy.example.net:8443", "fd00::9"})
	port := base[strings.LastIndex(base, ":")+1:]
	for _, host := range []string{
		"", // the Go client names the server's address: 127.0.0.1:port
		"localhost:" + port, "LOCALHOST", "localhost.:" + port, "127.0.0.1", "127.8.9.10:" + port, "[::1]:" + port, "[::ffff:127.0.0.1]:80",
		"10.1.2.3:8080", "10.1.2.3", // the listen address's host
		"sluice.example.com", "sluice.example.com:443", "proxy.example.net:8443", "[fd00::9]:8080",
	} {
		for _, path := range []string{"/", "/api/info", "/api/flows"} {
			if status, body := do(t, http.MethodGet, base, path, host, nil, ""); status != http.StatusOK {
				t.Errorf("Host %q GET %s: HTTP %d, want 200: %s", host, path, status, body)
			}
		}
	}
	refused := 0
	for _, host := range []string{"evil.example", "evil.example:" + port, "localhost.evil.example", "127.0.0.1.evil.example",
		"10.1.2.4:8080", "proxy.example.net", "proxy.example.net:80", "sluice.example.com.evil.example", "0.0.0.0:" + port} {
		status, body := do(t, http.MethodGet, base, "/api/info", host, nil, "")
		refused++
		if status != http.StatusMisdirectedRequest || !strings.Contains(body, "is not allowed") || !strings.Contains(body, "DNS rebinding") {
			t.Errorf("Host %q: HTTP %d, want 421 saying why: %s", host, status, body)
			continue
		}
		var e map[string]string
		if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e["error"], "sluice.ui.allowedHosts") {
			t.Errorf("Host %q: the API's refusal is not a JSON error naming sluice.ui.allowedHosts: %s", host, body)
		}
	}
	// A page is refused in text; so is a trace.
	status, body := do(t, http.MethodGet, base, "/", "evil.example", nil, "")
	if status != http.StatusMisdirectedRequest || strings.HasPrefix(body, "{") || strings.Contains(body, "<html") {
		t.Errorf("page for evil.example: HTTP %d: %s", status, body)
	}
	status, body = do(t, http.MethodPost, base, "/api/traceflow", "evil.example", map[string]string{"Content-Type": "application/json"},
		`{"source":"client","destination":"db","flow":"tcp,tcp_dst=5432"}`)
	if status != http.StatusMisdirectedRequest {
		t.Errorf("trace for evil.example: HTTP %d: %s", status, body)
	}
	refused += 2
	if got := testutil.ToFloat64(s.m.Refused.WithLabelValues(RefusedHost)); got != float64(refused) {
		t.Errorf("sluice_ui_requests_refused_total{reason=host} = %v, want %d", got, refused)
	}
}

// TestHostGuardWildcardListen: listening on every interface allows no
// name of its own: only loopback and the allowed hosts.
func TestHostGuardWildcardListen(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:8080", "[::]:8080", ":8080", ""} {
		g := newHostGuard(listen, nil)
		for host, want := range map[string]bool{"localhost:8080": true, "127.0.0.1:8080": true, "[::1]:8080": true,
			"0.0.0.0:8080": false, "[::]:8080": false, ":8080": false, "10.0.0.1:8080": false, "": false} {
			if got := g.allowed(host); got != want {
				t.Errorf("listening on %q: Host %q allowed %v, want %v", listen, host, got, want)
			}
		}
	}
}

// TestCrossOriginPost: a trace from the UI's own origin (or from no
// browser: no Origin) is run; one from another origin is refused with
// 403 before it runs, and counted; reads stay open to any origin's
// navigation (GET).
func TestCrossOriginPost(t *testing.T) {
	s, base := guardServer(t, "127.0.0.1:8080", []string{"sluice.example.com"})
	self := strings.TrimPrefix(base, "http://")
	const trace = `{"source":"client","destination":"db","flow":"tcp,tcp_dst=5432"}`
	traced := func(t *testing.T, status int, body string) {
		t.Helper()
		var res TraceResult
		if status != http.StatusOK {
			t.Fatalf("HTTP %d, want 200: %s", status, body)
		}
		if err := json.Unmarshal([]byte(body), &res); err != nil || res.Summary.Name == "" || !strings.Contains(res.YAML, "Delivered") {
			t.Fatalf("not a trace (%v): %s", err, body)
		}
	}
	for _, c := range []struct {
		name string
		host string
		hdr  map[string]string
	}{
		{"no Origin", "", nil},
		{"same origin", "", map[string]string{"Origin": base, "Sec-Fetch-Site": "same-origin"}},
		{"same origin, Origin only", "", map[string]string{"Origin": base}},
		{"same origin by name", "localhost:8080", map[string]string{"Origin": "http://localhost:8080"}},
		{"behind a TLS ingress", "sluice.example.com", map[string]string{"Origin": "https://sluice.example.com"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{"Content-Type": "application/json"}
			for k, v := range c.hdr {
				hdr[k] = v
			}
			status, body := do(t, http.MethodPost, base, "/api/traceflow", c.host, hdr, trace)
			traced(t, status, body)
		})
	}
	before := testutil.ToFloat64(s.m.Traces.WithLabelValues("ok"))
	refused := 0
	for _, hdr := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
		{"Origin": "null"},
		{"Origin": "http://127.0.0.1:1"}, // another port is another origin
		{"Origin": "http://localhost." + self[strings.LastIndex(self, ":"):]},
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		hdr["Content-Type"] = "application/json"
		status, body := do(t, http.MethodPost, base, "/api/traceflow", "", hdr, trace)
		refused++
		var e map[string]string
		if status != http.StatusForbidden || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e["error"], "cross-origin request refused") {
			t.Errorf("%v: HTTP %d, want 403 saying why: %s", hdr, status, body)
		}
	}
	if got := testutil.ToFloat64(s.m.Refused.WithLabelValues(RefusedCrossOrigin)); got != float64(refused) {
		t.Errorf("sluice_ui_requests_refused_total{reason=cross-origin} = %v, want %d", got, refused)
	}
	if got := testutil.ToFloat64(s.m.Traces.WithLabelValues("ok")); got != before {
		t.Errorf("refused requests ran %v traces", got-before)
	}
	// A cross-origin GET is a read the browser keeps from the other page
	// (no CORS headers); it is not refused.
	if status, body := do(t, http.MethodGet, base, "/api/info", "", map[string]string{"Origin": "http://evil.example"}, ""); status != http.StatusOK {
		t.Errorf("GET with a foreign Origin: HTTP %d: %s", status, body)
	}
}

// TestServeGuarded: Serve, on a real listener, applies the same checks.
func TestServeGuarded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Buffer: ring.New[*flow.Flow](16), Address: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	base := "http://" + ln.Addr().String()
	if status, body := do(t, http.MethodGet, base, "/api/info", "", nil, ""); status != http.StatusOK {
		t.Errorf("own address: HTTP %d: %s", status, body)
	}
	if status, body := do(t, http.MethodGet, base, "/api/info", "evil.example", nil, ""); status != http.StatusMisdirectedRequest {
		t.Errorf("evil.example: HTTP %d: %s", status, body)
	}
	if status, body := do(t, http.MethodPost, base, "/api/traceflow", "", map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json"}, "{}"); status != http.StatusForbidden {
		t.Errorf("cross-origin POST: HTTP %d: %s", status, body)
	}
}
