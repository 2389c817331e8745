package pipeline

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
)

// TestNamedPolicyPorts checks which Pod address, protocol and port each
// named port of a policy rule resolves to: for ingress the Pods the rule
// applies to, for egress the Pods its peers select (every Pod without
// peers), by name and protocol.
func TestNamedPolicyPorts(t *testing.T) {
	// db declares pg (TCP 5432) and dns (UDP 53); api declares pg as 6432.
	pods := `apiVersion: v1
kind: Pod
metadata: {name: db, namespace: default, labels: {app: db}}
spec:
  nodeName: k8s-node-2
  containers:
  - {name: c, image: postgres, ports: [{name: pg, containerPort: 5432}]}
  - {name: d, image: dns, ports: [{name: dns, containerPort: 53, protocol: UDP}]}
status: {phase: Running, podIPs: [{ip: 10.10.2.7}, {ip: "fd00:10:2::7"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: prod, labels: {app: api}}
spec: {nodeName: k8s-node-2, containers: [{name: c, image: api, ports: [{name: pg, containerPort: 6432}]}]}
status: {phase: Running, podIP: 10.10.2.8}
`
	k8s := func(spec string) string {
		return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: default}\nspec:\n" + spec
	}
	acnp := func(spec string) string {
		return "apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: p}\nspec:\n  tier: application\n  priority: 1\n" + spec
	}
	cases := []struct {
		name   string
		policy string
		want   []string // ip/proto/port of the policy's one rule
	}{
		{"ingress resolves on the applied-to Pod, both families", k8s(`
  podSelector: {matchLabels: {app: db}}
  ingress: [{ports: [{port: pg}]}]`), []string{"10.10.2.7/6/5432", "fd00:10:2::7/6/5432"}},
		{"ingress resolves only on the Pods the policy applies to", k8s(`
  podSelector: {}
  ingress: [{ports: [{port: pg}]}]`), []string{"10.10.2.7/6/5432", "fd00:10:2::7/6/5432"}},
		{"protocol must match the container port's", k8s(`
  podSelector: {matchLabels: {app: db}}
  ingress: [{ports: [{port: pg, protocol: UDP}, {port: dns, protocol: UDP}, {port: dns}]}]`), []string{"10.10.2.7/17/53", "fd00:10:2::7/17/53"}},
		{"unknown name resolves to nothing", k8s(`
  podSelector: {matchLabels: {app: db}}
  ingress: [{ports: [{port: http}]}]`), nil},
		{"egress resolves on the peers' Pods", k8s(`
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: api}}}], ports: [{port: pg}]}]`), []string{"10.10.2.8/6/6432"}},
		{"egress to an ipBlock resolves on no Pod", k8s(`
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.10.0.0/16}}], ports: [{port: pg}]}]`), nil},
		{"egress without peers resolves on every Pod", k8s(`
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{ports: [{port: pg}]}]`), []string{"10.10.2.7/6/5432", "10.10.2.8/6/6432", "fd00:10:2::7/6/5432"}},
		{"antrea-native ingress", acnp(`
  appliedTo: [{podSelector: {matchLabels: {app: db}}}]
  ingress: [{action: Allow, ports: [{protocol: TCP, port: pg}]}]`), []string{"10.10.2.7/6/5432", "fd00:10:2::7/6/5432"}},
		{"antrea-native egress", acnp(`
  appliedTo: [{podSelector: {matchLabels: {app: client}}}]
  egress: [{action: Drop, to: [{namespaceSelector: {}}], ports: [{port: pg}]}]`), []string{"10.10.2.7/6/5432", "10.10.2.8/6/6432", "fd00:10:2::7/6/5432"}},
	}
	ctx := context.Background()
	base, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, probs := stateWith(t, base, pods+"---\n"+c.policy, "named.yaml")
			if s := fmt.Sprint(probs); strings.Contains(s, "named port") {
				t.Errorf("named port still warned about: %s", s)
			}
			cp, err := compilePolicies(st, map[uint32]RuleRef{})
			if err != nil {
				t.Fatal(err)
			}
			if len(cp.rules) != 1 {
				t.Fatalf("%d rules, want 1", len(cp.rules))
			}
			var got []string
			for _, m := range cp.rules[0].named {
				got = append(got, fmt.Sprintf("%s/%d/%d", m.ip, m.proto, m.port))
			}
			sort.Strings(got)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("resolved %v, want %v", got, c.want)
			}
		})
	}
}

// TestNamedPortFlows checks the flows of a named port: per destination
// address with protocol and the resolved port, only for this Node's Pods
// on ingress.
func TestNamedPortFlows(t *testing.T) {
	m := overlayModel(t, "k8s-named-port.yaml")
	n1, n2 := flowDump(m, "k8s-node-1"), flowDump(m, "k8s-node-2")
	for _, want := range []string{"tcp,nw_dst=10.10.2.7,tp_dst=5432", "tcp6,ipv6_dst=fd00:10:2::7,tp_dst=5432"} {
		if !strings.Contains(n1, want) { // client's egress rule
			t.Errorf("k8s-node-1: no %q", want)
		}
		if !strings.Contains(n2, want) { // db's ingress rule
			t.Errorf("k8s-node-2: no %q", want)
		}
	}
	if strings.Contains(n1, "udp,nw_dst=10.10.2.7") {
		t.Error("UDP pg resolved though db declares pg for TCP only")
	}
}
