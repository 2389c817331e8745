package kube

// The Watcher's tests run the real informers against client-go's fake
// clientset and fake dynamic client (as enrich's Kube tests do); the test
// on a real kube-apiserver is test/kube's TestExporterAttributionWatch.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	k8stesting "k8s.io/client-go/testing"

	"sluice/internal/testkit"
	"sluice/traceflow/cluster"
)

// runWatcher runs a Watcher until the test ends.
func runWatcher(t *testing.T, client kubernetes.Interface, dyn dynamic.Interface) *Watcher {
	t.Helper()
	return runWatcherWith(t, client, dyn, WatchOptions{})
}

func runWatcherWith(t *testing.T, client kubernetes.Interface, dyn dynamic.Interface, o WatchOptions) *Watcher {
	t.Helper()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	w := NewWatcher(client, dyn, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return w
}

// synced waits for Objects to succeed.
func synced(t *testing.T, w *Watcher) ([]cluster.Object, cluster.Problems) {
	t.Helper()
	var objs []cluster.Object
	var probs cluster.Problems
	var err error
	testkit.WaitFor(t, "the watch's first lists", func() bool {
		objs, probs, err = w.Objects()
		return err == nil
	})
	return objs, probs
}

// The watch's objects are Load's, and give the same traces: the trimming
// of the informers' caches loses nothing the model uses. A change arrives
// as an event; status churn changes no object's encoding.
func TestWatchLikeLoad(t *testing.T) {
	files := fileObjects(t, true)
	client, dyn := fakes(t, files, allAntrea)
	w := runWatcher(t, client, dyn)
	live, probs := synced(t, w)
	if len(probs) != 0 {
		t.Errorf("unexpected problems: %v", probs)
	}
	if got, want := ids(live), ids(files); !reflect.DeepEqual(got, want) {
		t.Fatalf("watched objects\n%v\nwant the file objects\n%v", got, want)
	}
	if got, want := traces(t, live, requests), traces(t, files, requests); got != want {
		t.Errorf("traces of the watched objects differ from the files'\nwatched:\n%s\nfiles:\n%s", got, want)
	}
	if st := w.Stats(); !st.Synced || st.Objects != len(files) || st.WatchErrors != 0 {
		t.Errorf("stats %+v, want synced with %d objects and no errors", st, len(files))
	}
	again, _, err := w.Objects()
	if err != nil || !sameObjects(live, again) {
		t.Fatalf("Objects twice without a change differ (err %v)", err)
	}

	// A Pod's conditions change: an event, and the same encoding; no
	// change counted or signalled.
	ctx := context.Background()
	// Every object's add and every resource's first list are counted
	// (the latter by goroutines that may run after Objects succeeds).
	w.mu.Lock()
	nkinds := len(w.kinds)
	w.mu.Unlock()
	testkit.WaitFor(t, "the first lists' changes counted", func() bool { return w.Changes() == uint64(len(files)+nkinds) })
	drain(w)
	events, changes := w.Stats().Events, w.Changes()
	p, err := client.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	p.ResourceVersion = "999"
	if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the Pod's update event", func() bool { return w.Stats().Events > events })
	after, _, err := w.Objects()
	if err != nil || !sameObjects(live, after) {
		t.Errorf("a Pod's conditions changed the watched objects (err %v)", err)
	}
	if w.Changes() != changes {
		t.Errorf("a Pod's conditions counted as a change: %d changes, was %d", w.Changes(), changes)
	}
	select {
	case <-w.Changed():
		t.Error("a Pod's conditions signalled a change")
	default:
	}

	// Its labels change: a change, signalled.
	p, err = client.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["tier"] = "late"
	p.ResourceVersion = "1000"
	if _, err := client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the label change counted", func() bool { return w.Changes() > changes })
	select {
	case <-w.Changed():
	case <-time.After(time.Minute):
		t.Fatal("no change signalled for a Pod's labels")
	}
	if after, _, err := w.Objects(); err != nil || sameObjects(live, after) {
		t.Errorf("the watched objects did not change with a Pod's labels (err %v)", err)
	}

	// A new NetworkPolicy: signalled, and in the objects.
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "late"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	drain(w)
	if _, err := client.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changed():
	case <-time.After(time.Minute):
		t.Fatal("no change signalled for a new NetworkPolicy")
	}
	testkit.WaitFor(t, "the new NetworkPolicy in the objects", func() bool {
		objs, _, err := w.Objects()
		return err == nil && len(objs) == len(files)+1 && contains(objs, "NetworkPolicy", "default", "late")
	})
}

// drain empties the Changed channel.
func drain(w *Watcher) {
	select {
	case <-w.Changed():
	default:
	}
}

func contains(objs []cluster.Object, kind, ns, name string) bool {
	for _, o := range objs {
		if o.Kind == kind && o.Namespace == ns && o.Name == name {
			return true
		}
	}
	return false
}

func sameObjects(a, b []cluster.Object) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID() != b[i].ID() || !bytes.Equal(a[i].Raw, b[i].Raw) {
			return false
		}
	}
	return true
}

// A CRD not served at start is a warning; once discovery serves it, it
// is watched.
func TestWatchMissingCRDIsAWarning(t *testing.T) {
	client, dyn := fakes(t, fileObjects(t, true), []string{"networkpolicies", "clusternetworkpolicies"})
	// The Egress CRD is installed later: discovery's answer changes, in
	// the goroutine that reads it (the fake's reactors run under its lock).
	var installed atomic.Bool
	fd := client.Discovery().(*fakediscovery.FakeDiscovery)
	client.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
		if installed.Load() {
			rl := &metav1.APIResourceList{GroupVersion: antreaGroupVersion.String()}
			for _, r := range allAntrea {
				rl.APIResources = append(rl.APIResources, metav1.APIResource{Name: r, Namespaced: r == "egresses"})
			}
			fd.Resources = []*metav1.APIResourceList{rl}
		}
		return false, nil, nil
	})
	w := runWatcherWith(t, client, dyn, WatchOptions{Rediscover: 10 * time.Millisecond})
	live, probs := synced(t, w)
	var got []string
	for _, p := range probs {
		if p.Severity != cluster.Warning || !strings.Contains(p.Message, "is not served") {
			t.Errorf("unexpected problem %v", p)
		}
		got = append(got, p.Object)
	}
	if want := []string{"resource egresses.crd.antrea.io"}; !reflect.DeepEqual(got, want) { // groups are quiet
		t.Errorf("warnings name %v, want %v", got, want)
	}
	if contains(live, "Egress", "", "egress-client") {
		t.Error("an Egress was watched although its CRD is not served")
	}

	installed.Store(true)
	testkit.WaitFor(t, "the Egresses watched once served", func() bool {
		objs, probs, err := w.Objects()
		return err == nil && len(probs) == 0 && contains(objs, "Egress", "", "egress-client")
	})
}

func TestWatchForbiddenListIsAnError(t *testing.T) {
	for _, c := range []struct {
		resource, group string
		dynamic         bool
		want            string
	}{
		{"pods", "", false, "listing pods: "},
		{"networkpolicies", "networking.k8s.io", false, "listing networkpolicies.networking.k8s.io: "},
		{"clusternetworkpolicies", "crd.antrea.io", true, "listing clusternetworkpolicies.crd.antrea.io: "},
	} {
		t.Run(c.resource, func(t *testing.T) {
			client, dyn := fakes(t, fileObjects(t, true), allAntrea)
			react := func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: c.group, Resource: c.resource}, "",
					errors.New(`User "dev" cannot list resource`))
			}
			if c.dynamic {
				dyn.PrependReactor("list", c.resource, react)
			} else {
				client.PrependReactor("list", c.resource, react)
			}
			w := runWatcher(t, client, dyn)
			var err error
			testkit.WaitFor(t, "the forbidden list reported", func() bool {
				_, _, err = w.Objects()
				return err != nil && strings.Contains(err.Error(), c.want)
			})
			if !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "needs get, list and watch on") {
				t.Errorf("error %v, want one naming %q as forbidden", err, c.want)
			}
			if !apierrors.IsForbidden(err) {
				t.Errorf("%v does not wrap the Forbidden status", err)
			}
			if w.Stats().WatchErrors == 0 {
				t.Error("the failed list was not counted")
			}
		})
	}
}

func TestObjectsBeforeRun(t *testing.T) {
	client, dyn := fakes(t, nil, allAntrea)
	w := NewWatcher(client, dyn, WatchOptions{})
	if _, _, err := w.Objects(); err == nil {
		t.Error("Objects before Run: no error")
	}
}

// TestWatchKeepsNamedPorts: the watcher's trimmed Pods keep their named
// container ports, which policy rules can name: the state built from the
// watched objects resolves them as the files' state does.
func TestWatchKeepsNamedPorts(t *testing.T) {
	files := fileObjectsWith(t, "k8s-named-port.yaml")
	client, dyn := fakes(t, files, allAntrea)
	w := runWatcher(t, client, dyn)
	live, _ := synced(t, w)
	ports := func(objs []cluster.Object) map[string][]cluster.NamedPort {
		st, _ := cluster.Build(objs)
		out := map[string][]cluster.NamedPort{}
		for _, p := range st.Pods {
			if len(p.Ports) > 0 {
				out[p.Namespace+"/"+p.Name] = p.Ports
			}
		}
		return out
	}
	want := ports(files)
	if len(want) == 0 {
		t.Fatal("the fixture declares no named port")
	}
	if got := ports(live); !reflect.DeepEqual(got, want) {
		t.Errorf("named ports of the watched Pods %v, want %v", got, want)
	}
}

// With IPPools, the watch keeps what FlexibleIPAM reads (the IPPools and
// the ipam.antrea.io/ippools annotations), so each Pod gets the pool
// Load's objects give it; without, the exporter's default, none.
func TestWatchIPPools(t *testing.T) {
	files := fileObjectsWith(t, "flexible-ipam.yaml")
	pools := func(objs []cluster.Object) map[string]string {
		st, _ := cluster.Build(objs)
		out := map[string]string{}
		for _, p := range st.Pods {
			if p.IPPool != nil {
				out[p.Key()] = p.IPPool.Name
			}
		}
		return out
	}
	want := pools(files)
	if len(want) < 2 {
		t.Fatalf("the fixture gives pools to %v only", want)
	}
	client, dyn := fakes(t, files, allAntrea)
	live, _ := synced(t, runWatcherWith(t, client, dyn, WatchOptions{IPPools: true}))
	if got, want := ids(live), ids(files); !reflect.DeepEqual(got, want) {
		t.Fatalf("watched objects\n%v\nwant the file objects\n%v", got, want)
	}
	if got := pools(live); !reflect.DeepEqual(got, want) {
		t.Errorf("pools of the watched Pods %v, want %v", got, want)
	}
	client, dyn = fakes(t, files, allAntrea)
	if got := pools(first(synced(t, runWatcher(t, client, dyn)))); len(got) != 0 {
		t.Errorf("without IPPools, Pods got pools %v", got)
	}
}

func first[A, B any](a A, _ B) A { return a }

// WaitObjects waits for the first lists: it fails with ErrNotSynced,
// naming the cause, while a list is refused and the context ends, and
// answers once the retried list succeeds; a wait begun before Run ends
// when Run has listed.
func TestWaitObjects(t *testing.T) {
	files := fileObjects(t, true)
	client, dyn := fakes(t, files, allAntrea)
	var refuse atomic.Bool
	refuse.Store(true)
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("not yet"))
		}
		return false, nil, nil
	})
	w := NewWatcher(client, dyn, WatchOptions{Logger: slog.New(slog.DiscardHandler)})

	// Not started: the wait ends with the context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, _, err := w.WaitObjects(ctx)
	cancel()
	if !errors.Is(err, ErrNotSynced) || !strings.Contains(err.Error(), "has not started") {
		t.Fatalf("before Run: %v, want ErrNotSynced saying the watch has not started", err)
	}

	// A wait begun now sees the lists Run makes; it cannot end before the
	// Pods' list is let through.
	type result struct {
		objs []cluster.Object
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		objs, _, err := w.WaitObjects(ctx)
		waited <- result{objs, err}
	}()
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, "the refused list counted", func() bool { return w.Stats().WatchErrors > 0 })
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, _, err = w.WaitObjects(ctx)
	cancel()
	if !errors.Is(err, ErrNotSynced) || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "listing pods") {
		t.Errorf("with the Pods' list refused: %v, want ErrNotSynced wrapping the forbidden list of pods", err)
	}
	select {
	case r := <-waited:
		t.Fatalf("the wait ended while the Pods' list was refused: %v", r.err)
	default:
	}
	refuse.Store(false)
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got, want := ids(r.objs), ids(files); !reflect.DeepEqual(got, want) {
		t.Errorf("waited objects\n%v\nwant\n%v", got, want)
	}
}

// Objects reuses the encoding of an object whose resourceVersion has not
// changed, and encodes a changed one again.
func TestWatchReusesEncodings(t *testing.T) {
	files := fileObjects(t, true)
	client, dyn := fakes(t, files, allAntrea)
	w := runWatcher(t, client, dyn)
	ctx := context.Background()
	// The fake keeps what the client sends: give the fixture's Pod a
	// resourceVersion, as an API server would.
	p, err := client.CoreV1().Pods("default").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.ResourceVersion = "10"
	if _, err := client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw := func(objs []cluster.Object, name string) []byte {
		for _, o := range objs {
			if o.Kind == "Pod" && o.Name == name {
				return o.Raw
			}
		}
		t.Fatalf("no Pod %s", name)
		return nil
	}
	synced(t, w)
	testkit.WaitFor(t, "the Pod's resourceVersion in the cache", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, k := range w.kinds {
			if k.kind == "Pod" {
				it, ok, _ := k.informer.GetStore().GetByKey("default/client")
				return ok && it.(*corev1.Pod).ResourceVersion == "10"
			}
		}
		return false
	})
	first, _, err := w.Objects()
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := w.Objects()
	if err != nil {
		t.Fatal(err)
	}
	if a, b := raw(first, "client"), raw(again, "client"); &a[0] != &b[0] {
		t.Error("an unchanged Pod was encoded again")
	}

	p.ResourceVersion, p.Labels = "11", map[string]string{"app": "relabelled"}
	if _, err := client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the new label in the objects", func() bool {
		objs, _, err := w.Objects()
		return err == nil && strings.Contains(string(raw(objs, "client")), "relabelled")
	})
}
