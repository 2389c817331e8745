package recommend

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"sluice/policy/observed"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// testCluster: a Deployment (two Pods of one ReplicaSet, named port
// "http"), a StatefulSet, a DaemonSet Pod whose labels it shares with an
// ownerless Pod, and a cluster policy that isolates db for ingress from
// api only.
const testCluster = `
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDR: 10.1.1.0/24, podCIDRs: [10.1.1.0/24]}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: mon}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7c9d-a
  namespace: shop
  labels: {app: api, tier: web, pod-template-hash: 7c9d}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: api-7c9d, uid: u1, controller: true}]
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.1.1.10, podIPs: [{ip: 10.1.1.10}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7c9d-b
  namespace: shop
  labels: {app: api, tier: web, pod-template-hash: 7c9d}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: api-7c9d, uid: u1, controller: true}]
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.1.1.11, podIPs: [{ip: 10.1.1.11}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: db-0
  namespace: shop
  labels: {app: db, tier: data, statefulset.kubernetes.io/pod-name: db-0}
  ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u2, controller: true}]
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.20, podIPs: [{ip: 10.1.1.20}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: agent-x1
  namespace: mon
  labels: {app: agent}
  ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: u3, controller: true}]
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.30, podIPs: [{ip: 10.1.1.30}]}
---
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: mon, labels: {app: agent}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.31, podIPs: [{ip: 10.1.1.31}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], ports: [{name: http, port: 80, targetPort: http}], selector: {app: api}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-api, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: api}}}], ports: [{port: 5432}]}]
`

func testModel(t *testing.T) ([]cluster.Object, *pipeline.Model) {
	t.Helper()
	objs, err := cluster.ParseObjects([]byte(testCluster), "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	m, _, err := modelrun.Model(context.Background(), objs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return objs, m
}

func TestWorkloads(t *testing.T) {
	objs, m := testModel(t)
	got := map[string]*Workload{}
	for _, w := range Workloads(m.State, objs) {
		got[w.ID()] = w
	}
	api := got["shop/Deployment/api"]
	if api == nil || len(api.Pods) != 2 || len(api.Selector) != 1 || api.Selector["app"] != "api" || len(api.Extra) != 0 {
		t.Errorf("the Deployment: %+v", api)
	}
	if db := got["shop/StatefulSet/db"]; db == nil || db.Selector["app"] != "db" || len(db.Selector) != 1 {
		t.Errorf("the StatefulSet: %+v", db)
	}
	ds := got["mon/DaemonSet/agent"]
	stray := got["mon/Pods/agent"]
	if ds == nil || stray == nil || len(ds.Extra) != 1 || ds.Extra[0].Name != "stray" || len(stray.Extra) != 1 {
		t.Errorf("a DaemonSet and an ownerless Pod with the same labels: %+v, %+v (want each selecting the other as extra)", ds, stray)
	}
	if len(got) != 4 {
		t.Errorf("%d workloads: %v", len(got), got)
	}
}

func conn(src, dst string, proto uint8, port uint16, allowed, denied uint64) *observed.Conn {
	t0 := time.Unix(1_790_000_000, 0).UTC()
	return &observed.Conn{Key: observed.Key{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, DstPort: port},
		SrcPort: 40000, Allowed: allowed, Denied: denied, First: t0, Last: t0.Add(time.Hour)}
}

func TestRecommend(t *testing.T) {
	objs, m := testModel(t)
	conns := []*observed.Conn{
		conn("10.1.1.30", "10.1.1.10", 6, 8080, 3, 0),   // agent -> api, the named port
		conn("10.1.1.10", "10.1.1.20", 6, 5432, 2, 0),   // api -> db, allowed by db-from-api
		conn("10.1.1.11", "10.1.1.20", 6, 5432, 1, 0),   // the other api Pod
		conn("10.1.1.30", "10.1.1.20", 6, 5432, 4, 0),   // agent -> db: the cluster denies it
		conn("10.1.1.10", "198.51.100.7", 6, 443, 5, 0), // outside
		conn("10.1.1.10", "198.51.100.9", 6, 443, 5, 0), // the same /24
		conn("10.1.1.10", "10.1.1.20", 6, 9999, 0, 2),   // denied by records
		conn("10.1.1.10", "10.1.1.31", 1, 0, 1, 0),      // ICMP to the stray Pod
		conn("10.1.1.30", "10.96.0.10", 6, 80, 1, 0),    // a Service address, before DNAT
	}
	res, err := Recommend(context.Background(), m, objs, conns, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Carried != 6 || res.Skipped.Denied != 2 || res.Skipped.ServiceAddress != 1 {
		t.Errorf("carried %d, skipped %+v", res.Carried, res.Skipped)
	}
	byName := map[string]*Object{}
	for _, o := range res.Objects {
		byName[o.Policy.Namespace+"/"+o.Policy.Name] = o
	}
	for _, n := range []string{"shop/sluice-api", "shop/sluice-db", "shop/sluice-default-deny", "mon/sluice-agent", "mon/sluice-pods-agent", "mon/sluice-default-deny"} {
		if byName[n] == nil {
			t.Errorf("no %s among %v", n, keys(byName))
		}
	}
	api := byName["shop/sluice-api"]
	if api == nil {
		t.FailNow()
	}
	if len(api.Ingress) != 1 || api.Ingress[0].Peer != "DaemonSet mon/agent" || strings.Join(api.Ingress[0].Ports, ",") != "TCP/http(8080)" {
		t.Errorf("api ingress: %+v", api.Ingress)
	}
	in := api.Policy.Spec.Ingress[0]
	if in.Ports[0].Port.StrVal != "http" || in.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "mon" {
		t.Errorf("api ingress rule: %+v", in)
	}
	var peers []string
	for _, r := range api.Egress {
		peers = append(peers, r.Peer+" "+strings.Join(r.Ports, ","))
	}
	if strings.Join(peers, "; ") != "198.51.100.0/24 TCP/443; Pods mon/agent ; StatefulSet shop/db TCP/5432" {
		t.Errorf("api egress: %q", strings.Join(peers, "; "))
	}
	if api.Policy.Spec.Egress[1].Ports != nil {
		t.Errorf("the ICMP rule names ports: %+v", api.Policy.Spec.Egress[1])
	}
	if db := byName["shop/sluice-db"]; db == nil || len(db.Ingress) != 1 || len(db.Ingress[0].Conns) != 2 {
		t.Errorf("db: %+v (want one rule from api with two connections, not the denied agent)", db)
	}

	// Ingress only, one namespace, per-workload default deny, /32.
	res, err = Recommend(context.Background(), m, objs, conns, Options{Isolation: IsolationIngress, Namespaces: []string{"shop"},
		DefaultDeny: DenyWorkload, PrefixV4: 32})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Objects {
		if o.Policy.Namespace != "shop" || o.Workload == nil || len(o.Policy.Spec.Egress) != 0 ||
			len(o.Policy.Spec.PolicyTypes) != 1 || o.Policy.Spec.PolicyTypes[0] != "Ingress" {
			t.Errorf("ingress only in shop: %s/%s %+v", o.Policy.Namespace, o.Policy.Name, o.Policy.Spec)
		}
	}
	if len(res.Objects) != 2 {
		t.Errorf("%d objects, want api's and db's", len(res.Objects))
	}

	// --include-denied carries what the cluster and the records deny.
	res, err = Recommend(context.Background(), m, objs, conns, Options{IncludeDenied: true})
	if err != nil || res.Carried != len(conns)-1 {
		t.Errorf("include denied: carried %d of %d (%v)", res.Carried, len(conns)-1, err)
	}

	for _, bad := range []Options{{Isolation: "up"}, {DefaultDeny: "cluster"}, {PrefixV4: 33}, {PrefixV6: 129}, {PrefixV4: -1}, {Format: "calico"}} {
		if _, err := Recommend(context.Background(), m, objs, conns, bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func keys(m map[string]*Object) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestRender(t *testing.T) {
	objs, m := testModel(t)
	conns := []*observed.Conn{conn("10.1.1.30", "10.1.1.10", 6, 8080, 3, 0)}
	for i := range 7 {
		conns = append(conns, conn("10.1.1.10", "198.51.100."+string(rune('1'+i)), 6, 443, 1, 0))
	}
	res, err := Recommend(context.Background(), m, objs, conns, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := res.WriteYAML(&b); err != nil {
		t.Fatal(err)
	}
	back, err := cluster.ParseObjects(b.Bytes(), "stream")
	if err != nil || len(back) != len(res.Objects) {
		t.Fatalf("the stream reads back as %d objects (%v), want %d", len(back), err, len(res.Objects))
	}
	s := b.String()
	for _, want := range []string{
		"# NetworkPolicy shop/sluice-api: Deployment shop/api (2 Pods: api-7c9d-a, api-7c9d-b), isolated for ingress and egress.\n",
		"# ingress[0] from DaemonSet mon/agent, TCP/http(8080): 1 connection, 3 records, first seen 2026-09-21T14:13:20Z, last seen 2026-09-21T15:13:20Z\n",
		"#   10.1.1.30 -> 10.1.1.10 TCP/8080: 3 records, 2026-09-21T14:13:20Z to 2026-09-21T15:13:20Z\n",
		"# egress[0] to 198.51.100.0/24, TCP/443: 7 connections, 7 records,",
		"#   ... and 2 more connections\n",
		"# NetworkPolicy shop/sluice-default-deny: default deny (ingress and egress) for every Pod of namespace shop;\n",
		"# No labels tell the workload apart: the selector also selects stray.\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the stream lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "creationTimestamp") {
		t.Error("the stream writes creationTimestamp")
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := res.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(dir)
	if len(files) != len(res.Objects) {
		t.Errorf("%d files for %d objects", len(files), len(res.Objects))
	}
	one, _ := os.ReadFile(filepath.Join(dir, "shop_sluice-api.yaml"))
	if objs, err := cluster.ParseObjects(one, "one"); err != nil || len(objs) != 1 || objs[0].Name != "sluice-api" {
		t.Errorf("shop_sluice-api.yaml: %v %v", objs, err)
	}
}

// TestCIDRKeepsDeniedDenied: the cluster lets api reach one outside
// address only, and db be reached from one; neighbours in the same /24
// were observed denied. The aggregated CIDRs must not make them allowed
// (NetworkPolicies add up), in either format and direction; the allowed
// addresses stay allowed.
func TestCIDRKeepsDeniedDenied(t *testing.T) {
	extra := `
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-out, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 198.51.100.7/32}}], ports: [{port: 443}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-outside, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: 198.51.100.7/32}}], ports: [{port: 5432}]}]
`
	objs, err := cluster.ParseObjects([]byte(testCluster+extra), "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	if err != nil {
		t.Fatal(err)
	}
	build := func(objs []cluster.Object) *pipeline.Model {
		m, _, err := modelrun.Model(context.Background(), objs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := build(objs)
	allowed := conn("10.1.1.10", "198.51.100.7", 6, 443, 3, 0)
	deniedRec := conn("10.1.1.10", "198.51.100.9", 6, 443, 0, 2)   // the records say dropped
	deniedModel := conn("10.1.1.11", "198.51.100.8", 6, 443, 1, 0) // the model says dropped
	allowedIn := conn("198.51.100.7", "10.1.1.20", 6, 5432, 2, 0)
	deniedIn := conn("198.51.100.9", "10.1.1.20", 6, 5432, 1, 0) // the model says dropped
	conns := []*observed.Conn{allowed, deniedRec, deniedModel, allowedIn, deniedIn}
	for _, format := range []string{FormatK8s, FormatAntrea} {
		res, err := Recommend(context.Background(), m, objs, conns, Options{Format: format})
		if err != nil {
			t.Fatal(err)
		}
		if res.Carried != 2 || res.Skipped.Denied != 3 {
			t.Errorf("%s: carried %d, skipped %+v", format, res.Carried, res.Skipped)
		}
		var b bytes.Buffer
		if err := res.WriteYAML(&b); err != nil {
			t.Fatal(err)
		}
		cands, err := cluster.ParseObjects(b.Bytes(), "recommended")
		if err != nil {
			t.Fatalf("%s: %v\n%s", format, err, b.String())
		}
		after := build(cluster.Overlay(objs, cands))
		for _, c := range conns {
			v, err := tracer.Decide(context.Background(), after, tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort})
			if err != nil {
				t.Fatal(err)
			}
			if want := c == allowed || c == allowedIn; v.Denied == want {
				t.Errorf("%s: %s -> %s: denied=%v with the recommendation, want %v\n%s", format, c.Src, c.Dst, v.Denied, !want, b.String())
			}
		}
	}
}

func TestWithout(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
		want   string
	}{
		{"198.51.100.0/24", nil, "198.51.100.0/24"},
		{"198.51.100.0/30", []string{"198.51.100.2/32"}, "198.51.100.0/31 198.51.100.3/32"},
		{"198.51.100.0/29", []string{"198.51.100.0/32", "198.51.100.7/32"}, "198.51.100.1/32 198.51.100.2/31 198.51.100.4/31 198.51.100.6/32"},
		{"2001:db8::/126", []string{"2001:db8::1/128"}, "2001:db8::/128 2001:db8::2/127"},
	} {
		if got := strings.Join(without(tc.cidr, tc.except), " "); got != tc.want {
			t.Errorf("%s without %v: %s, want %s", tc.cidr, tc.except, got, tc.want)
		}
	}
}

// TestObjectNames: a workload of Pods without an owner is named after a
// label value, which may hold what an object name may not; the policies'
// names are valid all the same, and distinct.
func TestObjectNames(t *testing.T) {
	objs, err := cluster.ParseObjects([]byte(`
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDR: 10.1.1.0/24, podCIDRs: [10.1.1.0/24]}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: ui-1, namespace: shop, labels: {app: Shop_UI}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.10, podIPs: [{ip: 10.1.1.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: ui-2, namespace: shop, labels: {app: shop.ui}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.11, podIPs: [{ip: 10.1.1.11}]}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := modelrun.Model(context.Background(), objs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	conns := []*observed.Conn{conn("10.1.1.10", "10.1.1.11", 6, 8080, 1, 0)}
	res, err := Recommend(context.Background(), m, objs, conns, Options{DefaultDeny: DenyWorkload})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, o := range res.Objects {
		n := o.Policy.Name
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("policy name %q: %v", n, errs)
		}
		if seen[n] {
			t.Errorf("two policies named %q", n)
		}
		seen[n] = true
	}
	if len(seen) != 2 {
		t.Errorf("policies %v, want one per workload", seen)
	}
}
