package enrich

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"sluice/internal/testkit"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// logBuffer collects log output from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testPod struct {
	name, uid, ip string
	created       time.Time
	labels        string // YAML flow mapping, "" for none
	phase         string // "" for Running
	finished      time.Time
}

// listYAML renders Pods in namespace "ns", plus Node n1 and Service ns/svc
// unless left out, as `kubectl get ... -o yaml` would.
func listYAML(withNodeAndService bool, pods ...testPod) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nitems:\n")
	for _, p := range pods {
		fmt.Fprintf(&b, "- apiVersion: v1\n  kind: Pod\n  metadata:\n    creationTimestamp: %q\n", p.created.Format(time.RFC3339))
		if p.labels != "" {
			fmt.Fprintf(&b, "    labels: %s\n", p.labels)
		}
		fmt.Fprintf(&b, "    name: %s\n    namespace: ns\n    uid: %s\n  spec:\n    nodeName: n1\n", p.name, p.uid)
		phase := cmp.Or(p.phase, "Running")
		fmt.Fprintf(&b, "  status:\n    phase: %s\n    podIP: %s\n    podIPs:\n    - ip: %s\n", phase, p.ip, p.ip)
		if !p.finished.IsZero() {
			fmt.Fprintf(&b, "    containerStatuses:\n    - name: c\n      state:\n        terminated:\n          exitCode: 0\n          finishedAt: %q\n", p.finished.Format(time.RFC3339))
		}
	}
	if withNodeAndService {
		b.WriteString("- apiVersion: v1\n  kind: Node\n  metadata:\n    name: n1\n    uid: un1\n  status:\n    addresses:\n    - address: 172.18.0.2\n      type: InternalIP\n")
		b.WriteString("- apiVersion: v1\n  kind: Service\n  metadata:\n    name: svc\n    namespace: ns\n    uid: us1\n  spec:\n    clusterIP: 10.96.0.10\n")
	}
	b.WriteString("kind: List\nmetadata:\n  resourceVersion: \"\"\n")
	return b.String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write a temporary file and rename it over the inventory, as the
	// documentation recommends.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newTestInventory(t *testing.T, content string, opts InventoryOptions) (*Inventory, string, *logBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	writeFile(t, path, content)
	logs := &logBuffer{}
	if opts.Logger == nil {
		opts.Logger = logs.logger()
	}
	inv, err := NewInventory(path, opts)
	if err != nil {
		t.Fatalf("NewInventory: %v", err)
	}
	return inv, path, logs
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestInventoryFixture(t *testing.T) {
	inv, err := NewInventory("testdata/inventory.yaml", InventoryOptions{Logger: (&logBuffer{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ip, pod, node, uid, labels string
	}{
		{"10.244.1.12", "default/frontend-6d4cf56db6-8xk2p", "kind-worker", "6f4b2d80-1e9c-47a3-b5d2-8c0e7a3f1b46",
			`{"app":"frontend","pod-template-hash":"6d4cf56db6","tier":"web"}`},
		{"10.244.2.7", "default/frontend-6d4cf56db6-q7m4n", "kind-worker2", "d2c7a915-6e3f-4b81-9a0d-4f5e8b2c7a19",
			`{"app":"frontend","pod-template-hash":"6d4cf56db6","tier":"web"}`},
		{"10.244.1.13", "default/backend-0", "kind-worker", "3c9e1f27-5a4b-4d8e-b6f1-7a2c9d0e4b13",
			`{"app":"backend","apps.kubernetes.io/pod-index":"0","controller-revision-hash":"backend-5f7c8d9b44","statefulset.kubernetes.io/pod-name":"backend-0"}`},
		{"10.244.2.9", "default/debug", "kind-worker2", "9a1d7e44-0c2b-4f6e-8d3a-5b7e2c1f9d68", `{}`},
		{"10.244.0.3", "kube-system/coredns-5d78c9869d-2hcl4", "kind-control-plane", "4e8a0b63-9d2f-41c7-a5e8-0b3d6f9c2a74",
			`{"k8s-app":"kube-dns","pod-template-hash":"5d78c9869d"}`},
		{"10.244.0.4", "kube-system/coredns-5d78c9869d-wz9rx", "kind-control-plane", "a7d3f148-2c6b-4e90-b1f5-9e4a7c0d3b26",
			`{"k8s-app":"kube-dns","pod-template-hash":"5d78c9869d"}`},
		{"10.244.2.15", "monitoring/prometheus-k8s-0", "kind-worker2", "7b2e9f04-3d8c-4a51-b7e6-0c5f2a9d8e37",
			`{"app.kubernetes.io/component":"prometheus","app.kubernetes.io/instance":"k8s","app.kubernetes.io/name":"prometheus","app.kubernetes.io/part-of":"kube-prometheus","statefulset.kubernetes.io/pod-name":"prometheus-k8s-0"}`},
		{"10.244.1.20", "shop/cart-7b9f8d6c5-jx2lq", "kind-worker", "5d0a3e86-2f7b-4c19-9e4d-6a8b1f3c0e52",
			`{"app":"cart","pod-template-hash":"7b9f8d6c5","version":"v3"}`},
		{"fd00:10:244:1::14", "shop/cart-7b9f8d6c5-jx2lq", "kind-worker", "5d0a3e86-2f7b-4c19-9e4d-6a8b1f3c0e52",
			`{"app":"cart","pod-template-hash":"7b9f8d6c5","version":"v3"}`},
		{"::ffff:10.244.1.20", "shop/cart-7b9f8d6c5-jx2lq", "kind-worker", "5d0a3e86-2f7b-4c19-9e4d-6a8b1f3c0e52",
			`{"app":"cart","pod-template-hash":"7b9f8d6c5","version":"v3"}`},
	} {
		p, ok := inv.PodByIP(mustAddr(tc.ip), time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC))
		if got := podName(p, ok); got != tc.pod {
			t.Errorf("PodByIP(%s) = %s, want %s", tc.ip, got, tc.pod)
			continue
		}
		if p.NodeName != tc.node || p.UID != tc.uid || p.LabelsJSON() != tc.labels {
			t.Errorf("PodByIP(%s) = node %q uid %q labels %s, want %q %q %s", tc.ip, p.NodeName, p.UID, p.LabelsJSON(), tc.node, tc.uid, tc.labels)
		}
		if !p.Deleted.IsZero() {
			t.Errorf("PodByIP(%s) is deleted", tc.ip)
		}
	}
	p, _ := inv.PodByIP(mustAddr("10.244.1.20"), time.Time{})
	if want := time.Date(2026, 3, 4, 10, 31, 2, 0, time.UTC); !p.Created.Equal(want) {
		t.Errorf("Created = %v, want %v", p.Created, want)
	}
	if want := []netip.Addr{mustAddr("10.244.1.20"), mustAddr("fd00:10:244:1::14")}; !slices.Equal(p.IPs, want) {
		t.Errorf("IPs = %v, want %v", p.IPs, want)
	}
	// The hostNetwork etcd Pod is not indexed: its addresses are the Node's.
	for _, ip := range []string{"172.18.0.4", "fc00:f853:ccd:e793::4", "10.244.9.9"} {
		if p, ok := inv.PodByIP(mustAddr(ip), time.Time{}); ok {
			t.Errorf("PodByIP(%s) = %s/%s, want none", ip, p.Namespace, p.Name)
		}
	}

	for _, tc := range []struct {
		name, uid, ip string
		cidrs         []string
	}{
		{"kind-control-plane", "2b5e8d41-7c3a-4f96-b0e2-5d8a1c4f7e93", "172.18.0.4", []string{"10.244.0.0/24", "fd00:10:244::/64"}},
		{"kind-worker", "6a1c4e97-8b3d-4f25-a0e6-9c2d7b5f1a38", "172.18.0.3", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		{"kind-worker2", "f0d8b5a2-4e7c-4391-8b6f-1a3e9d2c5b74", "172.18.0.2", []string{"10.244.2.0/24"}},
	} {
		n, ok := inv.NodeByName(tc.name)
		if !ok {
			t.Errorf("NodeByName(%s) not found", tc.name)
			continue
		}
		var cidrs []string
		for _, c := range n.PodCIDRs {
			cidrs = append(cidrs, c.String())
		}
		if n.UID != tc.uid || n.InternalIP.String() != tc.ip || !slices.Equal(cidrs, tc.cidrs) {
			t.Errorf("NodeByName(%s) = %+v", tc.name, n)
		}
	}

	if s, ok := inv.ServiceByName("default", "kubernetes"); !ok || s.UID != "8e3b1d60-9a2f-4c57-b4e8-0d6c3a9f2e15" ||
		!slices.Equal(s.ClusterIPs, []netip.Addr{mustAddr("10.96.0.1")}) {
		t.Errorf("ServiceByName(default, kubernetes) = %+v, %v", s, ok)
	}
	if s, ok := inv.ServiceByName("shop", "cart"); !ok || s.UID != "2c7f0a94-6d1e-4b83-a9c5-3e8d0b2f6a17" ||
		!slices.Equal(s.ClusterIPs, []netip.Addr{mustAddr("10.96.120.33"), mustAddr("fd00:10:96::5c1a")}) {
		t.Errorf("ServiceByName(shop, cart) = %+v, %v", s, ok)
	}
	for _, ip := range []string{"10.96.120.33", "fd00:10:96::5c1a", "::ffff:10.96.120.33"} {
		s, ok := inv.ServiceByClusterIP(mustAddr(ip))
		if !ok || s.Name != "cart" {
			t.Errorf("ServiceByClusterIP(%s) = %+v, %v", ip, s, ok)
			continue
		}
		if name, ok := s.PortName(6, 7070); !ok || name != "shop/cart:grpc" {
			t.Errorf("PortName(TCP, 7070) = %q, %v", name, ok)
		}
		if _, ok := s.PortName(17, 7070); ok {
			t.Error("a TCP port answered for UDP")
		}
	}
	if s, ok := inv.ServiceByClusterIP(mustAddr("10.96.120.34")); ok {
		t.Errorf("ServiceByClusterIP(unknown) = %+v", s)
	}

	st := inv.Stats()
	// 10 Pods: the hostNetwork one is left out; the Pending one, without an IP, is counted.
	if st.Pods != 9 || st.DeletedPods != 0 || st.Nodes != 3 || st.Services != 2 || st.HostNetworkPods != 1 ||
		st.Loads != 1 || st.LoadErrors != 0 || st.Ignored != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestInventoryReloadDeletionAndReuse(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	a := testPod{name: "a", uid: "ua", ip: "10.0.0.1", created: at(0), labels: "{app: a}"}
	b := testPod{name: "b", uid: "ub", ip: "10.0.0.2", created: at(0)}
	inv, path, logs := newTestInventory(t, listYAML(true, a, b), InventoryOptions{Now: clock.Now})
	ctx := context.Background()

	// At 2h, a is gone and b's IP belongs to c, created at 1h50m.
	deletedAt := at(2 * time.Hour)
	clock.Set(deletedAt)
	c := testPod{name: "c", uid: "uc", ip: "10.0.0.2", created: at(110 * time.Minute)}
	writeFile(t, path, listYAML(true, c))
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		ip   string
		at   time.Time
		want string
	}{
		{"10.0.0.1", at(90 * time.Minute), "ns/a"},    // flow started before the deletion
		{"10.0.0.1", time.Time{}, "ns/a"},             // unknown start: the recently deleted Pod
		{"10.0.0.1", at(121 * time.Minute), "<none>"}, // started after it was gone
		{"10.0.0.2", at(90 * time.Minute), "ns/b"},    // reused IP: the Pod of the time
		{"10.0.0.2", at(115 * time.Minute), "ns/c"},   // c was created before the deletion was noticed
		{"10.0.0.2", at(3 * time.Hour), "ns/c"},
		{"10.0.0.2", time.Time{}, "ns/c"},
	} {
		if got := podName(inv.PodByIP(mustAddr(tc.ip), tc.at)); got != tc.want {
			t.Errorf("PodByIP(%s, %v) = %s, want %s", tc.ip, tc.at, got, tc.want)
		}
	}
	p, _ := inv.PodByIP(mustAddr("10.0.0.1"), time.Time{})
	if !p.Deleted.Equal(deletedAt) || p.LabelsJSON() != `{"app":"a"}` {
		t.Errorf("deleted pod = %+v, labels %s", p, p.LabelsJSON())
	}
	if st := inv.Stats(); st.Pods != 1 || st.DeletedPods != 2 || st.Loads != 2 {
		t.Errorf("Stats = %+v", st)
	}

	// Just before the retention ends, everything is still there.
	clock.Set(deletedAt.Add(DefaultRetention - time.Nanosecond))
	inv.poll(ctx)
	if got := podName(inv.PodByIP(mustAddr("10.0.0.1"), at(90*time.Minute))); got != "ns/a" {
		t.Errorf("within retention: %s", got)
	}
	// Then the deleted Pods are forgotten.
	clock.Set(deletedAt.Add(DefaultRetention))
	inv.poll(ctx)
	if got := podName(inv.PodByIP(mustAddr("10.0.0.1"), at(90*time.Minute))); got != "<none>" {
		t.Errorf("after retention: %s", got)
	}
	if got := podName(inv.PodByIP(mustAddr("10.0.0.2"), at(90*time.Minute))); got != "ns/c" {
		t.Errorf("after retention, reused IP: %s, want the live Pod", got)
	}
	if st := inv.Stats(); st.Pods != 1 || st.DeletedPods != 0 {
		t.Errorf("Stats = %+v", st)
	}
	if !strings.Contains(logs.String(), "inventory loaded") {
		t.Errorf("no load logged:\n%s", logs)
	}
}

func TestInventoryNodeAndServiceDeletion(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	opts := InventoryOptions{Now: clock.Now, Retention: time.Minute}
	inv, path, _ := newTestInventory(t, listYAML(true), opts)
	ctx := context.Background()

	clock.Set(at(time.Hour))
	writeFile(t, path, listYAML(false))
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := inv.NodeByName("n1"); !ok {
		t.Error("deleted Node forgotten within retention")
	}
	if _, ok := inv.ServiceByName("ns", "svc"); !ok {
		t.Error("deleted Service forgotten within retention")
	}
	clock.Set(at(time.Hour + time.Minute))
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := inv.NodeByName("n1"); ok {
		t.Error("deleted Node remembered after retention")
	}
	if _, ok := inv.ServiceByName("ns", "svc"); ok {
		t.Error("deleted Service remembered after retention")
	}
}

func TestInventoryPodComesBack(t *testing.T) {
	clock := &fakeClock{t: at(0)}
	a := testPod{name: "a", uid: "ua", ip: "10.0.0.1", created: at(0)}
	inv, path, _ := newTestInventory(t, listYAML(true, a), InventoryOptions{Now: clock.Now})
	ctx := context.Background()

	// A half-written file that lacks the Pod, then the full file again.
	clock.Set(at(time.Minute))
	writeFile(t, path, listYAML(true))
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Set(at(2 * time.Minute))
	writeFile(t, path, listYAML(true, a))
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	p, ok := inv.PodByIP(mustAddr("10.0.0.1"), at(3*time.Minute))
	if !ok || !p.Deleted.IsZero() {
		t.Errorf("PodByIP = %+v, %v; want the live Pod", p, ok)
	}
	if st := inv.Stats(); st.Pods != 1 || st.DeletedPods != 0 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestInventoryBadReloadKeepsData(t *testing.T) {
	a := testPod{name: "a", uid: "ua", ip: "10.0.0.1", created: at(0)}
	good := listYAML(true, a)
	inv, path, logs := newTestInventory(t, good, InventoryOptions{})
	ctx := context.Background()

	for i, bad := range []string{
		"apiVersion: v1\nitems:\n- kind: Pod\n  metadata: {name: x\n", // YAML syntax
		strings.ReplaceAll(good, "10.0.0.1", "10.0.0.256"),            // bad address
		"", // truncated to nothing
	} {
		writeFile(t, path, bad)
		if err := inv.Reload(ctx); err == nil {
			t.Errorf("bad file %d loaded", i)
		}
		if got := podName(inv.PodByIP(mustAddr("10.0.0.1"), time.Time{})); got != "ns/a" {
			t.Errorf("after bad file %d: PodByIP = %s", i, got)
		}
		if _, ok := inv.NodeByName("n1"); !ok {
			t.Errorf("after bad file %d: node lost", i)
		}
		st := inv.Stats()
		if st.LoadErrors != uint64(i+1) || st.LastError == "" || st.Loads != 1 || st.Pods != 1 {
			t.Errorf("after bad file %d: Stats = %+v", i, st)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := inv.Reload(ctx); err == nil {
		t.Error("missing file loaded")
	}
	if n := strings.Count(logs.String(), "inventory reload failed"); n != 4 {
		t.Errorf("%d failures logged, want 4:\n%s", n, logs)
	}

	// The same content as loaded: nothing to do, and the error is cleared.
	writeFile(t, path, good)
	if err := inv.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if st := inv.Stats(); st.LastError != "" || st.Loads != 1 || st.LoadErrors != 4 {
		t.Errorf("Stats = %+v", st)
	}
}

func TestNewInventoryErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewInventory(filepath.Join(dir, "missing.yaml"), InventoryOptions{}); err == nil {
		t.Error("missing file: no error")
	}
	bad := filepath.Join(dir, "bad.yaml")
	writeFile(t, bad, "kind: Pod\nmetadata: {name: a}\nstatus: {podIP: x}\n")
	if _, err := NewInventory(bad, InventoryOptions{}); err == nil || !strings.Contains(err.Error(), "status.podIP") {
		t.Errorf("bad file: err = %v", err)
	}
	writeFile(t, bad, "kind: Pod\nmetadata: {name: a}\nstatus: {phase: Succeeded, containerStatuses: [{state: {terminated: {finishedAt: yesterday}}}]}\n")
	if _, err := NewInventory(bad, InventoryOptions{}); err == nil || !strings.Contains(err.Error(), "finishedAt") {
		t.Errorf("bad finishedAt: err = %v", err)
	}
	good := filepath.Join(dir, "good.yaml")
	writeFile(t, good, listYAML(true))
	if _, err := NewInventory(good, InventoryOptions{Interval: -time.Second}); err == nil {
		t.Error("negative interval accepted")
	}
	if _, err := NewInventory(good, InventoryOptions{Retention: -time.Second}); err == nil {
		t.Error("negative retention accepted")
	}
}

// TestInventoryRunFollowsFile runs in a synctest bubble: its clock
// moves only when every goroutine waits, so "ten poll intervals have
// passed" is a wait for exactly that, not a guess.
func TestInventoryRunFollowsFile(t *testing.T) {
	synctest.Test(t, testInventoryRunFollowsFile)
}

func testInventoryRunFollowsFile(t *testing.T) {
	// pollsPass returns once Run has polled the file ten more times.
	pollsPass := func() {
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
	}
	a := testPod{name: "a", uid: "ua", ip: "10.0.0.1", created: at(0)}
	inv, path, logs := newTestInventory(t, listYAML(true, a), InventoryOptions{Interval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()

	// A changed file is picked up.
	b := testPod{name: "b", uid: "ub", ip: "10.0.0.2", created: at(0)}
	writeFile(t, path, listYAML(true, a, b))
	testkit.WaitFor(t, "pod b", func() bool { _, ok := inv.PodByIP(mustAddr("10.0.0.2"), time.Time{}); return ok })

	// A broken file is reported once, however many times it is polled.
	writeFile(t, path, "kind: List\nitems: [\n")
	testkit.WaitFor(t, "load error", func() bool { return inv.Stats().LoadErrors == 1 })
	pollsPass()
	if st := inv.Stats(); st.LoadErrors != 1 {
		t.Errorf("LoadErrors = %d, want 1", st.LoadErrors)
	}
	if _, ok := inv.PodByIP(mustAddr("10.0.0.2"), time.Time{}); !ok {
		t.Error("data lost after a broken file")
	}

	// A missing file, too; when it comes back it is loaded.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "missing file error", func() bool { return inv.Stats().LoadErrors == 2 })
	pollsPass()
	if st := inv.Stats(); st.LoadErrors != 2 {
		t.Errorf("LoadErrors = %d, want 2", st.LoadErrors)
	}
	writeFile(t, path, listYAML(true, b))
	testkit.WaitFor(t, "pod a deleted", func() bool {
		p, ok := inv.PodByIP(mustAddr("10.0.0.1"), time.Time{})
		return ok && !p.Deleted.IsZero()
	})
	if st := inv.Stats(); st.Loads != 3 || st.LastError != "" {
		t.Errorf("Stats = %+v", st)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
	if !strings.Contains(logs.String(), "inventory reload failed") {
		t.Errorf("failure not logged:\n%s", logs)
	}
}

func TestInventoryConcurrentReaders(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	old := testPod{name: "old", uid: "u-old", ip: "10.0.0.1", created: at(0), labels: "{app: old}"}
	inv, path, _ := newTestInventory(t, listYAML(true, old), InventoryOptions{Now: clock.Now, Retention: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// A flow that started at 30m belongs to "old" whatever the
				// reloads do; one without a start time to a current holder.
				p, ok := inv.PodByIP(mustAddr("10.0.0.1"), at(30*time.Minute))
				if !ok || p.Name != "old" || p.LabelsJSON() != `{"app":"old"}` {
					errs <- fmt.Sprintf("PodByIP at 30m = %+v, %v", p, ok)
					return
				}
				if _, ok := inv.PodByIP(mustAddr("10.0.0.1"), time.Time{}); !ok {
					errs <- "PodByIP without time found nothing"
					return
				}
				inv.NodeByName("n1")
				inv.ServiceByName("ns", "svc")
				inv.Stats()
			}
		}()
	}
	for i := range 50 {
		clock.Set(at(time.Hour + time.Duration(i+1)*time.Second))
		pods := []testPod{old}
		if i%2 == 1 {
			// The IP goes to a new Pod, then back to the old one (same UID).
			pods = []testPod{{name: fmt.Sprintf("new-%d", i), uid: fmt.Sprintf("u-%d", i), ip: "10.0.0.1", created: at(time.Hour)}}
		}
		writeFile(t, path, listYAML(i%3 != 0, pods...))
		if err := inv.Reload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// benchStore builds a Static store shaped like a large cluster: 10,000 Pods,
// every tenth IP reused once.
func benchStore() (*Static, []netip.Addr) {
	var pods []Pod
	var ips []netip.Addr
	for i := range 10000 {
		ip := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
		ips = append(ips, ip)
		p := Pod{
			Namespace: "ns", Name: fmt.Sprintf("pod-%d", i), UID: fmt.Sprintf("uid-%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%50)},
			IPs:    []netip.Addr{ip}, Created: at(time.Hour),
		}
		if i%10 == 0 {
			old := p
			old.Name, old.UID, old.Created, old.Deleted = p.Name+"-old", p.UID+"-old", at(0), at(50*time.Minute)
			pods = append(pods, old)
		}
		pods = append(pods, p)
	}
	return NewStatic(pods, nil, nil), ips
}

func BenchmarkPodByIP(b *testing.B) {
	s, ips := benchStore()
	flowStart := at(2 * time.Hour)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p, ok := s.PodByIP(ips[i%len(ips)], flowStart)
		if !ok || p.LabelsJSON() == "" {
			b.Fatal("not found")
		}
		i++
	}
}

func BenchmarkPodByIPReusedIP(b *testing.B) {
	s, ips := benchStore()
	flowStart := at(30 * time.Minute) // resolves to the deleted Pod
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.PodByIP(ips[0], flowStart); !ok {
			b.Fatal("not found")
		}
	}
}

func BenchmarkPodByIPParallel(b *testing.B) {
	s, ips := benchStore()
	flowStart := at(2 * time.Hour)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := s.PodByIP(ips[i%len(ips)], flowStart); !ok {
				b.Error("not found")
				return
			}
			i++
		}
	})
}

func BenchmarkInventoryPodByIP(b *testing.B) {
	inv, err := NewInventory("testdata/inventory.yaml", InventoryOptions{Logger: (&logBuffer{}).logger()})
	if err != nil {
		b.Fatal(err)
	}
	ip, flowStart := mustAddr("10.244.1.12"), time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		p, ok := inv.PodByIP(ip, flowStart)
		if !ok || p.LabelsJSON() == "" {
			b.Fatal("not found")
		}
	}
}

// TestInventoryFinishedPod: a Pod listed as Succeeded (or Failed) holds no
// address from the first load that lists it so: it names only flows of
// before, and a new Pod with its address is not confused with it.
func TestInventoryFinishedPod(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	job := testPod{name: "job", uid: "uj", ip: "10.0.0.1", created: at(0), phase: "Succeeded"}
	inv, path, _ := newTestInventory(t, listYAML(true, job), InventoryOptions{Now: clock.Now})
	ip := mustAddr("10.0.0.1")
	if got := podName(inv.PodByIP(ip, at(30*time.Minute))); got != "ns/job" {
		t.Errorf("a flow of the Pod while it ran: %s, want ns/job", got)
	}
	if p, ok := inv.PodByIP(ip, at(time.Hour+time.Second)); ok {
		t.Errorf("a flow from its address after it finished: %+v, want none", p)
	}

	// A reload within the retention keeps the time it was first seen
	// finished.
	clock.Set(at(time.Hour + 2*time.Minute))
	next := testPod{name: "next", uid: "un", ip: "10.0.0.1", created: at(time.Hour + time.Minute)}
	writeFile(t, path, listYAML(true, job, next))
	if err := inv.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := podName(inv.PodByIP(ip, at(time.Hour+90*time.Second))); got != "ns/next" {
		t.Errorf("a flow of the new Pod: %s, want ns/next", got)
	}
	if p, ok := inv.PodByIP(ip, at(30*time.Minute)); !ok || p.Name != "job" || !p.Deleted.Equal(at(time.Hour)) {
		t.Errorf("the finished Pod after a reload: %+v, want it ended at the first load (%v)", p, at(time.Hour))
	}
	if st := inv.Stats(); st.Pods != 1 || st.DeletedPods != 1 {
		t.Errorf("Stats = %+v, want 1 live Pod and 1 remembered", st)
	}
}

// TestInventoryFinishedPodEnd: a finished Pod whose containers say when
// they ended holds its address until then; once past the retention, a
// reload that still lists it does not bring it back.
func TestInventoryFinishedPodEnd(t *testing.T) {
	clock := &fakeClock{t: at(time.Hour)}
	job := testPod{name: "job", uid: "uj", ip: "10.0.0.1", created: at(0), phase: "Failed", finished: at(58 * time.Minute)}
	inv, path, _ := newTestInventory(t, listYAML(true, job), InventoryOptions{Now: clock.Now})
	ip := mustAddr("10.0.0.1")
	if p, ok := inv.PodByIP(ip, at(57*time.Minute)); !ok || p.Name != "job" || !p.Deleted.Equal(at(58*time.Minute)) {
		t.Errorf("a flow of the Pod while it ran: %+v, want job ended at %v", p, at(58*time.Minute))
	}
	if p, ok := inv.PodByIP(ip, at(59*time.Minute)); ok {
		t.Errorf("a flow from its address after it ended: %+v, want none", p)
	}
	clock.Set(at(58*time.Minute + DefaultRetention))
	writeFile(t, path, listYAML(true, job, testPod{name: "other", uid: "uo", ip: "10.0.0.9", created: at(0)}))
	if err := inv.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p, ok := inv.PodByIP(ip, at(57*time.Minute)); ok || inv.Stats().DeletedPods != 0 {
		t.Errorf("past the retention, after a reload: %+v, %d remembered; want it forgotten", p, inv.Stats().DeletedPods)
	}
}
