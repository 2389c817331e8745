package controller

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
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
