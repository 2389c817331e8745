package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"sluice/internal/testkit"
	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/tracer"
)

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// fixture reads the model's test cluster and the typed fakes holding it.
func fixture(t *testing.T) ([]cluster.Object, *fake.Clientset) {
	t.Helper()
	objs, err := cluster.ReadPath(context.Background(), "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var typed []runtime.Object
	var kept []cluster.Object
	for _, o := range objs {
		var into runtime.Object
		switch o.Kind {
		case "Node":
			into = &corev1.Node{}
		case "Namespace":
			into = &corev1.Namespace{}
		case "Pod":
			into = &corev1.Pod{}
		case "Service":
			into = &corev1.Service{}
		case "EndpointSlice":
			into = &discoveryv1.EndpointSlice{}
		default:
			continue // Antrea's Egresses: not served here
		}
		if err := json.Unmarshal(o.Raw, into); err != nil {
			t.Fatal(err)
		}
		into.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		typed = append(typed, into)
		kept = append(kept, o)
	}
	return kept, fake.NewClientset(typed...)
}

func traceflowObject(name string, spec crd.TraceflowSpec) *unstructured.Unstructured {
	tf := crd.Traceflow{Spec: spec}
	tf.APIVersion, tf.Kind, tf.Name = APIVersion, crd.KindTraceflow, name
	b, _ := json.Marshal(tf)
	u := &unstructured.Unstructured{}
	_ = u.UnmarshalJSON(b)
	delete(u.Object, "status")
	return u
}

// The controller answers a valid Traceflow with the status modelrun gives
// for the same objects (the CLI's path), an invalid one with the
// reference's reason, and deletes both once DeleteAfter has passed.
func TestController(t *testing.T) {
	objs, client := fixture(t)
	valid := crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "client"},
		Destination: crd.Destination{Namespace: "default", Pod: "db"},
		Packet:      crd.Packet{TransportHeader: crd.TransportHeader{TCP: &crd.TCPHeader{DstPort: 5432}}}}
	invalid := crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "ghost"},
		Destination: crd.Destination{Namespace: "default", Pod: "db"}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR(): "TraceflowList"},
		traceflowObject("valid", valid), traceflowObject("invalid", invalid))
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	reg := prometheus.NewRegistry()
	c, err := New(client, dyn, Options{Settings: modelrun.DefaultSettings(), DeleteAfter: time.Minute,
		Sweep: 20 * time.Millisecond, Registerer: reg, Log: slog.New(slog.DiscardHandler), Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	tfs := dyn.Resource(GVR())
	get := func(name string) *crd.Traceflow {
		u, err := tfs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		b, _ := u.MarshalJSON()
		var tf crd.Traceflow
		if err := json.Unmarshal(b, &tf); err != nil {
			t.Fatal(err)
		}
		return &tf
	}
	testkit.WaitFor(t, "both answered", func() bool {
		v, i := get("valid"), get("invalid")
		return v != nil && v.Status.Phase != "" && i != nil && i.Status.Phase != ""
	})
	want, _, err := modelrun.Trace(ctx, objs, modelrun.DefaultSettings(), get("valid"), tracer.Options{Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want.Traceflow.Status, get("valid").Status); d != "" {
		t.Errorf("status differs from modelrun's (-want +got):\n%s", d)
	}
	if get("valid").Status.Phase != crd.PhaseSucceeded {
		t.Errorf("valid: phase %s reason %q", get("valid").Status.Phase, get("valid").Status.Reason)
	}
	if st := get("invalid").Status; st.Phase != crd.PhaseFailed || st.Reason != "requested source Pod default/ghost not found" {
		t.Errorf("invalid: phase %s reason %q", st.Phase, st.Reason)
	}
	if got := testutil.ToFloat64(c.m.traced.WithLabelValues("Succeeded")); got != 1 {
		t.Errorf("traced Succeeded = %v", got)
	}
	if got := testutil.ToFloat64(c.m.traced.WithLabelValues("Failed")); got != 1 {
		t.Errorf("traced Failed = %v", got)
	}
	// Not yet due: kept.
	clk.add(59 * time.Second)
	n := c.sweeps()
	testkit.WaitFor(t, "a whole sweep after the clock moved", func() bool { return c.sweeps() >= n+2 })
	if get("valid") == nil || get("invalid") == nil {
		t.Fatal("deleted before DeleteAfter")
	}
	clk.add(2 * time.Second)
	testkit.WaitFor(t, "both deleted", func() bool {
		_, e1 := tfs.Get(ctx, "valid", metav1.GetOptions{})
		_, e2 := tfs.Get(ctx, "invalid", metav1.GetOptions{})
		return apierrors.IsNotFound(e1) && apierrors.IsNotFound(e2)
	})
	testkit.WaitFor(t, "deleted counted", func() bool {
		return testutil.ToFloat64(c.m.deleted) == 2
	})
}

// The queue holds each name once and refuses names beyond its cap.
func TestQueue(t *testing.T) {
	q := newQueue(2)
	for _, n := range []string{"a", "a", "b"} {
		if !q.add(n) {
			t.Fatalf("%s refused within the cap", n)
		}
	}
	if q.add("c") {
		t.Fatal("accepted beyond the cap")
	}
	ctx := context.Background()
	if n, _ := q.get(ctx); n != "a" {
		t.Fatalf("got %q, want a", n)
	}
	if !q.add("a") || q.len() != 1 {
		t.Fatalf("a busy name was queued again (len %d)", q.len())
	}
	q.done("a")
	if !q.add("c") || q.len() != 2 {
		t.Fatalf("len %d after adding c", q.len())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	q.get(ctx)
	q.get(ctx)
	if _, ok := q.get(cctx); ok {
		t.Fatal("get on an empty queue returned with a cancelled context")
	}
}

// runController runs c until the test ends.
func runController(t *testing.T, c *Controller) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ctx
}

// status waits for name's phase and returns its status.
func status(t *testing.T, ctx context.Context, dyn *dynamicfake.FakeDynamicClient, name string) crd.TraceflowStatus {
	t.Helper()
	var tf crd.Traceflow
	testkit.WaitFor(t, name+" answered", func() bool {
		u, err := dyn.Resource(GVR()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		b, _ := u.MarshalJSON()
		tf = crd.Traceflow{}
		return json.Unmarshal(b, &tf) == nil && tf.Status.Phase != ""
	})
	return tf.Status
}

// With Options.Objects, traces read the state from it, not from the
// clients (which hold no Pod here).
func TestControllerObjectsSource(t *testing.T) {
	objs, _ := fixture(t)
	spec := crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "client"},
		Destination: crd.Destination{Namespace: "default", Pod: "db"}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR(): "TraceflowList"}, traceflowObject("tf", spec))
	var calls atomic.Int32
	c, err := New(fake.NewClientset(), dyn, Options{Settings: modelrun.DefaultSettings(), Log: slog.New(slog.DiscardHandler),
		Objects: func(context.Context) ([]cluster.Object, cluster.Problems, error) {
			calls.Add(1)
			return objs, nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, c)
	if st := status(t, ctx, dyn, "tf"); st.Phase != crd.PhaseSucceeded {
		t.Errorf("phase %s reason %q, want Succeeded", st.Phase, st.Reason)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Objects called %d times, want 1", n)
	}
}

// A source whose caches have not synced within the Traceflow's timeout
// (spec.timeout) makes the Traceflow Failed at once, saying so, and is
// not asked again for it.
func TestControllerNotSynced(t *testing.T) {
	spec := crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "client"},
		Destination: crd.Destination{Namespace: "default", Pod: "db"}, Timeout: 1}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{GVR(): "TraceflowList"}, traceflowObject("early", spec))
	var calls atomic.Int32
	waits := make(chan time.Duration, 8)
	c, err := New(fake.NewClientset(), dyn, Options{Settings: modelrun.DefaultSettings(), Log: slog.New(slog.DiscardHandler),
		Sweep: 20 * time.Millisecond,
		Objects: func(ctx context.Context) ([]cluster.Object, cluster.Problems, error) {
			calls.Add(1)
			start := time.Now()
			<-ctx.Done()
			waits <- time.Since(start)
			return nil, nil, fmt.Errorf("%w: waiting for pods", kube.ErrNotSynced)
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := runController(t, c)
	st := status(t, ctx, dyn, "early")
	if st.Phase != crd.PhaseFailed || !strings.Contains(st.Reason, "not ready (waited 1s, the Traceflow's timeout)") ||
		!strings.Contains(st.Reason, "waiting for pods") {
		t.Errorf("phase %s reason %q, want Failed saying the state is not ready", st.Phase, st.Reason)
	}
	if d := <-waits; d < time.Second || d > 30*time.Second {
		t.Errorf("waited %v, want the Traceflow's timeout of 1s", d)
	}
	n := c.sweeps()
	testkit.WaitFor(t, "two sweeps after the answer", func() bool { return c.sweeps() >= n+2 })
	if got := calls.Load(); got != 1 {
		t.Errorf("Objects called %d times, want 1 (no retry)", got)
	}
}
