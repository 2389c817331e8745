package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/demo"
	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/policy/flowsrc"
)

// TestKeySpreadDemoTraffic measures how evenly the demo's own traffic
// (a few dozen Pod pairs, clients' source ports varying) spreads over 12
// partitions with the flow key, beside a key of the sorted address pair
// (netobserv's): the pair key puts every connection of a pair on one
// partition, so the busiest partition carries what the busiest pairs do.
func TestKeySpreadDemoTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for 8 s")
	}
	dir := t.TempDir()
	var out bytes.Buffer
	if _, err := demo.Run(context.Background(), demo.Options{Duration: 8 * time.Second, Rate: 200, Out: dir, Stdout: &out, Seed: 7}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	var recs []flow.Flow
	pairs := map[string]bool{}
	err := (&flowsrc.File{Path: filepath.Join(dir, "flows.log")}).Read(context.Background(), time.Time{}, func(r *flowsrc.Record) error {
		recs = append(recs, flow.Flow{SourceIP: r.Src, DestinationIP: r.Dst, SourcePort: r.SrcPort, DestinationPort: r.DstPort, Protocol: r.Proto})
		pairs[pairKeyString(r.Src.String(), r.Dst.String())] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) < 240 {
		t.Fatalf("the demo wrote %d records; too few to measure a spread over 12 partitions", len(recs))
	}
	const parts = 12
	part := kgo.StickyKeyPartitioner(nil).ForTopic("flows")
	spread := func(key func(*flow.Flow) []byte) (busiest float64, empty int) {
		counts := make([]int, parts)
		for i := range recs {
			counts[part.Partition(&kgo.Record{Key: key(&recs[i])}, parts)]++
		}
		busiest = float64(slices.Max(counts)) / (float64(len(recs)) / parts)
		for _, c := range counts {
			if c == 0 {
				empty++
			}
		}
		return busiest, empty
	}
	flowBusiest, flowEmpty := spread(func(f *flow.Flow) []byte { return flowkey.Append(nil, f) })
	pairBusiest, pairEmpty := spread(func(f *flow.Flow) []byte {
		a, b := f.SourceIP.As16(), f.DestinationIP.As16()
		if f.DestinationIP.Less(f.SourceIP) {
			a, b = b, a
		}
		return append(a[:], b[:]...)
	})
	t.Logf("demo traffic: %d records, %d address pairs, 12 partitions; busiest partition over the mean: flow key %.2f (%d empty), address-pair key %.2f (%d empty)",
		len(recs), len(pairs), flowBusiest, flowEmpty, pairBusiest, pairEmpty)
	if flowBusiest >= pairBusiest || flowEmpty > 0 {
		t.Errorf("the flow key spreads the demo's traffic no better than the pair key: %.2f (%d empty) vs %.2f", flowBusiest, flowEmpty, pairBusiest)
	}
}

func pairKeyString(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return fmt.Sprint(a, "-", b)
}
