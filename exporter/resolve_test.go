package exporter

import (
	"context"
	"net/netip"
	"testing"

	"sluice/enrich"
	"sluice/exporter/collectoraddr"
)

func TestResolveService(t *testing.T) {
	c, _ := collectoraddr.Parse("flow-aggregator/flow-aggregator:4739:tcp")
	if _, err := resolver(c, nil)(context.Background()); err == nil {
		t.Fatal("a Service resolved without a metadata source")
	}
	store := enrich.NewStatic(nil, nil, []enrich.Service{{Namespace: "flow-aggregator", Name: "flow-aggregator",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.4.4")}}})
	got, err := resolver(c, store)(context.Background())
	if err != nil || got != "10.96.4.4:4739" {
		t.Fatalf("%q %v", got, err)
	}
	c2, _ := collectoraddr.Parse("ns/missing")
	if _, err := resolver(c2, store)(context.Background()); err == nil {
		t.Fatal("a missing Service resolved")
	}
	c3, _ := collectoraddr.Parse("[fd00::1]:9:udp")
	if got, _ := resolver(c3, nil)(context.Background()); got != "[fd00::1]:9" {
		t.Fatalf("%q", got)
	}
}
