package tracer

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

func TestDecide(t *testing.T) {
	const (
		client = "10.10.1.5"
		web    = "10.10.1.6"
		db     = "10.10.2.7"
		api    = "10.10.2.8"
	)
	type dec struct {
		node, typ, ns, name, rule, action string
		isolation                         bool
	}
	cases := []struct {
		name              string
		overlays          []string
		src, dst          string
		proto             uint8
		dport             uint16
		egress, ingress   *dec
		denied            bool
		egName, egIP, egN string
	}{
		{name: "no policy, inter-Node", src: client, dst: db, proto: datapath.ProtoTCP, dport: 5432},
		{name: "remote Egress", src: client, dst: "8.8.8.8", proto: datapath.ProtoUDP, dport: 53,
			egName: "egress-client", egIP: "192.168.77.210", egN: "k8s-node-3"},
		{name: "local Egress", src: db, dst: "8.8.8.8", proto: datapath.ProtoTCP, dport: 443,
			egName: "egress-db", egIP: "192.168.77.200", egN: "k8s-node-2"},
		{name: "ACNP ingress drop, intra-Node", overlays: []string{"antrea-deny.yaml"}, src: client, dst: web,
			proto: datapath.ProtoTCP, dport: 80, denied: true,
			ingress: &dec{node: "k8s-node-1", typ: crd.AntreaClusterPolicyType, name: "protect-web", rule: "drop-from-client", action: "Drop"}},
		{name: "ANP egress reject", overlays: []string{"antrea-deny.yaml"}, src: client, dst: db,
			proto: datapath.ProtoTCP, dport: 5432, denied: true,
			egress: &dec{node: "k8s-node-1", typ: crd.AntreaNetworkPolicyType, ns: "default", name: "no-db-from-client", rule: "reject-db", action: "Reject"}},
		{name: "ANP egress reject does not match another port", overlays: []string{"antrea-deny.yaml"}, src: client, dst: db,
			proto: datapath.ProtoTCP, dport: 5433},
		{name: "K8s isolation drop on the destination Node", overlays: []string{"k8s-ingress-isolate.yaml"}, src: client, dst: db,
			proto: datapath.ProtoTCP, dport: 5432, denied: true,
			ingress: &dec{node: "k8s-node-2", typ: crd.K8sNetworkPolicyType, ns: "default", name: "db-deny-all", action: "Drop", isolation: true}},
		{name: "K8s allow", overlays: []string{"k8s-ingress-isolate.yaml"}, src: api, dst: db,
			proto: datapath.ProtoTCP, dport: 5432,
			ingress: &dec{node: "k8s-node-2", typ: crd.K8sNetworkPolicyType, ns: "default", name: "db-from-prod", action: "Allow"}},
		{name: "external source, isolation", overlays: []string{"k8s-ingress-isolate.yaml"}, src: "192.168.1.50", dst: db,
			proto: datapath.ProtoTCP, dport: 5432, denied: true,
			ingress: &dec{node: "k8s-node-2", typ: crd.K8sNetworkPolicyType, ns: "default", name: "db-deny-all", action: "Drop", isolation: true}},
		{name: "external source, allowed", src: "192.168.1.50", dst: db, proto: datapath.ProtoTCP, dport: 5432},
	}
	check := func(t *testing.T, what string, got *Decision, want *dec) {
		t.Helper()
		switch {
		case want == nil && got == nil:
		case want == nil:
			t.Errorf("%s: got %+v, want none", what, *got)
		case got == nil:
			t.Errorf("%s: got none, want %+v", what, *want)
		default:
			g := dec{node: got.Node, typ: got.Rule.PolicyType, ns: got.Rule.Namespace, name: got.Rule.Name, rule: got.Rule.Rule,
				action: got.Rule.Action, isolation: got.Isolation}
			if g != *want {
				t.Errorf("%s: got %+v, want %+v", what, g, *want)
			}
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := loadModel(t, pipeline.Encap, tc.overlays...)
			v, err := Decide(context.Background(), m, Connection{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst),
				Proto: tc.proto, SrcPort: 40000, DstPort: tc.dport})
			if err != nil {
				t.Fatal(err)
			}
			check(t, "egress", v.Egress, tc.egress)
			check(t, "ingress", v.Ingress, tc.ingress)
			if v.Denied != tc.denied {
				t.Errorf("denied %v, want %v (note %q)", v.Denied, tc.denied, v.Note)
			}
			egIP := ""
			if v.EgressIP.IsValid() {
				egIP = v.EgressIP.String()
			}
			if v.EgressName != tc.egName || egIP != tc.egIP || v.EgressNode != tc.egN {
				t.Errorf("Egress %q %q %q, want %q %q %q", v.EgressName, egIP, v.EgressNode, tc.egName, tc.egIP, tc.egN)
			}
			if !tc.denied && v.Note != "" && tc.egName == "" {
				t.Errorf("an allowed connection was lost: %s", v.Note)
			}
		})
	}
}

func TestDecideNotModelled(t *testing.T) {
	m := loadModel(t, pipeline.Encap)
	_, err := Decide(context.Background(), m, Connection{Src: netip.MustParseAddr("1.2.3.4"), Dst: netip.MustParseAddr("5.6.7.8"), Proto: 6})
	if !errors.Is(err, ErrNotModelled) {
		t.Fatalf("got %v, want ErrNotModelled", err)
	}
}

func BenchmarkDecide(b *testing.B) {
	m := loadModel(b, pipeline.Encap, "antrea-deny.yaml")
	c := Connection{Src: netip.MustParseAddr("10.10.1.5"), Dst: netip.MustParseAddr("10.10.2.7"), Proto: 6, SrcPort: 40000, DstPort: 5432}
	ctx := context.Background()
	for b.Loop() {
		if _, err := Decide(ctx, m, c); err != nil {
			b.Fatal(err)
		}
	}
}
