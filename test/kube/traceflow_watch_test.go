package kube_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sluice/test/kube/kubetest"
	tfcluster "sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/controller"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/tracer"
)

// modelList matches the path of a list of a resource the model is built
// from (not a single object's path, not Traceflows).
var modelList = regexp.MustCompile(`/(namespaces|nodes|pods|services|endpointslices|networkpolicies|egresses|clusternetworkpolicies|clustergroups|groups|ippools)$`)

// apiMeter counts, in a client's transport, the LIST requests of the
// model's resources it sends and the response bytes it reads; with
// holdPods set, it holds the Pods' lists until releasePods.
type apiMeter struct {
	lists    atomic.Int64
	bytes    atomic.Int64
	holdPods atomic.Bool
	once     sync.Once
	released chan struct{}
}

func newAPIMeter() *apiMeter { return &apiMeter{released: make(chan struct{})} }

func (m *apiMeter) releasePods() { m.once.Do(func() { close(m.released) }) }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (m *apiMeter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet && r.URL.Query().Get("watch") != "true" && modelList.MatchString(r.URL.Path) {
			m.lists.Add(1)
			if m.holdPods.Load() && strings.HasSuffix(r.URL.Path, "/pods") {
				select {
				case <-m.released:
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
			}
		}
		resp, err := rt.RoundTrip(r)
		if err == nil {
			resp.Body = &countingBody{ReadCloser: resp.Body, n: &m.bytes}
		}
		return resp, err
	})
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// meteredClients are the aggregator's clients (kube.RESTConfig's content
// types and rate) on rc, through m: their configuration, a Watcher as the
// aggregator makes it (not running), and a kube.Load through them.
func meteredClients(tb testing.TB, rc *rest.Config, m *apiMeter) (*rest.Config, *kube.Watcher, func(context.Context) ([]tfcluster.Object, error)) {
	tb.Helper()
	cfg := rest.CopyConfig(rc)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.QPS, cfg.Burst = 50, 100
	cfg.Wrap(m.wrap)
	client, dyn, err := kube.Clients(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	w := kube.NewWatcher(client, dyn, kube.WatchOptions{Logger: slog.New(slog.DiscardHandler), IPPools: true})
	load := func(ctx context.Context) ([]tfcluster.Object, error) {
		objs, _, err := kube.Load(ctx, client, dyn, kube.Options{})
		return objs, err
	}
	return cfg, w, load
}

// startWatchedController runs, as the aggregator does with
// sluice.traceflow.enable, one Watcher and a Traceflow controller tracing
// over its caches, with the admin's clients metered by m, until the test
// ends. It returns the Watcher and a function that lists the cluster once
// as kube.Load does through the same clients.
func startWatchedController(t *testing.T, c *kubetest.Cluster, m *apiMeter) (*kube.Watcher, func(context.Context) ([]tfcluster.Object, error)) {
	t.Helper()
	cfg, w, load := meteredClients(t, c.Admin, m)
	client, dyn, err := kube.Clients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := controller.New(client, dyn, controller.Options{Objects: w.WaitObjects,
		Settings: modelrun.DefaultSettings(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("watcher: %v", err)
		}
	})
	wg.Go(func() {
		if err := ctl.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("controller: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w, load
}

// applyTraceflow creates a Traceflow, deleting a leftover of the same
// name first, and waits for its phase.
func applyTraceflow(t *testing.T, ctx context.Context, dyn dynamic.Interface, name string, spec crd.TraceflowSpec) *crd.Traceflow {
	t.Helper()
	createTraceflow(t, ctx, dyn, name, spec)
	return answered(t, ctx, dyn, name)
}

func createTraceflow(t *testing.T, ctx context.Context, dyn dynamic.Interface, name string, spec crd.TraceflowSpec) {
	t.Helper()
	tfs := dyn.Resource(controller.GVR())
	_ = tfs.Delete(ctx, name, metav1.DeleteOptions{})
	if err := poll(ctx, "old "+name+" gone", func() (bool, error) {
		_, err := tfs.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := tfs.Create(ctx, traceflowObject(t, name, spec), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Traceflow %s: %v", name, err)
	}
	t.Cleanup(func() { _ = tfs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func answered(t *testing.T, ctx context.Context, dyn dynamic.Interface, name string) *crd.Traceflow {
	t.Helper()
	var tf *crd.Traceflow
	if err := poll(ctx, "status of "+name, func() (bool, error) {
		u, err := dyn.Resource(controller.GVR()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		tf = decodeTraceflow(t, u)
		return tf.Status.Phase != "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return tf
}

func clientTo(ns, pod string) crd.TraceflowSpec {
	return crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "client"},
		Destination: crd.Destination{Namespace: ns, Pod: pod},
		Packet:      crd.Packet{TransportHeader: crd.TransportHeader{TCP: &crd.TCPHeader{DstPort: 5432}}}}
}

// TestTraceflowWatchCache: the Traceflow controller, tracing over one
// Watcher's caches as the aggregator runs it, traces a Pod added after it
// started, and lists the cluster no more as Traceflows come: ten
// Traceflows, and the LIST requests of the model's resources stay what
// the watch's first lists made.
func TestTraceflowWatchCache(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 4*time.Minute)
	installDefaults(t, ctx, c)
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	tidyForModel(t, ctx, c)
	createFixture(t, ctx, dyn)
	const late = "late-db"
	deleteLate := func() {
		err := cs.CoreV1().Pods("default").Delete(context.Background(), late, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	deleteLate()
	t.Cleanup(deleteLate)

	m := newAPIMeter()
	w, load := startWatchedController(t, c, m)
	if tf := applyTraceflow(t, ctx, dyn, "watch-first", clientTo("default", "db")); tf.Status.Phase != crd.PhaseSucceeded {
		t.Fatalf("watch-first: %s %q", tf.Status.Phase, tf.Status.Reason)
	}

	// A Pod added now is in the next trace. The caches follow the API
	// server asynchronously: wait until they have its IP (a Traceflow
	// created within that lag would be traced on the older state).
	p := newPod("default", late, map[string]string{"app": "late"})
	p.Spec.NodeName = "k8s-node-2"
	created, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setPodIP(t, ctx, cs, created, "10.10.2.60")
	if err := poll(ctx, "the new Pod's IP in the caches", func() (bool, error) {
		objs, _, err := w.Objects()
		for _, o := range objs {
			if o.Kind == "Pod" && o.Name == late && strings.Contains(string(o.Raw), "10.10.2.60") {
				return true, nil
			}
		}
		return false, err
	}); err != nil {
		t.Fatal(err)
	}
	tf := applyTraceflow(t, ctx, dyn, "watch-late", clientTo("default", late))
	// Without the Pod in the state, the request would be Failed.
	if r := tf.Status.Results; tf.Status.Phase != crd.PhaseSucceeded || !hasAction(tf, crd.ActionDelivered) || r[len(r)-1].Node != "k8s-node-2" {
		t.Errorf("watch-late: %s %q %+v, want Delivered on k8s-node-2", tf.Status.Phase, tf.Status.Reason, tf.Status.Results)
	}

	// Ten more: no LIST of the model's resources. Each trace's reads end
	// before its status is written, and the meter counts a request when
	// it is sent, so the count is final once the statuses are read.
	before := m.lists.Load()
	if before < 6 {
		t.Fatalf("%d LISTs counted for the watch's first lists; the meter misses them", before)
	}
	for i := range 10 {
		createTraceflow(t, ctx, dyn, fmt.Sprintf("watch-%d", i), clientTo("default", "db"))
	}
	for i := range 10 {
		if tf := answered(t, ctx, dyn, fmt.Sprintf("watch-%d", i)); tf.Status.Phase != crd.PhaseSucceeded {
			t.Errorf("watch-%d: %s %q", i, tf.Status.Phase, tf.Status.Reason)
		}
	}
	if after := m.lists.Load(); after != before {
		t.Errorf("LISTs of the model's resources went from %d to %d over 10 traces, want no change", before, after)
	}
	// The meter sees a per-trace list: one kube.Load, as the controller
	// made per trace before, lists each typed resource.
	if _, err := load(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.lists.Load() - before; got < 6 {
		t.Errorf("one kube.Load counted %d LISTs, want at least 6", got)
	}
}

// TestTraceflowWatchBeforeSync: while the watch has not listed every
// resource (here the Pods' list is held), a Traceflow waits its own
// timeout (spec.timeout) and is Failed, saying the state is not ready and
// what is waited for; once the list is through, Traceflows are traced.
func TestTraceflowWatchBeforeSync(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 4*time.Minute)
	installDefaults(t, ctx, c)
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	tidyForModel(t, ctx, c)
	createFixture(t, ctx, dyn)
	m := newAPIMeter()
	m.holdPods.Store(true)
	t.Cleanup(m.releasePods)
	startWatchedController(t, c, m)

	spec := clientTo("default", "db")
	spec.Timeout = 2
	start := time.Now()
	tf := applyTraceflow(t, ctx, dyn, "watch-early", spec)
	const want = "the cluster state is not ready (waited 2s, the Traceflow's timeout): "
	if tf.Status.Phase != crd.PhaseFailed || !strings.HasPrefix(tf.Status.Reason, want) || !strings.Contains(tf.Status.Reason, "waiting for pods") {
		t.Errorf("watch-early: %s %q, want Failed with %q... waiting for pods", tf.Status.Phase, tf.Status.Reason, want)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("answered after %v, before the Traceflow's timeout", d)
	}

	m.releasePods()
	if tf := applyTraceflow(t, ctx, dyn, "watch-synced", clientTo("default", "db")); tf.Status.Phase != crd.PhaseSucceeded {
		t.Errorf("watch-synced: %s %q, want Succeeded", tf.Status.Phase, tf.Status.Reason)
	}
}

// benchPods is the size of the benchmark's cluster.
const benchPods = 2000

// populateBench creates, unless there, a cluster of benchPods Pods on four
// Nodes in Namespace bench-tf, with 50 Services, each Pod with the
// metadata and status a scheduled Pod has beside what the model reads
// (annotations, an owner, resources, env, conditions). The control plane
// is the run's own (TestMain starts a new one), so nothing is deleted.
func populateBench(b *testing.B, ctx context.Context, rc *rest.Config) {
	b.Helper()
	cfg := rest.CopyConfig(rc)
	cfg.QPS, cfg.Burst = 1000, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const ns = "bench-tf"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	for i := range 4 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-node-%d", i)},
			Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("10.200.%d.0/21", 8*i), PodCIDRs: []string{fmt.Sprintf("10.200.%d.0/21", 8*i)}}}
		created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.90.%d", 10+i)}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 50 {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("svc-%d", i)},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": fmt.Sprintf("app-%d", i)},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if _, err := cs.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < benchPods; i += 8 {
				if err := benchPod(ctx, cs, ns, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func benchPod(ctx context.Context, cs kubernetes.Interface, ns string, i int) error {
	node, k := i%4, i/4
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p-%04d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%50), "pod-template-hash": "5d8c7f9b6"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z",
				"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet",
				Name: fmt.Sprintf("app-%d-5d8c7f9b6", i%50), UID: "6f1c2b9e-0a4d-4c8e-9a51-2f7d3e8b1c40"}}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("bench-node-%d", node),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1.4.2",
				Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env:       []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "REGION", Value: "eu-west-1"}},
				Resources: corev1.ResourceRequirements{}}}},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ip := fmt.Sprintf("10.200.%d.%d", 8*node+k/250, k%250+2)
	now := metav1.Now()
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		HostIP: fmt.Sprintf("192.168.90.%d", 10+node), StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "registry.example/app:1.4.2",
			ImageID: "registry.example/app@sha256:3b0c5e6f1d2a4b8c9e7f6a5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291",
			State:   corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}}
	_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// BenchmarkTraceflowState is one Traceflow's work on a cluster of
// benchPods Pods: reading the state (source=load: kube.Load's lists, as
// the controller did per trace; source=watch: a synced Watcher's caches,
// as the aggregator does now; source=held: the caches' objects read
// once, so the trace alone) and tracing over it. B-read/op is what the
// client read from the API server per trace, LISTs/op its list requests.
// Compare with benchstat -col /source.
func BenchmarkTraceflowState(b *testing.B) {
	if shared.cluster == nil {
		b.Skipf("no control plane: %v", shared.err)
	}
	ctx := context.Background()
	populateBench(b, ctx, shared.cluster.Admin)
	tf := &crd.Traceflow{Spec: clientTo("bench-tf", "p-1999")}
	tf.Name, tf.Spec.Source = "bench", crd.Source{Namespace: "bench-tf", Pod: "p-0000"}
	for _, source := range []string{"load", "watch", "held"} {
		b.Run("source="+source, func(b *testing.B) {
			m := newAPIMeter()
			_, w, state := meteredClients(b, shared.cluster.Admin, m)
			if source != "load" {
				wctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- w.Run(wctx) }()
				b.Cleanup(func() { cancel(); <-done })
				// The first lists are the watch's once-only cost.
				if _, _, err := w.WaitObjects(ctx); err != nil {
					b.Fatal(err)
				}
				state = func(ctx context.Context) ([]tfcluster.Object, error) {
					objs, _, err := w.WaitObjects(ctx)
					return objs, err
				}
			}
			if source == "held" {
				objs, err := state(ctx)
				if err != nil {
					b.Fatal(err)
				}
				state = func(context.Context) ([]tfcluster.Object, error) { return objs, nil }
			}
			b.ReportAllocs()
			lists, bytes := m.lists.Load(), m.bytes.Load()
			for b.Loop() {
				objs, err := state(ctx)
				if err != nil {
					b.Fatal(err)
				}
				tr, _, err := modelrun.Trace(ctx, objs, modelrun.DefaultSettings(), tf, tracer.Options{})
				if err != nil || tr.Traceflow.Status.Phase != crd.PhaseSucceeded {
					b.Fatalf("trace: %v %+v", err, tr)
				}
			}
			b.ReportMetric(float64(m.bytes.Load()-bytes)/float64(b.N), "B-read/op")
			b.ReportMetric(float64(m.lists.Load()-lists)/float64(b.N), "LISTs/op")
			if source != "load" {
				// The watch's once-only cost, for comparison.
				b.ReportMetric(float64(bytes), "B-first-lists")
			}
		})
	}
}
