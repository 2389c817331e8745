package pipeline

import (
	"strings"
	"testing"

	"sluice/traceflow/datapath"
)

// TestICMPRuleFlows checks the port clause of Antrea-native rules with
// ICMP protocols: one flow per family, ICMPv6 with the same type and
// code numbers, and no flow left matching every protocol.
func TestICMPRuleFlows(t *testing.T) {
	m := overlayModel(t, "antrea-icmp.yaml")
	n1, n2 := flowDump(m, "k8s-node-1"), flowDump(m, "k8s-node-2")
	for node, wants := range map[string][]string{
		n1: {"priority=60000,icmp,icmp_type=8,icmp_code=0 actions=conjunction(", "priority=60000,icmp6,icmp_type=8,icmp_code=0 actions=conjunction("},
		n2: {"priority=59999,icmp,icmp_type=13 actions=conjunction(", "priority=59999,icmp,icmp_type=128 actions=conjunction(",
			"priority=59999,icmp6,icmp_type=13 actions=conjunction(", "priority=59999,icmp6,icmp_type=128 actions=conjunction("},
	} {
		for _, want := range wants {
			if !strings.Contains(node, want) {
				t.Errorf("no %q", want)
			}
		}
	}
	clauses := 0
	for _, f := range m.Nodes["k8s-node-2"].Bridge.Flows() {
		for _, a := range f.Actions {
			if c, ok := a.(datapath.Conjunction); ok && c.K == 3 {
				clauses++
				if f.Match.IPProto == 0 {
					t.Errorf("a port clause matches any protocol: %s", f)
				}
			}
		}
	}
	if clauses != 4 {
		t.Errorf("%d port clause flows on k8s-node-2, want 4", clauses)
	}
}
