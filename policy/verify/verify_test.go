package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sluice/policy/observed"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/pipeline"
)

const base = `
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
metadata: {name: api-a, namespace: shop, labels: {app: api}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.10, podIPs: [{ip: 10.1.1.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-b, namespace: shop, labels: {app: api}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.11, podIPs: [{ip: 10.1.1.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: shop, labels: {app: db}}
spec: {nodeName: n1, containers: [{name: c, image: x, ports: [{name: pg, containerPort: 5432}]}]}
status: {podIP: 10.1.1.20, podIPs: [{ip: 10.1.1.20}]}
---
apiVersion: v1
kind: Pod
metadata: {name: tool, namespace: shop, labels: {app: tool}}
spec: {nodeName: n1, containers: [{name: c, image: x}]}
status: {podIP: 10.1.1.30, podIPs: [{ip: 10.1.1.30}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-api, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: api}}}], ports: [{port: 5432}]}]
`

const candidate = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: open-db, namespace: shop}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {}}], ports: [{port: pg}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-egress, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Egress]
  egress:
  - {to: [{ipBlock: {cidr: 198.51.100.0/24}}], ports: [{port: 443}]}
  - {to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: 5432}]}
---
apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: noop}
spec:
  priority: 5
  tier: application
  appliedTo: [{podSelector: {matchLabels: {app: nothing}}}]
  ingress: [{action: Allow, from: [{podSelector: {}}]}]
`

func models(t *testing.T) (*pipeline.Model, *pipeline.Model, []cluster.Object) {
	t.Helper()
	objs, err := cluster.ParseObjects([]byte(base), "base")
	if err != nil {
		t.Fatal(err)
	}
	cands, err := cluster.ParseObjects([]byte(candidate), "candidate")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	before, _, err := modelrun.Model(context.Background(), objs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, _, err := modelrun.Model(context.Background(), cluster.Overlay(objs, cands), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return before, after, cands
}

func conn(src, dst string, proto uint8, port uint16, allowed, denied uint64) *observed.Conn {
	return &observed.Conn{Key: observed.Key{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, DstPort: port},
		SrcPort: 40000, Allowed: allowed, Denied: denied, SrcNamespace: "shop", SrcPod: "x"}
}

// TestVerify: the candidates open the database to every Pod (the denied
// tool connection becomes allowed, naming the rule), confine api's egress
// to one CIDR and the database (api's observed connection to an outside
// address elsewhere is newly blocked), and leave api to db unchanged; the surface lists the
// Pods the open rule admits that were never seen, and says the Antrea
// policy is not covered.
func TestVerify(t *testing.T) {
	before, after, cands := models(t)
	conns := []*observed.Conn{
		conn("10.1.1.10", "10.1.1.20", 6, 5432, 5, 0),  // api-a -> db, allowed before and after
		conn("10.1.1.30", "10.1.1.20", 6, 5432, 0, 3),  // tool -> db, denied before
		conn("10.1.1.10", "203.0.113.5", 6, 443, 2, 0), // api-a outside: blocked by api-egress
		conn("192.0.2.1", "192.0.2.2", 6, 80, 1, 0),    // neither end a Pod
	}
	rep, err := Verify(context.Background(), before, after, cands, conns, Options{Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Connections != 4 || rep.Records != 11 || rep.Unchanged != 1 || rep.NotModelled != 1 || rep.Errors != 0 {
		t.Errorf("figures: %+v", rep)
	}
	if len(rep.NewlyBlocked) != 1 || rep.NewlyBlocked[0].Destination != "203.0.113.5" || rep.NewlyBlocked[0].Port != 443 ||
		!strings.Contains(rep.NewlyBlocked[0].Rule, "egress K8sNetworkPolicy:shop/api-egress: isolated") {
		t.Errorf("newly blocked: %+v", rep.NewlyBlocked)
	}
	if len(rep.NewlyAllowed) != 1 || rep.NewlyAllowed[0].Destination != "10.1.1.20" ||
		!strings.Contains(rep.NewlyAllowed[0].Rule, "ingress K8sNetworkPolicy:shop/open-db: Allow") {
		t.Errorf("newly allowed: %+v", rep.NewlyAllowed)
	}
	var surface []string
	for _, s := range rep.Surface {
		surface = append(surface, s.Policy+" "+s.Direction+" "+s.Source+" "+s.Destination+" "+s.Port)
	}
	slices.Sort(surface)
	want := []string{
		"shop/api-egress egress shop/api-a 198.51.100.0/24 TCP/443",
		"shop/api-egress egress shop/api-b 198.51.100.0/24 TCP/443",
		"shop/api-egress egress shop/api-b shop/db-0 TCP/5432",
		"shop/open-db ingress shop/api-b shop/db-0 TCP/5432",
	}
	if !slices.Equal(surface, want) || rep.SurfaceTotal != 4 {
		t.Errorf("surface (%d):\n%s\nwant\n%s", rep.SurfaceTotal, strings.Join(surface, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(rep.SurfaceNote, "ClusterNetworkPolicy noop") {
		t.Errorf("surface note %q", rep.SurfaceNote)
	}
	if !rep.Blocks() {
		t.Error("Blocks() is false with a newly blocked flow")
	}

	// The formats.
	var tb, jb, yb bytes.Buffer
	for _, f := range []struct {
		name string
		b    *bytes.Buffer
	}{{"table", &tb}, {"json", &jb}, {"yaml", &yb}} {
		if err := rep.Write(f.b, f.name); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(tb.String(), "4 distinct connections from 11 records: 1 newly blocked, 1 newly allowed, 1 unchanged, 1 not modelled") ||
		!strings.Contains(tb.String(), "unobserved allowed surface: 4") {
		t.Errorf("table:\n%s", tb.String())
	}
	var back Report
	if err := json.Unmarshal(jb.Bytes(), &back); err != nil || back.Unchanged != 1 || len(back.NewlyBlocked) != 1 {
		t.Errorf("json: %v\n%s", err, jb.String())
	}
	if !strings.Contains(yb.String(), "unobservedSurfaceTotal: 4\n") {
		t.Errorf("yaml:\n%s", yb.String())
	}
	if err := rep.Write(&tb, "xml"); err == nil {
		t.Error("-o xml: no error")
	}

	// The surface is bounded.
	rep, err = Verify(context.Background(), before, after, cands, conns, Options{MaxSurface: 1})
	if err != nil || len(rep.Surface) != 1 || rep.SurfaceTotal != 4 {
		t.Errorf("MaxSurface 1: %d listed of %d (%v)", len(rep.Surface), rep.SurfaceTotal, err)
	}
}

// TestSurfaceSingleAddress: an ipBlock of one address is no unobserved
// surface for a Pod whose connection to it on the rule's port was
// observed (recommend --cidr-prefix 32 writes such rules); for the
// policy's other Pod it is.
func TestSurfaceSingleAddress(t *testing.T) {
	objs, err := cluster.ParseObjects([]byte(base), "base")
	if err != nil {
		t.Fatal(err)
	}
	cands, err := cluster.ParseObjects([]byte(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: api-out, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 203.0.113.5/32}}], ports: [{port: 443}, {port: 80}]}]
`), "candidate")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	if err != nil {
		t.Fatal(err)
	}
	before, _, err := modelrun.Model(context.Background(), objs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, _, err := modelrun.Model(context.Background(), cluster.Overlay(objs, cands), cfg)
	if err != nil {
		t.Fatal(err)
	}
	conns := []*observed.Conn{conn("10.1.1.10", "203.0.113.5", 6, 443, 4, 0)}
	rep, err := Verify(context.Background(), before, after, cands, conns, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var surface []string
	for _, s := range rep.Surface {
		surface = append(surface, s.Source+" "+s.Destination+" "+s.Port)
	}
	slices.Sort(surface)
	want := []string{
		"shop/api-a 203.0.113.5/32 TCP/80",
		"shop/api-b 203.0.113.5/32 TCP/443",
		"shop/api-b 203.0.113.5/32 TCP/80",
	}
	if !slices.Equal(surface, want) || rep.SurfaceTotal != 3 {
		t.Errorf("surface (%d):\n%s\nwant\n%s", rep.SurfaceTotal, strings.Join(surface, "\n"), strings.Join(want, "\n"))
	}
}
