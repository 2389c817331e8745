package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sluice/test/kube/kubetest"
	tfcluster "sluice/traceflow/cluster"
	"sluice/traceflow/controller"
	"sluice/traceflow/crd"
)

// tfFixture is the traceflow model's cluster state, created here as API
// objects.
const tfFixture = "../../traceflow/testdata/cluster"

// createFixture creates the fixture's Nodes, Namespaces, Pods, Services
// and EndpointSlices through the API, with the status of Nodes and Pods
// (which create ignores) written to their status subresource. Antrea's
// Egresses are left out: their CRD is not installed, which the model
// reports as a warning.
func createFixture(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	t.Helper()
	objs, err := tfcluster.ReadPath(ctx, tfFixture)
	if err != nil {
		t.Fatal(err)
	}
	gvrs := map[string]schema.GroupVersionResource{
		"Namespace":     {Version: "v1", Resource: "namespaces"},
		"Node":          {Version: "v1", Resource: "nodes"},
		"Pod":           {Version: "v1", Resource: "pods"},
		"Service":       {Version: "v1", Resource: "services"},
		"EndpointSlice": {Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"},
	}
	rank := map[string]int{"Namespace": 0, "Node": 1, "Service": 2, "Pod": 3, "EndpointSlice": 4}
	for pass := 0; pass <= 4; pass++ {
		for _, o := range objs {
			gvr, ok := gvrs[o.Kind]
			if !ok || rank[o.Kind] != pass {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(o.Raw); err != nil {
				t.Fatalf("%s: %v", o.Describe(), err)
			}
			u.SetCreationTimestamp(metav1.Time{})
			status, hasStatus := u.Object["status"]
			var ri dynamic.ResourceInterface = dyn.Resource(gvr)
			if o.Namespace != "" {
				ri = dyn.Resource(gvr).Namespace(o.Namespace)
			}
			// Left by an earlier test (a Service's create would fail on its
			// ClusterIP before its name).
			if _, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{}); err == nil {
				continue
			}
			created, err := ri.Create(ctx, u, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				t.Fatalf("creating %s: %v", o.Describe(), err)
			}
			if hasStatus && (o.Kind == "Pod" || o.Kind == "Node") {
				created.Object["status"] = status
				if _, err := ri.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
					t.Fatalf("status of %s: %v", o.Describe(), err)
				}
			}
		}
	}
}

// tidyForModel deletes, from the control plane the package's tests share,
// what earlier tests left that the model refuses as a cluster state (and
// so would make every trace, the CLI's and the controller's alike, fail):
// Nodes without an InternalIP (the tunnel endpoint) and Pods on no Node or
// on one that does not exist.
func tidyForModel(t *testing.T, ctx context.Context, c *kubetest.Cluster) {
	t.Helper()
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, n := range nodes.Items {
		internal := false
		for _, a := range n.Status.Addresses {
			internal = internal || a.Type == corev1.NodeInternalIP
		}
		if internal {
			kept[n.Name] = true
			continue
		}
		t.Logf("deleting Node %s (no InternalIP), left by an earlier test", n.Name)
		if err := cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if kept[p.Spec.NodeName] {
			continue
		}
		t.Logf("deleting Pod %s/%s (on Node %q, which does not exist), left by an earlier test", p.Namespace, p.Name, p.Spec.NodeName)
		if err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// traceflowCase is one Traceflow applied through the API.
type traceflowCase struct {
	name       string
	spec       crd.TraceflowSpec
	wantReason string // for an invalid request: the reference's reason
	wantAction crd.Action
}

func traceflowCases() []traceflowCase {
	tcp := func(port int32) crd.Packet {
		return crd.Packet{TransportHeader: crd.TransportHeader{TCP: &crd.TCPHeader{DstPort: port}}}
	}
	return []traceflowCase{
		{name: "client-to-db", spec: crd.TraceflowSpec{
			Source:      crd.Source{Namespace: "default", Pod: "client"},
			Destination: crd.Destination{Namespace: "default", Pod: "db"}, Packet: tcp(5432)},
			wantAction: crd.ActionDelivered},
		{name: "client-to-db-svc", spec: crd.TraceflowSpec{
			Source:      crd.Source{Namespace: "default", Pod: "client"},
			Destination: crd.Destination{Namespace: "default", Service: "db-svc"}, Packet: tcp(5432)},
			wantAction: crd.ActionDelivered},
		{name: "client-to-internet", spec: crd.TraceflowSpec{
			Source:      crd.Source{Namespace: "default", Pod: "client"},
			Destination: crd.Destination{IP: "8.8.8.8"}},
			wantAction: crd.ActionForwardedOutOfNetwork},
		{name: "ghost-to-db", spec: crd.TraceflowSpec{
			Source:      crd.Source{Namespace: "default", Pod: "ghost"},
			Destination: crd.Destination{Namespace: "default", Pod: "db"}},
			wantReason: "requested source Pod default/ghost not found"},
		{name: "no-pods", spec: crd.TraceflowSpec{Destination: crd.Destination{IP: "8.8.8.8"}},
			wantReason: "Traceflow no-pods has neither source nor destination Pod specified"},
		{name: "no-source", spec: crd.TraceflowSpec{Destination: crd.Destination{Namespace: "default", Pod: "db"}},
			wantReason: "source Pod must be specified in non-live-traffic Traceflow"},
		{name: "host-network-source", spec: crd.TraceflowSpec{
			Source:      crd.Source{Namespace: "prod", Pod: "node-exporter"},
			Destination: crd.Destination{Namespace: "default", Pod: "db"}},
			wantReason: "using hostNetwork Pod as source in non-live-traffic Traceflow is not supported"},
	}
}

// TestTraceflowController is test 5: the aggregator, running with a token
// of the chart's ServiceAccount and the Traceflow controller on, answers
// Traceflow objects applied through the API with the status `sluice
// traceflow --kubeconfig` prints for the same objects, gives invalid
// requests the reference's reason, and deletes finished ones after
// sluice.traceflow.deleteAfter.
func TestTraceflowController(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 4*time.Minute)
	installDefaults(t, ctx, c)
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		t.Fatal(err)
	}
	tidyForModel(t, ctx, c)
	createFixture(t, ctx, dyn)

	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	// The chart's grant reaches the authorizer through its informers.
	if err := poll(ctx, "RBAC grant on traceflows visible", func() (bool, error) {
		return canIGroup(ctx, sa, "watch", "sluice.io", "traceflows")
	}); err != nil {
		t.Fatal(err)
	}
	// What the controller may not do: create Traceflows, or write more
	// than their status.
	for _, verb := range []string{"create", "update"} {
		if ok, err := canIGroup(ctx, sa, verb, "sluice.io", "traceflows"); err != nil || ok {
			t.Errorf("the aggregator's ServiceAccount may %s traceflows (err %v)", verb, err)
		}
	}
	const deleteAfter = 4 * time.Second
	jc := startJSONCollector(t)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig,
		sluiceExtra: fmt.Sprintf("  traceflow:\n    enable: true\n    deleteAfter: %s\n", deleteAfter)}, jc)
	if err := poll(ctx, "traceflow controller watching", func() (bool, error) {
		select {
		case <-agg.exited:
			return false, fmt.Errorf("aggregator exited:\n%s", agg.logs.String())
		default:
		}
		return strings.Contains(agg.logs.String(), "traceflow controller: watching"), nil
	}); err != nil {
		t.Fatal(err)
	}

	tfs := dyn.Resource(controller.GVR())
	cases := traceflowCases()
	created := map[string]time.Time{}
	for _, tc := range cases {
		// A leftover of an earlier run would keep its old status.
		_ = tfs.Delete(ctx, tc.name, metav1.DeleteOptions{})
		if err := poll(ctx, "old "+tc.name+" gone", func() (bool, error) {
			_, err := tfs.Get(ctx, tc.name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		}); err != nil {
			t.Fatal(err)
		}
		u := traceflowObject(t, tc.name, tc.spec)
		if _, err := tfs.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Traceflow %s: %v", tc.name, err)
		}
		created[tc.name] = time.Now()
	}

	// Each gets a status, read before deleteAfter ends.
	got := map[string]*crd.Traceflow{}
	for _, tc := range cases {
		if err := poll(ctx, "status of "+tc.name, func() (bool, error) {
			u, err := tfs.Get(ctx, tc.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			tf := decodeTraceflow(t, u)
			if tf.Status.Phase == "" {
				return false, nil
			}
			got[tc.name] = tf
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s %q after %v", tc.name, got[tc.name].Status.Phase, got[tc.name].Status.Reason,
			time.Since(created[tc.name]).Round(time.Millisecond))
	}

	admin := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := kubetest.WriteKubeconfig(admin, c.Admin); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		tf := got[tc.name]
		if tf.Status.StartTime == nil {
			t.Errorf("%s: no startTime", tc.name)
		}
		cli, stderr, err := cliTraceflow(t, ctx, admin, tc.name, tc.spec)
		if tc.wantReason != "" {
			if tf.Status.Phase != crd.PhaseFailed || tf.Status.Reason != tc.wantReason {
				t.Errorf("%s: phase %s reason %q, want Failed with %q", tc.name, tf.Status.Phase, tf.Status.Reason, tc.wantReason)
			}
			// The CLI refuses the same request with the same words.
			if err == nil || !strings.Contains(stderr, tc.wantReason) {
				t.Errorf("%s: the CLI gave %v %q, want a refusal with %q", tc.name, err, stderr, tc.wantReason)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: CLI: %v\n%s", tc.name, err, stderr)
			continue
		}
		if tf.Status.Phase != crd.PhaseSucceeded || !hasAction(tf, tc.wantAction) {
			t.Errorf("%s: phase %s reason %q results %+v, want Succeeded with a %s observation", tc.name,
				tf.Status.Phase, tf.Status.Reason, tf.Status.Results, tc.wantAction)
		}
		if d := cmp.Diff(untimed(cli.Status), untimed(tf.Status)); d != "" {
			t.Errorf("%s: the controller's status differs from the CLI's (-cli +controller):\n%s", tc.name, d)
		}
	}

	// Finished objects are deleted deleteAfter after their start.
	for _, tc := range cases {
		if err := poll(ctx, tc.name+" deleted", func() (bool, error) {
			_, err := tfs.Get(ctx, tc.name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Fatal(err)
		}
		start := got[tc.name].Status.StartTime.Time
		if early := time.Since(start); early < deleteAfter {
			t.Errorf("%s deleted %v after its start, before deleteAfter %v", tc.name, early, deleteAfter)
		}
	}
	wants := []string{
		`sluice_traceflow_traced_total{phase="Succeeded"} 3`,
		`sluice_traceflow_traced_total{phase="Failed"} 4`,
		`sluice_traceflow_deleted_total 7`,
		`sluice_traceflow_queue_dropped_total 0`,
	}
	var metrics string
	if err := poll(ctx, "traceflow metrics", func() (bool, error) {
		metrics = scrape(t, ctx, agg.api)
		for _, want := range wants {
			if !strings.Contains(metrics, want) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Errorf("%v: want %q, have:\n%s", err, wants, grepLines(metrics, "sluice_traceflow_"))
	}
}

// canIGroup asks whether rc may verb resource of group, cluster-wide.
func canIGroup(ctx context.Context, rc *rest.Config, verb, group, resource string) (bool, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return false, err
	}
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Group: group, Resource: resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("access review %s %s.%s: %w", verb, resource, group, err)
	}
	return r.Status.Allowed, nil
}

func traceflowObject(t *testing.T, name string, spec crd.TraceflowSpec) *unstructured.Unstructured {
	t.Helper()
	tf := crd.Traceflow{Spec: spec}
	tf.APIVersion, tf.Kind, tf.Name = controller.APIVersion, crd.KindTraceflow, name
	b, err := json.Marshal(tf)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		t.Fatal(err)
	}
	delete(u.Object, "status")
	return u
}

func decodeTraceflow(t *testing.T, u *unstructured.Unstructured) *crd.Traceflow {
	t.Helper()
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var tf crd.Traceflow
	if err := json.Unmarshal(b, &tf); err != nil {
		t.Fatal(err)
	}
	return &tf
}

// cliTraceflow runs `sluice traceflow --kubeconfig --traceflow FILE -o
// json` for the same object and returns the Traceflow it prints.
func cliTraceflow(t *testing.T, ctx context.Context, kubeconfig, name string, spec crd.TraceflowSpec) (*crd.Traceflow, string, error) {
	t.Helper()
	u := traceflowObject(t, name, spec)
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name+".json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, shared.sluice, "traceflow", "--kubeconfig", kubeconfig, "--traceflow", file, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String(), err
	}
	var tf crd.Traceflow
	if err := json.Unmarshal(stdout.Bytes(), &tf); err != nil {
		t.Fatalf("%s: CLI output: %v\n%s", name, err, stdout.String())
	}
	return &tf, stderr.String(), nil
}

// untimed is a status without what depends on when it was traced.
func untimed(st crd.TraceflowStatus) crd.TraceflowStatus {
	st.StartTime = nil
	st.Results = append([]crd.NodeResult(nil), st.Results...)
	for i := range st.Results {
		st.Results[i].Timestamp = 0
	}
	return st
}

func hasAction(tf *crd.Traceflow, a crd.Action) bool {
	for _, r := range tf.Status.Results {
		for _, o := range r.Observations {
			if o.Action == a {
				return true
			}
		}
	}
	return false
}

func scrape(t *testing.T, ctx context.Context, addr string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
