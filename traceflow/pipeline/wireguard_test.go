package pipeline

import (
	"context"
	"strings"
	"testing"
)

// TestWireGuardFlows compares encap mode with and without WireGuard on
// the fixture: with it, the peer PodCIDRs are routed to the gateway
// rather than the tunnel and the Traceflow flow for the gateway outputs
// the packet (the host carries it on); the tunnel port and the remote
// Egress flow through it stay.
func TestWireGuardFlows(t *testing.T) {
	ctx := context.Background()
	st := overlayState(t, "")
	flows := func(enc EncryptionMode) []string {
		cfg := DefaultConfig()
		cfg.Tag, cfg.Encryption = 7, enc
		m, _, err := Build(ctx, st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, f := range m.Nodes["k8s-node-1"].Bridge.Flows() {
			out = append(out, f.String())
		}
		return out
	}
	find := func(fs []string, parts ...string) string {
	next:
		for _, f := range fs {
			for _, p := range parts {
				if !strings.Contains(f, p) {
					continue next
				}
			}
			return f
		}
		return ""
	}
	for _, c := range []struct {
		enc   EncryptionMode
		parts []string // the flow to find
		has   string   // in its actions
		lacks string
	}{
		{EncryptionNone, []string{"table=L3Forwarding,", "nw_dst=10.10.2.0/24 "}, "->tun_dst", ""},
		{WireGuard, []string{"table=L3Forwarding,", "nw_dst=10.10.2.0/24 "}, "set_field:0x20/0xf0->reg0", "tun_dst"},
		{WireGuard, []string{"table=L3Forwarding,", "ipv6_dst=fd00:10:2::/64 "}, "set_field:0x20/0xf0->reg0", "tun_dst"},
		{EncryptionNone, []string{"table=Output,", "priority=202,ip,", "reg1=0x2,"}, "controller", "output:"},
		{WireGuard, []string{"table=Output,", "priority=202,ip,", "reg1=0x2,"}, "output:NXM_NX_REG1[],controller", ""},
		{WireGuard, []string{"table=Classifier,", "in_port=1 "}, "goto_table:UnSNAT", ""},
		{WireGuard, []string{"table=EgressMark,", "in_port=3 "}, "set_field:192.168.77.210->tun_dst", ""},
	} {
		f := find(flows(c.enc), c.parts...)
		if f == "" || !strings.Contains(f, c.has) || (c.lacks != "" && strings.Contains(f, c.lacks)) {
			t.Errorf("%s %v: flow %q, want %q in it and not %q", c.enc, c.parts, f, c.has, c.lacks)
		}
	}

	// As the reference's agent, which refuses to start with these.
	for _, mode := range []TrafficMode{NoEncap, Hybrid, NetworkPolicyOnly} {
		cfg := DefaultConfig()
		cfg.TrafficMode, cfg.Encryption = mode, WireGuard
		if _, _, err := Build(ctx, st, cfg); err == nil || !strings.Contains(err.Error(), "WireGuard") {
			t.Errorf("%s with WireGuard: error %v", mode, err)
		}
	}
}
