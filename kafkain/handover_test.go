package kafkain

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowproto"
	"sluice/internal/testkit"
	"sluice/ring"
)

// A partition handed over while a batch holding its records is being
// handed to the mode: the flows are dropped only once the mode took that
// batch, not before (the mode would rebuild them after the drop, and
// export them besides their next owner).
func TestHandOverWaitsForTheBatchBeingBuilt(t *testing.T) {
	out := make(chan flow.Batch)
	buf := ring.New[*flow.Flow](16)
	var taken atomic.Bool
	forgot := make(chan map[string]bool, 1)
	in, err := New(Options{Topic: "t", Group: "g", Out: out, Exports: buf, Horizon: time.Hour,
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))},
		Forget: func(_ context.Context, keys map[string]bool) (int, error) {
			if !taken.Load() {
				t.Error("flows dropped before the mode took the batch holding their records")
			}
			forgot <- keys
			return len(keys), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	in.wg.Go(in.resolve)
	defer func() { close(in.pending); in.wg.Wait() }()

	f := &flow.Flow{StartTime: time.Unix(1000, 0), EndTime: time.Unix(1010, 0), Protocol: 6,
		SourceIP: netip.MustParseAddr("10.0.0.1"), DestinationIP: netip.MustParseAddr("10.0.0.2"),
		SourcePort: 1000, DestinationPort: 80, FlowType: flow.FlowTypeInterNode}
	for _, fl := range []flow.Field{flow.StartTime, flow.EndTime, flow.SourceIP, flow.DestinationIP,
		flow.SourcePort, flow.DestinationPort, flow.Protocol, flow.FlowType} {
		f.Present.Set(fl)
	}
	v, err := flowproto.AppendFlow(nil, f)
	if err != nil {
		t.Fatal(err)
	}
	in.t.assign(0, -1, -1)
	fs := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "t", Partitions: []kgo.FetchPartition{{Partition: 0,
		Records: []*kgo.Record{{Topic: "t", Partition: 0, Offset: 0, Value: v}}}}}}}}
	handDone := make(chan bool)
	go func() { handDone <- in.hand(context.Background(), fs) }()
	testkit.WaitFor(t, "the record noted", func() bool { return in.t.live() == 1 })

	overDone := make(chan struct{})
	go func() {
		defer close(overDone)
		in.handOver(context.Background(), []int32{0}, false)
	}()
	// The mode takes the batch late: a hand-over that does not wait for
	// it drops the flows within this window.
	select {
	case <-forgot:
		t.Fatal("flows dropped while the batch holding their records was not taken")
	case <-time.After(300 * time.Millisecond):
	}
	taken.Store(true)
	b := <-out
	b.Resolve(flow.Now)
	if !<-handDone {
		t.Fatal("hand failed")
	}
	<-overDone
	keys := <-forgot
	if !keys[string(flowkey.Append(nil, f))] {
		t.Errorf("handed over %v, want the record's flow", keys)
	}
}

// A partition handed over right after the store exported one of its
// flows: the hand-over's commit applies that export (it waits until the
// input read it), so the flow is not dropped as pending and exported
// again by the next owner.
func TestHandOverAppliesExportsMadeBeforeIt(t *testing.T) {
	buf := ring.New[*flow.Flow](16)
	forgot := make(chan map[string]bool, 1)
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch), Exports: buf, Horizon: time.Hour,
		HandOverTimeout: 2 * time.Second,
		Client:          []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))},
		Forget: func(_ context.Context, keys map[string]bool) (int, error) {
			forgot <- keys
			return len(keys), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	f := &flow.Flow{Protocol: 6, SourceIP: netip.MustParseAddr("10.0.0.1"), DestinationIP: netip.MustParseAddr("10.0.0.2"),
		SourcePort: 1000, DestinationPort: 80}
	key := string(flowkey.Append(nil, f))
	in.t.assign(0, -1, -1)
	pt, _, _ := in.t.fetched(key, 0, 0)
	in.t.resolved([]*part{pt}, buf.Produced(), map[int32]int64{0: 1})
	buf.Produce(f) // the store exports the flow

	overDone := make(chan struct{})
	go func() {
		defer close(overDone)
		in.handOver(context.Background(), []int32{0}, true)
	}()
	// The input reads the export late: a hand-over that does not wait
	// for it drops the exported flow as pending within this window.
	select {
	case keys := <-forgot:
		t.Fatalf("dropped %d flows as pending, though the store had exported the flow", len(keys))
	case <-time.After(300 * time.Millisecond):
	}
	in.wg.Go(in.readExports)
	<-overDone
	select {
	case keys := <-forgot:
		if keys[key] {
			t.Errorf("the exported flow was dropped as pending")
		}
	default:
	}
	buf.Close()
	in.wg.Wait()
}
