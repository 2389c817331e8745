package modelrun

import (
	"errors"
	"net/netip"
	"testing"

	"sluice/traceflow/pipeline"
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
