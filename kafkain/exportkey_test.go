package kafkain

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/aggregate"
	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/internal/testkit"
	"sluice/ring"
)

// The correlated export of an inter-Node from-external flow names the
// external client as its source, while both of its records were keyed on
// the proxy's SNAT endpoint: the export must still release them, without
// waiting for the horizon.
func TestExportOfFromExternalFlowReleasesItsRecords(t *testing.T) {
	t0 := time.Unix(1_750_000_000, 0)
	ck := &clock{t0}
	buf := ring.New[*flow.Flow](16)
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch), Exports: buf,
		Horizon: time.Hour, CommitInterval: 10 * time.Millisecond, Now: ck.now,
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()

	external, snat := netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("10.0.0.1")
	server := netip.MustParseAddr("10.0.2.7")
	rec := func() *flow.Flow {
		f := &flow.Flow{StartTime: t0, EndTime: t0.Add(10 * time.Second), Protocol: 6,
			DestinationIP: server, DestinationPort: 8080, FlowType: flow.FlowTypeInterNode}
		f.Present.Set(flow.StartTime)
		f.Present.Set(flow.EndTime)
		return f
	}
	ingress := rec()
	ingress.FlowType = flow.FlowTypeFromExternal
	ingress.SourceIP, ingress.SourcePort = external, 5555
	ingress.ProxySnatIP, ingress.ProxySnatPort = snat, 61000
	dest := rec()
	dest.SourceIP, dest.SourcePort = snat, 61000
	dest.DestinationPodNamespace, dest.DestinationPodName, dest.DestinationNodeName = "ns-b", "server", "node-2"

	in.t.assign(0, -1, -1)
	var parts []*part
	for i, f := range []*flow.Flow{ingress, dest} {
		pt, _, _ := in.t.fetched(string(flowkey.Append(nil, f)), 0, int64(i))
		parts = append(parts, pt)
	}
	s := aggregate.New(aggregate.Options{ActiveTimeout: time.Second, InactiveTimeout: time.Minute})
	var out []*flow.Flow
	emit := func(f *flow.Flow) { c := *f; out = append(out, &c) }
	s.Add(t0, ingress, emit)
	s.Add(t0, dest, emit)
	in.t.resolved(parts, buf.Produced(), map[int32]int64{0: 2})
	s.Tick(t0.Add(time.Second), emit)
	if len(out) != 1 || out[0].SourceIP != external {
		t.Fatalf("exports %v, want one correlated record from %v", out, external)
	}
	if string(flowkey.Append(nil, out[0])) == string(flowkey.Append(nil, dest)) {
		t.Fatal("the export's key equals its records': the case this test is about does not arise")
	}
	in.wg.Go(in.readExports)
	buf.Produce(out...)
	buf.Close()
	in.wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	in.commit(ctx)
	cancel()
	if n := in.t.live(); n != 0 {
		t.Fatalf("%d flows still hold the partition after their correlated export was written, want 0", n)
	}
}
