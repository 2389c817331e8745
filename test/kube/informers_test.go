package kube_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"sluice/test/kube/kubetest"
	"sluice/traceflow/crd"
)

// apiserverLists reads, from the API server's own metrics, how many LIST
// requests it has answered for each of resources (cluster scope, any
// code): every informer lists its resource once before it watches.
func apiserverLists(t *testing.T, ctx context.Context, cs kubernetes.Interface, resources []string) map[string]float64 {
	t.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("API server metrics: %v", err)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `verb="LIST"`) ||
			!strings.Contains(line, `scope="cluster"`) {
			continue
		}
		for _, r := range resources {
			if strings.Contains(line, `resource="`+r+`"`) {
				i := strings.LastIndexByte(line, ' ')
				v, err := strconv.ParseFloat(line[i+1:], 64)
				if err != nil {
					t.Fatalf("metric line %q: %v", line, err)
				}
				out[r] += v
			}
		}
	}
	return out
}

// TestOneInformerFactory runs the aggregator with Pod metadata and the
// Traceflow controller against the real API server and counts, in the
// API server's metrics, the lists it made: the Pod metadata cache and
// the Traceflow watch share their informers, so Pods, Nodes and Services
// are listed once, not once each.
func TestOneInformerFactory(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	installDefaults(t, ctx, c)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, "RBAC grant on traceflows visible", func() (bool, error) {
		return canIGroup(ctx, sa, "watch", "sluice.io", "traceflows")
	}); err != nil {
		t.Fatal(err)
	}
	common := []string{"pods", "nodes", "services"}
	watchOnly := []string{"namespaces", "endpointslices", "networkpolicies"}
	all := append(append([]string(nil), common...), watchOnly...)
	before := apiserverLists(t, ctx, cs, all)
	jc := startJSONCollector(t)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig, sluiceExtra: "  traceflow:\n    enable: true\n"}, jc)
	// The Pod metadata cache synced, and the Traceflow watch has listed
	// what only it reads: both have listed everything they will.
	var delta map[string]float64
	if err := poll(ctx, "both caches listed", func() (bool, error) {
		select {
		case <-agg.exited:
			return false, fmt.Errorf("aggregator exited:\n%s", agg.logs.String())
		default:
		}
		if !strings.Contains(agg.logs.String(), "kubernetes: caches synced") {
			return false, nil
		}
		now := apiserverLists(t, ctx, cs, all)
		delta = map[string]float64{}
		for _, r := range all {
			delta[r] = now[r] - before[r]
			if delta[r] < 1 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The Traceflow watch may not have listed Pods, Nodes and Services
	// yet even though it listed the others (its informers start
	// together): a second list of them (an informer of its own) would
	// come after the count above. A Traceflow answered from the cluster
	// state (not "not ready") is traced after every list of the watch;
	// count again after it.
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	tf := applyTraceflow(t, ctx, dyn, "informer-count", crd.TraceflowSpec{
		Source:      crd.Source{Namespace: "default", Pod: "no-such-pod"},
		Destination: crd.Destination{IP: "10.244.9.9"},
	})
	if strings.Contains(tf.Status.Reason, "not ready") {
		t.Fatalf("the Traceflow watch did not sync: %s", tf.Status.Reason)
	}
	now := apiserverLists(t, ctx, cs, all)
	for _, r := range all {
		delta[r] = now[r] - before[r]
	}
	for _, r := range common {
		if delta[r] != 1 {
			t.Errorf("%s listed %v times by the aggregator, want once (one informer for the Pod metadata and the Traceflow watch)", r, delta[r])
		}
	}
	t.Logf("lists by the aggregator: %v (Traceflow: %s %s)", delta, tf.Status.Phase, tf.Status.Reason)
}

// TestExporterOneInformerFactory does the same for the exporter: its Pod
// metadata and its policy attribution share their informers.
func TestExporterOneInformerFactory(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, c.Admin); err != nil {
		t.Fatal(err)
	}
	common := []string{"pods", "nodes", "services"}
	watchOnly := []string{"namespaces", "endpointslices", "networkpolicies"}
	all := append(append([]string(nil), common...), watchOnly...)
	before := apiserverLists(t, ctx, cs, all)
	coll := startJSONCollector(t) // a listener to connect to; what it hears is not read
	logs := &lockedBuffer{}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(shared.sluice, "exporter", "--source", "synthetic", "--kubeconfig", kubeconfig, "--node", "informer-test-node",
		"--pod-cidr", "10.244.9.0/24", "--collector", coll.ln.Addr().String()+":tcp", "--metrics-address", metricsAddr)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("exporter log:\n%s", logs.String())
		}
	})
	var delta map[string]float64
	if err := poll(ctx, "both caches listed", func() (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("exporter exited:\n%s", logs.String())
		default:
		}
		now := apiserverLists(t, ctx, cs, all)
		delta = map[string]float64{}
		for _, r := range all {
			delta[r] = now[r] - before[r]
			if delta[r] < 1 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The attribution's watch may not have listed Pods, Nodes and
	// Services yet even though it listed the others: count again once it
	// has loaded a model (generation 1), which it does only after every
	// list of its watch, and the Pod metadata cache has synced.
	if err := poll(ctx, "the attribution's first model", func() (bool, error) {
		if !strings.Contains(logs.String(), "kubernetes: caches synced") {
			return false, nil
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // not serving yet
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, nil
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "sluice_exporter_attribution_generation "); ok {
				g, err := strconv.ParseFloat(v, 64)
				return err == nil && g >= 1, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	now := apiserverLists(t, ctx, cs, all)
	for _, r := range all {
		delta[r] = now[r] - before[r]
	}
	for _, r := range common {
		if delta[r] != 1 {
			t.Errorf("%s listed %v times by the exporter, want once (one informer for the Pod metadata and the attribution)", r, delta[r])
		}
	}
	t.Logf("lists by the exporter: %v", delta)
}
