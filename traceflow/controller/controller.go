// Package controller answers Traceflow objects of Sluice's own API group
// (traceflows.sluice.io, v1alpha1, the fields of Antrea's
// crd.antrea.io/v1beta1 Traceflow): it watches them, traces each new one on
// the datapath model of the cluster, exactly as `sluice traceflow
// --kubeconfig` does (package traceflow/modelrun), writes the result into
// its status, and deletes finished ones after a configured time.
//
// A request the reference's admission webhook refuses (no source Pod, a
// source Pod that does not exist, a hostNetwork source, neither source nor
// destination Pod) cannot be refused here, since there is no webhook: it
// becomes Failed with the webhook's message as the reason.
//
// Work is bounded: a queue of at most QueueSize names (a name that does not
// fit is counted and picked up again by the next sweep), one trace at a
// time, and every pending object read from the informer's cache. The
// cluster state a trace runs on comes from Options.Objects (in the
// aggregator, one kube.Watcher's caches) or, without it, from one full
// list of the cluster per trace.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/tracer"
)

// The API of Sluice's Traceflow.
const (
	Group      = "sluice.io"
	Version    = "v1alpha1"
	Resource   = "traceflows"
	APIVersion = Group + "/" + Version
	// CRDName is the CustomResourceDefinition's name.
	CRDName = Resource + "." + Group
)

// GVR is the Traceflow resource.
func GVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}
}

// Defaults of Options.
const (
	DefaultQueueSize = 1024
	// DefaultMaxAttempts is how often reading the cluster state may fail
	// for one Traceflow before it is marked Failed.
	DefaultMaxAttempts = 5
	// maxSweep is the longest time between two sweeps.
	maxSweep = 10 * time.Second
	minSweep = 100 * time.Millisecond
	// stateTimeout bounds one read of the cluster state.
	stateTimeout = time.Minute
)

// Options configure a Controller. Settings and Log are required.
type Options struct {
	// Settings are the model's settings, as the CLI's flags.
	Settings modelrun.Settings
	// DeleteAfter: a finished Traceflow is deleted this long after its
	// status.startTime (or its creation when it has none); 0 keeps them.
	DeleteAfter time.Duration
	// QueueSize caps the work queue; DefaultQueueSize if 0.
	QueueSize int
	// MaxAttempts bounds the failed reads of the cluster state for one
	// Traceflow; DefaultMaxAttempts if 0.
	MaxAttempts int
	// Sweep is the time between sweeps, which re-queue pending Traceflows
	// (after a drop or an error) and delete expired ones; by default a
	// quarter of DeleteAfter, between 100 ms and 10 s.
	Sweep time.Duration
	// Registerer takes the metrics; none are registered if nil.
	Registerer prometheus.Registerer
	Log        *slog.Logger
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// Objects reads the cluster state for one trace. If nil, each trace
	// lists the whole cluster through the clients (kube.Load), bounded by
	// a minute, and a failed read is retried (MaxAttempts). The aggregator
	// passes a kube.Watcher's WaitObjects, given the Traceflow's own
	// timeout (spec.timeout, 20 s when unset) to wait for the watch's
	// first lists; a wait that ends with kube.ErrNotSynced makes the
	// Traceflow Failed at once, with the reason, rather than traced over
	// a partial state.
	Objects func(ctx context.Context) ([]cluster.Object, cluster.Problems, error)
}

// Controller is a configured Traceflow controller; Run it once.
type Controller struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	opts   Options
	log    *slog.Logger
	m      metrics
	q      *queue

	mu       sync.Mutex
	attempts map[string]int // failed reads of the state, by name
	// answered holds, by name, the resourceVersion whose status was
	// written, so that a cache not yet updated does not trace it again.
	answered map[string]string

	sweepCount atomic.Int64 // finished sweeps, for tests
}

// sweeps is how many sweeps have finished.
func (c *Controller) sweeps() int64 { return c.sweepCount.Load() }

type metrics struct {
	traced   *prometheus.CounterVec // by phase
	errors   *prometheus.CounterVec // by operation
	deleted  prometheus.Counter
	dropped  prometheus.Counter
	queueLen prometheus.GaugeFunc
}

// New checks the options and registers the metrics.
func New(client kubernetes.Interface, dyn dynamic.Interface, opts Options) (*Controller, error) {
	if _, err := opts.Settings.Config(crd.FirstTraceflowTag); err != nil {
		return nil, err
	}
	if opts.DeleteAfter < 0 {
		return nil, fmt.Errorf("traceflow controller: DeleteAfter %s is negative", opts.DeleteAfter)
	}
	if opts.QueueSize <= 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.Sweep <= 0 {
		opts.Sweep = min(max(opts.DeleteAfter/4, minSweep), maxSweep)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Controller{client: client, dyn: dyn, opts: opts, log: opts.Log, q: newQueue(opts.QueueSize),
		attempts: map[string]int{}, answered: map[string]string{}}
	c.m = metrics{
		traced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_traceflow_traced_total",
			Help: "Traceflow objects traced, by the phase written (Succeeded, Failed)."}, []string{"phase"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_traceflow_errors_total",
			Help: "Failed API requests of the Traceflow controller, by operation (state, status, delete)."}, []string{"op"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_traceflow_deleted_total",
			Help: "Finished Traceflow objects deleted after sluice.traceflow.deleteAfter."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_traceflow_queue_dropped_total",
			Help: "Traceflow names not queued because the queue was full (the next sweep queues them again)."}),
		queueLen: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_traceflow_queue_length",
			Help: "Traceflow names waiting to be traced."}, func() float64 { return float64(c.q.len()) }),
	}
	if opts.Registerer != nil {
		for _, col := range []prometheus.Collector{c.m.traced, c.m.errors, c.m.deleted, c.m.dropped, c.m.queueLen} {
			if err := opts.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("traceflow controller metrics: %w", err)
			}
		}
	}
	for _, p := range []string{string(crd.PhaseSucceeded), string(crd.PhaseFailed)} {
		c.m.traced.WithLabelValues(p)
	}
	for _, op := range []string{"state", "status", "delete"} {
		c.m.errors.WithLabelValues(op)
	}
	return c, nil
}

// Errors of Check that no retry can fix.
var (
	ErrNotServed = errors.New("the API server does not serve " + CRDName + ": install its CustomResourceDefinition (deploy/sluice.yaml or the chart)")
	ErrForbidden = errors.New("the Traceflow controller needs get, list, watch and delete on " + CRDName + " and update on " + Resource + "/status")
)

// Check asks the API server once for Traceflows, so that a missing CRD
// (ErrNotServed) or a missing permission (ErrForbidden) is an error at
// start-up rather than a log line repeated for ever. Other errors (an API
// server out of reach) are worth a warning only: Run keeps retrying.
func (c *Controller) Check(ctx context.Context) error {
	_, err := c.dyn.Resource(GVR()).List(ctx, metav1.ListOptions{Limit: 1})
	switch {
	case apierrors.IsNotFound(err):
		return ErrNotServed
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: %v", ErrForbidden, err)
	case err != nil:
		return fmt.Errorf("listing %s: %w", CRDName, err)
	}
	return nil
}

// Run watches Traceflows and answers them until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	inf := dynamicinformer.NewFilteredDynamicInformer(c.dyn, GVR(), metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	enqueue := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok && pending(u) {
			c.enqueue(u.GetName())
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return fmt.Errorf("traceflow controller: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.Run(ctx.Done()) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	c.log.InfoContext(ctx, "traceflow controller: watching", "resource", CRDName,
		"deleteAfter", c.opts.DeleteAfter.String(), "queueSize", c.opts.QueueSize)
	wg.Go(func() { c.sweepLoop(ctx, inf.GetStore()) })
	for {
		name, ok := c.q.get(ctx)
		if !ok {
			return nil
		}
		c.process(ctx, inf.GetStore(), name)
		c.q.done(name)
	}
}

func (c *Controller) enqueue(name string) {
	if !c.q.add(name) {
		c.m.dropped.Inc()
	}
}

// pending reports whether u has not been answered yet.
func pending(u *unstructured.Unstructured) bool {
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	return phase == "" && u.GetDeletionTimestamp() == nil
}

// sweepLoop re-queues pending Traceflows and deletes expired ones every
// Sweep.
func (c *Controller) sweepLoop(ctx context.Context, store cache.Store) {
	t := time.NewTicker(c.opts.Sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.sweep(ctx, store)
	}
}

func (c *Controller) sweep(ctx context.Context, store cache.Store) {
	now := c.opts.Now()
	live := map[string]bool{}
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		live[u.GetName()] = true
		if pending(u) {
			c.enqueue(u.GetName())
			continue
		}
		if c.opts.DeleteAfter == 0 || u.GetDeletionTimestamp() != nil {
			continue
		}
		if start := startOf(u); now.Before(start.Add(c.opts.DeleteAfter)) {
			continue
		}
		uid := u.GetUID()
		err := c.dyn.Resource(GVR()).Delete(ctx, u.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			c.m.deleted.Inc()
			c.log.DebugContext(ctx, "traceflow controller: deleted a finished Traceflow", "name", u.GetName())
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || ctx.Err() != nil:
		default:
			c.m.errors.WithLabelValues("delete").Inc()
			c.log.WarnContext(ctx, "traceflow controller: cannot delete a finished Traceflow", "name", u.GetName(), "err", err)
		}
	}
	c.mu.Lock()
	for name := range c.attempts {
		if !live[name] {
			delete(c.attempts, name)
		}
	}
	for name := range c.answered {
		if !live[name] {
			delete(c.answered, name)
		}
	}
	c.mu.Unlock()
	c.sweepCount.Add(1)
}

// startOf is when a finished Traceflow started: status.startTime, or its
// creation when the status has none.
func startOf(u *unstructured.Unstructured) time.Time {
	if s, ok, _ := unstructured.NestedString(u.Object, "status", "startTime"); ok {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			return t
		}
	}
	return u.GetCreationTimestamp().Time
}

// process traces the Traceflow name if it is still pending and writes its
// status.
func (c *Controller) process(ctx context.Context, store cache.Store, name string) {
	obj, ok, err := store.GetByKey(name)
	if err != nil || !ok {
		return
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || !pending(u) {
		return
	}
	c.mu.Lock()
	rv, done := c.answered[name]
	stale := done && rv == u.GetResourceVersion()
	c.mu.Unlock()
	if stale {
		return
	}
	tf, err := decode(u)
	var status crd.TraceflowStatus
	if err != nil {
		status = c.failed(fmt.Sprintf("the Traceflow cannot be read: %v", err))
	} else if status, err = c.trace(ctx, tf); err != nil {
		if ctx.Err() != nil {
			return
		}
		c.m.errors.WithLabelValues("state").Inc()
		c.mu.Lock()
		c.attempts[name]++
		n := c.attempts[name]
		c.mu.Unlock()
		if n < c.opts.MaxAttempts {
			c.log.WarnContext(ctx, "traceflow controller: cannot read the cluster state; the next sweep retries",
				"name", name, "attempt", n, "err", err)
			return
		}
		status = c.failed(err.Error())
	}
	c.mu.Lock()
	delete(c.attempts, name)
	c.mu.Unlock()
	if err := c.writeStatus(ctx, u, status); err != nil {
		if ctx.Err() != nil {
			return
		}
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			// Deleted, or changed since the cache saw it: the watch brings
			// the new version, which is queued if still pending.
			return
		}
		c.m.errors.WithLabelValues("status").Inc()
		c.log.WarnContext(ctx, "traceflow controller: cannot write the status; the next sweep retries", "name", name, "err", err)
		return
	}
	c.mu.Lock()
	c.answered[name] = u.GetResourceVersion()
	c.mu.Unlock()
	c.m.traced.WithLabelValues(string(status.Phase)).Inc()
	c.log.InfoContext(ctx, "traceflow controller: traced", "name", name, "phase", status.Phase,
		"reason", status.Reason, "nodes", len(status.Results))
}

// trace reads the cluster state and traces tf over its model, as the CLI
// does. A request the model cannot take gives a Failed status; an error is
// returned only when the state cannot be read.
func (c *Controller) trace(ctx context.Context, tf *crd.Traceflow) (crd.TraceflowStatus, error) {
	objs, probs, err := c.state(ctx, tf)
	switch {
	case err != nil && ctx.Err() != nil:
		return crd.TraceflowStatus{}, err
	case errors.Is(err, kube.ErrNotSynced):
		// Retrying would hold the queue for another timeout while the
		// requester waits on a Traceflow of its own timeout.
		return c.failed(fmt.Sprintf("the cluster state is not ready (waited %s, the Traceflow's timeout): %v", waitFor(tf), err)), nil
	case err != nil:
		return crd.TraceflowStatus{}, fmt.Errorf("reading the cluster state: %w", err)
	}
	tr, more, err := modelrun.Trace(ctx, objs, c.opts.Settings, tf, tracer.Options{Now: c.opts.Now})
	c.logProblems(ctx, tf.Name, append(probs, more...))
	var ae *tracer.AdmissionError
	switch {
	case errors.As(err, &ae):
		return c.failed(ae.Msg), nil
	case err != nil && ctx.Err() != nil:
		return crd.TraceflowStatus{}, err
	case err != nil:
		return c.failed(err.Error()), nil
	}
	return tr.Traceflow.Status, nil
}

// state reads the cluster state for tf: from Options.Objects, waiting at
// most tf's timeout, or a whole list bounded as the CLI's default
// --request-timeout.
func (c *Controller) state(ctx context.Context, tf *crd.Traceflow) ([]cluster.Object, cluster.Problems, error) {
	if c.opts.Objects != nil {
		wctx, cancel := context.WithTimeout(ctx, waitFor(tf))
		defer cancel()
		return c.opts.Objects(wctx)
	}
	lctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	return kube.Load(lctx, c.client, c.dyn, kube.Options{})
}

// waitFor is tf's timeout: spec.timeout seconds, the reference's default
// when unset.
func waitFor(tf *crd.Traceflow) time.Duration {
	s := tf.Spec.Timeout
	if s <= 0 {
		s = crd.DefaultTraceflowTimeout
	}
	return time.Duration(s) * time.Second
}

func (c *Controller) logProblems(ctx context.Context, name string, probs cluster.Problems) {
	for _, p := range probs {
		c.log.DebugContext(ctx, "traceflow controller: cluster state", "name", name, "problem", p.String())
	}
}

// failed is a Failed status with reason, started now.
func (c *Controller) failed(reason string) crd.TraceflowStatus {
	start := metav1.NewTime(c.opts.Now().Truncate(time.Second))
	return crd.TraceflowStatus{Phase: crd.PhaseFailed, Reason: reason, StartTime: &start}
}

// decode reads a Traceflow's spec and metadata.
func decode(u *unstructured.Unstructured) (*crd.Traceflow, error) {
	b, err := u.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var tf crd.Traceflow
	if err := json.Unmarshal(b, &tf); err != nil {
		return nil, err
	}
	return &tf, nil
}

// writeStatus replaces u's status, failing with a conflict when u changed
// since it was read (another aggregator replica answered it first).
func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, st crd.TraceflowStatus) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	out := u.DeepCopy()
	out.Object["status"] = m
	_, err = c.dyn.Resource(GVR()).UpdateStatus(ctx, out, metav1.UpdateOptions{})
	return err
}
