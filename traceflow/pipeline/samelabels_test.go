package pipeline

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
)

// TestSameLabelsPeers checks which Pods a rule with a namespaces.sameLabels
// peer lets reach which, as upstream compiles it: namespaces grouped by
// their values for the keys (none for a namespace missing a key), the
// peer's podSelector within the group, only the last appliedTo entry, a
// group entry standing for every Pod of its namespaces, other peers in a
// rule of their own, and no such field in a namespaced policy.
func TestSameLabelsPeers(t *testing.T) {
	// Four tenant namespaces; t4 has no env label. default and prod (the
	// fixture's) have no tenant label.
	objs := `apiVersion: v1
kind: Namespace
metadata: {name: t1, labels: {tenant: x, env: dev}}
---
apiVersion: v1
kind: Namespace
metadata: {name: t2, labels: {tenant: x, env: prod}}
---
apiVersion: v1
kind: Namespace
metadata: {name: t3, labels: {tenant: y, env: dev}}
---
apiVersion: v1
kind: Namespace
metadata: {name: t4, labels: {tenant: x}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: t1, labels: {role: fe}}
spec: {nodeName: k8s-node-2, containers: [{name: c, image: a}]}
status: {phase: Running, podIP: 10.10.2.31}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: t2, labels: {role: be}}
spec: {nodeName: k8s-node-2, containers: [{name: c, image: b}]}
status: {phase: Running, podIP: 10.10.2.32}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: t3, labels: {role: fe}}
spec: {nodeName: k8s-node-2, containers: [{name: c, image: c}]}
status: {phase: Running, podIP: 10.10.2.33}
---
apiVersion: v1
kind: Pod
metadata: {name: d, namespace: t4, labels: {role: fe}}
spec: {nodeName: k8s-node-2, containers: [{name: c, image: d}]}
status: {phase: Running, podIP: 10.10.2.34}
---
apiVersion: crd.antrea.io/v1beta1
kind: ClusterGroup
metadata: {name: backends-of-x}
spec:
  podSelector: {matchLabels: {role: be}}
  namespaceSelector: {matchLabels: {tenant: x}}
`
	acnp := func(spec string) string {
		return "apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: p}\nspec:\n  tier: application\n  priority: 1\n" + spec
	}
	tenantX := []string{"t1/a", "t2/b", "t4/d"}
	cases := []struct {
		name   string
		policy string
		want   []string // src>dst the rule "allow" matches; * is any source
		warn   string
	}{
		{"one key groups namespaces by value", acnp(`
  appliedTo: [{namespaceSelector: {}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}}]}]`),
			append(pairs(tenantX, tenantX), "t3/c>t3/c"), ""},
		{"a namespace missing one of the keys is in no group", acnp(`
  appliedTo: [{namespaceSelector: {}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant, env]}}]}]`),
			[]string{"t1/a>t1/a", "t2/b>t2/b", "t3/c>t3/c"}, ""},
		{"the podSelector narrows the peers within the group", acnp(`
  appliedTo: [{namespaceSelector: {}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}, podSelector: {matchLabels: {role: fe}}}]}]`),
			append(pairs([]string{"t1/a", "t4/d"}, tenantX), "t3/c>t3/c"), ""},
		{"egress the same way", acnp(`
  appliedTo: [{namespaceSelector: {matchLabels: {env: dev}}}]
  egress: [{name: allow, action: Allow, to: [{namespaces: {sameLabels: [tenant]}}]}]`),
			append(pairs([]string{"t1/a"}, tenantX), "t3/c>t3/c"), ""},
		{"only the last appliedTo entry counts", acnp(`
  appliedTo: [{namespaceSelector: {matchLabels: {tenant: y}}}, {namespaceSelector: {matchLabels: {env: prod}}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}}]}]`),
			pairs(tenantX, []string{"t2/b"}), ""},
		{"rule-level appliedTo likewise", acnp(`
  ingress:
  - name: allow
    action: Allow
    appliedTo: [{namespaceSelector: {matchLabels: {env: prod}}}, {namespaceSelector: {matchLabels: {tenant: y}}}]
    from: [{namespaces: {sameLabels: [tenant]}}]`),
			[]string{"t3/c>t3/c"}, ""},
		{"a group entry stands for every Pod of its namespaces", acnp(`
  appliedTo: [{group: backends-of-x}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}}]}]`),
			pairs(tenantX, tenantX), ""},
		{"other peers keep a rule of their own", acnp(`
  appliedTo: [{namespaceSelector: {matchLabels: {env: dev}}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}}, {podSelector: {matchLabels: {app: client}}, namespaceSelector: {}}]}]`),
			append(pairs([]string{"default/client"}, []string{"t1/a", "t3/c"}), append(pairs(tenantX, []string{"t1/a"}), "t3/c>t3/c")...), ""},
		{"no keys: upstream leaves the peer out, so the rule matches any source", acnp(`
  appliedTo: [{namespaceSelector: {matchLabels: {tenant: y}}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: []}}]}]`),
			[]string{"*>t3/c"}, "leaves that peer out"},
		{"a namespaced policy has no namespaces field: its own namespace", `apiVersion: crd.antrea.io/v1beta1
kind: NetworkPolicy
metadata: {name: p, namespace: t1}
spec:
  tier: application
  priority: 1
  appliedTo: [{podSelector: {}}]
  ingress: [{name: allow, action: Allow, from: [{namespaces: {sameLabels: [tenant]}}]}]`,
			[]string{"t1/a>t1/a"}, "no namespaces field upstream"},
	}
	ctx := context.Background()
	base, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, probs := stateWith(t, base, objs+"---\n"+c.policy, "samelabels.yaml")
			if s := fmt.Sprint(probs); c.warn != "" && !strings.Contains(s, c.warn) || c.warn == "" && strings.Contains(s, "namespaces") {
				t.Errorf("warnings %s; want one with %q", s, c.warn)
			}
			refs := map[uint32]RuleRef{}
			cp, err := compilePolicies(st, refs)
			if err != nil {
				t.Fatal(err)
			}
			got := reachPairs(st, cp, refs, "allow")
			want := append([]string(nil), c.want...)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("rule matches\n  %v\nwant\n  %v", got, want)
			}
		})
	}
}

// pairs lists src>dst for every src and dst.
func pairs(srcs, dsts []string) []string {
	var out []string
	for _, s := range srcs {
		for _, d := range dsts {
			out = append(out, s+">"+d)
		}
	}
	return out
}

// reachPairs lists, sorted, the src>dst Pod pairs (src * for any peer)
// that the compiled rules named rule match: the Pods a rule applies to
// are the destinations of an ingress rule and the sources of an egress
// one; its peers, by their IPv4 addresses, the other end.
func reachPairs(st *cluster.State, cp *compiledPolicies, refs map[uint32]RuleRef, rule string) []string {
	seen := map[string]bool{}
	for _, r := range cp.rules {
		if refs[r.id].Rule != rule {
			continue
		}
		var peers []string
		if r.anyPeer {
			peers = []string{"*"}
		}
		for _, p := range st.Pods {
			ip, ok := p.IP(false)
			if ok && containsAddr(r.peers, ip) {
				peers = append(peers, p.Key())
			}
		}
		for _, a := range r.appliedTo {
			for _, q := range peers {
				if r.ingress {
					seen[q+">"+a.Key()] = true
				} else {
					seen[a.Key()+">"+q] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func containsAddr(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
