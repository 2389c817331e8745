package enrich

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func mustParse(t *testing.T, src string) *inventoryContents {
	t.Helper()
	c, err := parseInventory(context.Background(), []byte(src))
	if err != nil {
		t.Fatalf("parseInventory: %v", err)
	}
	return c
}

func TestParseMultiDocument(t *testing.T) {
	c := mustParse(t, `# written by hand
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
  uid: u1
  creationTimestamp: 2026-03-01T08:02:31Z
  labels:
    app: web
    version: 3
    canary: true
spec:
  nodeName: n1
status:
  podIP: 10.244.1.12
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: knative
  namespace: default
--- # a Node
apiVersion: v1
kind: Node
metadata:
  name: n1
  uid: un1
spec:
  podCIDR: 10.244.1.0/24
status:
  addresses:
  - {type: Hostname, address: n1}
  - {type: InternalIP, address: 172.18.0.3}
...
---
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: default
  uid: us1
spec:
  clusterIP: None
---
`)
	if len(c.pods) != 1 || len(c.nodes) != 1 || len(c.services) != 1 || c.ignored != 2 {
		t.Fatalf("got %d pods, %d nodes, %d services, %d ignored", len(c.pods), len(c.nodes), len(c.services), c.ignored)
	}
	p := c.pods[0]
	if p.Name != "web" || p.UID != "u1" || p.NodeName != "n1" || !p.Created.Equal(time.Date(2026, 3, 1, 8, 2, 31, 0, time.UTC)) ||
		!slices.Equal(p.IPs, []netip.Addr{netip.MustParseAddr("10.244.1.12")}) {
		t.Errorf("pod = %+v", p)
	}
	if got, want := p.LabelsJSON(), `{"app":"web","canary":"true","version":"3"}`; got != want {
		t.Errorf("labels = %s, want %s", got, want)
	}
	n := c.nodes[0]
	if n.InternalIP != netip.MustParseAddr("172.18.0.3") || !slices.Equal(n.PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) {
		t.Errorf("node = %+v", n)
	}
	if s := c.services[0]; s.UID != "us1" || len(s.ClusterIPs) != 0 {
		t.Errorf("headless service = %+v", s)
	}
}

func TestParseTypedList(t *testing.T) {
	// The API's own list format: items carry no kind.
	c := mustParse(t, `apiVersion: v1
kind: PodList
items:
- metadata: {name: a, namespace: x, uid: ua}
  status:
    podIPs: [{ip: 10.0.0.1}, {ip: "fd00::1"}, {ip: "10.0.0.1"}]
- metadata: {name: b, namespace: x, uid: ub}
  status: {}
---
kind: ServiceList
apiVersion: v1
items:
- metadata: {name: s, namespace: x}
  spec: {clusterIPs: ["10.96.0.10", "fd00:10:96::a"]}
`)
	if len(c.pods) != 2 || len(c.services) != 1 {
		t.Fatalf("got %d pods, %d services", len(c.pods), len(c.services))
	}
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}
	if !slices.Equal(c.pods[0].IPs, want) {
		t.Errorf("IPs = %v, want %v", c.pods[0].IPs, want)
	}
	if len(c.pods[1].IPs) != 0 {
		t.Errorf("pod without IP got %v", c.pods[1].IPs)
	}
	if len(c.services[0].ClusterIPs) != 2 {
		t.Errorf("service = %+v", c.services[0])
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"empty", "", "no YAML documents"},
		{"comments only", "# nothing\n---\n# here\n", "no YAML documents"},
		{"syntax", "apiVersion: v1\nkind: List\nitems: [\n", "document 1"},
		{"no kind", "apiVersion: v1\nmetadata: {name: x}\n", "document 1: no kind"},
		{"not a map", "- a\n- b\n", "document 1"},
		{"second document", "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: b}\nstatus: {podIP: 10.0.0.300}\n",
			`document 2: Pod "b": status.podIP`},
		{"pod IPs", "kind: List\nitems:\n- kind: Pod\n  metadata: {name: a, namespace: ns1}\n  status: {podIPs: [{ip: nope}]}\n",
			`document 1: items[0]: Pod "ns1/a": status.podIPs[0]`},
		{"timestamp", "kind: Pod\nmetadata: {name: a, creationTimestamp: yesterday}\n", "metadata.creationTimestamp"},
		{"pod name", "kind: Pod\nmetadata: {namespace: n}\n", "no metadata.name"},
		{"node CIDR", "kind: Node\nmetadata: {name: n}\nspec: {podCIDR: 10.244.0.0/33}\n", "spec.podCIDRs[0]"},
		{"node address", "kind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: x}]}\n", "status.addresses[0]"},
		{"service IP", "kind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.96.0}\n", "spec.clusterIPs[0]"},
		{"labels type", "kind: Pod\nmetadata: {name: a, labels: [x]}\n", "document 1"},
		{"null item", "kind: List\nitems:\n- null\n", "items[0]: empty"},
	} {
		_, err := parseInventory(context.Background(), []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestParseCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := parseInventory(ctx, []byte("kind: List\nitems: []\n")); err != context.Canceled {
		t.Errorf("err = %v, want context.Canceled", err)
	}
}

func TestSplitDocuments(t *testing.T) {
	got := splitDocuments([]byte("a: 1\n---\nb: 2\n--- c: 3\n...\r\n---  \nd: 4"))
	want := []string{"a: 1\n", "b: 2\n", "c: 3\n", "", "d: 4"}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("doc %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func TestParseJSON(t *testing.T) {
	src, err := os.ReadFile("testdata/inventory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fromYAML := mustParse(t, string(src))
	j, err := yaml.YAMLToJSON(src)
	if err != nil {
		t.Fatal(err)
	}
	// Two concatenated values, as `kubectl get pods -o json; kubectl get nodes -o json` gives.
	fromJSON := mustParse(t, "\n  "+string(j)+"\n"+`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"extra","namespace":"x"},"status":{"podIP":"10.9.9.9"}}`)
	if len(fromJSON.pods) != len(fromYAML.pods)+1 || len(fromJSON.nodes) != len(fromYAML.nodes) ||
		len(fromJSON.services) != len(fromYAML.services) || fromJSON.hostNetworkPods != fromYAML.hostNetworkPods {
		t.Fatalf("JSON gave %d pods %d nodes %d services, YAML %d %d %d",
			len(fromJSON.pods), len(fromJSON.nodes), len(fromJSON.services), len(fromYAML.pods), len(fromYAML.nodes), len(fromYAML.services))
	}
	for i, p := range fromYAML.pods {
		if q := fromJSON.pods[i]; !reflect.DeepEqual(p, q) {
			t.Errorf("pod %d: JSON %+v, YAML %+v", i, q, p)
		}
	}
	if !reflect.DeepEqual(fromJSON.nodes, fromYAML.nodes) || !reflect.DeepEqual(fromJSON.services, fromYAML.services) {
		t.Error("nodes or services differ between JSON and YAML")
	}

	// A YAML flow mapping is not JSON but is still read.
	c := mustParse(t, "{kind: Pod, metadata: {name: a, namespace: x}, status: {podIP: 10.0.0.1}}\n")
	if len(c.pods) != 1 {
		t.Errorf("flow mapping: %d pods", len(c.pods))
	}
	// Errors in valid JSON are reported as such.
	_, err = parseInventory(context.Background(), []byte(`{"kind":"Pod","metadata":{"name":"a"},"status":{"podIP":"x"}}`))
	if err == nil || !strings.Contains(err.Error(), `JSON value 1: Pod "a": status.podIP`) {
		t.Errorf("err = %v", err)
	}
	if _, err := parseInventory(context.Background(), []byte(`{"kind":"List","items":[{"kind":"Pod"`)); err == nil {
		t.Error("truncated JSON accepted")
	}
}

// bigInventory repeats the fixture's Pods to make an inventory of about
// n Pods.
func bigInventory(tb testing.TB, n int) []byte {
	src, err := os.ReadFile("testdata/inventory.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	s := string(src)
	start := strings.Index(s, "- apiVersion: v1\n  kind: Pod")
	end := strings.Index(s, "- apiVersion: v1\n  kind: Node")
	var b strings.Builder
	b.WriteString(s[:start])
	for i := range n / 10 {
		b.WriteString(strings.ReplaceAll(s[start:end], "uid: ", fmt.Sprintf("uid: r%d-", i)))
	}
	b.WriteString(s[end:])
	return []byte(b.String())
}

func BenchmarkParseInventory(b *testing.B) {
	data := bigInventory(b, 1000)
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{{"yaml", data}, {"json", j}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseInventory(context.Background(), tc.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestInventoryPodWorkload: Pods read from `kubectl get -o yaml` name
// their workload from their controller owner reference, as the informers'
// do.
func TestInventoryPodWorkload(t *testing.T) {
	const doc = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata:
    name: server-564c497b9d-hhbdl
    namespace: shop
    labels: {app: web, pod-template-hash: 564c497b9d}
    ownerReferences:
    - {apiVersion: apps/v1, kind: ReplicaSet, name: server-564c497b9d, uid: u1, controller: true, blockOwnerDeletion: true}
  status: {podIP: 10.0.0.1}
- apiVersion: v1
  kind: Pod
  metadata:
    name: bare
    namespace: shop
  status: {podIP: 10.0.0.2}
`
	inv, err := parseInventory(context.Background(), []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Workload{"server-564c497b9d-hhbdl": {"Deployment", "server"}, "bare": {}}
	if len(inv.pods) != len(want) {
		t.Fatalf("%d Pods, want %d", len(inv.pods), len(want))
	}
	for _, p := range inv.pods {
		if p.Workload != want[p.Name] {
			t.Errorf("Pod %s: workload %+v, want %+v", p.Name, p.Workload, want[p.Name])
		}
	}
}
