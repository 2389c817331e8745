package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"sluice/certs"
	"sluice/exporter/grpcsend"
	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/internal/testkit/testagg"
)

// TestGetFlows: records sent over gRPC to an aggregator in Proxy mode are
// read back with `sluice get flows`, filtered, as JSON and as a table.
func TestGetFlows(t *testing.T) {
	dir := t.TempDir()
	certDir := filepath.Join(dir, "certs")
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: none
flowStreamService: {enable: true}
sluice: {grpcAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", flowStreamAddress: "127.0.0.1:0", tls: {certDir: %s}}
`, certDir))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	b, err := certs.Ensure(certDir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := grpcsend.New(grpcsend.Options{Address: a.Addrs().GRPC, TLS: b.ClientTLS("localhost"), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(16)
	sctx, scancel := context.WithCancel(context.Background())
	sdone := make(chan struct{})
	go func() { defer close(sdone); s.Run(sctx, q) }()
	defer func() { scancel(); <-sdone }()
	for i := range 4 {
		f := flowtest.Full(i, false)
		if i%2 == 1 {
			f.FlowType = flow.FlowTypeIntraNode
		}
		q.Push([]flow.Flow{*f})
	}

	stream := []string{"get", "flows", "--stream-server", a.Addrs().FlowStream, "--ca-file", filepath.Join(certDir, "ca.crt"), "--server-name", "localhost"}
	// Follow until the two inter-node flows came.
	out, _, err := runCLI(t, append(stream, "-f", "--max-count", "2", "--flow-type", "inter-node", "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("json: %d lines:\n%s", len(lines), out)
	}
	for i, l := range lines {
		var v struct {
			ID  string `json:"id"`
			K8s struct {
				SourcePodName string `json:"sourcePodName"`
			} `json:"k8s"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("flow-%d", 2*i); v.ID != want || v.K8s.SourcePodName != fmt.Sprintf("client-%d", 2*i) {
			t.Errorf("line %d: %s", i, l)
		}
	}
	// History, no follow: a Pod filter on one end.
	out, _, err = runCLI(t, append(stream, "--pod", "ns-b/server-3", "--direction", "to")...)
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 2 || !strings.Contains(rows[1], "ns-b/server-3 (10.10.1.3:8080)") || !strings.Contains(rows[1], "intra-node") {
		t.Errorf("table:\n%s", out)
	}
	out, _, err = runCLI(t, append(stream, "--pod", "ns-b/server-3", "--direction", "from")...)
	if err != nil || strings.Count(out, "\n") != 1 {
		t.Errorf("direction from: %v\n%s", err, out)
	}
	if _, _, err := runCLI(t, append(stream, "-l", "app in (")...); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Errorf("bad selector: %v", err)
	}
	if _, _, err := runCLI(t, append(stream, "--since", "yesterday")...); err == nil {
		t.Error("bad --since: no error")
	}
}

// TestGetFlowsRefusesServer: --server, inherited from "get", names the
// HTTP API; get flows refuses it instead of ignoring it.
func TestGetFlowsRefusesServer(t *testing.T) {
	_, _, err := runCLI(t, "get", "flows", "--server", "http://10.0.0.1:10348")
	if err == nil || !strings.Contains(err.Error(), "--stream-server") {
		t.Fatalf("err = %v, want one pointing at --stream-server", err)
	}
}
