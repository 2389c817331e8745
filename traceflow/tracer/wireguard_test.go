package tracer

import (
	"context"
	"net/netip"
	"testing"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
)

// TestWireGuardTunnelDstFamily: with WireGuard the agent names the peer
// Node by its transport address of the destination's family, and reports
// the packet as leaving the cluster when the peer has none of that
// family. Loopback to the Node's own gateway stays Delivered.
func TestWireGuardTunnelDstFamily(t *testing.T) {
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	build := func(peerV6 string) *pipeline.Model {
		st, probs := cluster.Build(objs)
		if err := probs.Err(); err != nil {
			t.Fatal(err)
		}
		if peerV6 != "" {
			for _, n := range st.Nodes {
				if n.Name == "k8s-node-2" {
					n.TransportV6 = netip.MustParseAddr(peerV6)
				}
			}
		}
		cfg := pipeline.DefaultConfig()
		cfg.Tag, cfg.Encryption = 7, pipeline.WireGuard
		m, _, err := pipeline.Build(ctx, st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	last := func(tf *crd.Traceflow, node string) crd.Observation {
		for _, r := range tf.Status.Results {
			if r.Node == node && len(r.Observations) > 0 {
				return r.Observations[len(r.Observations)-1]
			}
		}
		t.Fatalf("no observations from %s: %+v", node, tf.Status.Results)
		return crd.Observation{}
	}
	for _, c := range []struct {
		peerV6, dst, flow string
		action            crd.Action
		tunnelDst         string
	}{
		{"", "default/db", "tcp", crd.ActionForwarded, "192.168.77.102"},
		{"fd00:77::102", "default/db", "ipv6,tcp", crd.ActionForwarded, "fd00:77::102"},
		{"", "default/db", "ipv6,tcp", crd.ActionForwardedOutOfNetwork, ""},
		{"", "10.10.1.1", "tcp", crd.ActionDelivered, ""},
	} {
		tf := trace(t, build(c.peerV6), "default/client", c.dst, c.flow)
		o := last(tf, "k8s-node-1")
		if o.Action != c.action || o.TunnelDstIP != c.tunnelDst {
			t.Errorf("%s %s (peer IPv6 %q): %s tunnelDstIP %q, want %s %q", c.dst, c.flow, c.peerV6, o.Action, o.TunnelDstIP, c.action, c.tunnelDst)
		}
	}
}
