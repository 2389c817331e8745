// Package kafkain is the aggregator's Kafka input: it reads records that
// an ingest tier's kafka sink wrote (the reference's Flow Protobuf
// message, or its JSON mapping) from a topic, in a consumer group, and
// hands them to the mode like a collector does.
//
// Partitions are assigned by Kafka's group protocol with the
// cooperative-sticky balancer. Offsets are committed by the input, never
// automatically: per partition, only up to the oldest record that still
// contributes to state the mode has not exported (see tracker), so that
// the next owner of a partition (after a crash, a rebalance, a scale-out)
// replays from there and rebuilds that state. What it replays that the
// previous owner had taken already is counted
// (sluice_kafka_input_records_replayed_total): such records may be
// exported twice. docs/scale.md gives the bound.
package kafkain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/encoding/protojson"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/ring"
)

// Options configures an Input.
type Options struct {
	// Client are the client options: brokers, TLS, SASL.
	Client []kgo.Opt
	Topic  string
	Group  string
	// Out is where batches go (the mode's input).
	Out chan<- flow.Batch
	// Exports is the buffer the mode hands exported records to. Set, the
	// input is stateful (Aggregate mode): a record is done once its flow
	// was exported after it and the sinks wrote that export. Nil, a
	// record is done once its batch is written (Proxy mode).
	Exports *ring.Buffer[*flow.Flow]
	// Horizon is how long after its last record a flow's state may still
	// wait for export (Aggregate mode's inactive timeout, and its active
	// timeouts while waiting for the other Node): past it, a flow that
	// exported nothing more no longer holds its partition's commit back.
	Horizon time.Duration
	// CommitInterval is how often offsets are committed; default 1s.
	CommitInterval time.Duration
	// MaxBatch bounds the records of one batch; default 4096.
	MaxBatch int
	Log      *slog.Logger
	// Registry takes the input's series; nil registers none.
	Registry prometheus.Registerer
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Forget, when set, drops from the mode's state, without exporting
	// them, the flows of the given keys (package flowkey): those of
	// partitions this replica lost, which their next owner rebuilds.
	Forget func(ctx context.Context, keys map[string]bool) (int, error)
	// HandOverTimeout bounds what a revoke waits for (batches the mode
	// has not taken yet, the state dropped); default 10s.
	HandOverTimeout time.Duration
}

// Input reads records from Kafka.
type Input struct {
	o   Options
	cl  *kgo.Client
	adm *kadm.Client
	t   *tracker
	m   metrics
	// exports reads the export buffer (stateful only); created in New,
	// before anything is exported, so that its positions count from 0.
	exports *ring.Consumer[*flow.Flow]
	dec     *flowproto.Decoder
	pool    *flow.Pool

	// pending are batches handed to Out, waiting for their Written
	// answer, in order.
	pending chan pendingBatch
	// emitted are exports read and not applied yet (key, position).
	emMu    sync.Mutex
	emitted []emission
	// exportsRead is the export buffer's position readExports has read
	// up to (what it lost included).
	exportsRead atomic.Uint64

	// handed and resolvedN count batches handed on and resolved.
	handed, resolvedN atomic.Uint64
	// building is held by hand from the first record it notes until its
	// batch is counted in handed: a hand-over waits for it, so that the
	// batch being built (records fetched before the partitions left) is
	// taken by the mode before their flows are dropped.
	building chan struct{}

	// maxEmitted is the constant, lowered by tests.
	maxEmitted int

	stopped   chan struct{} // closed when Run's fetching ended
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type pendingBatch struct {
	written <-chan func(context.Context) error
	parts   []*part
	upTo    map[int32]int64
}

// maxEmitted bounds the exports waiting to be applied (about 80 bytes
// each).
const maxEmitted = 1 << 20

// Fetch bounds: what the client buffers from the brokers is at most
// maxConcurrentFetches fetches of fetchMaxBytes each (64 MiB), instead of
// one fetch of 50 MiB per broker. Both are plain fetch settings, valid
// for any Kafka; eight concurrent fetches hold back no cluster of up to
// eight brokers.
const (
	fetchMaxBytes        = 8 << 20
	maxConcurrentFetches = 8
)

type emission struct {
	key string
	pos uint64
}

type metrics struct {
	records, replayed, unknownFields, handedOver, expired prometheus.Counter
	exportsDropped                                        prometheus.Counter
	invalid                                               *prometheus.CounterVec
	commits, commitErrs, fetchErrs                        prometheus.Counter
	partitions, tracked                                   prometheus.GaugeFunc
}

// Reasons a record is refused (the label of
// sluice_kafka_input_records_invalid_total).
const (
	ReasonMalformed = "malformed"     // not a Flow message
	ReasonValue     = "invalid-value" // a value Sluice cannot represent
)

// New makes an input; the client connects when Run runs.
func New(o Options) (*Input, error) {
	if o.Topic == "" || o.Group == "" {
		return nil, errors.New("kafkain: a topic and a group are required")
	}
	if o.Out == nil {
		return nil, errors.New("kafkain: Options.Out is required")
	}
	if o.CommitInterval <= 0 {
		o.CommitInterval = time.Second
	}
	if o.HandOverTimeout <= 0 {
		o.HandOverTimeout = 10 * time.Second
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 4096
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	in := &Input{o: o, dec: flowproto.NewDecoder(), pool: flow.NewPool(),
		pending: make(chan pendingBatch, 256), stopped: make(chan struct{}), maxEmitted: maxEmitted,
		building: make(chan struct{}, 1)}
	in.t = newTracker(o.Exports != nil, o.Horizon, o.Now)
	in.initMetrics()
	in.t.expiredFn = func(n int) { in.m.expired.Add(float64(n)) }
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.MaxConcurrentFetches(maxConcurrentFetches),
		// A group with no commit yet starts at the beginning of what the
		// topic retains: records written before the first replica started
		// are aggregated too.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(in.onAssigned),
		kgo.OnPartitionsRevoked(in.onRevoked),
		kgo.OnPartitionsLost(in.onLost),
	}, o.Client...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkain: %w", err)
	}
	in.cl = cl
	in.adm = kadm.NewClient(cl)
	if o.Exports != nil {
		in.exports = o.Exports.Consumer()
		in.exports.BestEffort() // only reads keys: the sinks are what confirmations wait for
	}
	if o.Registry != nil {
		for _, c := range []prometheus.Collector{in.m.records, in.m.replayed, in.m.unknownFields, in.m.handedOver,
			in.m.expired, in.m.exportsDropped, in.m.invalid, in.m.commits, in.m.commitErrs, in.m.fetchErrs, in.m.partitions, in.m.tracked} {
			if err := o.Registry.Register(c); err != nil {
				cl.Close()
				return nil, fmt.Errorf("kafkain: %w", err)
			}
		}
	}
	return in, nil
}

func (in *Input) initMetrics() {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	in.m = metrics{
		records: c("sluice_kafka_input_records_total", "Records read from Kafka and handed to the mode."),
		replayed: c("sluice_kafka_input_records_replayed_total",
			"Records read again after a partition changed owner that the previous owner had taken already: their contribution may be exported twice."),
		unknownFields: c("sluice_kafka_input_records_unknown_fields_total",
			"Records carrying fields this version does not know (a newer schema): processed, the unknown fields kept."),
		handedOver: c("sluice_kafka_input_flows_handed_over_total",
			"Flows of partitions this replica lost that it dropped unexported: their next owner rebuilds them by replaying the partition."),
		expired: c("sluice_kafka_input_flows_expired_total",
			"Flows whose records stopped holding back the commit because nothing was exported for them within the horizon."),
		exportsDropped: c("sluice_kafka_input_exports_dropped_total",
			"Exports the input dropped unapplied because the sinks were not writing: their flows hold their partitions' commits until the horizon instead."),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_kafka_input_records_invalid_total",
			Help: "Records refused: malformed (not a Flow message) or invalid-value (a value Sluice cannot represent)."}, []string{"reason"}),
		commits:    c("sluice_kafka_input_commits_total", "Offset commits that succeeded."),
		commitErrs: c("sluice_kafka_input_commit_errors_total", "Offset commits that failed (retried at the next interval)."),
		fetchErrs:  c("sluice_kafka_input_fetch_errors_total", "Errors fetching from the brokers (the client retries)."),
	}
	in.m.partitions = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_kafka_input_partitions",
		Help: "Partitions this replica owns."}, func() float64 {
		in.t.mu.Lock()
		defer in.t.mu.Unlock()
		return float64(len(in.t.parts))
	})
	in.m.tracked = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_kafka_input_flows_pending_export",
		Help: "Flows whose records hold back their partition's commit until they are exported."}, func() float64 { return float64(in.t.live()) })
}

// Run reads until ctx ends. The batches it handed on are then still
// followed: call Close once the mode and the sinks have drained, to
// commit what they exported and leave the group.
func (in *Input) Run(ctx context.Context) error {
	in.wg.Go(in.resolve)
	if in.exports != nil {
		in.wg.Go(in.readExports)
	}
	commitCtx, stopCommit := context.WithCancel(context.Background())
	commitDone := make(chan struct{})
	go func() {
		defer close(commitDone)
		tk := time.NewTicker(in.o.CommitInterval)
		defer tk.Stop()
		for {
			select {
			case <-commitCtx.Done():
				return
			case <-tk.C:
				in.commit(commitCtx)
			}
		}
	}()
	defer func() {
		close(in.pending)
		stopCommit()
		<-commitDone
		close(in.stopped)
	}()
	for {
		fs := in.cl.PollRecords(ctx, in.o.MaxBatch)
		if ctx.Err() != nil {
			return nil
		}
		if fs.IsClientClosed() {
			return nil
		}
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			in.m.fetchErrs.Inc()
			in.o.Log.Warn("cannot fetch from Kafka; the client retries", "topic", topic, "partition", p, "err", err)
		})
		if !in.hand(ctx, fs) {
			return nil
		}
	}
}

// hand decodes the records of fs into one batch and hands it on; false
// when ctx ended first.
func (in *Input) hand(ctx context.Context, fs kgo.Fetches) bool {
	select {
	case in.building <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-in.building }()
	var b flow.Batch
	if in.o.Exports != nil {
		b.Pool = in.pool // Aggregate mode copies what it keeps
	}
	var parts []*part
	upTo := map[int32]int64{}
	var key []byte
	fs.EachRecord(func(r *kgo.Record) {
		f := in.pool.Get()
		if f == nil {
			f = new(flow.Flow)
		}
		if err := in.decode(r.Value, f); err != nil {
			in.pool.Put(f)
			in.o.Log.Debug("refused a Kafka record", "partition", r.Partition, "offset", r.Offset, "err", err)
			// A refused record holds no state: it is done.
			in.t.skipped(r.Partition, r.Offset)
			if r.Offset+1 > upTo[r.Partition] {
				upTo[r.Partition] = r.Offset + 1
			}
			return
		}
		key = flowkey.Append(key[:0], f)
		pt, replay, owned := in.t.fetched(string(key), r.Partition, r.Offset)
		if !owned {
			// Revoked since it was fetched: its new owner reads it.
			in.pool.Put(f)
			return
		}
		if replay {
			in.m.replayed.Inc()
		}
		if pt != nil {
			parts = append(parts, pt)
		}
		if r.Offset+1 > upTo[r.Partition] {
			upTo[r.Partition] = r.Offset + 1
		}
		b.Flows = append(b.Flows, f)
	})
	if len(upTo) == 0 {
		return true
	}
	in.m.records.Add(float64(len(b.Flows)))
	written := make(chan func(context.Context) error, 1)
	b.Written = written
	select {
	case in.o.Out <- b:
	case <-ctx.Done():
		b.Release()
		// The parts it made are never resolved: their partitions' commits
		// stay before them, so the next owner reads them.
		return false
	}
	in.handed.Add(1)
	in.pending <- pendingBatch{written: written, parts: parts, upTo: upTo}
	return true
}

// decode fills f from a record's value and counts what it refuses or
// finds newer than this version.
func (in *Input) decode(v []byte, f *flow.Flow) error {
	unknown, reason, err := decodeValue(in.dec, v, f)
	if err != nil {
		in.m.invalid.WithLabelValues(reason).Inc()
		return err
	}
	if unknown > 0 {
		in.m.unknownFields.Inc()
	}
	return nil
}

// decodeValue fills f, which must be zero, from a record's value: the
// Flow message, or its JSON mapping (kafka.format json). It returns the
// number of unknown fields (a newer schema's, kept in f.ProtoUnknown for
// Protobuf), or the reason (ReasonMalformed, ReasonValue) and the error
// of a value it refuses.
func decodeValue(dec *flowproto.Decoder, v []byte, f *flow.Flow) (unknown int, reason string, err error) {
	if len(v) > 0 && v[0] == '{' {
		var p flowpb.Flow
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(v, &p); err != nil {
			return 0, ReasonMalformed, fmt.Errorf("%w: %w", flowproto.ErrMalformed, err)
		}
		unknown, err = flowproto.ToFlow(&p, f)
	} else {
		unknown, err = dec.Decode(v, f)
	}
	switch {
	case errors.Is(err, flowproto.ErrMalformed):
		return 0, ReasonMalformed, err
	case err != nil:
		return 0, ReasonValue, err
	}
	return unknown, "", nil
}

// resolve follows the batches handed on, in order: once the mode took
// one (and, in Proxy mode, the sinks wrote it), its records are resolved.
func (in *Input) resolve() {
	for pb := range in.pending {
		wait := <-pb.written
		_ = wait(context.Background())
		var pos uint64
		if in.o.Exports != nil {
			pos = in.o.Exports.Produced()
		}
		in.t.resolved(pb.parts, pos, pb.upTo)
		in.resolvedN.Add(1)
	}
}

// readExports reads the export buffer and keeps each export's flow key
// and position, until the buffer closes.
func (in *Input) readExports() {
	var buf []*flow.Flow
	var read uint64
	var key []byte
	for {
		var ok bool
		buf, ok = in.exports.Next(context.Background(), buf[:0], 1024)
		if !ok {
			in.exports.Close()
			return
		}
		base := read + in.exports.Lost
		ems := make([]emission, 0, len(buf))
		for i, f := range buf {
			key = flowkey.Append(key[:0], f)
			ems = append(ems, emission{key: string(key), pos: base + uint64(i)})
			// A correlated inter-Node from-external flow was built from
			// records keyed on the SNAT endpoint.
			var ok bool
			if key, ok = flowkey.AppendSNAT(key[:0], f); ok && string(key) != ems[len(ems)-1].key {
				ems = append(ems, emission{key: string(key), pos: base + uint64(i)})
			}
		}
		read += uint64(len(buf))
		// The keys are copies: the buffer may reuse the records.
		in.exports.Release(0)
		clear(buf)
		in.emMu.Lock()
		in.exportsRead.Store(base + uint64(len(buf)))
		in.emitted = append(in.emitted, ems...)
		if n := len(in.emitted) - in.maxEmitted; n > 0 {
			// The sinks are not writing: forget the oldest exports. Their
			// flows then hold their partitions' commits back until the
			// horizon (more replay after a failover, never a loss).
			in.emitted = append(in.emitted[:0], in.emitted[n:]...)
			in.m.exportsDropped.Add(float64(n))
		}
		in.emMu.Unlock()
	}
}

// commit applies the exports the sinks wrote, forgets the parts past
// their horizon, and commits what may be.
func (in *Input) commit(ctx context.Context) {
	if in.o.Exports != nil {
		// The cut is taken before reading the buffer's head: whatever the
		// store exported for a flow whose last record was taken before
		// cut-horizon is then before that head, and the wait below covers
		// it, whatever its key (and whether readExports saw it yet).
		cut := in.o.Now().Add(-in.o.Horizon)
		head := in.o.Exports.Produced()
		in.emMu.Lock()
		ems := in.emitted
		in.emitted = nil
		in.emMu.Unlock()
		if len(ems) > 0 {
			head = max(head, ems[len(ems)-1].pos+1)
		}
		if head > 0 {
			// The exports count once the sinks wrote them.
			wctx, cancel := context.WithTimeout(ctx, 10*in.o.CommitInterval)
			err := in.o.Exports.WaitWritten(wctx, head)
			cancel()
			if err != nil {
				in.emMu.Lock()
				in.emitted = append(ems, in.emitted...)
				in.emMu.Unlock()
				return
			}
		}
		for _, e := range ems {
			in.t.exported(e.key, e.pos)
		}
		in.t.expire(cut)
	}
	in.commitOffsets(ctx, in.t.commitable())
}

// commitOffsets commits offsets (partition → offset, and the next offset
// fetched, kept in the commit's metadata for the next owner).
func (in *Input) commitOffsets(ctx context.Context, offs map[int32][2]int64) {
	if len(offs) == 0 {
		return
	}
	unc := map[string]map[int32]kgo.EpochOffset{in.o.Topic: {}}
	for p, o := range offs {
		unc[in.o.Topic][p] = kgo.EpochOffset{Epoch: -1, Offset: o[0]}
	}
	cctx := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			for j := range req.Topics[i].Partitions {
				p := &req.Topics[i].Partitions[j]
				if o, ok := offs[p.Partition]; ok {
					md := strconv.FormatInt(o[1], 10)
					p.Metadata = &md
				}
			}
		}
		return nil
	})
	in.cl.CommitOffsetsSync(cctx, unc, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			in.m.commitErrs.Inc()
			in.o.Log.Warn("cannot commit offsets; retried at the next interval", "err", err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					in.m.commitErrs.Inc()
					continue
				}
				in.t.committedAt(p.Partition, offs[p.Partition][0], offs[p.Partition][1])
				in.m.commits.Inc()
			}
		}
	})
}

func (in *Input) onAssigned(ctx context.Context, _ *kgo.Client, assigned map[string][]int32) {
	ps := assigned[in.o.Topic]
	if len(ps) == 0 {
		return
	}
	resp, err := in.adm.FetchOffsets(ctx, in.o.Group)
	if err != nil {
		in.o.Log.Warn("cannot read the group's committed offsets; replays will not be counted", "err", err)
	}
	for _, p := range ps {
		c, r := int64(-1), int64(-1)
		if o, ok := resp.Lookup(in.o.Topic, p); ok && o.Err == nil {
			c = o.At
			if n, err := strconv.ParseInt(o.Metadata, 10, 64); err == nil {
				r = n
			}
		}
		in.t.assign(p, c, r)
	}
	in.o.Log.Info("Kafka partitions assigned", "topic", in.o.Topic, "partitions", ps)
}

// onRevoked hands partitions over: it commits what is safe for them
// (so that their next owner replays as little as possible), stops taking
// their records, waits until the mode took what was handed on, and drops
// the state their records built that is not exported yet. Their next
// owner rebuilds it from the commit on.
func (in *Input) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	if ps := revoked[in.o.Topic]; len(ps) > 0 {
		in.handOver(ctx, ps, true)
	}
}

// onLost is onRevoked without the commit: the session expired, and no
// commit is possible any more.
func (in *Input) onLost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	if ps := lost[in.o.Topic]; len(ps) > 0 {
		in.handOver(ctx, ps, false)
	}
}

func (in *Input) handOver(ctx context.Context, ps []int32, commit bool) {
	in.t.leave(ps)
	ctx, cancel := context.WithTimeout(ctx, in.o.HandOverTimeout)
	defer cancel()
	// Batches already handed on, or being built, may hold records of ps:
	// the mode must have taken them before their flows are dropped.
	select {
	case in.building <- struct{}{}:
		<-in.building
	case <-ctx.Done():
	}
	target := in.handed.Load()
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for in.resolvedN.Load() < target && ctx.Err() == nil {
		select {
		case <-tk.C:
		case <-ctx.Done():
		}
	}
	if in.o.Exports != nil {
		// What the store exported by now must be read for the commit
		// below to apply it: a flow exported and not applied would be
		// dropped as pending, and exported again by the next owner.
		head := in.o.Exports.Produced()
		for in.exportsRead.Load() < head && ctx.Err() == nil {
			select {
			case <-tk.C:
			case <-ctx.Done():
			}
		}
	}
	if commit {
		in.commit(ctx)
	}
	keys := in.t.revoke(ps)
	dropped := 0
	if in.o.Forget != nil && len(keys) > 0 {
		n, err := in.o.Forget(ctx, keys)
		if err != nil {
			in.o.Log.Warn("cannot drop the state of partitions handed over; this replica will export it too (a duplicate)", "err", err)
		}
		dropped = n
	}
	in.m.handedOver.Add(float64(dropped))
	how := "revoked"
	if !commit {
		how = "lost"
	}
	in.o.Log.Info("Kafka partitions "+how, "topic", in.o.Topic, "partitions", ps, "flows_pending", len(keys), "flows_dropped", dropped)
}

// Close waits for what Run handed on to be resolved and exported (call
// it once the mode and the sinks drained), commits, and leaves the group.
// ctx bounds the wait.
func (in *Input) Close(ctx context.Context) {
	in.closeOnce.Do(func() { in.close(ctx) })
}

func (in *Input) close(ctx context.Context) {
	select {
	case <-in.stopped:
		done := make(chan struct{})
		go func() { in.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
		}
		in.commit(ctx)
	default: // Run never ran
		if in.exports != nil {
			in.exports.Close()
		}
	}
	in.cl.Close() // leaves the group
}
