package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/render"
	"sluice/traceflow/tracer"
)

// policyOverlays are the overlays that together still let traffic
// through (the others isolate namespaces or move an Egress).
var policyOverlays = []string{"allow-external.yaml", "antrea-deny.yaml", "k8s-egress-allow.yaml", "k8s-ingress-isolate.yaml"}

// fileObjects reads the fixture cluster with the policy overlays applied
// when overlays is set.
func fileObjects(t *testing.T, overlays bool) []cluster.Object {
	t.Helper()
	if overlays {
		return fileObjectsWith(t, policyOverlays...)
	}
	return fileObjectsWith(t)
}

// fileObjectsWith reads the fixture cluster with the given overlays.
func fileObjectsWith(t *testing.T, overlays ...string) []cluster.Object {
	t.Helper()
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overlays {
		top, err := cluster.ReadPath(ctx, "../../testdata/overlays/"+o)
		if err != nil {
			t.Fatal(err)
		}
		objs = cluster.Overlay(objs, top)
	}
	return objs
}

var antreaListKinds = map[schema.GroupVersionResource]string{
	antreaGroupVersion.WithResource("egresses"):               "EgressList",
	antreaGroupVersion.WithResource("networkpolicies"):        "NetworkPolicyList",
	antreaGroupVersion.WithResource("clusternetworkpolicies"): "ClusterNetworkPolicyList",
	antreaGroupVersion.WithResource("clustergroups"):          "ClusterGroupList",
	antreaGroupVersion.WithResource("groups"):                 "GroupList",
	antreaGroupVersion.WithResource("ippools"):                "IPPoolList",
}

// fakes populates a fake clientset and a fake dynamic client with objs,
// decoded the way an API server would hold them. served lists the Antrea
// resources discovery reports; nil reports the group version as absent.
func fakes(t *testing.T, objs []cluster.Object, served []string) (*fake.Clientset, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	var typed, crds []runtime.Object
	for _, o := range objs {
		var into runtime.Object
		switch {
		case o.APIVersion == "v1" && o.Kind == "Node":
			into = &corev1.Node{}
		case o.APIVersion == "v1" && o.Kind == "Namespace":
			into = &corev1.Namespace{}
		case o.APIVersion == "v1" && o.Kind == "Pod":
			into = &corev1.Pod{}
		case o.APIVersion == "v1" && o.Kind == "Service":
			into = &corev1.Service{}
		case o.APIVersion == "discovery.k8s.io/v1":
			into = &discoveryv1.EndpointSlice{}
		case o.APIVersion == "networking.k8s.io/v1":
			into = &networkingv1.NetworkPolicy{}
		case o.APIVersion == antreaGroupVersion.String():
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(o.Raw); err != nil {
				t.Fatalf("%s: %v", o.Describe(), err)
			}
			crds = append(crds, u)
			continue
		default:
			t.Fatalf("fixture %s has no fake", o.Describe())
		}
		if err := json.Unmarshal(o.Raw, into); err != nil {
			t.Fatalf("%s: %v", o.Describe(), err)
		}
		// What a typed list returns: no apiVersion and kind on items.
		into.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		typed = append(typed, into)
	}
	client := fake.NewClientset(typed...)
	if served != nil {
		rl := &metav1.APIResourceList{GroupVersion: antreaGroupVersion.String()}
		for _, r := range served {
			rl.APIResources = append(rl.APIResources, metav1.APIResource{Name: r, Namespaced: r == "egresses"})
		}
		client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{rl}
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), antreaListKinds, crds...)
	return client, dyn
}

var allAntrea = []string{"egresses", "networkpolicies", "clusternetworkpolicies", "clustergroups", "groups", "ippools"}

var fixedNow = func() time.Time { return time.Unix(1700000000, 0) }

// traces runs each request through the state's model and renders every
// result the way `sluice traceflow` prints it.
func traces(t *testing.T, objs []cluster.Object, reqs [][3]string) string {
	t.Helper()
	ctx := context.Background()
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.DefaultConfig()
	cfg.Tag = 7
	m, _, err := pipeline.Build(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, r := range reqs {
		s, d, err := tracer.Endpoints(m.State, r[0], r[1])
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		pkt, err := flowspec.Parse(r[2])
		if err != nil {
			t.Fatal(err)
		}
		tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
		tf.Name = r[0] + " to " + r[1] // Name adds a random suffix
		tr, err := tracer.Run(ctx, m, tf, tracer.Options{Now: fixedNow})
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		if err := render.YAML(&out, render.Summarize(tr.Traceflow)); err != nil {
			t.Fatal(err)
		}
	}
	return out.String()
}

var requests = [][3]string{
	{"default/client", "default/db", "tcp,tcp_dst=5432"},
	{"default/client", "default/db-svc", "tcp,tcp_dst=5432"},
	{"default/client", "default/web", ""},
	{"default/db", "8.8.8.8", ""},
	{"default/client", "8.8.8.8", "udp,udp_dst=53"},
	{"default/web", "1.1.1.1", ""},
	{"prod/api", "default/db", "tcp,tcp_dst=5432"},
	{"prod/batch", "192.168.77.101", ""},
	{"default/client", "fd00:10:2::7", "ipv6,tcp,tcp_dst=5432"},
}

func ids(objs []cluster.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.ID())
	}
	slices.Sort(out)
	return out
}

// The live loader's objects, built and traced, give the same traces as the
// files they were made from: the conversion loses nothing the model uses.
func TestLiveTracesLikeFiles(t *testing.T) {
	for _, c := range []struct {
		name     string
		overlays []string
		want     []string // in the file traces, so they are not trivially equal
	}{
		{"base", nil, []string{"action: MarkedForSNAT", "action: ForwardedToEgressNode", "translatedDstIP: 10.10.2.7", "action: Delivered"}},
		{"policies", policyOverlays, []string{"action: Rejected", "action: Dropped", "networkPolicyRule: reject-db", "networkPolicy: K8sNetworkPolicy:default/client-external", "networkPolicy: K8sNetworkPolicy:default/db-from-prod", "action: Delivered"}},
		{"self and failover", []string{"antrea-self.yaml", "egress-failover.yaml"}, []string{"networkPolicyRule: drop-other-namespaces", "networkPolicyRule: allow-same-namespace", "egressNode: k8s-node-2"}},
		{"groups", []string{"antrea-groups.yaml"}, []string{"networkPolicyRule: allow-frontends", "networkPolicyRule: drop-others", "networkPolicyRule: reject-public-dns"}},
		// IPPools and annotated Namespaces and Pods come through too (the
		// object lists are compared).
		{"ippools", []string{"flexible-ipam.yaml"}, []string{"action: Delivered"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := fileObjectsWith(t, c.overlays...)
			client, dyn := fakes(t, files, allAntrea)
			live, probs, err := Load(context.Background(), client, dyn, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(probs) != 0 {
				t.Errorf("unexpected problems: %v", probs)
			}
			if got, want := ids(live), ids(files); !reflect.DeepEqual(got, want) {
				t.Fatalf("live objects\n%v\nwant the file objects\n%v", got, want)
			}
			for _, o := range live {
				if !strings.HasPrefix(o.Source, "live ") {
					t.Errorf("%s: source %q", o.Describe(), o.Source)
				}
			}
			want := traces(t, files, requests)
			got := traces(t, live, requests)
			if got != want {
				t.Errorf("live traces differ from the file traces\nlive:\n%s\nfiles:\n%s", got, want)
			}
			for _, w := range c.want {
				if !strings.Contains(want, w) {
					t.Errorf("the file traces lack %q; the comparison proves little:\n%s", w, want)
				}
			}
		})
	}
}

func TestMissingCRDIsAWarning(t *testing.T) {
	// The fakes hold the Egresses either way: discovery or the list must
	// keep them out.
	for _, c := range []struct {
		name    string
		served  []string
		react   bool // the list of egresses answers NotFound
		missing []string
	}{
		{"no Antrea group", nil, false, []string{"egresses", "networkpolicies", "clusternetworkpolicies"}}, // missing group CRDs are quiet
		{"no Egress CRD in discovery", []string{"networkpolicies", "clusternetworkpolicies", "clustergroups", "groups"}, false, []string{"egresses"}},
		{"Egress list not found", allAntrea, true, []string{"egresses"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, dyn := fakes(t, fileObjects(t, true), c.served)
			if c.react {
				dyn.PrependReactor("list", "egresses", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewNotFound(antreaGroupVersion.WithResource("egresses").GroupResource(), "")
				})
			}
			live, probs, err := Load(context.Background(), client, dyn, Options{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range probs {
				if p.Severity != cluster.Warning || !strings.Contains(p.Message, "is not served") {
					t.Errorf("unexpected problem %v", p)
				}
				got = append(got, p.Object)
			}
			var want []string
			for _, r := range c.missing {
				want = append(want, "resource "+r+".crd.antrea.io")
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("warnings name %v, want %v", got, want)
			}
			var kinds []string
			for _, o := range live {
				kinds = append(kinds, o.Kind)
			}
			if slices.Contains(kinds, "Egress") {
				t.Errorf("Egress loaded although its CRD is missing: %v", kinds)
			}
			// The state still builds and traces.
			if out := traces(t, live, [][3]string{{"default/db", "8.8.8.8", ""}}); !strings.Contains(out, "ForwardedOutOfNetwork") || strings.Contains(out, "MarkedForSNAT") {
				t.Errorf("trace without the Egress CRD:\n%s", out)
			}
		})
	}
}

func TestForbiddenListIsAnError(t *testing.T) {
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
			_, _, err := Load(context.Background(), client, dyn, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "forbidden") ||
				!strings.Contains(err.Error(), "needs get and list") {
				t.Fatalf("error %v, want one naming %q as forbidden", err, c.want)
			}
			if !apierrors.IsForbidden(err) {
				t.Errorf("%v does not wrap the Forbidden status", err)
			}
		})
	}
}

func TestCancelledContext(t *testing.T) {
	client, dyn := fakes(t, fileObjects(t, false), allAntrea)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := Load(ctx, client, dyn, Options{})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "listing namespaces") {
		t.Fatalf("error %v, want context.Canceled naming the resource", err)
	}
}

// pagedServer serves items in pages of size, as an API server does.
type pagedServer struct {
	items   []string
	expired bool // the first continuation expires once
	calls   []metav1.ListOptions
}

func (s *pagedServer) list(_ context.Context, opts metav1.ListOptions) ([]string, string, error) {
	s.calls = append(s.calls, opts)
	start := 0
	if opts.Continue != "" {
		if s.expired {
			s.expired = false
			return nil, "", apierrors.NewResourceExpired("continue token too old")
		}
		if _, err := fmt.Sscanf(opts.Continue, "at-%d", &start); err != nil {
			return nil, "", apierrors.NewBadRequest("bad continue")
		}
	}
	end := min(start+int(opts.Limit), len(s.items))
	cont := ""
	if end < len(s.items) {
		cont = fmt.Sprintf("at-%d", end)
	}
	return s.items[start:end], cont, nil
}

func TestPagination(t *testing.T) {
	items := []string{"a", "b", "c", "d", "e"}
	for _, c := range []struct {
		name    string
		expired bool
		calls   []string // Continue of each call
	}{
		{"pages", false, []string{"", "at-2", "at-4"}},
		{"expired continuation restarts", true, []string{"", "at-2", "", "at-2", "at-4"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &pagedServer{items: items, expired: c.expired}
			var got []string
			err := pages(context.Background(), "things", 2, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
				page, cont, err := s.list(ctx, opts)
				got = append(got, page...)
				return cont, err
			}, func() { got = nil })
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, items) {
				t.Errorf("got %v, want %v", got, items)
			}
			var conts []string
			for _, o := range s.calls {
				if o.Limit != 2 {
					t.Errorf("call with limit %d, want 2", o.Limit)
				}
				conts = append(conts, o.Continue)
			}
			if !reflect.DeepEqual(conts, c.calls) {
				t.Errorf("continue tokens %q, want %q", conts, c.calls)
			}
		})
	}
	// A server that loops on its token is stopped.
	err := pages(context.Background(), "things", 2, func(context.Context, metav1.ListOptions) (string, error) {
		return "again", nil
	}, func() {})
	if err == nil || !strings.Contains(err.Error(), `listing things: the server repeated continue token "again"`) {
		t.Errorf("looping server: %v", err)
	}
}

func TestRESTConfig(t *testing.T) {
	if _, err := RESTConfig(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "kubeconfig ") {
		t.Errorf("missing kubeconfig: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kc = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://10.0.0.1:6443" || cfg.BearerToken != "secret" || cfg.UserAgent != "sluice-traceflow" {
		t.Errorf("config %+v", cfg)
	}
	if _, _, err := Clients(cfg); err != nil {
		t.Errorf("clients: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := RESTConfig(""); err == nil || !strings.Contains(err.Error(), "in-cluster configuration") {
		t.Errorf("in-cluster outside a Pod: %v", err)
	}
}
