package tracer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
)

// TestAntreaICMPRules traces pings and TCP from client to db past an
// Antrea-native Drop rule on db's ingress with protocols (and ports),
// and checks which the rule drops, as upstream's flows would: an ICMP
// entry matches ICMP, and ICMPv6 for IPv6 with the same numbers, on its
// type and code when given; the entries and ports are alternatives; an
// IGMP entry matches nothing; an entry of neither kind adds no match.
func TestAntreaICMPRules(t *testing.T) {
	ping, ping6, pg, http := "icmp", "ipv6", "tcp,tcp_dst=5432", "tcp,tcp_dst=80"
	cases := []struct {
		name    string
		rule    string
		dropped []string // of ping, ping6, pg, http
	}{
		{"echo request type and code", `protocols: [{icmp: {icmpType: 8, icmpCode: 0}}]`, []string{ping}},
		{"type only", `protocols: [{icmp: {icmpType: 8}}]`, []string{ping}},
		{"code only", `protocols: [{icmp: {icmpCode: 0}}]`, []string{ping, ping6}},
		{"another code", `protocols: [{icmp: {icmpCode: 1}}]`, nil},
		{"another type", `protocols: [{icmp: {icmpType: 0}}]`, nil},
		{"ICMPv6 echo request number", `protocols: [{icmp: {icmpType: 128}}]`, []string{ping6}},
		{"any ICMP", `protocols: [{icmp: {}}]`, []string{ping, ping6}},
		{"protocols and ports are alternatives", `protocols: [{icmp: {icmpType: 8}}]
    ports: [{protocol: TCP, port: 5432}]`, []string{ping, pg}},
		{"IGMP matches nothing", `protocols: [{igmp: {igmpType: 17, groupAddress: 224.0.0.1}}]`, nil},
		{"an empty entry adds no match", `protocols: [{}]`, []string{ping, ping6, pg, http}},
	}
	ctx := context.Background()
	base, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			policy := `apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: p}
spec:
  tier: securityops
  priority: 1
  appliedTo: [{podSelector: {matchLabels: {app: db}}}]
  ingress:
  - name: drop
    action: Drop
    ` + c.rule + "\n"
			top, err := cluster.ParseObjects([]byte(policy), "icmp.yaml")
			if err != nil {
				t.Fatal(err)
			}
			st, probs := cluster.Build(cluster.Overlay(base, top))
			if probs.Err() != nil {
				t.Fatal(probs.Err())
			}
			if s := fmt.Sprint(probs); strings.Contains(c.rule, "igmp") != strings.Contains(s, "igmp is not modelled") {
				t.Errorf("warnings: %s", s)
			}
			cfg := pipeline.DefaultConfig()
			cfg.Tag = 7
			m, _, err := pipeline.Build(ctx, st, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, flow := range []string{ping, ping6, pg, http} {
				dst := "default/db"
				if flow == ping6 {
					dst = "fd00:10:2::7"
				}
				tf := trace(t, m, "default/client", dst, flow)
				if droppedBy(tf, "AntreaClusterNetworkPolicy:p", "drop") {
					got = append(got, flow)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.dropped) {
				t.Errorf("dropped %v, want %v", got, c.dropped)
			}
		})
	}
}

func droppedBy(tf *crd.Traceflow, policy, rule string) bool {
	for _, r := range tf.Status.Results {
		for _, o := range r.Observations {
			if o.Action == crd.ActionDropped && o.NetworkPolicy == policy && o.NetworkPolicyRule == rule {
				return true
			}
		}
	}
	return false
}
