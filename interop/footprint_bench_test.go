package interop

import (
	"fmt"
	"testing"
)

// BenchmarkDecodeFootprint decodes the benchmark's records in memory, as
// Decode/sluice does, with the bytes decoded per operation growing from
// well inside a core's L2 cache (256 records, ~60 KB) to far beyond it
// (65536 records, ~15 MB). If Sluice's decode were slowed by its working set
// leaving L2 (the suspicion of issue #30 on a 512 KB-L2 CPU), ns/record would
// step up where the bytes pass the L2 size; a flat line says the streamed,
// sequential reads are prefetched and the footprint does not matter.
func BenchmarkDecodeFootprint(b *testing.B) {
	for _, records := range []int{256, 1024, 4096, 16384, 65536} {
		flows := sampleAntreaFlows(records, false)
		tmpl, data := sluiceMessages(b, flows, false, benchMsgSize)
		octets := 0
		for _, m := range data {
			octets += len(m)
		}
		want := sumFlows(flows)
		b.Run(fmt.Sprintf("records=%d/KB=%d", records, octets>>10), func(b *testing.B) {
			d := primedDecoder(b, tmpl)
			ms := startTimer(b)
			for range b.N {
				n, s, err := decodeSluice(d, data, sumSluice)
				if err != nil || n != records || s != want {
					b.Fatalf("decoded %d records, checksum %d (want %d): %v", n, s, want, err)
				}
			}
			perRecord(b, records, ms)
		})
	}
}
