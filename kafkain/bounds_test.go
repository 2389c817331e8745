package kafkain

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/ring"
)

// What the client may buffer from the brokers is bounded.
func TestFetchesBounded(t *testing.T) {
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch),
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	if v := in.cl.OptValue(kgo.FetchMaxBytes); v != int32(fetchMaxBytes) {
		t.Errorf("FetchMaxBytes %v, want %d", v, fetchMaxBytes)
	}
	if v := in.cl.OptValue(kgo.MaxConcurrentFetches); v != maxConcurrentFetches {
		t.Errorf("MaxConcurrentFetches %v, want %d", v, maxConcurrentFetches)
	}
}

// Exports dropped while the sinks do not write are counted.
func TestExportsDroppedCounted(t *testing.T) {
	buf := ring.New[*flow.Flow](64)
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch), Exports: buf,
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	in.maxEmitted = 4
	in.wg.Go(in.readExports)
	for range 10 {
		buf.Produce(&flow.Flow{})
	}
	buf.Close()
	in.wg.Wait()
	if got := testutil.ToFloat64(in.m.exportsDropped); got != 6 {
		t.Errorf("exports dropped %v, want 6", got)
	}
	if len(in.emitted) != 4 {
		t.Errorf("%d exports kept, want 4", len(in.emitted))
	}
}
