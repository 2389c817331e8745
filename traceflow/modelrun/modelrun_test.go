package modelrun

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

func TestSettingsConfig(t *testing.T) {
	cfg, err := DefaultSettings().Config(7)
	if err != nil {
		t.Fatal(err)
	}
	def := pipeline.DefaultConfig()
	if cfg.TrafficMode != def.TrafficMode || cfg.TunnelType != def.TunnelType || cfg.Tag != 7 ||
		len(cfg.ServiceCIDRs) != 1 || cfg.ServiceCIDRs[0] != def.ServiceCIDRs[0] {
		t.Errorf("default settings give %+v, want pipeline.DefaultConfig with tag 7", cfg)
	}
	s := DefaultSettings()
	s.EgressExceptCIDRs = []string{"10.0.0.5/8"}
	if cfg, err = s.Config(7); err != nil || cfg.EgressExceptCIDRs[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("except CIDRs %v (%v), want masked 10.0.0.0/8", cfg.EgressExceptCIDRs, err)
	}
	for field, s := range map[string]Settings{
		"TrafficMode":       {TrafficMode: "bridge", TunnelType: "geneve"},
		"TunnelType":        {TrafficMode: "encap", TunnelType: "gre"},
		"ServiceCIDRs":      {TrafficMode: "encap", TunnelType: "geneve", ServiceCIDRs: []string{"nope"}},
		"EgressExceptCIDRs": {TrafficMode: "encap", TunnelType: "geneve", EgressExceptCIDRs: []string{"1.2.3.4"}},
	} {
		_, err := s.Config(7)
		var se *SettingError
		if !errors.As(err, &se) || se.Field != field {
			t.Errorf("%s: error %v, want a SettingError naming it", field, err)
		}
	}
}

// trafficEncryptionMode is read without regard to case, as the reference
// reads it; WireGuard outside encap mode and IPsec are refused, naming the
// setting.
func TestSettingsEncryption(t *testing.T) {
	for _, v := range []string{"", "none", "None"} {
		s := DefaultSettings()
		s.TrafficEncryptionMode = v
		if cfg, err := s.Config(7); err != nil || cfg.WireGuard() {
			t.Errorf("%q: WireGuard %v, error %v; want neither", v, cfg.WireGuard(), err)
		}
	}
	for _, v := range []string{"wireGuard", "WireGuard", "wireguard"} {
		s := DefaultSettings()
		s.TrafficEncryptionMode = v
		if cfg, err := s.Config(7); err != nil || !cfg.WireGuard() {
			t.Errorf("%q: WireGuard %v, error %v; want WireGuard", v, cfg.WireGuard(), err)
		}
	}
	for _, s := range []Settings{
		{TrafficMode: "noEncap", TunnelType: "geneve", TrafficEncryptionMode: "wireGuard"},
		{TrafficMode: "hybrid", TunnelType: "geneve", TrafficEncryptionMode: "wireGuard"},
		{TrafficMode: "encap", TunnelType: "geneve", TrafficEncryptionMode: "ipsec"},
		{TrafficMode: "encap", TunnelType: "geneve", TrafficEncryptionMode: "tls"},
	} {
		_, err := s.Config(7)
		var se *SettingError
		if !errors.As(err, &se) || se.Field != "TrafficEncryptionMode" {
			t.Errorf("%s with %s: error %v, want a SettingError naming TrafficEncryptionMode", s.TrafficMode, s.TrafficEncryptionMode, err)
		}
	}
}

// TestTraceSkipsWhatIsNotReady traces between two running Pods of a
// cluster that also has a pending Pod and a Node that has not reported
// its address yet (with a Pod of its own): the trace runs, and the
// skipped objects come back as warnings.
func TestTraceSkipsWhatIsNotReady(t *testing.T) {
	objs, err := cluster.ParseObjects([]byte(`
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {podCIDR: 10.10.1.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.77.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
spec: {podCIDR: 10.10.2.0/24}
status: {addresses: [{type: InternalIP, address: 192.168.77.2}]}
---
apiVersion: v1
kind: Node
metadata: {name: joining}
spec: {podCIDR: 10.10.3.0/24}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec: {nodeName: n1}
status: {phase: Running, podIP: 10.10.1.5}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: default}
spec: {nodeName: n2}
status: {phase: Running, podIP: 10.10.2.5}
---
apiVersion: v1
kind: Pod
metadata: {name: pending, namespace: default}
status: {phase: Pending}
---
apiVersion: v1
kind: Pod
metadata: {name: early, namespace: default}
spec: {nodeName: joining}
status: {phase: Running, podIP: 10.10.3.5}
`), "cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		t.Fatalf("cluster check: %v", err)
	}
	tf, err := NewTraceflow(st, "default/client", "default/server", "")
	if err != nil {
		t.Fatal(err)
	}
	tr, warnings, err := Trace(context.Background(), objs, DefaultSettings(), tf, tracer.Options{})
	if err != nil {
		t.Fatalf("trace: %v", err)
	}
	if tr.Traceflow.Status.Phase != crd.PhaseSucceeded {
		t.Errorf("phase %q, want %q", tr.Traceflow.Status.Phase, crd.PhaseSucceeded)
	}
	var text []string
	for _, p := range warnings {
		text = append(text, p.String())
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"Pod default/pending: is not scheduled", "Node joining: has no InternalIP address",
		`Pod default/early: is on Node "joining", which has no InternalIP address; ignored`} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings lack %q:\n%s", want, all)
		}
	}
}
