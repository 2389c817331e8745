package pipeline

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
)

// TestFlexibleIPAMWarning: a Pod whose IP is outside its Node's PodCIDRs
// (an AntreaIPAM Pod) is warned about, once; the fixture's Pods are not.
func TestFlexibleIPAMWarning(t *testing.T) {
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	count := func(pool string) (n int, msg string) {
		st, probs := cluster.Build(objs)
		if probs.Err() != nil {
			t.Fatal(probs.Err())
		}
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
