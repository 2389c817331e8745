package kube_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"sluice/exporter/attribution"
	"sluice/flow"
	"sluice/test/kube/kubetest"
	tfcluster "sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/pipeline"
)

// TestExporterAttributionWatch follows the cluster state with the
// informers of the exporter's policy attribution, authenticated as the
// chart's exporter ServiceAccount. With the chart's defaults (Pod
// metadata only: Pods, Nodes, Services) every other list is forbidden, an
// error naming the resource; with
// exporter.attribution.enable=true every list and watch is allowed, the
// same watch recovers, the model is built from what it holds, and a
// NetworkPolicy created afterwards reaches a connection's verdict (a new
// generation) without a re-list, within a deadline.
func TestExporterAttributionWatch(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	// The chart's defaults first: the exporter may read Pods, Nodes and
	// Services only.
	installDefaults(t, ctx, c)
	admin := modelFixture(t, ctx, c)
	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator-exporter")
	if err != nil {
		t.Fatal(err)
	}
	client, dyn, err := kube.Clients(sa)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	w := kube.NewWatcher(client, dyn, kube.WatchOptions{Logger: log})
	a := attribution.New(attribution.Options{Log: log})
	l := attribution.NewLoader(a, attribution.WatchSource(w), pipeline.DefaultConfig())
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = w.Run(wctx); done <- struct{}{} }()
	go func() { l.Follow(wctx, w.Changed(), 50*time.Millisecond); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })

	// Forbidden lists are errors naming each resource.
	var lastErr error
	if err := poll(ctx, "forbidden lists reported", func() (bool, error) {
		_, _, lastErr = w.Objects()
		if lastErr == nil {
			return false, nil
		}
		msg := lastErr.Error()
		for _, r := range []string{"namespaces", "networkpolicies.networking.k8s.io", "endpointslices.discovery.k8s.io"} {
			if !strings.Contains(msg, "listing "+r+": ") || !strings.Contains(msg, "needs get, list and watch on "+r) {
				return false, nil
			}
		}
		if strings.Contains(msg, "listing pods: ") {
			return false, fmt.Errorf("pods forbidden with the chart's defaults: %s", msg)
		}
		return strings.Contains(msg, "forbidden"), nil
	}); err != nil {
		t.Fatalf("%v: last error %v", err, lastErr)
	}
	if a.Generation() != 0 || a.Stats().LoadErrors == 0 {
		t.Errorf("without permissions: generation %d, stats %+v; want no model and load errors", a.Generation(), a.Stats())
	}

	// The chart with attribution: the same watch recovers (the informers
	// retry their lists) and the first model is loaded.
	out, err := render(t, "flow-aggregator", "flow-aggregator", "createNamespace=true", "exporter.attribution.enable=true")
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, ctx, c, out)
	// The chart's default (the exporter's least privilege) for the tests
	// after this one.
	t.Cleanup(func() { installDefaults(t, testContext(t, time.Minute), c) })

	// What the watch reads, and nothing to write.
	for _, p := range []struct {
		group, resource, verb string
		want                  bool
	}{
		{"", "pods", "watch", true}, {"", "namespaces", "list", true}, {"", "nodes", "watch", true}, {"", "services", "list", true},
		{"discovery.k8s.io", "endpointslices", "watch", true}, {"networking.k8s.io", "networkpolicies", "watch", true},
		{"crd.antrea.io", "clusternetworkpolicies", "watch", true}, {"crd.antrea.io", "networkpolicies", "list", true},
		{"crd.antrea.io", "egresses", "watch", true}, {"crd.antrea.io", "clustergroups", "list", true}, {"crd.antrea.io", "groups", "watch", true},
		{"", "secrets", "list", false}, {"networking.k8s.io", "networkpolicies", "create", false}, {"", "pods", "update", false},
	} {
		ok, err := canIGroup(ctx, sa, p.verb, p.group, p.resource)
		if err != nil {
			t.Fatal(err)
		}
		if ok != p.want {
			t.Errorf("exporter may %s %s.%s: %v, want %v", p.verb, p.resource, p.group, ok, p.want)
		}
	}

	var probs tfcluster.Problems
	if err := poll(ctx, "the first model", func() (bool, error) {
		var err error
		_, probs, err = w.Objects()
		return a.Generation() > 0, err
	}); err != nil {
		t.Fatalf("%v\nwatcher log:\n%s", err, logs.String())
	}
	if st := w.Stats(); !st.Synced || st.Objects == 0 {
		t.Errorf("watch stats %+v, want synced, with objects\nlog:\n%s", st, logs.String())
	}
	// Antrea's CRDs are not installed here: warnings, not errors.
	if probs.Err() != nil || !strings.Contains(fmt.Sprint(probs), "egresses.crd.antrea.io") {
		t.Errorf("problems %v, want a warning for the Egress CRD that is not served", probs)
	}

	key := attribution.Key{Src: netip.MustParseAddr("10.10.1.5"), Dst: netip.MustParseAddr("10.10.2.7"), Proto: 6, DstPort: 5432}
	v := a.Verdict(ctx, key)
	if v == nil || v.Denied || v.Ingress.RuleAction != 0 {
		t.Fatalf("client → db before any policy: %+v, want allowed without a policy", v)
	}
	gen := a.Generation()

	// db is isolated for ingress: the verdict names the policy, Drop.
	want := isolateDB(t, ctx, admin, "db-deny-all")
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := poll(pctx, "the NetworkPolicy in the verdict", func() (bool, error) {
		v = a.Verdict(ctx, key)
		return a.Generation() > gen && v != nil && v.Denied && v.Ingress == want, nil
	}); err != nil {
		t.Fatalf("%v: last verdict %+v, generation %d (was %d)\nlog:\n%s", err, v, a.Generation(), gen, logs.String())
	}
}

// TestAttributionCatchUp: with the real API server and informers, a
// change in the watcher's cache is in the model once CatchUp returns,
// although the Loader's interval (an hour here) would hold it back: what
// each exporter poll does first, so that a new Pod's or policy's first
// connections are not judged by the model from before it.
func TestAttributionCatchUp(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	admin := modelFixture(t, ctx, c)
	client, dyn, err := kube.Clients(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	w := kube.NewWatcher(client, dyn, kube.WatchOptions{Logger: log})
	a := attribution.New(attribution.Options{Log: log})
	l := attribution.NewLoader(a, attribution.WatchSource(w), pipeline.DefaultConfig())
	l.TrackChanges(w.Changes)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = w.Run(wctx); done <- struct{}{} }()
	go func() { l.Follow(wctx, w.Changed(), time.Hour); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })

	// The first signal is loaded at once, before every list is done; the
	// lists' ends are changes, which CatchUp loads.
	if err := poll(ctx, "the first model", func() (bool, error) {
		a.CatchUp(ctx, 10*time.Second)
		return a.Generation() > 0, nil
	}); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, logs.String())
	}
	key := attribution.Key{Src: netip.MustParseAddr("10.10.1.5"), Dst: netip.MustParseAddr("10.10.2.7"), Proto: 6, DstPort: 5432}
	if v := a.Verdict(ctx, key); v == nil || v.Denied {
		t.Fatalf("client → db before any policy: %+v, want allowed", v)
	}
	gen, before := a.Generation(), w.Changes()

	want := isolateDB(t, ctx, admin, "db-catch-up")
	// The policy is in the cache and a change was counted since (the
	// count follows the cache).
	if err := poll(ctx, "the policy in the watcher's cache", func() (bool, error) {
		objs, _, err := w.Objects()
		if err != nil {
			return false, nil
		}
		for _, o := range objs {
			if o.Kind == "NetworkPolicy" && o.Namespace == "default" && o.Name == want.Name {
				return w.Changes() > before, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	// One CatchUp, then the verdict, without waiting for anything else.
	a.CatchUp(ctx, 30*time.Second)
	v := a.Verdict(ctx, key)
	if a.Generation() <= gen || v == nil || !v.Denied || v.Ingress != want {
		t.Fatalf("after CatchUp: generation %d (was %d), verdict %+v; want denied by %s\nlog:\n%s", a.Generation(), gen, v, want.Name, logs.String())
	}
	if st := a.Stats(); st.CatchUps == 0 || st.CatchUpTimeouts != 0 {
		t.Errorf("stats %+v, want catch-ups and no timeout", st)
	}
}

// modelFixture leaves the cluster as the attribution tests want it: the
// Traceflow fixture's objects, nothing a model cannot read. It returns an
// admin client.
func modelFixture(t *testing.T, ctx context.Context, c *kubetest.Cluster) kubernetes.Interface {
	t.Helper()
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	adminDyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	tidyForModel(t, ctx, c)
	createFixture(t, ctx, adminDyn)
	return admin
}

// isolateDB creates, until the test ends, a NetworkPolicy called name
// that isolates the fixture's db Pod for ingress, and returns the policy
// a verdict names for a connection it drops.
func isolateDB(t *testing.T, ctx context.Context, admin kubernetes.Interface, name string) flow.Policy {
	t.Helper()
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := admin.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := admin.NetworkingV1().NetworkPolicies("default").Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	return flow.Policy{Type: attribution.PolicyTypeK8s, Namespace: "default", Name: name, RuleAction: flow.ActionDrop}
}
