package attribution

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync/atomic"
	"time"

	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/pipeline"
)

// Source yields the cluster's objects, as `sluice traceflow` reads them.
type Source func(ctx context.Context) ([]cluster.Object, error)

// FileSource reads a `kubectl get -o yaml` file or directory: the
// exporter's --inventory, whose Pods and Nodes name connections too.
func FileSource(path string) Source {
	return func(ctx context.Context) ([]cluster.Object, error) { return cluster.ReadPath(ctx, path) }
}

// WatchSource is the live cluster as w follows it with informers (Pods,
// Services, Nodes, NetworkPolicies, Antrea's policies, groups and
// Egresses): the informers' caches, with no request to the API server.
// Run w, and the Loader with Follow(ctx, w.Changed(), …).
func WatchSource(w *kube.Watcher) Source {
	return func(context.Context) ([]cluster.Object, error) {
		objs, probs, err := w.Objects()
		if err != nil {
			return nil, err
		}
		if err := probs.Err(); err != nil {
			return nil, err
		}
		return objs, nil
	}
}

// Loader keeps an Attributor's model in step with a Source.
type Loader struct {
	a    *Attributor
	src  Source
	cfg  pipeline.Config
	hash [sha256.Size]byte

	// changes is the source's change count (see TrackChanges); nil when
	// the source is not followed that way.
	changes func() uint64
	// tried is the change count read before the objects of the last load,
	// whatever its outcome: the model holds every change up to it, or the
	// load failed on them (retried at the next change, not at every poll).
	tried atomic.Uint64
	// kick asks Follow for a load now; the channel sent is closed when
	// that load is done.
	kick chan chan struct{}
	// followDone is closed when the running Follow returns.
	followDone atomic.Pointer[chan struct{}]
}

// NewLoader returns a Loader for a (one Loader per Attributor); cfg is
// the agents' configuration (traffic mode, tunnel type, Service CIDRs);
// its Tag is replaced by Tag.
func NewLoader(a *Attributor, src Source, cfg pipeline.Config) *Loader {
	cfg.Tag = Tag
	return &Loader{a: a, src: src, cfg: cfg, kick: make(chan chan struct{})}
}

// TrackChanges gives the Loader its source's change count (a
// kube.Watcher's Changes): counted after the change is readable, never
// decreasing. With it, while Follow runs, the Attributor's CatchUp can
// tell whether the model is behind the source and have Follow load at
// once. Call it before Load and Follow.
func (l *Loader) TrackChanges(changes func() uint64) { l.changes = changes }

// behind reports whether the source changed after the last load began.
func (l *Loader) behind() bool {
	return l.changes != nil && l.changes() != l.tried.Load()
}

// Load reads the source once and, when its objects changed, builds the
// model and gives it to the Attributor (a new generation). On error the
// previous model stays in use.
func (l *Loader) Load(ctx context.Context) (changed bool, err error) {
	if l.changes != nil {
		// Read before the objects: what changes after is not in this
		// load. Stored after it, so that a CatchUp meanwhile waits.
		seen := l.changes()
		defer l.tried.Store(seen)
	}
	objs, err := l.src(ctx)
	if err != nil {
		l.a.loadErrors.Add(1)
		return false, fmt.Errorf("attribution: %w", err)
	}
	h := sha256.New()
	for _, o := range objs {
		h.Write([]byte(o.ID()))
		h.Write([]byte{0})
		h.Write(o.Raw)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if sum == l.hash && l.a.Generation() != 0 {
		return false, nil
	}
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		l.a.loadErrors.Add(1)
		return false, fmt.Errorf("attribution: %w", err)
	}
	m, _, err := pipeline.Build(ctx, st, l.cfg)
	if err != nil {
		l.a.loadErrors.Add(1)
		return false, fmt.Errorf("attribution: the datapath model: %w", err)
	}
	l.hash = sum
	l.a.SetModel(m)
	l.a.o.Log.Info("policy attribution model loaded", "generation", l.a.Generation(), "pods", len(st.Pods),
		"network_policies", len(st.NetworkPolicies), "antrea_policies", len(st.AntreaPolicies), "egresses", len(st.Egresses))
	return true, nil
}

// Run reloads every interval until ctx ends; failures are logged and the
// previous model stays in use.
func (l *Loader) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := l.Load(ctx); err != nil && ctx.Err() == nil {
			l.a.o.Log.Warn("cannot reload the policy attribution model; keeping the previous one", "err", err)
		}
	}
}

// Follow loads at each signal of changed (a kube.Watcher's Changed), at
// most once per minInterval (changes meanwhile are loaded together), and
// at once when the Attributor's CatchUp asks, until ctx ends; failures are
// logged (a warning while the cluster state is not listed yet is logged
// once) and the previous model stays in use. A load whose objects did not
// change starts no generation. CatchUp asks the Loader whose Follow
// started last, while it runs.
func (l *Loader) Follow(ctx context.Context, changed <-chan struct{}, minInterval time.Duration) {
	done := make(chan struct{})
	l.followDone.Store(&done)
	l.a.loader.Store(l)
	defer close(done) // after the Attributor forgets l: a CatchUp that still asks returns
	defer l.a.loader.CompareAndSwap(l, nil)
	var last time.Time
	lastErr := ""
	pending := false // a change signal was taken without loading it
	for {
		var asked chan struct{} // a CatchUp waiting for this load
		if !pending {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case asked = <-l.kick:
			}
		}
		pending = false
		if wait := minInterval - time.Since(last); wait > 0 && asked == nil {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case asked = <-l.kick:
				t.Stop()
			}
		}
		last = time.Now()
		var err error
		if asked == nil || l.behind() { // a load since the ask may have caught up already
			_, err = l.Load(ctx)
		}
		if asked != nil {
			close(asked)
			// The signal of a change this load took in is no reason for
			// another load. Taken first, then the count checked: a change
			// counted after the load began is loaded at the next turn,
			// its signal taken or not.
			select {
			case <-changed:
				pending = l.behind()
			default:
			}
		}
		switch {
		case err != nil && ctx.Err() == nil && err.Error() != lastErr:
			l.a.o.Log.Warn("cannot load the policy attribution model; keeping the previous one", "err", err)
			lastErr = err.Error()
		case err == nil && lastErr != "":
			lastErr = ""
		}
	}
}

// catchUp has Follow load at once and waits for that load, at most
// until ctx ends. It reports whether the load finished in time.
func (l *Loader) catchUp(ctx context.Context) bool {
	done := *l.followDone.Load() // set before Follow published l
	ch := make(chan struct{})
	select {
	case l.kick <- ch:
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}
