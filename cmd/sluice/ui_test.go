package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"sluice/flow"
	"sluice/ring"
	"sluice/traceflow/cluster"
	"sluice/ui"
)

// uiTraceServer serves the web UI's API tracing on the objects of path.
func uiTraceServer(t *testing.T, path string) *httptest.Server {
	t.Helper()
	objs, err := cluster.ReadPath(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ui.New(ui.Options{Buffer: ring.New[*flow.Flow](16),
		Cluster: func(context.Context) ([]cluster.Object, error) { return objs, nil }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs
}

// postTrace asks the UI's API for a trace; status is the HTTP status.
func postTrace(t *testing.T, base string, req ui.TraceRequest) (ui.TraceResult, int, string) {
	t.Helper()
	b, _ := json.Marshal(req)
	resp, err := http.Post(base+"/api/traceflow", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	var res ui.TraceResult
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(buf.Bytes(), &res); err != nil {
			t.Fatal(err)
		}
	}
	return res, resp.StatusCode, buf.String()
}

// Two values differ between any two runs of the command itself: the
// name's random suffix (as antctl's) and the results' timestamps.
var (
	traceName  = regexp.MustCompile(`(?m)^name: (.*)-[a-z0-9]{8}$`)
	traceStamp = regexp.MustCompile(`(?m)^(\s+timestamp: )\d+$`)
)

func normalizeTrace(s string) string {
	return traceStamp.ReplaceAllString(traceName.ReplaceAllString(s, "name: $1-SUFFIX"), "${1}TIME")
}

// TestUITraceflowMatchesCLI: the web UI's Traceflow API answers exactly
// what `sluice traceflow` prints for the same request: delivered, through
// an Egress, dropped by a policy, to a Service, a failed trace, and with a
// what-if manifest.
func TestUITraceflowMatchesCLI(t *testing.T) {
	hs := uiTraceServer(t, tfCluster)
	overlay := "../../traceflow/testdata/overlays/antrea-deny.yaml"
	manifest, err := os.ReadFile(overlay)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  ui.TraceRequest
		args []string
	}{
		{ui.TraceRequest{Source: "default/db", Destination: "8.8.8.8"}, nil},
		{ui.TraceRequest{Source: "client", Destination: "db", Flow: "tcp,tcp_dst=5432"}, nil},
		{ui.TraceRequest{Source: "client", Destination: "nope"}, nil},
		{ui.TraceRequest{Source: "client", Destination: "db", Flow: "tcp,tcp_dst=5432", With: string(manifest)}, []string{"--with", overlay}},
	} {
		args := []string{"traceflow", "-S", c.req.Source, "-D", c.req.Destination, "--cluster", tfCluster}
		if c.req.Flow != "" {
			args = append(args, "-f", c.req.Flow)
		}
		args = append(args, c.args...)
		want, stderr, code := runSluice(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		got, status, body := postTrace(t, hs.URL, c.req)
		if status != http.StatusOK {
			t.Fatalf("%+v: HTTP %d: %s", c.req, status, body)
		}
		if normalizeTrace(got.YAML) != normalizeTrace(want) {
			t.Errorf("%v: the API's YAML differs from the command's:\n--- API\n%s\n--- command\n%s", args, got.YAML, want)
		}
		if got.Summary.Name == "" || len(got.Summary.Results) == 0 && got.Summary.Phase != "Failed" {
			t.Errorf("%v: summary %+v", args, got.Summary)
		}
	}
	// Only JSON: another site's plain form cannot start a trace.
	resp, err := http.Post(hs.URL+"/api/traceflow", "text/plain", strings.NewReader(`{"source":"client","destination":"db"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("a text/plain request: HTTP %d", resp.StatusCode)
	}
	// What the command refuses, the API refuses as the request's fault.
	for _, req := range []ui.TraceRequest{{Source: "", Destination: "db"}, {Source: "client", Destination: "db", Flow: "tcp,bogus=1"},
		{Source: "client", Destination: "db", With: "kind: [unclosed"},
		{Source: "client", Destination: "ff05::1", Flow: "ipv6"}} { // the reference cannot trace it
		if _, status, body := postTrace(t, hs.URL, req); status != http.StatusUnprocessableEntity {
			t.Errorf("%+v: HTTP %d, want 422: %s", req, status, body)
		}
	}
}
