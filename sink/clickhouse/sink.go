// Package clickhouse is the clickHouse sink: exported records become rows
// of Antrea's `flows` table (plus destinationServiceIP), inserted column by
// column in batches over ClickHouse's native protocol.
//
// Records wait in a bounded queue (QueueSize rows). Every CommitInterval,
// or as soon as BatchRows rows wait, the queue is inserted in batches of
// at most BatchRows. A failed insert puts its rows back at the front of the
// queue and is retried with backoff; while the server is away the queue
// fills, and then the oldest rows are dropped and counted
// (sluice_sink_records_dropped_total{reason="queue-full"}). When the
// pipeline ends, what is queued is inserted within FlushTimeout; rows that
// could not be are counted with reason "send-error".
package clickhouse

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/ring"
	"sluice/sink"
)

// Defaults of Options.
const (
	DefaultCommitInterval = 8 * time.Second
	// DefaultQueueSize is the reference's cap (2^19 rows).
	DefaultQueueSize = 524288
	// DefaultBatchRows bounds one INSERT.
	DefaultBatchRows    = 65536
	DefaultFlushTimeout = 10 * time.Second
	DefaultDialTimeout  = 10 * time.Second
	// blockRows bounds a block of an INSERT.
	blockRows = 8192
	// insertTimeout bounds one INSERT, sent and acknowledged.
	insertTimeout = time.Minute
	// Backoff between failed attempts doubles from minBackoff to
	// maxBackoff.
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// ReasonQueueFull is the "reason" of rows dropped, oldest first, because
// the queue was full (the server away or too slow).
const ReasonQueueFull = sink.ReasonQueueFull

// Protocols of Options.Protocol.
const (
	Native = "native"
	HTTP   = "http"
)

// Options configures a Sink.
type Options struct {
	// Addr is the server's host:port.
	Addr string
	// Protocol is Native (the default) or HTTP.
	Protocol string
	// TLS, when not nil, secures the connection.
	TLS *tls.Config
	// Database holds the flows table; default "default".
	Database           string
	Username, Password string
	// Compress compresses blocks with lz4.
	Compress bool
	// Debug logs the driver's protocol exchanges at debug level.
	Debug bool
	// CommitInterval is the time between inserts (default 8s).
	CommitInterval time.Duration
	// QueueSize bounds the rows waiting, including those of an insert
	// under way (default DefaultQueueSize).
	QueueSize int
	// BatchRows bounds one insert (default DefaultBatchRows, at most
	// QueueSize).
	BatchRows int
	// CreateSchema creates the table and the views that are missing.
	CreateSchema bool
	// TTL is the rows' time to live in a table CreateSchema creates.
	TTL time.Duration
	// FlushTimeout bounds the final insert (default 10s).
	FlushTimeout time.Duration
	// DialTimeout bounds a connection's set-up (default 10s).
	DialTimeout time.Duration
	Log         *slog.Logger
	Metrics     *sink.Metrics
	// Registry takes the sink's own series when not nil.
	Registry prometheus.Registerer
	// Name labels the metrics; default "clickHouse".
	Name string
	// ClusterUUID fills the clusterUUID column, as the reference fills it
	// with the cluster's UUID whatever clusterID says; empty: the
	// record's clusterId.
	ClusterUUID string
}

// Sink inserts records into ClickHouse.
type Sink struct {
	o    Options
	conn driver.Conn

	mu       sync.Mutex
	q        deque
	inflight int  // rows at the front of q that an insert under way took
	evicted  int  // rows an insert under way took that push dropped
	closing  bool // no more rows will come
	wake     chan struct{}
	// free are the sink's own records that left the queue, for push to
	// copy the next rows into (at most BatchRows are kept).
	free []*flow.Flow

	// The writer's own.
	blk     *block
	version Version
	ready   bool
	failing bool
	taken   []*flow.Flow

	exported, dropped, sendErrs, lostRing prometheus.Counter
	attempts                              prometheus.Counter
	connected, queued                     prometheus.Gauge
	inserts, insertErrs                   prometheus.Counter
	insertSeconds                         prometheus.Observer
}

// New returns the sink; it connects when it runs, so a server that is not
// up yet delays rows rather than the start.
func New(o Options) (*Sink, error) {
	if o.Addr == "" {
		return nil, errors.New("clickhouse: no address")
	}
	if o.Protocol == "" {
		o.Protocol = Native
	}
	if o.Protocol != Native && o.Protocol != HTTP {
		return nil, fmt.Errorf("clickhouse: protocol %q (want native or http)", o.Protocol)
	}
	if o.Database == "" {
		o.Database = "default"
	}
	if o.CommitInterval <= 0 {
		o.CommitInterval = DefaultCommitInterval
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.BatchRows <= 0 {
		o.BatchRows = DefaultBatchRows
	}
	o.BatchRows = min(o.BatchRows, o.QueueSize)
	if o.FlushTimeout <= 0 {
		o.FlushTimeout = DefaultFlushTimeout
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = sink.NewMetrics(nil)
	}
	if o.Name == "" {
		o.Name = "clickHouse"
	}
	o.Log = o.Log.With("sink", o.Name)
	copts := &ch.Options{
		Addr:         []string{o.Addr},
		Auth:         ch.Auth{Database: o.Database, Username: o.Username, Password: o.Password},
		TLS:          o.TLS,
		DialTimeout:  o.DialTimeout,
		MaxOpenConns: 2,
		MaxIdleConns: 1,
		ClientInfo:   ch.ClientInfo{Products: []struct{ Name, Version string }{{Name: "sluice", Version: "1"}}},
	}
	if o.Protocol == HTTP {
		copts.Protocol = ch.HTTP
	}
	if o.Compress {
		copts.Compression = &ch.Compression{Method: ch.CompressionLZ4}
	}
	if o.Debug {
		copts.Logger = o.Log.With("driver", "clickhouse-go")
	}
	conn, err := ch.Open(copts)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: %w", err)
	}
	s := &Sink{o: o, conn: conn, wake: make(chan struct{}, 1)}
	m := o.Metrics
	s.exported = m.Exported.WithLabelValues(o.Name)
	s.dropped = m.Dropped.WithLabelValues(o.Name, ReasonQueueFull)
	s.sendErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonSendError)
	s.lostRing = m.Dropped.WithLabelValues(o.Name, sink.ReasonBufferFull)
	s.connected = m.Connected.WithLabelValues(o.Name)
	s.attempts = m.Reconnects.WithLabelValues(o.Name)
	s.queued = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_clickhouse_queue_rows",
		Help: "Rows waiting for the ClickHouse sink's next insert, including those of an insert under way."})
	ins := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_clickhouse_inserts_total",
		Help: "INSERTs of the ClickHouse sink, by result (ok, error)."}, []string{"result"})
	s.inserts, s.insertErrs = ins.WithLabelValues("ok"), ins.WithLabelValues("error")
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_clickhouse_insert_seconds",
		Help:    "Time of one successful INSERT of the ClickHouse sink, from prepare to acknowledgement.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	s.insertSeconds = hist
	if o.Registry != nil {
		for _, c := range []prometheus.Collector{s.queued, ins, hist} {
			if err := o.Registry.Register(c); err != nil {
				conn.Close()
				return nil, fmt.Errorf("clickhouse: metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Close releases the connections of a sink that never ran.
func (s *Sink) Close() error { return s.conn.Close() }

// Run queues the records c yields and inserts them until the buffer is
// closed and drained (then what is queued is inserted within
// FlushTimeout) or ctx ends (then it returns at once, counting what was
// queued as lost). It never fails for the server's sake: an unreachable
// or refusing server is logged and retried while rows queue.
func (s *Sink) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	defer s.conn.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.write(ctx)
	}()
	var batch []*flow.Flow
	var lost uint64
	for {
		var ok bool
		batch, ok = c.Next(ctx, batch[:0], 4096)
		if c.Lost > lost {
			s.lostRing.Add(float64(c.Lost - lost))
			lost = c.Lost
		}
		s.push(batch)
		clear(batch)
		// push copied the rows: the pipeline's records can be reused
		// (the queue outlives the buffer's lap by far).
		c.Release(0)
		if !ok {
			break
		}
	}
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.signal()
	<-done
	return nil
}

func (s *Sink) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push queues copies of rows (into the sink's own records, reused from
// one insert to the next), dropping the oldest queued ones when the
// queue is full. Rows an insert under way has taken stay at the front of
// the queue until it ends; if they must make room meanwhile, they are
// counted lost only if that insert fails.
func (s *Sink) push(rows []*flow.Flow) {
	if len(rows) == 0 {
		return
	}
	s.mu.Lock()
	drops := 0
	for _, f := range rows {
		if s.q.len() >= s.o.QueueSize {
			old := s.q.popFront()
			if s.inflight > 0 {
				// The insert under way still reads it: not reused.
				s.inflight--
				s.evicted++
			} else {
				drops++
				s.recycle(old)
			}
		}
		s.q.pushBack(s.copyOf(f))
	}
	full := s.q.len()-s.inflight >= s.o.BatchRows
	s.queued.Set(float64(s.q.len()))
	s.mu.Unlock()
	if drops > 0 {
		s.dropped.Add(float64(drops))
	}
	if full {
		s.signal()
	}
}

// row is a queued record: a copy of the pipeline's, with its
// Aggregation in the same allocation.
type row struct {
	f flow.Flow
	a flow.Aggregation
}

// copyOf copies f into a record of the sink's own, reused when one is
// free. Called with mu held.
func (s *Sink) copyOf(f *flow.Flow) *flow.Flow {
	var c *flow.Flow
	if n := len(s.free); n > 0 {
		c = s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
	} else {
		r := &row{}
		c = &r.f
		c.Aggregation = &r.a
	}
	a := c.Aggregation
	*c = *f
	if f.Aggregation != nil {
		*a = *f.Aggregation
	} else {
		*a = flow.Aggregation{} // a zero Aggregation inserts as none does
	}
	c.Aggregation = a
	return c
}

// recycle keeps a record that left the queue, and that no insert reads,
// for copyOf. Called with mu held.
func (s *Sink) recycle(f *flow.Flow) {
	if len(s.free) < s.o.BatchRows {
		s.free = append(s.free, f)
	}
}

// take copies up to BatchRows rows from the front of the queue to
// s.taken.
func (s *Sink) take() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.q.len(), s.o.BatchRows)
	s.taken = s.taken[:0]
	for i := range n {
		s.taken = append(s.taken, s.q.at(i))
	}
	s.inflight, s.evicted = n, 0
	return n
}

// settle ends an insert of the taken rows: done (they leave the queue) or
// failed (they stay, but those evicted meanwhile are lost).
func (s *Sink) settle(ok bool) {
	s.mu.Lock()
	lost := 0
	if ok {
		for ; s.inflight > 0; s.inflight-- {
			s.recycle(s.q.popFront())
		}
	} else {
		lost = s.evicted
	}
	s.inflight, s.evicted = 0, 0
	s.queued.Set(float64(s.q.len()))
	s.mu.Unlock()
	if lost > 0 {
		s.dropped.Add(float64(lost))
	}
	clear(s.taken)
	s.taken = s.taken[:0]
}

// Queued is the number of rows waiting, including those of an insert
// under way.
func (s *Sink) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.len()
}

// state reports the queued rows and whether the run is ending.
func (s *Sink) state() (queued int, closing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.len(), s.closing
}

// write is the writer: it inserts everything queued on the clock, full
// batches as soon as they are, retries with backoff, and flushes when the
// run ends.
func (s *Sink) write(ctx context.Context) {
	tick := time.NewTicker(s.o.CommitInterval)
	defer tick.Stop()
	var backoff time.Duration
	for {
		all := false
		select {
		case <-ctx.Done():
			s.abandon("the aggregator stopped the sink")
			return
		case <-tick.C:
			all = true
		case <-s.wake:
		}
		for {
			n, closing := s.state()
			if closing {
				s.final(ctx)
				return
			}
			if n == 0 || !all && n < s.o.BatchRows {
				break
			}
			if err := s.flushOnce(ctx); err == nil {
				backoff = 0
				continue
			}
			// Retry, everything queued, after the backoff.
			all = true
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			if !s.sleep(ctx, backoff) && ctx.Err() != nil {
				s.abandon("the aggregator stopped the sink")
				return
			}
		}
	}
}

// sleep waits d, or less if ctx ends or the run ends; it reports whether
// it waited all of d.
func (s *Sink) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-s.wake:
			if _, closing := s.state(); closing {
				return false
			}
		}
	}
}

// final inserts what is queued, within FlushTimeout.
func (s *Sink) final(ctx context.Context) {
	fctx, cancel := context.WithTimeout(ctx, s.o.FlushTimeout)
	defer cancel()
	backoff := time.Duration(0)
	for {
		if n, _ := s.state(); n == 0 {
			return
		}
		if err := s.flushOnce(fctx); err == nil {
			backoff = 0
			continue
		}
		backoff = min(max(2*backoff, minBackoff/4), maxBackoff)
		t := time.NewTimer(backoff)
		select {
		case <-fctx.Done():
			t.Stop()
			s.abandon(fmt.Sprintf("the final insert did not succeed within %s", s.o.FlushTimeout))
			return
		case <-t.C:
		}
	}
}

// abandon counts what is still queued as lost.
func (s *Sink) abandon(why string) {
	s.mu.Lock()
	n := s.q.len()
	s.q = deque{}
	s.queued.Set(0)
	s.mu.Unlock()
	if n > 0 {
		s.sendErrs.Add(float64(n))
		s.o.Log.Error("rows not inserted into ClickHouse are lost", "rows", n, "why", why)
	}
}

// flushOnce connects if needed and inserts one batch from the queue.
func (s *Sink) flushOnce(ctx context.Context) error {
	if !s.ready {
		if err := s.setup(ctx); err != nil {
			s.fail(err)
			return err
		}
	}
	n := s.take()
	if n == 0 {
		s.settle(true)
		return nil
	}
	start := time.Now()
	err := s.insert(ctx, s.taken)
	s.settle(err == nil)
	if err != nil {
		s.ready = false // check the server and the table again first
		s.insertErrs.Inc()
		s.fail(fmt.Errorf("inserting %d rows: %w", n, err))
		return err
	}
	s.insertSeconds.Observe(time.Since(start).Seconds())
	s.inserts.Inc()
	s.exported.Add(float64(n))
	s.connected.Set(1)
	if s.failing {
		s.failing = false
		s.o.Log.Info("ClickHouse takes rows again", "addr", s.o.Addr)
	}
	return nil
}

// fail logs the first error of a run of them (the rest at debug level).
func (s *Sink) fail(err error) {
	s.connected.Set(0)
	msg := describe(err, s.o.Username)
	if !s.failing {
		s.failing = true
		s.o.Log.Error("ClickHouse insert failed; rows stay queued and the insert is retried", "addr", s.o.Addr, "err", msg)
		return
	}
	s.o.Log.Debug("ClickHouse insert failed again", "addr", s.o.Addr, "err", msg)
}

// describe names the likely cause of err for the log.
func describe(err error, user string) string {
	var ex *ch.Exception
	if errors.As(err, &ex) {
		switch ex.Code {
		case 192, 193, 194, 516: // UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, AUTHENTICATION_FAILED
			if user == "" {
				user = "default"
			}
			return fmt.Sprintf("ClickHouse refused the credentials of user %q (set CH_USERNAME and CH_PASSWORD): %v", user, err)
		}
	}
	return err.Error()
}

// insert sends rows as one INSERT, in blocks of at most blockRows rows:
// the driver's column buffers, cleared after each block, are then reused
// instead of growing (and being collected) insert after insert.
func (s *Sink) insert(ctx context.Context, rows []*flow.Flow) error {
	ictx, cancel := context.WithTimeout(ctx, insertTimeout)
	defer cancel()
	batch, err := s.conn.PrepareBatch(ictx, s.blk.insert)
	if err != nil {
		return err
	}
	for len(rows) > 0 {
		n := min(len(rows), blockRows)
		s.blk.reset()
		for _, f := range rows[:n] {
			s.blk.add(f)
		}
		rows = rows[n:]
		if err := s.blk.appendTo(batch); err != nil {
			batch.Abort()
			return err
		}
		if len(rows) > 0 {
			if err := batch.Flush(); err != nil {
				batch.Abort()
				return err
			}
		}
	}
	err = batch.Send()
	s.blk.reset()
	return err
}

// deque is a growable ring of records.
type deque struct {
	buf        []*flow.Flow
	head, size int
}

func (d *deque) len() int { return d.size }

func (d *deque) grow() {
	n := max(2*len(d.buf), 1024)
	buf := make([]*flow.Flow, n)
	for i := range d.size {
		buf[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = buf, 0
}

func (d *deque) pushBack(f *flow.Flow) {
	if d.size == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.size)%len(d.buf)] = f
	d.size++
}

func (d *deque) at(i int) *flow.Flow { return d.buf[(d.head+i)%len(d.buf)] }

func (d *deque) popFront() *flow.Flow {
	f := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.size--
	return f
}
