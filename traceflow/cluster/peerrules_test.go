package cluster

import (
	"strings"
	"testing"
)

// TestNamespacesAndProtocolsChecks checks what Build accepts of
// namespaces peers and rule protocols: what upstream's API rejects is an
// error, what it accepts but Sluice traces differently or not at all is a
// warning, and sameLabels and ICMP are neither.
func TestNamespacesAndProtocolsChecks(t *testing.T) {
	acnp := func(rule string) string {
		return `{apiVersion: crd.antrea.io/v1beta1, kind: ClusterNetworkPolicy, metadata: {name: p}, spec: {priority: 1, appliedTo: [{podSelector: {}}], ingress: [` + rule + `]}}`
	}
	cases := []struct {
		name, doc string
		sev       Severity // -1: no problem at all
		want      string
	}{
		{"sameLabels", acnp(`{action: Allow, from: [{namespaces: {sameLabels: [tenant, env]}, podSelector: {}}]}`), -1, ""},
		{"Self", acnp(`{action: Allow, from: [{namespaces: {match: Self}}]}`), -1, ""},
		{"ICMP", acnp(`{action: Drop, protocols: [{icmp: {icmpType: 8, icmpCode: 0}}]}`), -1, ""},
		{"match other than Self", acnp(`{action: Allow, from: [{namespaces: {match: Other}}]}`), Error, `namespaces.match "Other" is not Self`},
		{"match and sameLabels", acnp(`{action: Allow, from: [{namespaces: {match: Self, sameLabels: [a]}}]}`), Error, "both match and sameLabels"},
		{"namespaces and namespaceSelector", acnp(`{action: Allow, from: [{namespaces: {sameLabels: [a]}, namespaceSelector: {}}]}`), Error, "namespaces and namespaceSelector"},
		{"bad label key", acnp(`{action: Allow, from: [{namespaces: {sameLabels: ["-x"]}}]}`), Error, `sameLabels key "-x"`},
		{"empty sameLabels", acnp(`{action: Allow, from: [{namespaces: {sameLabels: []}}]}`), Warning, "leaves that peer out"},
		{"namespaced policy", `{apiVersion: crd.antrea.io/v1beta1, kind: NetworkPolicy, metadata: {name: p, namespace: ns}, spec: {priority: 1, appliedTo: [{podSelector: {}}], ingress: [{action: Allow, from: [{namespaces: {sameLabels: [a]}}]}]}}`,
			Warning, "no namespaces field upstream"},
		{"ICMP type out of range", acnp(`{action: Drop, protocols: [{icmp: {icmpType: 256}}]}`), Error, "icmp type or code 256"},
		{"IGMP", acnp(`{action: Drop, protocols: [{igmp: {igmpType: 17}}]}`), Warning, "cannot trace IGMP"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, probs := build(t, base, c.doc)
			if c.sev == -1 {
				if len(probs) > 0 || st == nil {
					t.Errorf("problems %v", probs)
				}
				return
			}
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
