package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"sluice/traceflow/cluster"
)

// apiServer answers, over HTTP, the list and discovery requests the live
// loader makes, from the fixture files, in pages of the requested size. It
// stands in for a kube-apiserver so that the whole path (kubeconfig, REST
// clients, content negotiation, query parameters) runs for real.
type apiServer struct {
	objs map[string][]json.RawMessage // by list path

	mu        sync.Mutex
	forbidden string   // a list path answered 403
	hang      bool     // lists wait until the client gives up
	limits    []string // the limit parameter of every list
}

func (s *apiServer) set(forbidden string, hang bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forbidden, s.hang = forbidden, hang
}

// listPaths maps each list path to the objects' apiVersion and kind.
var listPaths = map[string][2]string{
	"/api/v1/namespaces": {"v1", "Namespace"},
	"/api/v1/nodes":      {"v1", "Node"},
	"/api/v1/pods":       {"v1", "Pod"},
	"/api/v1/services":   {"v1", "Service"},
	"/apis/discovery.k8s.io/v1/endpointslices":           {"discovery.k8s.io/v1", "EndpointSlice"},
	"/apis/networking.k8s.io/v1/networkpolicies":         {"networking.k8s.io/v1", "NetworkPolicy"},
	"/apis/crd.antrea.io/v1beta1/egresses":               {"crd.antrea.io/v1beta1", "Egress"},
	"/apis/crd.antrea.io/v1beta1/networkpolicies":        {"crd.antrea.io/v1beta1", "NetworkPolicy"},
	"/apis/crd.antrea.io/v1beta1/clusternetworkpolicies": {"crd.antrea.io/v1beta1", "ClusterNetworkPolicy"},
}

func newAPIServer(t *testing.T, objs []cluster.Object) *apiServer {
	t.Helper()
	s := &apiServer{objs: map[string][]json.RawMessage{}}
	for _, o := range objs {
		found := false
		for path, tk := range listPaths {
			if tk[0] == o.APIVersion && tk[1] == o.Kind {
				s.objs[path] = append(s.objs[path], o.Raw)
				found = true
			}
		}
		if !found {
			t.Fatalf("no list path for %s", o.Describe())
		}
	}
	return s
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/apis/crd.antrea.io/v1beta1" {
		fmt.Fprint(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"crd.antrea.io/v1beta1","resources":[`+
			`{"name":"egresses","namespaced":false,"kind":"Egress","verbs":["get","list"]},`+
			`{"name":"networkpolicies","namespaced":true,"kind":"NetworkPolicy","verbs":["get","list"]},`+
			`{"name":"clusternetworkpolicies","namespaced":false,"kind":"ClusterNetworkPolicy","verbs":["get","list"]}]}`)
		return
	}
	tk, ok := listPaths[r.URL.Path]
	if !ok || r.Method != http.MethodGet {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
		return
	}
	q := r.URL.Query()
	s.mu.Lock()
	hang, forbidden := s.hang, s.forbidden
	s.limits = append(s.limits, q.Get("limit"))
	s.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	if r.URL.Path == forbidden {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,`+
			`"message":"%s is forbidden: User \"dev\" cannot list resource"}`, r.URL.Path)
		return
	}
	items := s.objs[r.URL.Path]
	start, _ := strconv.Atoi(q.Get("continue"))
	end := len(items)
	if l, err := strconv.Atoi(q.Get("limit")); err == nil && l > 0 && start+l < end {
		end = start + l
	}
	cont := ""
	if end < len(items) {
		cont = strconv.Itoa(end)
	}
	list := map[string]any{"apiVersion": tk[0], "kind": tk[1] + "List",
		"metadata": map[string]string{"resourceVersion": "1", "continue": cont}, "items": items[start:end]}
	if items == nil {
		list["items"] = []any{}
	}
	if err := json.NewEncoder(w).Encode(list); err != nil {
		panic(err)
	}
}

// kubeconfigFor writes a kubeconfig whose current context points at url.
func kubeconfigFor(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q}
users:
- name: dev
  user: {token: t0ken}
contexts:
- name: test
  context: {cluster: test, user: dev}
current-context: test
`, url)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func fixtureObjects(t *testing.T) []cluster.Object {
	t.Helper()
	objs, err := cluster.ReadPath(context.Background(), tfCluster)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// Trace names end in a random suffix, and timestamps follow the clock.
var unstable = regexp.MustCompile(`(?m)^(name|\s*timestamp): .*$`)

func stable(s string) string { return unstable.ReplaceAllString(s, "$1: X") }

func TestTraceflowKubeconfig(t *testing.T) {
	api := newAPIServer(t, fixtureObjects(t))
	srv := httptest.NewServer(api)
	defer srv.Close()
	kc := kubeconfigFor(t, srv.URL)

	for _, args := range [][]string{
		{"traceflow", "-S", "default/db", "-D", "8.8.8.8"},
		{"traceflow", "-S", "default/client", "-D", "8.8.8.8", "-f", "udp,udp_dst=53"},
		{"traceflow", "-S", "default/client", "-D", "default/db-svc", "-f", "tcp,tcp_dst=5432", "--with", "../../traceflow/testdata/overlays/antrea-deny.yaml"},
		{"traceflow", "pipeline", "--node", "k8s-node-2"},
	} {
		fromFiles, errFiles, code := runSluice(t, append(args, "--cluster", tfCluster)...)
		if code != 0 {
			t.Fatalf("%v --cluster: exit %d: %s", args, code, errFiles)
		}
		live, errLive, code := runSluice(t, append(args, "--kubeconfig", kc)...)
		if code != 0 {
			t.Fatalf("%v --kubeconfig: exit %d: %s", args, code, errLive)
		}
		if stable(live) != stable(fromFiles) {
			t.Errorf("%v: --kubeconfig output\n%s\ndiffers from --cluster output\n%s", args, live, fromFiles)
		}
		if errLive != errFiles {
			t.Errorf("%v: --kubeconfig warnings %q, --cluster warnings %q", args, errLive, errFiles)
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.limits) == 0 {
		t.Fatal("no list reached the server")
	}
	for _, l := range api.limits {
		if l != "500" {
			t.Fatalf("list limits %v, want 500 on every list", api.limits)
		}
	}
}

func TestTraceflowKubeconfigPagination(t *testing.T) {
	// A page of 500 holds the whole fixture; 1200 Pods on a fourth Node
	// need three pages.
	objs := fixtureObjects(t)
	objs = append(objs, cluster.Object{APIVersion: "v1", Kind: "Node", Name: "k8s-node-4", Raw: json.RawMessage(
		`{"apiVersion":"v1","kind":"Node","metadata":{"name":"k8s-node-4"},"spec":{"podCIDR":"10.20.0.0/16"},` +
			`"status":{"addresses":[{"type":"InternalIP","address":"192.168.77.104"}]}}`)})
	for i := range 1200 {
		raw := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d","namespace":"bulk"},`+
			`"spec":{"nodeName":"k8s-node-4"},"status":{"phase":"Running","podIP":"10.20.%d.%d"}}`, i, i/256, i%256)
		objs = append(objs, cluster.Object{APIVersion: "v1", Kind: "Pod", Namespace: "bulk", Name: fmt.Sprint("p", i), Raw: json.RawMessage(raw)})
	}
	api := newAPIServer(t, objs)
	srv := httptest.NewServer(api)
	defer srv.Close()
	out, errs, code := runSluice(t, "traceflow", "-S", "bulk/p1199", "-D", "default/db", "--kubeconfig", kubeconfigFor(t, srv.URL))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	// The last Pod of the last page is found and traced.
	if !strings.Contains(out, "source: bulk/p1199") || !strings.Contains(out, "phase: Succeeded") || !strings.Contains(out, "action: Delivered") {
		t.Errorf("output:\n%s", out)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.limits) != 9+2 { // one request per resource, two more for the Pods' pages
		t.Errorf("%d list requests, want 11", len(api.limits))
	}
}

func TestTraceflowKubeconfigErrors(t *testing.T) {
	api := newAPIServer(t, fixtureObjects(t))
	srv := httptest.NewServer(api)
	defer srv.Close()
	kc := kubeconfigFor(t, srv.URL)
	base := []string{"traceflow", "-S", "default/db", "-D", "8.8.8.8"}

	_, errs, code := runSluice(t, append(base, "--kubeconfig", kc, "--cluster", tfCluster)...)
	if code == 0 || !strings.Contains(errs, "--cluster and --kubeconfig are mutually exclusive") {
		t.Errorf("both sources: exit %d, %q", code, errs)
	}
	_, errs, code = runSluice(t, append(base, "--kubeconfig", filepath.Join(t.TempDir(), "none"))...)
	if code == 0 || !strings.Contains(errs, "kubeconfig ") || !strings.Contains(errs, "none") {
		t.Errorf("missing kubeconfig: exit %d, %q", code, errs)
	}

	api.set("/apis/crd.antrea.io/v1beta1/egresses", false)
	_, errs, code = runSluice(t, append(base, "--kubeconfig", kc)...)
	if code == 0 || !strings.Contains(errs, "listing egresses.crd.antrea.io: ") || !strings.Contains(errs, "forbidden") ||
		!strings.Contains(errs, srv.URL) {
		t.Errorf("forbidden Egresses: exit %d, %q", code, errs)
	}
	api.set("", true)
	_, errs, code = runSluice(t, append(base, "--kubeconfig", kc, "--request-timeout", "200ms")...)
	if code == 0 || !strings.Contains(errs, "listing namespaces: context deadline exceeded") {
		t.Errorf("hanging server: exit %d, %q", code, errs)
	}
	api.set("", false)
	_, errs, code = runSluice(t, append(base, "--kubeconfig", kc, "--request-timeout", "-1s")...)
	if code == 0 || !strings.Contains(errs, "--request-timeout -1s") {
		t.Errorf("negative timeout: exit %d, %q", code, errs)
	}
}

func TestTraceflowInCluster(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("runs in a Pod with a service account")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	_, errs, code := runSluice(t, "traceflow", "-S", "default/db", "-D", "8.8.8.8")
	if code == 0 || !strings.Contains(errs, "in-cluster configuration") {
		t.Errorf("in a Pod without a service account: exit %d, %q", code, errs)
	}
}
