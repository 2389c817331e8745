package proxy_test

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/proxy"
	"sluice/ring"
)

func TestDirection(t *testing.T) {
	cases := []struct {
		typ      uint8
		src, dst string
		want     uint8
	}{
		{flow.FlowTypeInterNode, "a", "", flow.DirectionEgress},
		{flow.FlowTypeInterNode, "", "b", flow.DirectionIngress},
		{flow.FlowTypeInterNode, "a", "b", flow.DirectionUnknown},
		{flow.FlowTypeToExternal, "a", "", flow.DirectionEgress},
		{flow.FlowTypeFromExternal, "", "b", flow.DirectionIngress},
		{flow.FlowTypeIntraNode, "a", "b", flow.DirectionUnknown},
		{flow.FlowTypeToExternal, "", "", flow.DirectionUnknown},
	}
	for _, c := range cases {
		f := flow.Flow{FlowType: c.typ, SourcePodName: c.src, DestinationPodName: c.dst}
		if got := proxy.Direction(&f); got != c.want {
			t.Errorf("%+v: direction %d, want %d", c, got, c.want)
		}
	}
}

func store() enrich.Store {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	return enrich.NewStatic([]enrich.Pod{
		{Namespace: "shop", Name: "cart-1", UID: "0a1b2c3d-0000-4000-8000-000000000001", NodeName: "node-a",
			Labels: map[string]string{"app": "cart", "tier": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Created: t0},
		{Namespace: "shop", Name: "db-0", NodeName: "node-b", IPs: []netip.Addr{netip.MustParseAddr("10.244.2.7")}, Created: t0},
	}, []enrich.Node{{Name: "node-a", UID: "0a1b2c3d-0000-4000-8000-0000000000aa"}}, nil)
}

func TestProcessFillsInterNodeHalf(t *testing.T) {
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: store(), PodLabels: true, UIDs: true, ClusterID: "c-9"})})
	// The source node's half of an inter-node flow: no destination Pod.
	f := flow.Flow{FlowType: flow.FlowTypeInterNode, SourcePodNamespace: "shop", SourcePodName: "cart-1", SourceNodeName: "node-a",
		SourceIP: netip.MustParseAddr("10.244.1.5"), DestinationIP: netip.MustParseAddr("10.244.2.7"), StartTime: time.Now()}
	p.Process(&f)
	if f.DestinationPodName != "db-0" || f.DestinationPodNamespace != "shop" || f.DestinationNodeName != "node-b" || !f.Present.Has(flow.DestinationPodName) {
		t.Errorf("destination not filled: %+v", f)
	}
	// Direction is decided on what the exporter sent (its own Pod), not on
	// the fill: as the reference, egress for the source Node's half.
	if f.FlowDirection != flow.DirectionEgress || !f.Present.Has(flow.FlowDirection) {
		t.Errorf("direction %d, want %d (egress)", f.FlowDirection, flow.DirectionEgress)
	}
	// The destination Node's half, whose source Pod the store knows:
	// ingress.
	h := flow.Flow{FlowType: flow.FlowTypeInterNode, DestinationPodNamespace: "shop", DestinationPodName: "db-0", DestinationNodeName: "node-b",
		SourceIP: netip.MustParseAddr("10.244.1.5"), DestinationIP: netip.MustParseAddr("10.244.2.7"), StartTime: time.Now()}
	p.Process(&h)
	if h.SourcePodName != "cart-1" {
		t.Errorf("source not filled: %+v", h)
	}
	if h.FlowDirection != flow.DirectionIngress {
		t.Errorf("destination half: direction %d, want %d (ingress)", h.FlowDirection, flow.DirectionIngress)
	}
	if f.SourcePodLabels != `{"app":"cart","tier":"web"}` || f.DestinationPodLabels != "{}" {
		t.Errorf("labels %q %q", f.SourcePodLabels, f.DestinationPodLabels)
	}
	if f.ClusterID != "c-9" || f.SourcePodUID[0] != 0x0a || f.SourceNodeUID[15] != 0xaa || !f.Present.Has(flow.SourceNodeUID) {
		t.Errorf("cluster/UIDs %+v", f)
	}
	// An external address: no labels, no Pod.
	g := flow.Flow{FlowType: flow.FlowTypeToExternal, SourcePodName: "cart-1", SourcePodNamespace: "shop",
		SourceIP: netip.MustParseAddr("10.244.1.5"), DestinationIP: netip.MustParseAddr("8.8.8.8")}
	p.Process(&g)
	if g.DestinationPodLabels != "" || g.DestinationPodName != "" || g.FlowDirection != flow.DirectionEgress {
		t.Errorf("to-external %+v", g)
	}
}

// TestMemoryDoesNotGrowWithConnections sends a million distinct
// connections through the proxy stage; the heap afterwards holds only what
// the bounded buffer retains.
func TestMemoryDoesNotGrowWithConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("a million records")
	}
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: store(), PodLabels: true, ClusterID: "c"})})
	in := make(chan flow.Batch, 16)
	out := ring.New[*flow.Flow](1024)
	c := out.Consumer()
	done := make(chan struct{})
	go func() { defer close(done); p.Run(context.Background(), in, out) }()
	consumed := make(chan int)
	go func() {
		n := 0
		var buf []*flow.Flow
		for {
			var ok bool
			buf, ok = c.Next(context.Background(), buf[:0], 256)
			if !ok {
				break
			}
			n += len(buf)
		}
		consumed <- n + int(c.Lost)
	}()
	before := heapAlloc()
	const total = 1_000_000
	for i := 0; i < total; i += 100 {
		b := flow.Batch{Flows: make([]*flow.Flow, 100)}
		for j := range b.Flows {
			k := i + j
			b.Flows[j] = &flow.Flow{FlowType: flow.FlowTypeInterNode, SourcePodName: "x",
				SourceIP: netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}), DestinationIP: netip.MustParseAddr("10.244.2.7"),
				SourcePort: uint16(k), DestinationPort: uint16(k >> 16), Protocol: 6}
		}
		in <- b
	}
	endMemoryRun(t, in, done, out.Close, consumed, before, total)
}

// heapAlloc is the heap in use after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// endMemoryRun ends a memory test's run: it closes in, waits for the
// stage (done) and closes its output, then fails t unless the consumer
// saw every record (read or counted lost) and the heap grew by at most
// 4 MiB since before.
func endMemoryRun(t *testing.T, in chan<- flow.Batch, done <-chan struct{}, closeOut func(), consumed <-chan int, before uint64, total int) {
	t.Helper()
	close(in)
	<-done
	closeOut()
	if n := <-consumed; n != total {
		t.Fatalf("consumed+lost %d, want %d", n, total)
	}
	after := heapAlloc()
	growth := int64(after) - int64(before)
	t.Logf("heap before %d, after %d: %+d bytes for %d connections", before, after, growth, total)
	if growth > 4<<20 {
		t.Fatalf("heap grew by %d bytes over %d connections", growth, total)
	}
}
