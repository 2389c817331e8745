package pipeline

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// TestFlexibleIPAMWarning: a Pod whose IP is outside its Node's PodCIDRs
// (an AntreaIPAM Pod) is warned about, once; the fixture's Pods are not.
func TestFlexibleIPAMWarning(t *testing.T) {
	ctx := context.Background()
	count := func(pool string) (n int, msg string) {
		st := overlayState(t, "")
		if pool != "" {
			p := st.Pod("default", "db")
			p.IPs = append([]netip.Addr{netip.MustParseAddr(pool)}, p.IPs...)
		}
		_, more, err := Build(ctx, st, DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range more {
			if strings.Contains(p.Message, "FlexibleIPAM") {
				n, msg = n+1, p.Object+": "+p.Message
			}
		}
		return n, msg
	}
	if n, msg := count(""); n != 0 {
		t.Errorf("fixture: %d warnings, e.g. %s", n, msg)
	}
	if n, msg := count("172.30.0.9"); n != 1 || !strings.Contains(msg, "Pod default/db: IP 172.30.0.9 is outside Node k8s-node-2's PodCIDRs") {
		t.Errorf("an IPPool address: %d warnings, %q", n, msg)
	}
}

// TestBridgingMode: enableBridgingMode needs noEncap; with it the
// AntreaIPAM Pods of the fixture's FlexibleIPAM overlay are modelled (no
// warning), the uplink and host ports are wired, and the bridges of Nodes
// without such Pods differ from noEncap's only by the bridging flows.
func TestBridgingMode(t *testing.T) {
	ctx := context.Background()
	st := overlayState(t, "flexible-ipam.yaml")
	cfg := DefaultConfig()
	cfg.BridgingMode = true
	if _, _, err := Build(ctx, st, cfg); err == nil || !strings.Contains(err.Error(), "requires the noEncap traffic mode") {
		t.Errorf("bridging in encap mode: %v", err)
	}
	cfg.TrafficMode = NoEncap
	m, more, err := Build(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		if strings.Contains(p.Message, "FlexibleIPAM") {
			t.Errorf("warned: %s: %s", p.Object, p.Message)
		}
	}
	if !m.AntreaIPAM(st.Pod("bridged", "front")) || m.VLAN(st.Pod("default", "vlan-app")) != 20 || m.AntreaIPAM(st.Pod("default", "client")) {
		t.Errorf("AntreaIPAM Pods misclassified")
	}
	dump := func(m *Model, node string) string {
		var b strings.Builder
		for _, f := range m.Nodes[node].Bridge.Flows() {
			b.WriteString(f.String() + "\n")
		}
		return b.String()
	}
	n1 := dump(m, "k8s-node-1")
	for _, want := range []string{
		"table=Classifier, priority=200,in_port=32770 actions=output:32771",
		"table=Classifier, priority=200,in_port=32771 actions=output:32770",
		"table=L2ForwardingCalc, priority=190,reg4=0x200000/0x200000 actions=load:0x8002->NXM_NX_REG1[],set_field:0x200000/0x600000->reg0,goto_table:ConntrackCommit",
	} {
		if !strings.Contains(n1, want) {
			t.Errorf("node 1 has no %q:\n%s", want, n1)
		}
	}
	cfg.BridgingMode = false
	off, _, err := Build(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(dump(off, "k8s-node-1"), "32770") {
		t.Errorf("the uplink is wired without bridging")
	}
}
