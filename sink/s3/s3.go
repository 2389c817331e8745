// Package s3 is the s3Uploader sink: records are written into files in
// memory (the reference's CSV rows, gzipped by default, or Sluice's typed
// Parquet columns) and uploaded to a bucket of AWS S3 or of an
// S3-compatible store as `[prefix/]records-<12 random [a-z0-9]>.<ext>`.
//
// A file is closed when it holds MaxRecordsPerFile records and every
// UploadInterval; closed files wait in a queue of at most MaxPending
// files, uploaded oldest first by a goroutine of their own, so a slow or
// unreachable store never holds up reading the pipeline. A failed upload
// is retried with backoff; when the queue is full the oldest file is
// dropped and its records counted. When the pipeline ends, the file being
// written is closed and the queue uploaded within FinalTimeout.
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/ring"
	"sluice/sink"
)

// Defaults of Options.
const (
	DefaultMaxRecordsPerFile = 1000000
	DefaultUploadInterval    = 60 * time.Second
	// DefaultMaxPending is the reference's number of files kept waiting.
	DefaultMaxPending = 5
	// DefaultUploadTimeout bounds one upload attempt.
	DefaultUploadTimeout = 60 * time.Second
	// DefaultFinalTimeout bounds the last uploads when the pipeline ends,
	// as the reference's flush on stop.
	DefaultFinalTimeout = time.Minute
	// DefaultRetryMin and DefaultRetryMax bound the wait between attempts
	// at a failed upload (doubling each time; never more than
	// UploadInterval).
	DefaultRetryMin = time.Second
	DefaultRetryMax = 30 * time.Second
)

// Options configures a Sink.
type Options struct {
	// Endpoint is host[:port] of the store; empty means AWS S3
	// (s3.amazonaws.com). Secure selects HTTPS.
	Endpoint string
	Secure   bool
	// Bucket is the bucket name (required); Prefix is put before the
	// object names, with a slash between.
	Bucket string
	Prefix string
	// Region, with an Endpoint, is the region requests are signed for;
	// empty asks the store. With AWS S3 the bucket's region is always
	// asked (GetBucketLocation, and the region a refusal names), as the
	// reference finds it: Region is only the reference's hint there.
	Region string
	// Creds are the credentials; nil means the standard AWS environment
	// variables (see EnvCredentials).
	Creds *credentials.Credentials
	// Format is FormatCSV (default) or FormatParquet; Compress gzips CSV
	// files and compresses Parquet pages with zstd.
	Format   string
	Compress bool
	// MaxRecordsPerFile closes a file when it holds that many records.
	MaxRecordsPerFile int
	// UploadInterval closes the file being written (if it holds any
	// record) and uploads what waits, at least 1s.
	UploadInterval time.Duration
	// MaxPending is how many closed files may wait for upload (besides the
	// one being uploaded); past it the oldest is dropped.
	MaxPending int
	// UploadTimeout bounds one attempt; FinalTimeout the last uploads
	// when the pipeline ends.
	UploadTimeout time.Duration
	FinalTimeout  time.Duration
	// RetryMin and RetryMax bound the backoff between attempts.
	RetryMin, RetryMax time.Duration

	Log     *slog.Logger
	Metrics *sink.Metrics
	// Registry takes the sink's own series (files uploaded, dropped,
	// waiting); nil registers none.
	Registry prometheus.Registerer
	// Name labels the metrics; default "s3Uploader".
	Name string
	// ClusterUUID fills the clusterUUID column of every row, as the
	// reference fills it with the cluster's UUID whatever clusterID says;
	// empty: the record's clusterId.
	ClusterUUID string
}

// EnvCredentials are the credentials of the AWS SDKs' usual chain: the
// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN),
// then the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
// ~/.aws/credentials, profile AWS_PROFILE), then the role of the Pod or
// instance (web identity token, ECS or EC2 metadata). Nothing found means
// anonymous requests.
func EnvCredentials() *credentials.Credentials {
	return credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{},
	})
}

// Metrics are the sink's own series.
type Metrics struct {
	FilesUploaded prometheus.Counter
	FilesDropped  prometheus.Counter
	UploadErrors  prometheus.Counter
	PendingFiles  prometheus.Gauge
	PendingBytes  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, name string) *Metrics {
	l := prometheus.Labels{"sink": name}
	m := &Metrics{
		FilesUploaded: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_s3_files_uploaded_total",
			Help: "Files the S3 sink uploaded.", ConstLabels: l}),
		FilesDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_s3_files_dropped_total",
			Help: "Files the S3 sink dropped without uploading them (the queue was full, or the sink was stopped); their records count in sluice_sink_records_dropped_total{reason=\"send-error\"}.", ConstLabels: l}),
		UploadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_s3_upload_errors_total",
			Help: "Upload attempts that failed (each is retried while the file is kept).", ConstLabels: l}),
		PendingFiles: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_s3_pending_files",
			Help: "Closed files waiting for upload, the one being uploaded included.", ConstLabels: l}),
		PendingBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_s3_pending_bytes",
			Help: "Octets of the closed files waiting for upload.", ConstLabels: l}),
	}
	if reg != nil {
		reg.MustRegister(m.FilesUploaded, m.FilesDropped, m.UploadErrors, m.PendingFiles, m.PendingBytes)
	}
	return m
}

// Sink uploads records to S3.
type Sink struct {
	o       Options
	format  format
	client  *minio.Client
	metrics *Metrics

	exported, lost, sendErrs, encodeErrs prometheus.Counter
	connected                            prometheus.Gauge
	attempts                             prometheus.Counter

	// mu guards the queue and what goes with it.
	mu       sync.Mutex
	queue    []*object // closed files waiting, oldest first
	inflight *object   // the file being uploaded
	closed   bool      // no more files will come
	kick     chan struct{}
	ended    chan struct{} // closed when reading has ended (closed is set)
	failing  string        // the error of the last failed attempt, "" after a success
}

// object is one closed file.
type object struct {
	key     string
	data    []byte
	records int
}

// New checks the options and returns the sink; it does not contact the
// store (Run does, and keeps records while it cannot).
func New(o Options) (*Sink, error) {
	if o.Bucket == "" {
		return nil, errors.New("s3: no bucket name")
	}
	f, err := newFormat(o.Format, o.Compress, o.ClusterUUID)
	if err != nil {
		return nil, fmt.Errorf("s3: %w", err)
	}
	if o.MaxRecordsPerFile <= 0 {
		o.MaxRecordsPerFile = DefaultMaxRecordsPerFile
	}
	if o.UploadInterval <= 0 {
		o.UploadInterval = DefaultUploadInterval
	}
	o.UploadInterval = max(o.UploadInterval, time.Second)
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.UploadTimeout <= 0 {
		o.UploadTimeout = DefaultUploadTimeout
	}
	if o.FinalTimeout <= 0 {
		o.FinalTimeout = DefaultFinalTimeout
	}
	if o.RetryMin <= 0 {
		o.RetryMin = DefaultRetryMin
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	o.RetryMax = max(min(o.RetryMax, o.UploadInterval), o.RetryMin)
	if o.Creds == nil {
		o.Creds = EnvCredentials()
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = sink.NewMetrics(nil)
	}
	if o.Name == "" {
		o.Name = "s3Uploader"
	}
	o.Prefix = strings.Trim(o.Prefix, "/")
	endpoint, region := o.Endpoint, o.Region
	if endpoint == "" {
		endpoint, o.Secure, region = "s3.amazonaws.com", true, ""
	}
	// With no region the client asks the store for the bucket's region
	// (GetBucketLocation) before its first request, and follows the region
	// a refusal names (its one retry). Failures are retried by the sink.
	client, err := minio.New(endpoint, &minio.Options{Creds: o.Creds, Secure: o.Secure, Region: region, MaxRetries: 2})
	if err != nil {
		return nil, fmt.Errorf("s3: endpoint %q: %w", endpoint, err)
	}
	s := &Sink{o: o, format: f, client: client, kick: make(chan struct{}, 1), ended: make(chan struct{})}
	s.metrics = newMetrics(o.Registry, o.Name)
	m := o.Metrics
	s.exported = m.Exported.WithLabelValues(o.Name)
	s.lost = m.Dropped.WithLabelValues(o.Name, sink.ReasonBufferFull)
	s.sendErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonSendError)
	s.encodeErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonEncodeError)
	s.connected = m.Connected.WithLabelValues(o.Name)
	s.attempts = m.Reconnects.WithLabelValues(o.Name)
	return s, nil
}

// SinkMetrics returns the sink's own series.
func (s *Sink) SinkMetrics() *Metrics { return s.metrics }

// Run writes the records c yields into files and uploads them until the
// buffer is closed and drained (then the file being written is closed and
// every file uploaded, within FinalTimeout) or ctx ends (then it returns
// at once, counting what it held as dropped).
func (s *Sink) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	uploaded := make(chan struct{})
	go func() {
		defer close(uploaded)
		s.uploadLoop(ctx)
	}()
	s.read(ctx, c)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	close(s.ended)
	<-uploaded
	s.mu.Lock()
	left := s.queue
	s.queue = nil
	s.gauges()
	s.mu.Unlock()
	for _, obj := range left {
		s.drop(obj, "the sink stopped before the store took it")
	}
	s.connected.Set(0)
	return nil
}

// read fills files from c until c ends, closing them by size and time.
func (s *Sink) read(ctx context.Context, c *ring.Consumer[*flow.Flow]) {
	var (
		enc     encoder
		n       int // records in enc
		lost    uint64
		batch   []*flow.Flow
		closeAt = time.Now().Add(s.o.UploadInterval)
	)
	seal := func() {
		if enc == nil {
			return
		}
		data, err := enc.finish()
		if err != nil {
			s.encodeErrs.Add(float64(n))
			s.o.Log.Error("cannot complete a file; its records are dropped", "sink", s.o.Name, "records", n, "err", err)
		} else {
			s.push(&object{key: s.objectKey(), data: data, records: n})
		}
		enc, n = nil, 0
	}
	for {
		wctx, cancel := context.WithDeadline(ctx, closeAt)
		var ok bool
		batch, ok = c.Next(wctx, batch[:0], 512)
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		if c.Lost > lost {
			s.lost.Add(float64(c.Lost - lost))
			lost = c.Lost
		}
		now := time.Now()
		for _, f := range batch {
			if enc == nil {
				enc = s.format.newEncoder()
			}
			if err := enc.add(f, now); err != nil {
				// A file the encoder failed on cannot be trusted: drop it.
				s.encodeErrs.Add(float64(n + 1))
				s.o.Log.Error("cannot encode a record; the file it was going into is dropped", "sink", s.o.Name,
					"records", n+1, "err", err)
				enc, n = nil, 0
				continue
			}
			n++
			if n >= s.o.MaxRecordsPerFile {
				seal()
			}
		}
		// The file holds its own octets (CSV) or rows whose strings are
		// the records' immutable ones (Parquet), no record: the buffer
		// may reuse them.
		c.Release(0)
		clear(batch)
		if ctx.Err() != nil {
			if n > 0 {
				s.sendErrs.Add(float64(n))
				s.o.Log.Warn("stopped with a file not yet closed; its records are dropped", "sink", s.o.Name, "records", n)
			}
			return
		}
		if !ok && !timedOut {
			seal() // the buffer is closed and drained
			return
		}
		if !now.Before(closeAt) {
			seal()
			closeAt = now.Add(s.o.UploadInterval)
		}
	}
}

// push queues a closed file, dropping the oldest waiting one when more
// than MaxPending wait.
func (s *Sink) push(obj *object) {
	s.mu.Lock()
	s.queue = append(s.queue, obj)
	dropped := s.trim()
	s.gauges()
	s.mu.Unlock()
	if dropped != nil {
		s.drop(dropped, "more files wait than the queue holds")
	}
	s.wake()
}

// trim removes and returns the oldest waiting file when more than
// MaxPending wait; called with mu held.
func (s *Sink) trim() *object {
	if len(s.queue) <= s.o.MaxPending {
		return nil
	}
	obj := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return obj
}

func (s *Sink) drop(obj *object, why string) {
	s.metrics.FilesDropped.Inc()
	s.sendErrs.Add(float64(obj.records))
	s.o.Log.Warn("dropped a file without uploading it: "+why, "sink", s.o.Name, "object", obj.key,
		"records", obj.records)
}

// gauges updates the queue's gauges; called with mu held.
func (s *Sink) gauges() {
	n, b := len(s.queue), 0
	for _, obj := range s.queue {
		b += len(obj.data)
	}
	if s.inflight != nil {
		n++
		b += len(s.inflight.data)
	}
	s.metrics.PendingFiles.Set(float64(n))
	s.metrics.PendingBytes.Set(float64(b))
}

func (s *Sink) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// uploadLoop uploads queued files oldest first, waiting with backoff
// after a failure, until the queue is closed and empty, FinalTimeout has
// passed since it was closed, or ctx ends. A file whose upload failed goes
// back to the head of the queue, where it is the first dropped if the
// queue overflows.
func (s *Sink) uploadLoop(ctx context.Context) {
	backoff := time.Duration(0)
	actx := ctx // becomes the final context once the queue is closed
	ended := s.ended
	finalSet := false
	for {
		s.mu.Lock()
		closed := s.closed
		var obj *object
		if len(s.queue) > 0 {
			obj = s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.inflight = obj
		}
		s.mu.Unlock()
		if closed && !finalSet {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(ctx, s.o.FinalTimeout)
			defer cancel()
			finalSet = true
		}
		if obj == nil {
			if closed {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			case <-s.ended:
			}
			continue
		}
		var err error
		if err = actx.Err(); err == nil {
			err = s.upload(actx, obj)
		}
		var dropped *object
		s.mu.Lock()
		s.inflight = nil
		if err != nil {
			s.queue = append(s.queue, nil)
			copy(s.queue[1:], s.queue)
			s.queue[0] = obj
			dropped = s.trim()
		}
		s.gauges()
		s.mu.Unlock()
		if dropped != nil {
			s.drop(dropped, "more files wait than the queue holds")
		}
		if err == nil {
			backoff = 0
			continue
		}
		if actx.Err() != nil {
			return
		}
		if backoff == 0 {
			backoff = s.o.RetryMin
		} else {
			backoff = min(2*backoff, s.o.RetryMax)
		}
		t := time.NewTimer(backoff)
		select {
		case <-actx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-ended:
			// The pipeline ended during the wait: try again at once, now
			// within FinalTimeout.
			t.Stop()
			ended = nil
		}
	}
}

// upload puts one object, logging the first failure of a run of them and
// the recovery.
func (s *Sink) upload(ctx context.Context, obj *object) error {
	s.attempts.Inc()
	uctx, cancel := context.WithTimeout(ctx, s.o.UploadTimeout)
	defer cancel()
	_, err := s.client.PutObject(uctx, s.o.Bucket, obj.key, bytes.NewReader(obj.data), int64(len(obj.data)),
		minio.PutObjectOptions{ContentType: s.format.contentType, DisableMultipart: len(obj.data) < 64<<20})
	if err != nil {
		err = explain(err, s.o.Bucket)
		s.metrics.UploadErrors.Inc()
		s.connected.Set(0)
		msg := err.Error()
		s.mu.Lock()
		first := s.failing == ""
		s.failing = msg
		s.mu.Unlock()
		if first {
			s.o.Log.Error("cannot upload to S3; files are kept and retried", "sink", s.o.Name, "bucket", s.o.Bucket,
				"object", obj.key, "err", err)
		} else {
			s.o.Log.Debug("upload failed again", "sink", s.o.Name, "object", obj.key, "err", err)
		}
		return err
	}
	s.exported.Add(float64(obj.records))
	s.metrics.FilesUploaded.Inc()
	s.connected.Set(1)
	s.mu.Lock()
	recovered := s.failing != ""
	s.failing = ""
	s.mu.Unlock()
	if recovered {
		s.o.Log.Info("uploads to S3 work again", "sink", s.o.Name, "bucket", s.o.Bucket)
	}
	s.o.Log.Debug("uploaded", "sink", s.o.Name, "object", obj.key, "records", obj.records, "bytes", len(obj.data))
	return nil
}

// LastError is the error of the last failed upload attempt, or nil after a
// success.
func (s *Sink) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing == "" {
		return nil
	}
	return errors.New(s.failing)
}

// explain turns the store's refusals into errors that say what to fix.
func explain(err error, bucket string) error {
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.StatusCode == 401 || resp.StatusCode == 403 || slices.Contains([]string{"InvalidAccessKeyId",
		"SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "AccessDenied", "InvalidClientTokenId",
		"XAdminUserNotFound"}, resp.Code): // the last one is versitygw's name for an unknown access key
		return fmt.Errorf("the store refused the credentials (%s: %s); check AWS_ACCESS_KEY_ID, "+
			"AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, and that they may write to bucket %q: %w",
			resp.Code, resp.Message, bucket, err)
	case resp.Code == "NoSuchBucket":
		return fmt.Errorf("bucket %q does not exist (s3Uploader.bucketName): %w", bucket, err)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("cannot reach the store: %w", err)
	}
	return err
}

// objectKey names a new object: [prefix/]records-<12 random [a-z0-9]><ext>.
func (s *Sink) objectKey() string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	var r [12]byte
	for i := range r {
		r[i] = chars[rand.IntN(len(chars))]
	}
	name := "records-" + string(r[:]) + s.format.ext
	if s.o.Prefix != "" {
		return s.o.Prefix + "/" + name
	}
	return name
}
