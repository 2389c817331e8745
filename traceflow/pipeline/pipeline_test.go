package pipeline

import (
	"context"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sluice/traceflow/cluster"
	"sluice/traceflow/datapath"
)

func TestSubtract(t *testing.T) {
	got := subtract(netip.MustParsePrefix("10.0.0.0/24"), []netip.Prefix{netip.MustParsePrefix("10.0.0.128/26")})
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/25"), netip.MustParsePrefix("10.0.0.192/26")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v want %v", got, want)
	}
	if got := subtract(netip.MustParsePrefix("10.0.0.0/24"), []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); len(got) != 0 {
		t.Errorf("covered prefix left %v", got)
	}
}

// TestBuildIsDeterministic builds the fixture twice per mode: the flows
// must print identically, since users diff them.
func TestBuildIsDeterministic(t *testing.T) {
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	dump := func(mode TrafficMode) string {
		st, probs := cluster.Build(objs)
		if probs.Err() != nil {
			t.Fatal(probs.Err())
		}
		cfg := DefaultConfig()
		cfg.TrafficMode, cfg.Tag = mode, 7
		m, _, err := Build(ctx, st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, n := range sortedNodeNames(m) {
			for _, f := range m.Nodes[n].Bridge.Flows() {
				b.WriteString(f.String() + "\n")
			}
		}
		return b.String()
	}
	for _, mode := range []TrafficMode{Encap, NoEncap, Hybrid, NetworkPolicyOnly} {
		a, b := dump(mode), dump(mode)
		if a != b {
			t.Errorf("%s: two builds differ", mode)
		}
		if !mode.Encapsulates() && strings.Contains(a, "tun_dst") {
			t.Errorf("%s: tunnel flows in a mode without Egress or encap", mode)
		}
	}
}

// TestServiceAddresses checks which Service addresses each Node
// load-balances: LoadBalancer ingress IPs and externalIPs everywhere, a
// Service with internalTrafficPolicy Local only where it has an endpoint
// (elsewhere it is a Service without endpoints).
func TestServiceAddresses(t *testing.T) {
	ctx := context.Background()
	st := overlayState(t, "")
	m, _, err := Build(ctx, st, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	lbFlow := func(node, match string) string {
		for _, f := range m.Nodes[node].Bridge.Flows() {
			if f.Table == TServiceLB && strings.Contains(f.String(), match+" ") {
				return f.String()
			}
		}
		return ""
	}
	for _, c := range []struct {
		node, match, action string // action "" means no flow
	}{
		{"k8s-node-1", "nw_dst=172.18.0.50,tp_dst=5432", "group:"},
		{"k8s-node-3", "nw_dst=172.18.0.50,tp_dst=5432", "group:"},
		{"k8s-node-1", "nw_dst=192.168.77.50,tp_dst=5432", "group:"},
		{"k8s-node-1", "nw_dst=10.96.0.50,tp_dst=5432", "group:"},
		{"k8s-node-1", "nw_dst=192.168.77.50,tp_dst=30432", ""}, // externalIPs use the Service port
		{"k8s-node-2", "nw_dst=10.96.0.60,tp_dst=5432", "group:"},
		{"k8s-node-1", "nw_dst=10.96.0.60,tp_dst=5432", "->reg4"}, // no local endpoint: the reject mark
		{"k8s-node-3", "nw_dst=10.96.0.60,tp_dst=5432", "->reg4"},
	} {
		f := lbFlow(c.node, c.match)
		switch {
		case c.action == "" && f != "":
			t.Errorf("%s: unexpected flow %s", c.node, f)
		case c.action != "" && !strings.Contains(f, c.action):
			t.Errorf("%s %s: flow %q, want an action %q", c.node, c.match, f, c.action)
		}
	}
}

// TestNodePortMark checks proxyAll's NodePort flows: the Node's own
// address is marked, and ServiceLB load-balances the marked nodePort;
// without proxyAll there is no NodePortMark table and no nodePort flow.
func TestNodePortMark(t *testing.T) {
	ctx := context.Background()
	st := overlayState(t, "")
	dump := func(proxyAll bool) string {
		cfg := DefaultConfig()
		cfg.ProxyAll = proxyAll
		m, _, err := Build(ctx, st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, f := range m.Nodes["k8s-node-1"].Bridge.Flows() {
			b.WriteString(f.String() + "\n")
		}
		return b.String()
	}
	with, without := dump(true), dump(false)
	for _, want := range []string{
		"table=PreRoutingClassifier, priority=0 actions=resubmit(,NodePortMark),resubmit(,SessionAffinity),resubmit(,ServiceLB)\n",
		"table=NodePortMark, priority=200,ip,nw_dst=192.168.77.101 actions=set_field:0x100000/0x100000->reg4\n",
		"table=ServiceLB, priority=200,tcp,reg4=0x110000/0x170000,tp_dst=30432 actions=group:",
	} {
		if !strings.Contains(with, want) {
			t.Errorf("proxyAll: no %q", want)
		}
	}
	if strings.Contains(with, "nw_dst=192.168.77.102 actions=set_field:0x100000") {
		t.Error("proxyAll marks another Node's address")
	}
	if strings.Contains(without, "NodePortMark") || strings.Contains(without, "tp_dst=30432") {
		t.Error("NodePort flows without proxyAll")
	}
}

// TestNamedTargetPort checks that a named target port resolves per Pod:
// two EndpointSlices give the name two numbers, and each endpoint is
// DNATed to its own.
func TestNamedTargetPort(t *testing.T) {
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	more, err := cluster.ParseObjects([]byte(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-named-77xqp
  namespace: default
  labels: {kubernetes.io/service-name: web-named}
addressType: IPv4
ports: [{name: http, port: 9090, protocol: TCP}]
endpoints:
- addresses: [10.10.2.9]
  nodeName: k8s-node-2
`), "slice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, probs := cluster.Build(append(objs, more...))
	if probs.Err() != nil {
		t.Fatal(probs.Err())
	}
	m, _, err := Build(ctx, st, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range m.Nodes["k8s-node-3"].Bridge.Flows() {
		b.WriteString(f.String() + "\n")
	}
	for _, g := range m.Nodes["k8s-node-3"].Bridge.Groups() {
		b.WriteString(g.String() + "\n")
	}
	for _, want := range []string{
		"nat(dst=10.10.1.6:8080)",
		"nat(dst=10.10.2.9:9090)",
		"load:0xa0a0106->NXM_NX_REG3[],set_field:0x21f90/0x7ffff->reg4", // 8080
		"load:0xa0a0209->NXM_NX_REG3[],set_field:0x22382/0x7ffff->reg4", // 9090
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q", want)
		}
	}
}

// TestNamespacesMatchSelf checks that a namespaces.match Self peer gives
// one rule per applied-to namespace, each allowing only its own Pods.
func TestNamespacesMatchSelf(t *testing.T) {
	m := overlayModel(t, "antrea-self.yaml")
	var ids []uint32
	for id, r := range m.Rules {
		if r.Rule == "allow-same-namespace" {
			ids = append(ids, id)
		}
	}
	if len(ids) != 2 { // default and prod hold the applied-to Pods
		t.Fatalf("allow-same-namespace compiled to %d rules, want 2", len(ids))
	}
	// On k8s-node-2 (db in default; api, batch in prod) each rule's peer
	// clause lists only its own namespace's Pod IPs.
	peers := map[uint32][]string{}
	for _, f := range m.Nodes["k8s-node-2"].Bridge.Flows() {
		for _, a := range f.Actions {
			if c, ok := a.(datapath.Conjunction); ok && c.K == 2 && f.Match.NwSrc.IsValid() {
				peers[c.ID] = append(peers[c.ID], f.Match.NwSrc.String())
			}
		}
	}
	got := map[string]bool{}
	for _, id := range ids {
		sort.Strings(peers[id])
		got[strings.Join(peers[id], " ")] = true
	}
	for _, want := range []string{
		"10.10.1.5/32 10.10.1.6/32 10.10.2.7/32 fd00:10:1::5/128 fd00:10:2::7/128",
		"10.10.2.8/32 10.10.2.9/32",
	} {
		if !got[want] {
			t.Errorf("no Self rule whose peers are %s; got %v", want, got)
		}
	}
}

// TestPolicySCTPPort checks that an SCTP port of a policy rule matches
// SCTP, not nothing.
func TestPolicySCTPPort(t *testing.T) {
	sctp := corev1.ProtocolSCTP
	port := intstr.FromInt32(3868)
	anyPort, ms := portMatches([]networkingv1.NetworkPolicyPort{{Protocol: &sctp, Port: &port}})
	if anyPort || len(ms) != 1 || ms[0].proto != datapath.ProtoSCTP || ms[0].port.Value != 3868 {
		t.Errorf("any %v matches %+v", anyPort, ms)
	}
}

// TestSessionAffinityFlows checks the flows of ClientIP affinity: every
// packet passes SessionAffinity, whose default marks the endpoint still
// to select; an affinity Service's buckets come back to ServiceLB to
// learn with the Service's timeout (Kubernetes' 10800 s by default), and
// a Service without affinity goes straight to EndpointDNAT.
func TestSessionAffinityFlows(t *testing.T) {
	ctx := context.Background()
	st := overlayState(t, "")
	timeouts := map[string]int{}
	for _, s := range st.Services {
		timeouts[s.Name] = s.AffinityTimeout
	}
	if timeouts["sticky"] != 600 || timeouts["db-sticky"] != cluster.DefaultAffinityTimeout || timeouts["db-svc"] != 0 {
		t.Errorf("affinity timeouts %v", timeouts)
	}
	m, _, err := Build(ctx, st, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var flows, groups strings.Builder
	for _, f := range m.Nodes["k8s-node-1"].Bridge.Flows() {
		flows.WriteString(f.String() + "\n")
	}
	for _, g := range m.Nodes["k8s-node-1"].Bridge.Groups() {
		groups.WriteString(g.String() + "\n")
	}
	for _, want := range []string{
		"table=PreRoutingClassifier, priority=0 actions=resubmit(,SessionAffinity),resubmit(,ServiceLB)\n",
		"table=SessionAffinity, priority=0 actions=set_field:0x10000/0x70000->reg4\n",
		"table=ServiceLB, priority=190,tcp,reg4=0x30000/0x70000,nw_dst=10.96.0.90,tp_dst=80 actions=learn(table=SessionAffinity,hard_timeout=600,priority=200,",
		"table=ServiceLB, priority=190,tcp,reg4=0x30000/0x70000,nw_dst=10.96.0.91,tp_dst=5432 actions=learn(table=SessionAffinity,hard_timeout=10800,",
		"table=ServiceLB, priority=190,tcp6,reg4=0x30000/0x70000,ipv6_dst=fd00:10:96::91,tp_dst=5432 actions=learn(table=SessionAffinity,hard_timeout=10800,priority=200,delete_learned,eth_type=0x86dd,",
		"load:0x2->NXM_NX_REG4[16..18]),set_field:0x20000/0x70000->reg4,goto_table:EndpointDNAT\n",
	} {
		if !strings.Contains(flows.String(), want) {
			t.Errorf("no %q", want)
		}
	}
	if strings.Contains(flows.String(), "nw_dst=10.96.0.20,tp_dst=5432 actions=learn") {
		t.Error("db-svc, without affinity, learns")
	}
	for _, want := range []string{
		"load:0xa0a0106->NXM_NX_REG3[],set_field:0x31f90/0x7ffff->reg4,resubmit(,ServiceLB)",    // sticky: back to ServiceLB
		"load:0xa0a0207->NXM_NX_REG3[],set_field:0x21538/0x7ffff->reg4,resubmit(,EndpointDNAT)", // db-svc: straight to DNAT
	} {
		if !strings.Contains(groups.String(), want) {
			t.Errorf("no bucket %q in\n%s", want, groups.String())
		}
	}
}
