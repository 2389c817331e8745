package attribution

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/traceflow/cluster"
	"sluice/traceflow/pipeline"
)

func fixture(t *testing.T, overlays ...string) Source {
	t.Helper()
	return func(ctx context.Context) ([]cluster.Object, error) {
		objs, err := cluster.ReadPath(ctx, "../../traceflow/testdata/cluster")
		if err != nil {
			return nil, err
		}
		for _, o := range overlays {
			top, err := cluster.ReadPath(ctx, "../../traceflow/testdata/overlays/"+o)
			if err != nil {
				return nil, err
			}
			objs = cluster.Overlay(objs, top)
		}
		return objs, nil
	}
}

func key(src, dst string, port uint16) Key {
	return Key{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: 6, DstPort: port}
}

// TestVerdicts: verdicts in the records' terms, cached, bounded, and
// recomputed under a new generation; concurrent use is safe.
func TestVerdicts(t *testing.T) {
	ctx := context.Background()
	a := New(Options{MaxEntries: 2})
	if v := a.Verdict(ctx, key("10.10.1.5", "10.10.1.6", 80)); v != nil || a.Generation() != 0 {
		t.Fatalf("a verdict without a model: %+v", v)
	}
	l := NewLoader(a, fixture(t, "antrea-deny.yaml"), pipeline.DefaultConfig())
	if changed, err := l.Load(ctx); err != nil || !changed {
		t.Fatalf("load: %v %v", changed, err)
	}
	v := a.Verdict(ctx, key("10.10.1.5", "10.10.1.6", 80))
	want := flow.Policy{Type: PolicyTypeAntreaCNP, Name: "protect-web", RuleName: "drop-from-client", RuleAction: flow.ActionDrop}
	if v == nil || !v.Denied || v.Ingress != want || v.Egress != (flow.Policy{}) || v.Gen != 1 {
		t.Fatalf("verdict %+v, want denied by %+v", v, want)
	}
	if again := a.Verdict(ctx, key("10.10.1.5", "10.10.1.6", 80)); again != v {
		t.Error("the second lookup was not the cached verdict")
	}
	// An address the model does not know: an empty verdict, cached.
	if v := a.Verdict(ctx, key("1.2.3.4", "5.6.7.8", 80)); v == nil || v.Denied || v.Ingress.RuleAction != 0 {
		t.Errorf("unmodelled: %+v", v)
	}
	a.Verdict(ctx, key("10.10.1.5", "10.10.2.7", 5432))
	st := a.Stats()
	if st.Entries != 2 || st.Evicted != 1 || st.Hits != 1 || st.Computed != 2 {
		t.Errorf("stats %+v", st)
	}
	// A new state: generation 2, verdicts asked again.
	l2 := NewLoader(a, fixture(t, "k8s-ingress-isolate.yaml"), pipeline.DefaultConfig())
	if _, err := l2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	v = a.Verdict(ctx, key("10.10.1.5", "10.10.2.7", 5432))
	if v.Gen != 2 || !v.Denied || v.Ingress.Name != "db-deny-all" || v.Ingress.Type != PolicyTypeK8s || v.Egress.RuleAction != 0 {
		t.Errorf("after the change: %+v", v)
	}
	// A state the model cannot use leaves the last one in place.
	bad := NewLoader(a, func(context.Context) ([]cluster.Object, error) {
		return cluster.ParseObjects([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec: {nodeName: nowhere}\nstatus: {podIP: 10.0.0.5}\n"), "bad.yaml")
	}, pipeline.DefaultConfig())
	if _, err := bad.Load(ctx); err == nil || a.Generation() != 2 {
		t.Errorf("a Pod on a Node not in the state: err %v, generation %d", err, a.Generation())
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 20 {
				a.Verdict(ctx, key("10.10.1.5", "10.10.2.7", uint16(5000+i*20+j%3)))
			}
		})
	}
	wg.Go(func() { _, _ = l.Load(ctx) })
	wg.Wait()
	if st := a.Stats(); st.Entries > 2 {
		t.Errorf("%d entries in a cache of 2", st.Entries)
	}
}

// TestFollow: the Loader loads at each change signal, starts a generation
// only when the objects changed, counts failed loads and keeps the model
// they would have replaced.
func TestFollow(t *testing.T) {
	base, isolate := fixture(t), fixture(t, "k8s-ingress-isolate.yaml")
	failing := Source(func(context.Context) ([]cluster.Object, error) { return nil, errors.New("listing pods: forbidden") })
	var cur atomic.Pointer[Source]
	var calls atomic.Int64
	set := func(s Source) { cur.Store(&s) }
	set(base)
	src := func(ctx context.Context) ([]cluster.Object, error) {
		s := *cur.Load() // before the count: a counted call read this source
		calls.Add(1)
		return s(ctx)
	}
	a := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l := NewLoader(a, src, pipeline.DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { l.Follow(ctx, changed, time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()

	k := key("10.10.1.5", "10.10.2.7", 5432)
	changed <- struct{}{}
	testkit.WaitFor(t, "the first model", func() bool { return a.Generation() == 1 })
	if v := a.Verdict(ctx, k); v == nil || v.Denied {
		t.Fatalf("client → db without isolation: %+v", v)
	}
	// The same objects: loaded, no generation.
	changed <- struct{}{}
	testkit.WaitFor(t, "the second load", func() bool { return calls.Load() >= 2 })
	// A failing source: counted, the model stays.
	set(failing)
	changed <- struct{}{}
	testkit.WaitFor(t, "the failed load counted", func() bool { return a.Stats().LoadErrors == 1 })
	if g := a.Generation(); g != 1 {
		t.Errorf("generation %d after an unchanged and a failed load, want 1", g)
	}
	// db isolated: a new generation, and the verdict says so.
	set(isolate)
	changed <- struct{}{}
	testkit.WaitFor(t, "the isolating policy's model", func() bool { return a.Generation() == 2 })
	if v := a.Verdict(ctx, k); v == nil || !v.Denied || v.Ingress.Name != "db-deny-all" {
		t.Errorf("client → db with db isolated: %+v", v)
	}
}

// TestCatchUp: with the source's change count tracked, CatchUp has a
// Follow that would wait its whole interval (an hour here) load at once,
// and returns once the new model is in place; with nothing changed it
// asks for nothing; a load that fails is not asked for again until the
// next change; a load slower than the wait is a counted timeout, and
// lands later; without a Follow running, CatchUp does not wait.
func TestCatchUp(t *testing.T) {
	base, isolate := fixture(t), fixture(t, "k8s-ingress-isolate.yaml")
	failing := Source(func(context.Context) ([]cluster.Object, error) { return nil, errors.New("listing pods: forbidden") })
	var cur atomic.Pointer[Source]
	var calls, changes atomic.Uint64
	var gateMu sync.Mutex
	gate := make(chan struct{}) // closed: loads do not block
	close(gate)
	entered := make(chan struct{}, 1)
	set := func(s Source) { cur.Store(&s) }
	set(base)
	src := func(ctx context.Context) ([]cluster.Object, error) {
		gateMu.Lock()
		g := gate
		gateMu.Unlock()
		select {
		case entered <- struct{}{}:
		default:
		}
		<-g
		calls.Add(1)
		return (*cur.Load())(ctx)
	}
	a := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := NewLoader(a, src, pipeline.DefaultConfig())
	l.TrackChanges(changes.Load)

	// Behind, but nothing follows: CatchUp neither waits nor counts.
	changes.Add(1)
	a.CatchUp(ctx, time.Minute)
	if st := a.Stats(); st.CatchUps != 0 || a.Behind() {
		t.Fatalf("CatchUp without a Follow: stats %+v, behind %v", st, a.Behind())
	}

	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { l.Follow(ctx, changed, time.Hour); close(done) }()
	defer func() { cancel(); <-done }()
	changed <- struct{}{} // the first load is not held back by the interval
	// The load is over once its count is kept (after the model is set).
	testkit.WaitFor(t, "the first model, loaded", func() bool { return a.Generation() == 1 && !a.Behind() })
	n := calls.Load()
	a.CatchUp(ctx, time.Hour)
	if calls.Load() != n || a.Stats().CatchUps != 0 {
		t.Fatalf("CatchUp with nothing changed: %d loads (was %d), stats %+v", calls.Load(), n, a.Stats())
	}

	// db isolated. Follow takes the signal and would wait an hour.
	k := key("10.10.1.5", "10.10.2.7", 5432)
	set(isolate)
	changes.Add(1)
	changed <- struct{}{}
	a.CatchUp(ctx, time.Minute)
	if v := a.Verdict(ctx, k); a.Generation() != 2 || v == nil || !v.Denied || v.Ingress.Name != "db-deny-all" {
		t.Fatalf("after CatchUp: generation %d, verdict %+v; want 2, denied by db-deny-all", a.Generation(), v)
	}
	if st := a.Stats(); st.CatchUps != 1 || st.CatchUpTimeouts != 0 {
		t.Errorf("stats %+v, want one catch-up, no timeout", st)
	}
	// Caught up: the next CatchUp asks for nothing.
	n = calls.Load()
	a.CatchUp(ctx, time.Hour)
	if calls.Load() != n || a.Stats().CatchUps != 1 {
		t.Errorf("CatchUp after catching up: %d loads (was %d), stats %+v", calls.Load(), n, a.Stats())
	}

	// A source that fails: one load for the change, not one per CatchUp.
	set(failing)
	changes.Add(1)
	a.CatchUp(ctx, time.Minute)
	a.CatchUp(ctx, time.Minute)
	if st := a.Stats(); calls.Load() != n+1 || st.LoadErrors != 1 || st.CatchUps != 2 || a.Generation() != 2 {
		t.Errorf("a failing source: %d loads (was %d), stats %+v, generation %d; want one failed load", calls.Load(), n, st, a.Generation())
	}

	// A load slower than the wait: a CatchUp that waits long starts it
	// (it is in the source), then one that waits 10 ms times out.
	gateMu.Lock()
	gate = make(chan struct{})
	g := gate
	gateMu.Unlock()
	select {
	case <-entered: // left by an earlier load
	default:
	}
	set(base)
	changes.Add(1)
	long := make(chan struct{})
	go func() { a.CatchUp(ctx, time.Minute); close(long) }()
	<-entered
	a.CatchUp(ctx, 10*time.Millisecond)
	if st := a.Stats(); st.CatchUps != 4 || st.CatchUpTimeouts != 1 || a.Generation() != 2 {
		t.Errorf("a slow load: stats %+v, generation %d; want four catch-ups, one timeout, generation 2", st, a.Generation())
	}
	close(g)
	<-long
	if a.Generation() != 3 || a.Stats().CatchUpTimeouts != 1 {
		t.Errorf("after the slow load: generation %d, stats %+v; want 3, one timeout", a.Generation(), a.Stats())
	}
}

// TestFollowLoadsAChangeMadeDuringACatchUp: a change counted and signalled
// while a load CatchUp asked for runs is loaded afterwards, with no other
// signal or CatchUp, although Follow takes that signal as it drains the
// ones the load made redundant.
func TestFollowLoadsAChangeMadeDuringACatchUp(t *testing.T) {
	base, isolate := fixture(t), fixture(t, "k8s-ingress-isolate.yaml")
	var cur atomic.Pointer[Source]
	var changes atomic.Uint64
	set := func(s Source) { cur.Store(&s) }
	set(base)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	var gated atomic.Bool
	src := func(ctx context.Context) ([]cluster.Object, error) {
		s := *cur.Load() // the objects as they are when the load reads them
		if gated.Load() {
			entered <- struct{}{}
			<-gate
		}
		return s(ctx)
	}
	a := New(Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l := NewLoader(a, src, pipeline.DefaultConfig())
	l.TrackChanges(changes.Load)
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { l.Follow(ctx, changed, time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	changed <- struct{}{}
	testkit.WaitFor(t, "the first model, loaded", func() bool { return a.Generation() == 1 && !a.Behind() })

	gated.Store(true)
	changes.Add(1) // a change with no content: the catch-up's
	long := make(chan struct{})
	go func() { a.CatchUp(ctx, time.Minute); close(long) }()
	<-entered
	gated.Store(false)
	set(isolate) // during the load, after it read the count
	changes.Add(1)
	changed <- struct{}{}
	close(gate)
	<-long
	testkit.WaitFor(t, "the change made during the catch-up loaded", func() bool { return a.Generation() == 2 && !a.Behind() })
	if v := a.Verdict(ctx, key("10.10.1.5", "10.10.2.7", 5432)); v == nil || !v.Denied {
		t.Errorf("client → db after the change: %+v, want denied", v)
	}
}
