package exporter_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoAggregatorPackage: the per-Node exporter is small and has
// its own job; it must not link the aggregator's stages (a seam pointing
// upwards once made it carry the aggregator's store, collector and ring).
func TestLinksNoAggregatorPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "sluice/exporter").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list named only %v", deps)
	}
	forbidden := []string{"sluice/aggregator", "sluice/aggregate", "sluice/proxy", "sluice/collector", "sluice/mode",
		"sluice/ring", "sluice/sink", "sluice/config", "sluice/grpcserve"}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("the exporter links %s", d)
			}
		}
	}
}
