package kafkain

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/internal/testkit"
	"sluice/internal/testkit/recpool"
)

// TestExportsTrackerReleases: the exports tracker releases what it read
// (the buffer recycles records while it reads), and never keys an export
// on a record recycled under it, even lapped again and again.
func TestExportsTrackerReleases(t *testing.T) {
	p := recpool.New(64)
	p.Quarantine = true
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch), Exports: p.Buf,
		Horizon: time.Hour, CommitInterval: 10 * time.Millisecond,
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	recs := recpool.Records(2048)
	keys := map[string]bool{}
	for _, f := range recs {
		keys[string(flowkey.Append(nil, f))] = true
	}
	in.wg.Go(in.readExports)
	for range 5 {
		p.Round(t, context.Background(), recs, 32, func() bool { return true })
	}
	p.Buf.Close()
	in.wg.Wait()
	in.emMu.Lock()
	defer in.emMu.Unlock()
	for _, e := range in.emitted {
		if !keys[e.key] {
			t.Fatalf("export %d keyed %x: a recycled record", e.pos, e.key)
		}
	}
	t.Logf("%d exports kept, %d lost, %d recycled", len(in.emitted), in.exports.Lost, p.Recycled)
	if p.Recycled == 0 || len(in.emitted) == 0 {
		t.Errorf("%d recycled, %d exports kept: want both", p.Recycled, len(in.emitted))
	}
}
