package s3_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/flow"
	"sluice/internal/testkit/recpool"
	"sluice/internal/testkit/s3server"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/s3"
)

// runOn runs a sink for srv's bucket "flows" on a consumer of p's buffer;
// the returned function closes the buffer and waits for Run (which
// uploads what is left).
func runOn(t testing.TB, srv *s3server.Server, p *recpool.Producer, o s3.Options) (*ring.Consumer[*flow.Flow], *sink.Metrics, func()) {
	t.Helper()
	m := sink.NewMetrics(nil)
	o.Endpoint, o.Bucket, o.Creds, o.Metrics = srv.Addr, "flows", credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), m
	o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := s3.New(o)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Buf.Consumer()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	finish := func() {
		p.Buf.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		p.Buf.Close()
		select {
		case <-done:
		default:
		}
	})
	return c, m, finish
}

// TestEncodeAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled by the buffer once every reader released them),
// writing records into a CSV file costs no allocation per record (a few
// per batch, and per file), nor in a Parquet file (address texts are
// cached); no file holds a recycled record's poison.
func TestEncodeAllocatesNothingPerRecord(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	for _, c := range []struct {
		name     string
		format   string
		compress bool
	}{{"csv", s3.FormatCSV, false}, {"csv.gz", s3.FormatCSV, true}, {"parquet", s3.FormatParquet, false}} {
		t.Run(c.name, func(t *testing.T) {
			p := recpool.New(8192)
			// One file, closed when the buffer closes: uploads are per file.
			cons, m, finish := runOn(t, srv, p, s3.Options{Prefix: c.name + "/", Format: c.format, Compress: c.compress,
				MaxRecordsPerFile: 1 << 20, UploadInterval: time.Hour})
			recs := recpool.Records(2048)
			round := func() {
				p.Round(t, context.Background(), recs, 256, func() bool { return cons.Behind() == 0 })
			}
			per := recpool.Measure(8, len(recs), round)
			t.Logf("%s: %.4f allocations per record; %d records made, %d recycled", c.name, per, p.Made, p.Recycled)
			if per > recpool.PerRecordBound {
				t.Errorf("%.3f allocations per record, want none (but a few per batch)", per)
			}
			if p.Recycled == 0 {
				t.Error("no record was recycled: the sink never released")
			}
			finish()
			want := recpool.MeasureRounds(8) * len(recs)
			if e := testutil.ToFloat64(m.Exported.WithLabelValues("s3Uploader")); e != float64(want) {
				t.Errorf("exported %v, want %d", e, want)
			}
			objs := srv.Objects("flows", c.name+"/")
			if len(objs) != 1 {
				t.Fatalf("%d objects, want 1", len(objs))
			}
			if !c.compress && (bytes.Contains(objs[0].Data, []byte(recpool.Poison)) || bytes.Contains(objs[0].Data, []byte("192.0.2.66"))) {
				t.Error("the file holds a recycled record")
			}
		})
	}
}

// TestLappedNeverWritesRecycled: a sink the producer laps again and again
// (a small buffer) never writes a record that was recycled under it.
func TestLappedNeverWritesRecycled(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	for _, format := range []string{s3.FormatCSV, s3.FormatParquet} {
		t.Run(format, func(t *testing.T) {
			p := recpool.New(64)
			p.Quarantine = true
			cons, m, finish := runOn(t, srv, p, s3.Options{Prefix: format + "/", Format: format, MaxRecordsPerFile: 1 << 20,
				UploadInterval: time.Hour})
			recs := recpool.Records(4096)
			for range 5 {
				p.Round(t, context.Background(), recs, 64, func() bool { return true })
			}
			finish()
			objs := srv.Objects("flows", format+"/")
			if len(objs) != 1 {
				t.Fatalf("%d objects, want 1", len(objs))
			}
			if bytes.Contains(objs[0].Data, []byte(recpool.Poison)) || bytes.Contains(objs[0].Data, []byte("192.0.2.66")) {
				t.Fatal("the file holds a recycled record")
			}
			e := testutil.ToFloat64(m.Exported.WithLabelValues("s3Uploader"))
			t.Logf("%v written, %d lost, %d recycled", e, cons.Lost, p.Recycled)
			if cons.Lost == 0 || p.Recycled == 0 || e+float64(cons.Lost) != 5*4096 {
				t.Errorf("written %v, lost %d, recycled %d: want lapped, recycled, and every record counted", e, cons.Lost, p.Recycled)
			}
		})
	}
}

// BenchmarkWrite is one record through the sink into its file, from the
// producer on (the upload, once per file, is left out).
// warmRounds of 1024 records go through before the benchmark: 1.5 laps
// of its buffer.
const warmRounds = 12

func BenchmarkWrite(b *testing.B) {
	srv := s3server.Start(b)
	srv.MakeBucket("flows")
	for _, format := range []string{s3.FormatCSV, s3.FormatParquet} {
		b.Run(format, func(b *testing.B) {
			p := recpool.New(8192)
			cons, _, _ := runOn(b, srv, p, s3.Options{Prefix: "bench/", Format: format, MaxRecordsPerFile: 1 << 30,
				UploadInterval: time.Hour})
			recs := recpool.Records(1024)
			for range warmRounds { // the buffer's first lap allocates its records
				p.Round(b, context.Background(), recs, 256, func() bool { return cons.Behind() == 0 })
			}
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n += len(recs) {
				p.Round(b, context.Background(), recs[:min(len(recs), b.N-n)], 256, func() bool { return cons.Behind() == 0 })
			}
			b.StopTimer()
		})
	}
}
