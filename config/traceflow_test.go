package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// The sluice.traceflow keys decode, a list replaces its default rather
// than adding to it, and a negative deleteAfter is refused.
func TestTraceflowKeys(t *testing.T) {
	a, err := Parse([]byte("sluice:\n  traceflow:\n    enable: true\n    deleteAfter: 5s\n    serviceCIDRs: [10.0.0.0/16]\n    trafficMode: encap\n    trafficEncryptionMode: wireGuard\n    multicast: true\n    enableBridgingMode: true\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := TraceflowOptions{Enable: true, DeleteAfter: Duration{5 * time.Second}, TrafficMode: "encap",
		TunnelType: "geneve", ServiceCIDRs: []string{"10.0.0.0/16"}, TrafficEncryptionMode: "wireGuard", Multicast: true, EnableBridgingMode: true}
	if !reflect.DeepEqual(a.Sluice.Traceflow, want) {
		t.Errorf("sluice.traceflow = %+v, want %+v", a.Sluice.Traceflow, want)
	}
	_, err = Parse([]byte("sluice:\n  traceflow:\n    deleteAfter: -1s\n"), "t.yaml")
	if err == nil || !strings.Contains(err.Error(), "sluice.traceflow.deleteAfter") {
		t.Errorf("negative deleteAfter: error %v", err)
	}
}
