package enrich

// The Kube tests run the real informers against client-go's fake clientset
// (k8s.io/client-go/kubernetes/fake), the usual way to test informer code:
// its object tracker serves lists and watches, resource versions included.
// A test against a real kube-apiserver (envtest) would also cover
// serialisation and RBAC, but it needs the apiserver and etcd binaries and
// takes long to start, so it is not part of the unit tests.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"sluice/internal/testkit"
)

type kpodOpt func(*corev1.Pod)

func withLabels(l map[string]string) kpodOpt { return func(p *corev1.Pod) { p.Labels = l } }

func withHostNetwork() kpodOpt { return func(p *corev1.Pod) { p.Spec.HostNetwork = true } }

// kpod is a running Pod in namespace ns on node n1.
func kpod(name, uid string, created time.Time, ips []string, opts ...kpodOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         "ns",
			Name:              name,
			UID:               types.UID(uid),
			CreationTimestamp: metav1.NewTime(created),
			Annotations:       map[string]string{"big": strings.Repeat("x", 100)},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.PodSpec{
			NodeName:   "n1",
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func knode(name, uid, internalIP string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)},
		Spec:       corev1.NodeSpec{PodCIDRs: cidrs},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name},
			{Type: corev1.NodeInternalIP, Address: internalIP},
		}},
	}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	return n
}

func kservice(name, uid string, clusterIPs ...string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)},
		Spec: corev1.ServiceSpec{
			ClusterIPs: clusterIPs,
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80}},
			Selector:   map[string]string{"app": name},
		},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	return s
}

type kubeHarness struct {
	k      *Kube
	client *fake.Clientset
	clock  *fakeClock
	logs   *logBuffer
	ctx    context.Context
	done   chan error
}

// startKube runs a Kube over a fake clientset holding objs and waits until
// it has synced. The Kube stops at the end of the test.
func startKube(t *testing.T, opts KubeOptions, objs ...kruntime.Object) *kubeHarness {
	t.Helper()
	h := &kubeHarness{client: fake.NewClientset(objs...), clock: &fakeClock{t: at(time.Hour)},
		logs: &logBuffer{}, done: make(chan error, 1)}
	if opts.Now == nil {
		opts.Now = h.clock.Now
	}
	if opts.Logger == nil {
		opts.Logger = h.logs.logger()
	}
	h.k = NewKube(h.client, opts)
	ctx, cancel := context.WithCancel(context.Background())
	h.ctx = ctx
	go func() { h.done <- h.k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	testkit.WaitFor(t, "sync", h.k.HasSynced)
	return h
}

func TestKubeInitialLookups(t *testing.T) {
	objs := []kruntime.Object{
		kpod("web", "u-web", at(0), []string{"10.0.0.1", "fd00::1"}, withLabels(map[string]string{"tier": "web", "app": "shop"})),
		kpod("plain", "u-plain", at(0), []string{"10.0.0.2"}),
		kpod("pending", "u-pending", at(0), nil),
		kpod("agent", "u-agent", at(0), []string{"172.18.0.2"}, withHostNetwork()),
		knode("n1", "u-n1", "172.18.0.2", "10.0.0.0/24", "fd00::/64"),
		kservice("svc", "u-svc", "10.96.0.10", "fd00:96::a"),
		kservice("headless", "u-headless", "None"),
	}
	h := startKube(t, KubeOptions{}, objs...)
	k := h.k

	p, ok := k.PodByIP(mustAddr("10.0.0.1"), at(time.Minute))
	if !ok || p.Name != "web" || p.Namespace != "ns" || p.UID != "u-web" || p.NodeName != "n1" || !p.Created.Equal(at(0)) {
		t.Fatalf("PodByIP(10.0.0.1) = %+v, %v", p, ok)
	}
	if got, want := p.LabelsJSON(), `{"app":"shop","tier":"web"}`; got != want {
		t.Errorf("LabelsJSON = %s, want %s", got, want)
	}
	if q, ok := k.PodByIP(mustAddr("fd00::1"), time.Time{}); !ok || q != p {
		t.Errorf("PodByIP(fd00::1) = %+v, %v; want the same Pod", q, ok)
	}
	if q, ok := k.PodByIP(mustAddr("::ffff:10.0.0.1"), time.Time{}); !ok || q != p {
		t.Errorf("PodByIP(mapped) = %+v, %v", q, ok)
	}
	if q, ok := k.PodByIP(mustAddr("10.0.0.2"), time.Time{}); !ok || q.LabelsJSON() != "{}" {
		t.Errorf("PodByIP(10.0.0.2) = %+v, %v; want labels {}", q, ok)
	}
	if q, ok := k.PodByIP(mustAddr("172.18.0.2"), time.Time{}); ok {
		t.Errorf("host-network Pod found by IP: %+v", q)
	}

	n, ok := k.NodeByName("n1")
	if !ok || n.UID != "u-n1" || n.InternalIP != mustAddr("172.18.0.2") ||
		!slices.Equal(n.PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")}) {
		t.Errorf("NodeByName(n1) = %+v, %v", n, ok)
	}
	s, ok := k.ServiceByName("ns", "svc")
	if !ok || s.UID != "u-svc" || !slices.Equal(s.ClusterIPs, []netip.Addr{mustAddr("10.96.0.10"), mustAddr("fd00:96::a")}) {
		t.Errorf("ServiceByName(ns, svc) = %+v, %v", s, ok)
	}
	if s, ok := k.ServiceByClusterIP(mustAddr("fd00:96::a")); !ok || s.Name != "svc" || len(s.Ports) != 1 {
		t.Errorf("ServiceByClusterIP(fd00:96::a) = %+v, %v", s, ok)
	} else if name, ok := s.PortName(6, 80); !ok || name != "ns/svc:http" {
		t.Errorf("PortName(TCP, 80) = %q, %v", name, ok)
	}
	if s, ok := k.ServiceByName("ns", "headless"); !ok || len(s.ClusterIPs) != 0 {
		t.Errorf("ServiceByName(ns, headless) = %+v, %v", s, ok)
	}
	if _, ok := k.ServiceByName("other", "svc"); ok {
		t.Error("Service found in the wrong namespace")
	}

	st := k.Stats()
	if !st.Synced || st.SyncDuration <= 0 || st.Pods != 3 || st.DeletedPods != 0 || st.HostNetworkPods != 1 ||
		st.Nodes != 1 || st.Services != 2 || st.Rebuilds != 1 || st.Events != 7 || st.InvalidAddresses != 0 {
		t.Errorf("Stats = %+v", st)
	}
	select {
	case <-k.Ready():
	default:
		t.Error("Ready not closed after sync")
	}
	if logs := h.logs.String(); !strings.Contains(logs, "caches synced") {
		t.Errorf("sync not logged:\n%s", logs)
	}
}

func TestKubeEventsDeletionAndReuse(t *testing.T) {
	h := startKube(t, KubeOptions{})
	k, pods, ctx := h.k, h.client.CoreV1().Pods("ns"), h.ctx
	ip := mustAddr("10.0.0.1")

	// A Pod created after the sync is seen.
	h.clock.Set(at(time.Hour))
	old := kpod("old", "u-old", at(0), []string{"10.0.0.1"}, withLabels(map[string]string{"v": "1"}))
	if _, err := pods.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "old Pod", func() bool { _, ok := k.PodByIP(ip, at(time.Minute)); return ok })

	// A label change is seen; a status-only change is dropped.
	old.Labels = map[string]string{"v": "2"}
	if _, err := pods.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "label update", func() bool {
		p, ok := k.PodByIP(ip, time.Time{})
		return ok && p.LabelsJSON() == `{"v":"2"}`
	})
	old.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := pods.UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "unchanged update", func() bool { return k.Stats().Unchanged == 1 })

	// Deleted at 2h: still found for flows that started before, within the
	// retention.
	h.clock.Set(at(2 * time.Hour))
	if err := pods.Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "deletion", func() bool { return k.Stats().DeletedPods == 1 })
	p, ok := k.PodByIP(ip, at(90*time.Minute))
	if !ok || p.Name != "old" || !p.Deleted.Equal(at(2*time.Hour)) {
		t.Fatalf("PodByIP before deletion = %+v, %v", p, ok)
	}
	if p, ok := k.PodByIP(ip, at(2*time.Hour+time.Second)); ok {
		t.Errorf("PodByIP after deletion = %+v; want none", p)
	}
	if got := podName(k.PodByIP(ip, time.Time{})); got != "ns/old" {
		t.Errorf("PodByIP without time = %s; want the deleted Pod", got)
	}

	// The IP is reused by a new Pod created at 2h1m: look-ups go by time.
	h.clock.Set(at(2*time.Hour + 2*time.Minute))
	if _, err := pods.Create(ctx, kpod("new", "u-new", at(2*time.Hour+time.Minute), []string{"10.0.0.1"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "new Pod", func() bool { return k.Stats().Pods == 1 })
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{at(90 * time.Minute), "ns/old"},
		{at(2*time.Hour + 90*time.Second), "ns/new"},
		{time.Time{}, "ns/new"},
		{at(-time.Hour), "ns/new"}, // before every lifetime: the live Pod
	} {
		if got := podName(k.PodByIP(ip, tc.at)); got != tc.want {
			t.Errorf("PodByIP(%v) = %s, want %s", tc.at, got, tc.want)
		}
	}

	// Past the retention the old Pod is forgotten (Run checks every second).
	h.clock.Set(at(2*time.Hour + DefaultRetention))
	testkit.WaitFor(t, "expiry", func() bool { return k.Stats().DeletedPods == 0 })
	if got := podName(k.PodByIP(ip, at(90*time.Minute))); got != "ns/new" {
		t.Errorf("PodByIP(90m) after expiry = %s, want new", got)
	}
}

func TestKubeNodeAndServiceEvents(t *testing.T) {
	h := startKube(t, KubeOptions{Retention: time.Minute}, knode("n1", "u-n1", "172.18.0.2"))
	k, ctx := h.k, h.ctx
	nodes, services := h.client.CoreV1().Nodes(), h.client.CoreV1().Services("ns")

	if _, err := services.Create(ctx, kservice("svc", "u-svc", "10.96.0.10"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "Service", func() bool { _, ok := k.ServiceByName("ns", "svc"); return ok })

	n := knode("n1", "u-n1", "172.18.0.3", "10.0.1.0/24")
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "Node update", func() bool {
		n, ok := k.NodeByName("n1")
		return ok && n.InternalIP == mustAddr("172.18.0.3") && len(n.PodCIDRs) == 1
	})
	// A heartbeat changes nothing Sluice reads.
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "unchanged Node", func() bool { return k.Stats().Unchanged == 1 })

	h.clock.Set(at(2 * time.Hour))
	if err := nodes.Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := services.Delete(ctx, "svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "deletions received", func() bool { return k.Stats().Events == 6 })
	k.flush() // apply them now rather than wait for the batch
	if _, ok := k.NodeByName("n1"); !ok {
		t.Error("deleted Node forgotten within the retention")
	}
	if _, ok := k.ServiceByName("ns", "svc"); !ok {
		t.Error("deleted Service forgotten within the retention")
	}
	h.clock.Set(at(2*time.Hour + time.Minute))
	testkit.WaitFor(t, "expiry", func() bool { st := k.Stats(); return st.Nodes == 0 && st.Services == 0 })
}

func TestKubeHostNetworkPods(t *testing.T) {
	h := startKube(t, KubeOptions{})
	pods := h.client.CoreV1().Pods("ns")
	if _, err := pods.Create(h.ctx, kpod("agent", "u-agent", at(0), []string{"172.18.0.2"}, withHostNetwork()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "host-network Pod counted", func() bool { return h.k.Stats().HostNetworkPods == 1 })
	if p, ok := h.k.PodByIP(mustAddr("172.18.0.2"), time.Time{}); ok {
		t.Errorf("host-network Pod found by IP: %+v", p)
	}
	if err := pods.Delete(h.ctx, "agent", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "host-network Pod gone", func() bool { return h.k.Stats().HostNetworkPods == 0 })
	if st := h.k.Stats(); st.Pods != 0 || st.DeletedPods != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

// The handlers are called directly with the tombstones that informers
// deliver for deletions they inferred from a relist.
func TestKubeTombstones(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	k := NewKube(fake.NewClientset(), KubeOptions{Now: clock.Now, Logger: (&logBuffer{}).logger()})
	a := kpod("a", "u-a", at(0), []string{"10.0.0.1"})
	b := kpod("b", "u-b", at(0), []string{"10.0.0.2"})
	host := kpod("host", "u-host", at(0), []string{"172.18.0.2"}, withHostNetwork())
	for _, p := range []*corev1.Pod{a, b, host} {
		obj, _ := trimObject(p)
		k.onPodAdd(obj, true)
	}
	k.onNodeAdd(knode("n1", "u-n1", "172.18.0.2"), true)
	k.onNodeAdd(knode("n2", "u-n2", "172.18.0.3"), true)
	k.onServiceAdd(kservice("s1", "u-s1", "10.96.0.1"), true)
	k.onServiceAdd(kservice("s2", "u-s2", "10.96.0.2"), true)
	k.flush()
	if st := k.Stats(); st.Pods != 2 || st.HostNetworkPods != 1 || st.Nodes != 2 || st.Services != 2 {
		t.Fatalf("Stats = %+v", st)
	}

	clock.Set(at(2 * time.Hour))
	// With the last known object, and without it (the key only).
	k.onPodDelete(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: a})
	k.onPodDelete(cache.DeletedFinalStateUnknown{Key: "ns/b"})
	k.onPodDelete(cache.DeletedFinalStateUnknown{Key: "ns/host", Obj: host})
	k.onPodDelete(cache.DeletedFinalStateUnknown{Key: "ns/missing"})
	k.onNodeDelete(cache.DeletedFinalStateUnknown{Key: "n1", Obj: knode("n1", "u-n1", "172.18.0.2")})
	k.onNodeDelete(cache.DeletedFinalStateUnknown{Key: "n2"})
	k.onServiceDelete(cache.DeletedFinalStateUnknown{Key: "ns/s1", Obj: kservice("s1", "u-s1")})
	k.onServiceDelete(cache.DeletedFinalStateUnknown{Key: "ns/s2"})
	k.onServiceDelete(cache.DeletedFinalStateUnknown{Key: "a/b/c"}) // malformed: ignored
	k.flush()

	st := k.Stats()
	if st.Pods != 0 || st.DeletedPods != 2 || st.HostNetworkPods != 0 || st.Tombstones != 9 {
		t.Errorf("Stats = %+v", st)
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		p, ok := k.PodByIP(mustAddr(ip), at(time.Minute))
		if !ok || !p.Deleted.Equal(at(2*time.Hour)) {
			t.Errorf("PodByIP(%s) = %+v, %v; want deleted at 2h", ip, p, ok)
		}
	}
	// Deleted Nodes and Services are remembered, then forgotten.
	for _, name := range []string{"n1", "n2"} {
		if _, ok := k.NodeByName(name); !ok {
			t.Errorf("Node %s forgotten", name)
		}
	}
	k.t.expire(at(2*time.Hour + DefaultRetention))
	if st := k.Stats(); st.DeletedPods != 0 || st.Nodes != 0 || st.Services != 0 {
		t.Errorf("after expiry: Stats = %+v", st)
	}
}

// A relist after a watch gap reports a Pod deleted and created again under
// the same name as an update whose UID changed.
func TestKubeUpdateWithNewUID(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	k := NewKube(fake.NewClientset(), KubeOptions{Now: clock.Now, Logger: (&logBuffer{}).logger()})
	first := kpod("web-0", "u-1", at(0), []string{"10.0.0.1"})
	k.onPodAdd(first, true)
	k.flush()
	clock.Set(at(2 * time.Hour))
	second := kpod("web-0", "u-2", at(2*time.Hour-time.Minute), []string{"10.0.0.1"})
	k.onPodUpdate(first, second)
	k.flush()
	if got := podName(k.PodByIP(mustAddr("10.0.0.1"), at(time.Minute))); got != "ns/web-0" {
		t.Fatalf("old Pod not found: %s", got)
	}
	p, _ := k.PodByIP(mustAddr("10.0.0.1"), at(time.Minute))
	q, _ := k.PodByIP(mustAddr("10.0.0.1"), time.Time{})
	if p.UID != "u-1" || !p.Deleted.Equal(at(2*time.Hour)) || q.UID != "u-2" || !q.Deleted.IsZero() {
		t.Errorf("old = %+v, new = %+v", p, q)
	}
}

func TestKubeConcurrentLookupsDuringChurn(t *testing.T) {
	h := startKube(t, KubeOptions{Retention: time.Hour, BatchInterval: 5 * time.Millisecond},
		kpod("stable", "u-stable", at(0), []string{"10.0.0.1"}, withLabels(map[string]string{"app": "stable"})))
	k, pods := h.k, h.client.CoreV1().Pods("ns")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	var wg sync.WaitGroup
	var lookups atomic.Int64
	errs := make(chan string, 8)
	// Two readers, yielding between rounds: the machine may have two cores,
	// and the writers (the fake API server and the informers) need some.
	for range 2 {
		wg.Go(func() {
			for ; ctx.Err() == nil; runtime.Gosched() {
				p, ok := k.PodByIP(mustAddr("10.0.0.1"), at(time.Minute))
				if !ok || p.Name != "stable" || p.LabelsJSON() != `{"app":"stable"}` {
					errs <- fmt.Sprintf("PodByIP(10.0.0.1) = %+v, %v", p, ok)
					return
				}
				for i := range 50 {
					if p, ok := k.PodByIP(netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), time.Time{}); ok && p.NodeName != "n1" {
						errs <- fmt.Sprintf("churned Pod %+v", p)
						return
					}
				}
				k.NodeByName("n1")
				k.ServiceByName("ns", "svc")
				k.Stats()
				lookups.Add(1)
			}
		})
	}

	const n = 200
	for i := range n {
		ip := fmt.Sprintf("10.1.0.%d", i%50)
		name := fmt.Sprintf("churn-%d", i)
		if _, err := pods.Create(h.ctx, kpod(name, "u-"+name, at(time.Duration(i)*time.Second), []string{ip}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i >= 50 {
			if err := pods.Delete(h.ctx, fmt.Sprintf("churn-%d", i-50), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.WaitFor(t, "churn applied", func() bool {
		st := k.Stats()
		return st.Pods == 51 && st.DeletedPods == n-50
	})
	stop()
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if lookups.Load() == 0 {
		t.Error("no look-ups ran")
	}
	// Every IP resolves to its latest Pod.
	for i := n - 50; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(i % 50)})
		if got, want := podName(k.PodByIP(ip, time.Time{})), fmt.Sprintf("ns/churn-%d", i); got != want {
			t.Errorf("PodByIP(%v) = %s, want %s", ip, got, want)
		}
	}
	if st := k.Stats(); st.Rebuilds >= uint64(n+n-50) {
		t.Errorf("Rebuilds = %d: events were not batched", st.Rebuilds)
	}
}

// A list that fails makes the sync time out: Ready is closed, the failure is
// logged, and the data comes once the list succeeds.
func TestKubeSyncTimeout(t *testing.T) {
	client := fake.NewClientset(kpod("web", "u-web", at(0), []string{"10.0.0.1"}))
	var failing atomic.Bool
	failing.Store(true)
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("pods is forbidden: test")
		}
		return false, nil, nil
	})
	logs := &logBuffer{}
	k := NewKube(client, KubeOptions{SyncTimeout: 200 * time.Millisecond, Logger: logs.logger()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case <-k.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("Ready not closed after the sync timeout")
	}
	if k.HasSynced() {
		t.Fatal("HasSynced with a failing list")
	}
	testkit.WaitFor(t, "timeout logged", func() bool {
		return strings.Contains(logs.String(), "initial lists not complete") && k.Stats().WatchErrors > 0
	})
	if logs := logs.String(); !strings.Contains(logs, "missing=pods") || !strings.Contains(logs, "pods is forbidden") {
		t.Errorf("log lacks the missing kind or the list error:\n%s", logs)
	}
	if st := k.Stats(); !strings.Contains(st.LastWatchError, "forbidden") {
		t.Errorf("LastWatchError = %q", st.LastWatchError)
	}

	failing.Store(false)
	testkit.WaitFor(t, "late sync", k.HasSynced)
	if _, ok := k.PodByIP(mustAddr("10.0.0.1"), time.Time{}); !ok {
		t.Error("Pod not found after the late sync")
	}
}

func TestKubeRunTwice(t *testing.T) {
	h := startKube(t, KubeOptions{})
	if err := h.k.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
}

func TestTrimObject(t *testing.T) {
	p := kpod("web", "u-web", at(0), []string{"10.0.0.1"}, withLabels(map[string]string{"app": "web"}))
	p.ResourceVersion = "42"
	obj, err := trimObject(p)
	if err != nil {
		t.Fatal(err)
	}
	tp := obj.(*corev1.Pod)
	if tp.Annotations != nil || tp.ManagedFields != nil || tp.Spec.Containers != nil {
		t.Errorf("not trimmed: %+v", tp)
	}
	if tp.Name != "web" || tp.Namespace != "ns" || tp.UID != "u-web" || tp.ResourceVersion != "42" ||
		tp.Labels["app"] != "web" || tp.Spec.NodeName != "n1" || tp.Status.PodIP != "10.0.0.1" || tp.Status.Phase != corev1.PodRunning ||
		len(tp.Status.PodIPs) != 1 || !tp.CreationTimestamp.Equal(&p.CreationTimestamp) {
		t.Errorf("lost a field Sluice reads: %+v", tp)
	}
	again, _ := trimObject(tp)
	if !samePod(tp, again.(*corev1.Pod)) {
		t.Error("trimObject not idempotent")
	}
	if a, b := convertPod(tp, nil), convertPod(p, nil); fmt.Sprint(*a) != fmt.Sprint(*b) {
		t.Errorf("trimmed Pod converts to %+v, the full one to %+v", *a, *b)
	}

	n, _ := trimObject(knode("n1", "u-n1", "172.18.0.2", "10.0.0.0/24"))
	if tn := n.(*corev1.Node); len(tn.Status.Addresses) != 1 || tn.Status.Addresses[0].Type != corev1.NodeInternalIP ||
		!sameNode(convertNode(tn, nil), convertNode(knode("n1", "u-n1", "172.18.0.2", "10.0.0.0/24"), nil)) {
		t.Errorf("trimmed Node = %+v", tn)
	}
	s, _ := trimObject(kservice("svc", "u-svc", "10.96.0.10"))
	if ts := s.(*corev1.Service); len(ts.Spec.Ports) != 1 || ts.Spec.Selector != nil || ts.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("trimmed Service = %+v", ts)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: tp}
	if got, _ := trimObject(tomb); got != any(tomb) {
		t.Errorf("tombstone changed: %+v", got)
	}
}

func TestConvertInvalidAddresses(t *testing.T) {
	var invalid atomic.Uint64
	p := convertPod(kpod("web", "u", at(0), []string{"10.0.0.1", "bogus", "::ffff:10.0.0.1"}), &invalid)
	if !slices.Equal(p.IPs, []netip.Addr{mustAddr("10.0.0.1")}) {
		t.Errorf("IPs = %v", p.IPs)
	}
	// status.podIP is the fallback when status.podIPs is empty.
	old := kpod("old", "u", at(0), nil)
	old.Status.PodIP = "10.0.0.9"
	if p := convertPod(old, &invalid); !slices.Equal(p.IPs, []netip.Addr{mustAddr("10.0.0.9")}) {
		t.Errorf("IPs from podIP = %v", p.IPs)
	}
	n := convertNode(knode("n1", "u", "not-an-ip", "10.0.0.0/33"), &invalid)
	if n.InternalIP.IsValid() || len(n.PodCIDRs) != 0 {
		t.Errorf("Node = %+v", n)
	}
	s := convertService(kservice("svc", "u", "10.96.0.300"), &invalid)
	if len(s.ClusterIPs) != 0 {
		t.Errorf("Service = %+v", s)
	}
	if got := invalid.Load(); got != 4 {
		t.Errorf("invalid = %d, want 4", got)
	}
}

func TestKubeConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
users:
- name: test
  user:
    token: secret-token
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := KubeConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.BearerToken != "secret-token" ||
		cfg.ContentType != "application/vnd.kubernetes.protobuf" || cfg.UserAgent != "sluice" {
		t.Errorf("config = host %q, content type %q, user agent %q", cfg.Host, cfg.ContentType, cfg.UserAgent)
	}

	if _, err := KubeConfig(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing kubeconfig: %v", err)
	}

	// Outside a cluster an empty path is an error that says what to do.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := KubeConfig(""); err == nil || !strings.Contains(err.Error(), "sluice.kubeconfig") {
		t.Errorf("no configuration: %v", err)
	}
}

// TestKubeInitialSync10k measures the initial sync of 10,000 Pods from the
// fake clientset and checks that it costs one snapshot rebuild.
func TestKubeInitialSync10k(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	const n = 10000
	objs := make([]kruntime.Object, 0, n)
	for i := range n {
		objs = append(objs, kpod(fmt.Sprintf("p%d", i), fmt.Sprintf("u%d", i), at(0),
			[]string{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()},
			withLabels(map[string]string{"app": fmt.Sprintf("a%d", i%100)})))
	}
	start := time.Now()
	h := startKube(t, KubeOptions{}, objs...)
	elapsed := time.Since(start)
	st := h.k.Stats()
	t.Logf("initial sync of %d Pods: %v (Run to synced: %v), %d rebuild(s)", n, elapsed.Round(time.Millisecond),
		st.SyncDuration.Round(time.Millisecond), st.Rebuilds)
	if st.Pods != n || st.Rebuilds != 1 {
		t.Errorf("Stats = %+v", st)
	}
	if p, ok := h.k.PodByIP(mustAddr("10.0.39.15"), time.Time{}); !ok || p.Name != "p9999" {
		t.Errorf("PodByIP = %+v, %v", p, ok)
	}
}

// BenchmarkKubeInitialSync is the initial sync of 10,000 Pods from the fake
// clientset, from Run to HasSynced.
func BenchmarkKubeInitialSync(b *testing.B) {
	const n = 10000
	objs := make([]kruntime.Object, 0, n)
	for i := range n {
		objs = append(objs, kpod(fmt.Sprintf("p%d", i), fmt.Sprintf("u%d", i), at(0),
			[]string{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()}))
	}
	client := fake.NewClientset(objs...)
	b.ResetTimer()
	for b.Loop() {
		k := NewKube(client, KubeOptions{Logger: (&logBuffer{}).logger()})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- k.Run(ctx) }()
		for !k.HasSynced() {
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
	}
}

// BenchmarkKubeEventPerRebuild is what batching avoids: 10,000 Pods applied
// one tracker update (snapshot rebuild) each.
func BenchmarkKubeEventPerRebuild(b *testing.B) {
	const n = 10000
	pods := make([]*Pod, n)
	for i := range n {
		pods[i] = convertPod(kpod(fmt.Sprintf("p%d", i), fmt.Sprintf("u%d", i), at(0),
			[]string{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}).String()}), nil)
	}
	for b.Loop() {
		tr := newTracker(DefaultRetention)
		for _, p := range pods {
			tr.update(at(time.Hour), func(tx *txn) { tx.setPod(p) })
		}
	}
}

func withOwner(kind, name string, controller bool) kpodOpt {
	return func(p *corev1.Pod) {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind,
			Name: name, UID: types.UID("u-" + name), Controller: &controller})
	}
}

// TestKubePodWorkload: through the informers and their trim, a Pod's
// workload is its controller, a Deployment's ReplicaSet read as the
// Deployment (its name less the pod-template-hash), whatever the Pod's
// name looks like; a Pod without a controller has none. An adoption (the
// controller set later) is an update that is seen.
func TestKubePodWorkload(t *testing.T) {
	hash := map[string]string{"pod-template-hash": "564c497b9d"}
	cases := []struct {
		pod  *corev1.Pod
		want Workload
	}{
		// A suffix without a digit: name parsing cannot tell it.
		{kpod("server-564c497b9d-hhbdl", "u1", at(0), []string{"10.0.0.1"}, withLabels(hash),
			withOwner("ReplicaSet", "server-564c497b9d", true)), Workload{"Deployment", "server"}},
		{kpod("cache-0", "u2", at(0), []string{"10.0.0.2"}, withOwner("StatefulSet", "cache", true)), Workload{"StatefulSet", "cache"}},
		{kpod("agent-x7k2p", "u3", at(0), []string{"10.0.0.3"}, withOwner("DaemonSet", "agent", true)), Workload{"DaemonSet", "agent"}},
		{kpod("migrate-29012345-abcde", "u4", at(0), []string{"10.0.0.4"}, withOwner("Job", "migrate-29012345", true)), Workload{"Job", "migrate-29012345"}},
		// A ReplicaSet of its own (no pod-template-hash): kept as it is.
		{kpod("rs-abcde", "u5", at(0), []string{"10.0.0.5"}, withOwner("ReplicaSet", "rs", true)), Workload{"ReplicaSet", "rs"}},
		// An owner that is not the controller does not name a workload.
		{kpod("loose-abcde", "u6", at(0), []string{"10.0.0.6"}, withOwner("ReplicaSet", "loose", false)), Workload{}},
		{kpod("bare", "u7", at(0), []string{"10.0.0.7"}), Workload{}},
	}
	var objs []kruntime.Object
	for _, c := range cases {
		objs = append(objs, c.pod)
	}
	h := startKube(t, KubeOptions{}, objs...)
	for _, c := range cases {
		p, ok := h.k.PodByIP(mustAddr(c.pod.Status.PodIP), time.Time{})
		if !ok || p.Workload != c.want || p.Workload.Known() != (c.want != Workload{}) {
			t.Errorf("Pod %s: workload %+v (found %v), want %+v", c.pod.Name, p.Workload, ok, c.want)
		}
	}

	bare := cases[len(cases)-1].pod
	withOwner("StatefulSet", "adopter", true)(bare)
	if _, err := h.client.CoreV1().Pods("ns").Update(h.ctx, bare, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the adoption seen", func() bool {
		p, ok := h.k.PodByIP(mustAddr(bare.Status.PodIP), time.Time{})
		return ok && p.Workload == Workload{"StatefulSet", "adopter"}
	})
}

// TestKubePodUIDChangeIsOneEvent: a Pod deleted and created again under
// its name during a watch gap comes as one update with a new UID. It is
// one event (not an update, a delete and an add), and the old Pod is
// recorded as deleted, the new one as live.
func TestKubePodUIDChangeIsOneEvent(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	k := NewKube(fake.NewClientset(), KubeOptions{Now: clock.Now, Logger: (&logBuffer{}).logger()})
	old := kpod("a", "u-old", at(0), []string{"10.0.0.1"})
	k.onPodAdd(old, true)
	k.flush()
	clock.Set(at(2 * time.Hour))
	renewed := kpod("a", "u-new", at(2*time.Hour), []string{"10.0.0.1"})
	k.onPodUpdate(old, renewed)
	k.flush()
	if st := k.Stats(); st.Events != 2 || st.Pods != 1 || st.DeletedPods != 1 {
		t.Errorf("Stats = %+v, want 2 events (the add and the update), 1 live and 1 deleted Pod", st)
	}
	if p, ok := k.PodByIP(mustAddr("10.0.0.1"), at(time.Minute)); !ok || p.UID != "u-old" || !p.Deleted.Equal(at(2*time.Hour)) {
		t.Errorf("before the change: %+v, %v; want u-old deleted at 2h", p, ok)
	}
	if p, ok := k.PodByIP(mustAddr("10.0.0.1"), at(3*time.Hour)); !ok || p.UID != "u-new" || !p.Deleted.IsZero() {
		t.Errorf("after the change: %+v, %v; want u-new live", p, ok)
	}
}

// TestSamePodOwnerReferences: two versions of a Pod decoded apart hold
// their owner references' booleans in different memory; equal values are
// the same Pod (a pointer comparison re-queued every update of every Pod
// that has a controller).
func TestSamePodOwnerReferences(t *testing.T) {
	yes := func() *bool { b := true; return &b }
	owned := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "u-rs",
			Controller: yes(), BlockOwnerDeletion: yes()}}
	}
	a := kpod("p", "u-p", at(0), []string{"10.0.0.1"}, owned)
	b := a.DeepCopy()
	if !samePod(a, b) {
		t.Error("a Pod and its copy differ")
	}
	no := false
	b.OwnerReferences[0].Controller = &no
	if samePod(a, b) {
		t.Error("a changed controller flag went unseen")
	}
	b.OwnerReferences[0].Controller = nil
	if samePod(a, b) {
		t.Error("a cleared controller flag went unseen")
	}
}

// TestKubeFinishedPodReleasesIP: a Pod that has run to completion (a
// Job's) stays in the API with its status.podIP, but the CNI gives the
// address to new Pods. From the moment it is seen finished it names only
// the flows it made while it ran: a flow from its address afterwards is
// not put on it (so that the exporter looks the address up again until
// the new Pod's IP is posted), and the new Pod has the address.
func TestKubeFinishedPodReleasesIP(t *testing.T) {
	h := startKube(t, KubeOptions{})
	k, pods, ctx := h.k, h.client.CoreV1().Pods("ns"), h.ctx
	ip := mustAddr("10.0.0.1")

	h.clock.Set(at(time.Hour))
	job := kpod("job", "u-job", at(0), []string{"10.0.0.1"})
	if _, err := pods.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the running Pod", func() bool { _, ok := k.PodByIP(ip, at(time.Minute)); return ok })

	// Seen finished at 2h.
	h.clock.Set(at(2 * time.Hour))
	job.Status.Phase = corev1.PodSucceeded
	if _, err := pods.UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the finished Pod", func() bool { return k.Stats().DeletedPods == 1 })
	if got := podName(k.PodByIP(ip, at(90*time.Minute))); got != "ns/job" {
		t.Errorf("a flow of the Pod while it ran: %s, want ns/job", got)
	}
	if p, ok := k.PodByIP(ip, at(2*time.Hour+time.Second)); ok {
		t.Errorf("a flow from its address after it finished: %+v, want none", p)
	}

	// Later changes to the finished Pod, and its deletion, keep the time it
	// finished.
	h.clock.Set(at(2*time.Hour + time.Minute))
	job.Labels = map[string]string{"done": "yes"}
	if _, err := pods.Update(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the label change", func() bool {
		p, ok := k.PodByIP(ip, at(90*time.Minute))
		return ok && p.LabelsJSON() == `{"done":"yes"}`
	})
	if p, _ := k.PodByIP(ip, at(90*time.Minute)); !p.Deleted.Equal(at(2 * time.Hour)) {
		t.Errorf("after a change, the finished Pod's end is %v, want %v", p.Deleted, at(2*time.Hour))
	}

	// The address goes to a new Pod.
	h.clock.Set(at(2*time.Hour + 3*time.Minute))
	if _, err := pods.Create(ctx, kpod("next", "u-next", at(2*time.Hour+2*time.Minute), []string{"10.0.0.1"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the new Pod", func() bool { return k.Stats().Pods == 1 })
	rebuilds := k.Stats().Rebuilds
	if err := pods.Delete(ctx, "job", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the finished Pod's deletion", func() bool { return k.Stats().Rebuilds > rebuilds })
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{at(90 * time.Minute), "ns/job"},
		{at(2*time.Hour + 150*time.Second), "ns/next"},
		{time.Time{}, "ns/next"},
	} {
		if got := podName(k.PodByIP(ip, tc.at)); got != tc.want {
			t.Errorf("PodByIP(%v) = %s, want %s", tc.at, got, tc.want)
		}
	}
	if p, _ := k.PodByIP(ip, at(90*time.Minute)); !p.Deleted.Equal(at(2 * time.Hour)) {
		t.Errorf("after its deletion, the finished Pod's end is %v, want %v", p.Deleted, at(2*time.Hour))
	}
}

// withFinished makes a Pod that ran to completion in phase, its one
// container having ended at end.
func withFinished(phase corev1.PodPhase, end time.Time) kpodOpt {
	return func(p *corev1.Pod) {
		p.Status.Phase = phase
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: metav1.NewTime(end)}}}}
	}
}

// TestKubeFinishedPodEndsWhenItsContainersDid: a finished Pod's address is
// free from when its containers ended, as they report it, not from when
// Sluice hears of it; so a Pod that finished longer ago than the retention
// is forgotten at once, at the first list or at any later change, and
// does not come back.
func TestKubeFinishedPodEndsWhenItsContainersDid(t *testing.T) {
	// Listed at 1h, finished at 30m: past the retention already.
	h := startKube(t, KubeOptions{}, kpod("old-job", "u-old", at(0), []string{"10.0.0.1"}, withFinished(corev1.PodSucceeded, at(30*time.Minute))))
	k, pods, ctx := h.k, h.client.CoreV1().Pods("ns"), h.ctx
	if p, ok := k.PodByIP(mustAddr("10.0.0.1"), at(20*time.Minute)); ok || k.Stats().DeletedPods != 0 {
		t.Errorf("a Pod that finished 30 minutes before the list: %+v, %d remembered; want it forgotten", p, k.Stats().DeletedPods)
	}

	// A Pod failing while watched ends when its container did.
	ip := mustAddr("10.0.0.2")
	job := kpod("job", "u-job", at(0), []string{"10.0.0.2"})
	if _, err := pods.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the running Pod", func() bool { _, ok := k.PodByIP(ip, at(time.Minute)); return ok })
	withFinished(corev1.PodFailed, at(59*time.Minute))(job)
	if _, err := pods.UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the failed Pod", func() bool { p, ok := k.PodByIP(ip, at(58*time.Minute)); return ok && p.Finished })
	if p, ok := k.PodByIP(ip, at(58*time.Minute)); !ok || p.Name != "job" || !p.Deleted.Equal(at(59*time.Minute)) {
		t.Errorf("a flow of the Pod while it ran: %+v, want job, ended at %v", p, at(59*time.Minute))
	}
	if p, ok := k.PodByIP(ip, at(59*time.Minute+time.Second)); ok {
		t.Errorf("a flow from its address after it failed: %+v, want none", p)
	}

	// Past the retention it is forgotten, and a later change to it does
	// not bring it back.
	h.clock.Set(at(59*time.Minute + DefaultRetention))
	testkit.WaitFor(t, "expiry", func() bool { return k.Stats().DeletedPods == 0 })
	rebuilds := k.Stats().Rebuilds
	job.Labels = map[string]string{"seen": "again"}
	if _, err := pods.Update(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the change", func() bool { return k.Stats().Rebuilds > rebuilds })
	if p, ok := k.PodByIP(ip, at(58*time.Minute)); ok || k.Stats().DeletedPods != 0 {
		t.Errorf("after a change past the retention: %+v, %d remembered; want it forgotten", p, k.Stats().DeletedPods)
	}
}
