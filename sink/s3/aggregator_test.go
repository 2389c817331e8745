package s3_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"sluice/certs"
	"sluice/exporter/grpcsend"
	"sluice/exporter/queue"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/s3server"
	"sluice/internal/testkit/testagg"
	"sluice/sink/s3"
)

// s3Aggregator runs an aggregator in mode whose only sink is the S3
// uploader, configured from the file's keys with the credentials in the
// AWS environment variables, and returns a sender to its gRPC collector.
func s3Aggregator(t *testing.T, srv *s3server.Server, mode, prefix string) func(...*flow.Flow) {
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	dir := t.TempDir()
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: none
activeFlowRecordTimeout: 1s
clusterID: cluster-x
s3Uploader:
  enable: true
  bucketName: flows
  bucketPrefix: %s
  endpoint: %s
  uploadInterval: 1s
sluice:
  apiAddress: "127.0.0.1:0"
  tls: {certDir: %s}
`, mode, prefix, srv.URL, filepath.Join(dir, "certs")))
	b, err := certs.Ensure(filepath.Join(dir, "certs"), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := grpcsend.New(grpcsend.Options{Address: a.Addrs().GRPC, TLS: b.ClientTLS("localhost"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(1024)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, q) }()
	t.Cleanup(func() { cancel(); <-done })
	return func(flows ...*flow.Flow) {
		for _, f := range flows {
			q.Push([]flow.Flow{*f})
		}
	}
}

// csvRows are the rows of the gzipped CSV objects under prefix.
func csvRows(t *testing.T, srv *s3server.Server, prefix string) []string {
	t.Helper()
	var rows []string
	for _, o := range srv.Objects("flows", prefix) {
		z, err := gzip.NewReader(bytes.NewReader(o.Data))
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		sc := bufio.NewScanner(z)
		for sc.Scan() {
			rows = append(rows, sc.Text())
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
	}
	return rows
}

// TestProxyModeToS3: in Proxy mode each record received over gRPC becomes
// one row, with the configured cluster ID and the per-node columns 0.
func TestProxyModeToS3(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	send := s3Aggregator(t, srv, "Proxy", "proxy")
	sent := records(0, 20, false)
	send(sent...)
	var rows []string
	testkit.WaitFor(t, "20 rows in the bucket", func() bool {
		rows = csvRows(t, srv, "proxy/")
		return len(rows) >= 20
	})
	if len(rows) != 20 {
		t.Fatalf("%d rows, want 20", len(rows))
	}
	byPort := map[string]*flow.Flow{}
	for _, f := range sent {
		byPort[strconv.Itoa(int(f.SourcePort))] = f
	}
	for _, row := range rows {
		fields := splitRow(row)
		f := byPort[fields[7]]
		if f == nil {
			t.Fatalf("row for an unknown port: %s", row)
		}
		delete(byPort, fields[7])
		ts, _ := strconv.ParseInt(fields[49], 10, 64)
		want := *f
		want.ClusterID = "cluster-x"
		if w := string(appendRow(&want, ts)); row != w {
			t.Errorf("row\n got %s\nwant %s", row, w)
		}
		if fields[2] != "0" || fields[3] != "0" || fields[42] != "0" {
			t.Errorf("per-node columns set in Proxy mode: %s", row)
		}
	}
}

// TestAggregateModeToS3: the two halves of an inter-Node flow become one
// row with both Pods and each Node's end time.
func TestAggregateModeToS3(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	send := s3Aggregator(t, srv, "Aggregate", "agg")
	src, dst := flowtest.Full(3, false), flowtest.Full(3, false)
	src.Egress.RuleAction = flow.ActionAllow // a denied flow is not correlated
	for _, fl := range []flow.Field{flow.DestinationPodName, flow.DestinationPodNamespace, flow.DestinationPodUID,
		flow.DestinationPodLabels, flow.DestinationNodeName, flow.DestinationNodeUID, flow.IngressPolicyName,
		flow.IngressPolicyNamespace, flow.IngressPolicyUID, flow.IngressPolicyRuleName} {
		src.Present.Clear(fl)
	}
	src.DestinationPodName, src.DestinationPodNamespace, src.DestinationNodeName = "", "", ""
	src.Ingress = flow.Policy{}
	for _, fl := range []flow.Field{flow.SourcePodName, flow.SourcePodNamespace, flow.SourcePodUID,
		flow.SourcePodLabels, flow.SourceNodeName, flow.SourceNodeUID, flow.EgressPolicyName,
		flow.EgressPolicyNamespace, flow.EgressPolicyUID, flow.EgressPolicyRuleName} {
		dst.Present.Clear(fl)
	}
	dst.SourcePodName, dst.SourcePodNamespace, dst.SourceNodeName = "", "", ""
	dst.Egress = flow.Policy{}
	send(src, dst)
	var rows []string
	testkit.WaitFor(t, "a row in the bucket", func() bool {
		rows = csvRows(t, srv, "agg/")
		return len(rows) > 0
	})
	fields := splitRow(rows[0])
	if len(fields) != s3.CSVFields {
		t.Fatalf("%d fields: %s", len(fields), rows[0])
	}
	end := strconv.FormatInt(src.EndTime.Unix(), 10)
	for i, w := range map[int]string{2: end, 3: end, 18: "client-3", 21: "server-3", 28: "allow-web",
		33: "acnp-out", 48: "cluster-x"} {
		if fields[i] != w {
			t.Errorf("field %d = %q, want %q in %s", i+1, fields[i], w, rows[0])
		}
	}
	if fields[42] == "0" {
		t.Errorf("no throughput in an aggregated row: %s", rows[0])
	}
}

func appendRow(f *flow.Flow, ts int64) []byte {
	return s3.AppendCSVRow(nil, f, time.Unix(ts, 0))
}
