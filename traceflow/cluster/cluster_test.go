package cluster

import (
	"context"
	"strings"
	"testing"
)

const base = `
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: n1}
  spec: {podCIDR: 10.0.1.0/24}
  status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
- apiVersion: v1
  kind: Node
  metadata: {name: n2}
  spec: {podCIDR: 10.0.2.0/24}
  status: {addresses: [{type: InternalIP, address: 192.168.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns}
spec: {nodeName: n1}
status: {podIP: 10.0.1.5}
`

func build(t *testing.T, docs ...string) (*State, Problems) {
	t.Helper()
	var objs []Object
	for i, d := range docs {
		o, err := ParseObjects([]byte(d), "doc"+string(rune('0'+i)))
		if err != nil {
			t.Fatal(err)
		}
		objs = Overlay(objs, o)
	}
	return Build(objs)
}

func TestBuildBase(t *testing.T) {
	st, probs := build(t, base)
	if err := probs.Err(); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 2 || st.Pod("ns", "a") == nil || st.Node("n2").TransportIP.String() != "192.168.0.2" {
		t.Fatalf("state %+v", st)
	}
	if _, ok := st.Namespaces["ns"]; !ok {
		t.Error("namespace implied by a Pod is missing")
	}
}

// TestSkipsWhatIsNotReady: in a live cluster some Pods are always
// pending (not scheduled, or without an IP yet) and a Node may not have
// reported its addresses yet. Each is skipped with a warning naming it,
// and the rest of the cluster is still modelled: a trace between other
// Pods goes on.
func TestSkipsWhatIsNotReady(t *testing.T) {
	st, probs := build(t, base,
		`{apiVersion: v1, kind: Pod, metadata: {name: pending, namespace: ns}, status: {phase: Pending}}`,
		`{apiVersion: v1, kind: Pod, metadata: {name: no-ip, namespace: ns}, spec: {nodeName: n1}, status: {phase: Pending}}`,
		`{apiVersion: v1, kind: Node, metadata: {name: n3}, spec: {podCIDR: 10.0.3.0/24}}`,
		`{apiVersion: v1, kind: Pod, metadata: {name: on-n3, namespace: ns}, spec: {nodeName: n3}, status: {podIP: 10.0.3.5}}`,
		`{apiVersion: crd.antrea.io/v1beta1, kind: Egress, metadata: {name: via-n3}, spec: {appliedTo: {podSelector: {}}}, status: {egressIP: 192.168.0.50, egressNode: n3}}`,
	)
	if err := probs.Err(); err != nil {
		t.Fatalf("the cluster check failed: %v", err)
	}
	if st == nil {
		t.Fatal("no state")
	}
	for _, want := range []string{
		"Pod ns/pending: is not scheduled (no spec.nodeName); ignored",
		"Pod ns/no-ip: has no IP address yet; ignored",
		"Node n3: has no InternalIP address (needed as the tunnel endpoint); ignored",
		`Pod ns/on-n3: is on Node "n3", which has no InternalIP address; ignored`,
		`Egress via-n3: status.egressNode "n3" has no InternalIP address; traced as an Egress without IP`,
	} {
		found := false
		for _, p := range probs {
			found = found || p.Severity == Warning && strings.Contains(p.String(), want)
		}
		if !found {
			t.Errorf("no warning %q in %v", want, probs)
		}
	}
	if st.Node("n3") != nil || st.Pod("ns", "on-n3") != nil || st.Pod("ns", "pending") != nil || st.Pod("ns", "no-ip") != nil {
		t.Errorf("skipped objects are in the state: Nodes %d, Pods %d", len(st.Nodes), len(st.Pods))
	}
	if st.Pod("ns", "a") == nil || st.Node("n1") == nil || st.Node("n2") == nil {
		t.Errorf("the ready objects are missing: %+v", st)
	}
}

// TestProblems checks that each inconsistency is reported, with its
// severity, naming the object.
func TestProblems(t *testing.T) {
	cases := []struct {
		name, doc string
		sev       Severity
		want      string
	}{
		{"pod on unknown node", `{apiVersion: v1, kind: Pod, metadata: {name: b, namespace: ns}, spec: {nodeName: n9}, status: {podIP: 10.0.1.6}}`,
			Error, `Pod ns/b: is on Node "n9", which is not in the cluster state`},
		{"overlapping CIDRs", `{apiVersion: v1, kind: Node, metadata: {name: n3}, spec: {podCIDR: 10.0.0.0/16}, status: {addresses: [{type: InternalIP, address: 192.168.0.3}]}}`,
			Error, "Node n3: podCIDR 10.0.0.0/16 overlaps podCIDR 10.0.1.0/24 of Node n1"},
		{"duplicate pod IP", `{apiVersion: v1, kind: Pod, metadata: {name: b, namespace: ns}, spec: {nodeName: n1}, status: {podIP: 10.0.1.5}}`,
			Error, "Pod ns/b: IP 10.0.1.5 is also the IP of Pod ns/a"},
		{"bad pod IP", `{apiVersion: v1, kind: Pod, metadata: {name: b, namespace: ns}, spec: {nodeName: n1}, status: {podIP: 10.0.1.500}}`,
			Error, `Pod ns/b: Pod IP "10.0.1.500" is not an IP address`},
		{"pod outside its CIDR", `{apiVersion: v1, kind: Pod, metadata: {name: b, namespace: ns}, spec: {nodeName: n1}, status: {podIP: 10.0.2.6}}`,
			Warning, "IP 10.0.2.6 is outside the podCIDRs of its Node n1"},
		{"egress IP held by no node", `{apiVersion: crd.antrea.io/v1beta1, kind: Egress, metadata: {name: e}, spec: {appliedTo: {podSelector: {}}, egressIP: 192.168.0.50}}`,
			Warning, "Egress e: egress IP 192.168.0.50 is held by no Node"},
		{"egress on unknown node", `{apiVersion: crd.antrea.io/v1beta1, kind: Egress, metadata: {name: e}, spec: {appliedTo: {podSelector: {}}}, status: {egressIP: 192.168.0.50, egressNode: n7}}`,
			Error, `Egress e: status.egressNode "n7" is not a Node`},
		{"node without address", `{apiVersion: v1, kind: Node, metadata: {name: n3}, spec: {podCIDR: 10.0.3.0/24}}`,
			Warning, "Node n3: has no InternalIP address (needed as the tunnel endpoint); ignored"},
		{"bad policy action", `{apiVersion: crd.antrea.io/v1beta1, kind: ClusterNetworkPolicy, metadata: {name: p}, spec: {priority: 1, appliedTo: [{podSelector: {}}], ingress: [{action: Maybe}]}}`,
			Error, `ClusterNetworkPolicy p: ingress rule 0: action "Maybe"`},
		{"bad ipBlock", `{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: p, namespace: ns}, spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: nope}}]}]}}`,
			Error, `NetworkPolicy ns/p: ipBlock cidr "nope" is not a CIDR`},
		{"unknown kind", `{apiVersion: apps/v1, kind: Deployment, metadata: {name: d, namespace: ns}}`,
			Warning, "Deployment ns/d: kind Deployment (apps/v1) is not part of the model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, probs := build(t, base, c.doc)
			found := false
			for _, p := range probs {
				if p.Severity == c.sev && strings.Contains(p.String(), c.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("problems %v: none with severity %d containing %q", probs, c.sev, c.want)
			}
			if (c.sev == Error) != (st == nil) {
				t.Errorf("state returned %v with severity %d", st != nil, c.sev)
			}
		})
	}
}

func TestParseErrorsNameTheDocument(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"kind: Pod\nmetadata: {}\n", "f#1: Pod has no metadata.name"},
		{"---\napiVersion: v1\n---\n", "f#1: object has no kind"},
		{"a: [1, 2\n", "f document 1"},
		{"- 1\n- 2\n", "f#1: not a Kubernetes object"},
	} {
		_, err := ParseObjects([]byte(c.in), "f")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
}

func TestOverlayReplacesByIdentity(t *testing.T) {
	a, _ := ParseObjects([]byte(base), "a")
	b, _ := ParseObjects([]byte(`{apiVersion: v1, kind: Pod, metadata: {name: a, namespace: ns}, spec: {nodeName: n2}, status: {podIP: 10.0.2.5}}`), "b")
	st, probs := Build(Overlay(a, b))
	if probs.Err() != nil || st.Pod("ns", "a").Node != "n2" || len(st.Pods) != 1 {
		t.Fatalf("overlay: %v %+v", probs, st.Pods)
	}
}

func TestReadPathDirectory(t *testing.T) {
	objs, err := ReadPath(context.Background(), "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	st, probs := Build(objs)
	if probs.Err() != nil || len(st.Nodes) != 3 {
		t.Fatalf("%v", probs)
	}
	if _, err := ReadPath(context.Background(), "../testdata/none"); err == nil {
		t.Error("missing path accepted")
	}
}
