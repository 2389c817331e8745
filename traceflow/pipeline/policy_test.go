package pipeline

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
)

// TestCompilePoliciesRefuses checks the states compilePolicies cannot
// order: a tier cluster.Build would have refused (a state built in code),
// and more Baseline-tier rules than the DefaultRule tables have flow
// priorities for. Neither may compile into a model with the rules in the
// wrong order.
func TestCompilePoliciesRefuses(t *testing.T) {
	policy := func(name, tier string, rules int) *crd.AntreaPolicy {
		p := &crd.AntreaPolicy{TypeMeta: metav1.TypeMeta{Kind: crd.KindAntreaClusterPolicy},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: crd.AntreaPolicySpec{Tier: tier}}
		for range rules {
			p.Spec.Ingress = append(p.Spec.Ingress, crd.AntreaPolicyRule{Action: crd.RuleActionAllow})
		}
		return p
	}
	for _, c := range []struct {
		name     string
		policies []*crd.AntreaPolicy
		want     string // "" for no error
	}{
		{"unknown tier", []*crd.AntreaPolicy{policy("p", "nosuchtier", 1)}, `tier "nosuchtier"`},
		{"baseline rules at the limit", []*crd.AntreaPolicy{policy("a", "application", 150), policy("b", "baseline", maxBaselineRules)}, ""},
		{"too many baseline rules", []*crd.AntreaPolicy{policy("b", "baseline", maxBaselineRules), policy("c", "Baseline", 1)},
			"200 Baseline-tier rules"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := compilePolicies(&cluster.State{AntreaPolicies: c.policies}, map[uint32]RuleRef{})
			if c.want == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}
