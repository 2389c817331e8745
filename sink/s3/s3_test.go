package s3_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/parquet-go/parquet-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/s3server"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/s3"
)

// running is a sink reading its own buffer, against a server.
type running struct {
	s    *s3.Sink
	buf  *ring.Buffer[*flow.Flow]
	m    *sink.Metrics
	logs *testkit.LogBuffer
	stop context.CancelFunc
	done chan error
}

// start makes a sink for srv's bucket with o (endpoint, bucket and
// credentials filled in unless set) and runs it until the test ends.
func start(t *testing.T, srv *s3server.Server, o s3.Options) *running {
	t.Helper()
	r := &running{m: sink.NewMetrics(nil), logs: &testkit.LogBuffer{}, buf: ring.New[*flow.Flow](4096),
		done: make(chan error, 1)}
	if o.Endpoint == "" {
		o.Endpoint = srv.Addr
	}
	if o.Bucket == "" {
		o.Bucket = "flows"
	}
	if o.Creds == nil {
		o.Creds = credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")
	}
	o.Metrics = r.m
	o.Log = slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := s3.New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	c := r.buf.Consumer()
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- s.Run(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		r.buf.Close()
		<-r.done
		if t.Failed() {
			t.Logf("sink log:\n%s\nserver log:\n%s", r.logs.String(), srv.Log())
		}
	})
	return r
}

// finish closes the buffer and waits for Run, which uploads what is left.
func (r *running) finish(t *testing.T) {
	t.Helper()
	r.buf.Close()
	select {
	case err := <-r.done:
		r.done <- err
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return after the buffer closed")
	}
}

func (r *running) exported() float64 {
	return testutil.ToFloat64(r.m.Exported.WithLabelValues("s3Uploader"))
}
func (r *running) dropped() float64 {
	return testutil.ToFloat64(r.m.Dropped.WithLabelValues("s3Uploader", sink.ReasonSendError))
}

// records returns n records with distinct source ports from first on.
func records(first, n int, agg bool) []*flow.Flow {
	out := make([]*flow.Flow, n)
	for i := range out {
		out[i] = flowtest.Full(first+i, agg)
		out[i].SourcePort = uint16(10000 + first + i)
	}
	return out
}

// splitRow splits a CSV row into its fields, the single-quoted label
// fields (which hold commas) kept whole.
func splitRow(row string) []string {
	var out []string
	parts := strings.Split(row, ",")
	for i := 0; i < len(parts); i++ {
		f := parts[i]
		if strings.HasPrefix(f, "'") {
			for !(len(f) > 1 && strings.HasSuffix(f, "'")) && i+1 < len(parts) {
				i++
				f += "," + parts[i]
			}
		}
		out = append(out, f)
	}
	return out
}

var keyRE = regexp.MustCompile(`^(.*/)?records-[a-z0-9]{12}\.(csv|csv\.gz|parquet)$`)

// csvRows decompresses (if gz) and splits every object into rows, checks
// each row against the record of the same source port, with the
// upload-side timestamp between from and to, and that every record came
// exactly once. It returns the number of rows of each object.
func checkCSV(t *testing.T, objs []s3server.Object, gz bool, sent []*flow.Flow, from, to time.Time) []int {
	t.Helper()
	byPort := map[string]*flow.Flow{}
	for _, f := range sent {
		byPort[strconv.Itoa(int(f.SourcePort))] = f
	}
	seen := map[string]bool{}
	var counts []int
	for _, o := range objs {
		var rd io.Reader = bytes.NewReader(o.Data)
		if gz {
			z, err := gzip.NewReader(rd)
			if err != nil {
				t.Fatalf("%s: %v", o.Key, err)
			}
			rd = z
		}
		sc := bufio.NewScanner(rd)
		sc.Buffer(nil, 1<<20)
		n := 0
		for sc.Scan() {
			n++
			row := sc.Text()
			fields := splitRow(row)
			if len(fields) != s3.CSVFields {
				t.Fatalf("%s: row of %d fields: %s", o.Key, len(fields), row)
			}
			port := fields[7]
			f := byPort[port]
			if f == nil || seen[port] {
				t.Fatalf("%s: row for source port %s: unknown or repeated", o.Key, port)
			}
			seen[port] = true
			ts, err := strconv.ParseInt(fields[49], 10, 64)
			if err != nil || ts < from.Unix() || ts > to.Unix() {
				t.Fatalf("%s: upload-side timestamp %q not within [%d, %d]", o.Key, fields[49], from.Unix(), to.Unix())
			}
			if want := string(s3.AppendCSVRow(nil, f, time.Unix(ts, 0))); row != want {
				t.Fatalf("%s: row\n got %s\nwant %s", o.Key, row, want)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		counts = append(counts, n)
	}
	if len(seen) != len(sent) {
		t.Fatalf("%d of %d records in the bucket", len(seen), len(sent))
	}
	slices.Sort(counts)
	return counts
}

// TestUploadCSV: 250 records, 100 a file, go to the bucket under the
// prefix as three objects named as the reference names them (the last one
// closed by the end of the pipeline, long before the upload interval);
// read back, decompressed, every row is the record's.
func TestUploadCSV(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	for _, gz := range []bool{true, false} {
		t.Run("gzip="+strconv.FormatBool(gz), func(t *testing.T) {
			prefix := "cluster-a/gz-" + strconv.FormatBool(gz)
			r := start(t, srv, s3.Options{Prefix: prefix + "/", Compress: gz, MaxRecordsPerFile: 100,
				UploadInterval: time.Hour})
			from := time.Now()
			sent := records(0, 250, true)
			for i := 0; i < len(sent); i += 50 {
				r.buf.Produce(sent[i : i+50]...)
			}
			r.finish(t)
			to := time.Now()
			objs := srv.Objects("flows", prefix+"/")
			for _, o := range objs {
				if !keyRE.MatchString(o.Key) || !strings.HasPrefix(o.Key, prefix+"/records-") ||
					strings.HasSuffix(o.Key, ".gz") != gz {
					t.Errorf("object name %q", o.Key)
				}
			}
			if counts := checkCSV(t, objs, gz, sent, from, to); !slices.Equal(counts, []int{50, 100, 100}) {
				t.Errorf("rows per object %v, want 50, 100, 100", counts)
			}
			if r.exported() != 250 || r.dropped() != 0 {
				t.Errorf("exported %v, dropped %v", r.exported(), r.dropped())
			}
			if m := r.s.SinkMetrics(); testutil.ToFloat64(m.FilesUploaded) != 3 || testutil.ToFloat64(m.PendingFiles) != 0 {
				t.Errorf("files uploaded %v, pending %v", testutil.ToFloat64(m.FilesUploaded), testutil.ToFloat64(m.PendingFiles))
			}
		})
	}
}

// TestUploadInterval: a file is closed and uploaded every interval
// without the pipeline ending.
func TestUploadInterval(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	r := start(t, srv, s3.Options{Compress: true, UploadInterval: time.Second})
	sent := records(0, 10, false)
	from := time.Now()
	r.buf.Produce(sent...)
	testkit.WaitFor(t, "the records uploaded", func() bool { return r.exported() == 10 })
	checkCSV(t, srv.Objects("flows", ""), true, sent, from, time.Now())
}

// TestUploadParquet: Parquet files read back (with parquet-go's reader;
// interop/ reads them with Apache Arrow's) hold every record, typed.
func TestUploadParquet(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	r := start(t, srv, s3.Options{Format: s3.FormatParquet, Compress: true, MaxRecordsPerFile: 700,
		UploadInterval: time.Hour})
	sent := records(0, 1000, true)
	sent[5].Aggregation = nil // a record that was not aggregated
	sent[6].SourcePodName = "line\nbreak"
	from := time.Now()
	r.buf.Produce(sent...)
	r.finish(t)
	to := time.Now()
	objs := srv.Objects("flows", "")
	if len(objs) != 2 {
		t.Fatalf("%d objects, want 2", len(objs))
	}
	byPort := map[int32]*flow.Flow{}
	for _, f := range sent {
		byPort[int32(f.SourcePort)] = f
	}
	n := 0
	for _, o := range objs {
		if !keyRE.MatchString(o.Key) || !strings.HasSuffix(o.Key, ".parquet") {
			t.Errorf("object name %q", o.Key)
		}
		rows, err := parquet.Read[s3.ParquetRow](bytes.NewReader(o.Data), int64(len(o.Data)))
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		for _, row := range rows {
			f := byPort[row.SourceTransportPort]
			if f == nil {
				t.Fatalf("%s: row for unknown port %d", o.Key, row.SourceTransportPort)
			}
			delete(byPort, row.SourceTransportPort)
			if row.TimeInserted < from.UnixMilli() || row.TimeInserted > to.UnixMilli() {
				t.Fatalf("timeInserted %d not within [%d, %d]", row.TimeInserted, from.UnixMilli(), to.UnixMilli())
			}
			var want s3.ParquetRow
			s3.MakeParquetRow(&want, f, time.UnixMilli(row.TimeInserted))
			if row != want {
				t.Fatalf("row\n got %+v\nwant %+v", row, want)
			}
			n++
		}
	}
	if n != len(sent) || len(byPort) != 0 {
		t.Fatalf("%d rows for %d records (%d missing)", n, len(sent), len(byPort))
	}
}

// TestOutage: while the server is down, closed files wait and their
// uploads are retried; once it is back they are uploaded and nothing is
// lost. Down again with more files than the queue holds, the oldest are
// dropped and their records counted; the newest are uploaded after.
func TestOutage(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	reg := prometheus.NewRegistry()
	r := start(t, srv, s3.Options{MaxRecordsPerFile: 10, UploadInterval: time.Hour, MaxPending: 2,
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, UploadTimeout: 5 * time.Second,
		Registry: reg})
	m := r.s.SinkMetrics()
	var sent []*flow.Flow
	file := func() {
		recs := records(len(sent), 10, true)
		sent = append(sent, recs...)
		r.buf.Produce(recs...)
	}
	file()
	testkit.WaitFor(t, "the first file uploaded", func() bool { return r.exported() == 10 })

	// Down for a while: two files wait (the queue holds them).
	srv.Stop()
	errs := testutil.ToFloat64(m.UploadErrors)
	file()
	file()
	testkit.WaitFor(t, "uploads retried while the server is down", func() bool {
		return testutil.ToFloat64(m.UploadErrors) >= errs+3 && testutil.ToFloat64(m.PendingFiles) == 2
	})
	if r.dropped() != 0 || r.exported() != 10 {
		t.Fatalf("while down: exported %v, dropped %v", r.exported(), r.dropped())
	}
	if err := r.s.LastError(); err == nil || !strings.Contains(err.Error(), "cannot reach the store") {
		t.Errorf("last error %v, want one saying the store cannot be reached", err)
	}
	srv.Restart()
	testkit.WaitFor(t, "the waiting files uploaded once the server is back", func() bool { return r.exported() == 30 })
	if r.dropped() != 0 || r.s.LastError() != nil {
		t.Fatalf("after the outage: dropped %v, last error %v", r.dropped(), r.s.LastError())
	}

	// Down again, with four files: the two oldest are dropped.
	srv.Stop()
	for range 4 {
		file()
	}
	testkit.WaitFor(t, "the oldest files dropped", func() bool { return r.dropped() == 20 })
	if got := testutil.ToFloat64(m.FilesDropped); got != 2 {
		t.Errorf("files dropped %v, want 2", got)
	}
	srv.Restart()
	testkit.WaitFor(t, "the newest files uploaded", func() bool { return r.exported() == 50 })
	r.finish(t)

	// In the bucket: the first three files and the last two of the second
	// outage.
	want := slices.Concat(sent[:30], sent[50:70])
	checkCSV(t, srv.Objects("flows", ""), false, want, time.Now().Add(-time.Hour), time.Now())
	if r.exported() != 50 || r.dropped() != 20 {
		t.Errorf("exported %v, dropped %v", r.exported(), r.dropped())
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_s3_files_dropped_total"); err != nil || n != 1 {
		t.Errorf("the sink's series are not registered: %d, %v", n, err)
	}
	if !strings.Contains(r.logs.String(), "uploads to S3 work again") {
		t.Error("no log line for the recovery")
	}
}

// TestWrongCredentials: a wrong secret or an unknown access key gives an
// error that says so and what to check; the records are kept meanwhile.
func TestWrongCredentials(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	for _, c := range []struct {
		name, id, secret, code string
	}{
		{"wrong secret", srv.AccessKey, "not-the-secret", "SignatureDoesNotMatch"},
		{"unknown key", "nobody", "whatever", "XAdminUserNotFound"}, // versitygw's code (AWS says InvalidAccessKeyId)
	} {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, srv, s3.Options{Creds: credentials.NewStaticV4(c.id, c.secret, ""), UploadInterval: time.Second,
				RetryMin: 100 * time.Millisecond})
			r.buf.Produce(records(0, 5, false)...)
			testkit.WaitFor(t, "an upload error", func() bool { return r.s.LastError() != nil })
			msg := r.s.LastError().Error()
			for _, w := range []string{"refused the credentials", c.code, "AWS_ACCESS_KEY_ID", `bucket "flows"`} {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			testkit.WaitFor(t, "the error logged", func() bool {
				return strings.Contains(r.logs.String(), "level=ERROR msg=\"cannot upload to S3")
			})
			if r.exported() != 0 || r.dropped() != 0 {
				t.Errorf("exported %v, dropped %v while refused", r.exported(), r.dropped())
			}
		})
	}
	if objs := srv.Objects("flows", ""); len(objs) != 0 {
		t.Errorf("%d objects written with wrong credentials", len(objs))
	}
}

// TestNoBucket: a bucket that does not exist is named in the error.
func TestNoBucket(t *testing.T) {
	srv := s3server.Start(t)
	r := start(t, srv, s3.Options{Bucket: "missing", UploadInterval: time.Second, RetryMin: 100 * time.Millisecond})
	r.buf.Produce(records(0, 1, false)...)
	testkit.WaitFor(t, "an upload error", func() bool { return r.s.LastError() != nil })
	if msg := r.s.LastError().Error(); !strings.Contains(msg, `bucket "missing" does not exist`) {
		t.Errorf("error %q", msg)
	}
}

// TestCancelCountsWhatItHeld: when the sink is stopped (not drained) with
// the server down, Run returns at once and every record it held is
// counted as dropped.
func TestCancelCountsWhatItHeld(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	srv.Stop()
	r := start(t, srv, s3.Options{MaxRecordsPerFile: 10, UploadInterval: time.Hour, RetryMin: 50 * time.Millisecond})
	r.buf.Produce(records(0, 25, false)...) // two closed files, five records in the open one
	m := r.s.SinkMetrics()
	testkit.WaitFor(t, "two files waiting", func() bool {
		return testutil.ToFloat64(m.PendingFiles) == 2 && testutil.ToFloat64(m.UploadErrors) >= 1
	})
	r.stop()
	select {
	case <-r.done:
		r.done <- nil
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("Run did not return when its context ended")
	}
	testkit.WaitFor(t, "the records counted", func() bool { return r.dropped() == 25 })
	if r.exported() != 0 || testutil.ToFloat64(m.PendingFiles) != 0 {
		t.Errorf("exported %v, pending %v", r.exported(), testutil.ToFloat64(m.PendingFiles))
	}
}

// TestFinalTimeout: when the pipeline ends with the server down, Run
// tries again at once (not after the backoff it was waiting out) and for
// FinalTimeout, then returns and counts what it held as dropped.
func TestFinalTimeout(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	srv.Stop()
	r := start(t, srv, s3.Options{MaxRecordsPerFile: 10, UploadInterval: time.Hour, RetryMin: 20 * time.Second,
		RetryMax: 20 * time.Second, FinalTimeout: 500 * time.Millisecond})
	m := r.s.SinkMetrics()
	r.buf.Produce(records(0, 15, false)...)
	testkit.WaitFor(t, "a failed upload", func() bool { return testutil.ToFloat64(m.UploadErrors) >= 1 })
	began := time.Now()
	r.finish(t)
	if took := time.Since(began); took < 500*time.Millisecond || took > 10*time.Second {
		t.Errorf("Run returned after %v, want about FinalTimeout (500ms), well before the 20s backoff", took)
	}
	if got := testutil.ToFloat64(m.UploadErrors); got < 2 {
		t.Errorf("%v upload attempts failed, want another one once the pipeline ended", got)
	}
	if r.dropped() != 15 || r.exported() != 0 {
		t.Errorf("dropped %v, exported %v; want 15 and 0", r.dropped(), r.exported())
	}
	if !strings.Contains(r.logs.String(), "the sink stopped before the store took it") {
		t.Errorf("no log line for the dropped files:\n%s", r.logs.String())
	}
}
