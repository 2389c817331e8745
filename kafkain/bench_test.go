package kafkain

import (
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
)

// BenchmarkTake is the input's work per record besides the store's:
// decode the value, make the flow key, follow the record in the tracker
// until its flow's export (one export per two records, as a correlated
// connection's two halves make).
func BenchmarkTake(b *testing.B) {
	vals := make([][]byte, 1024)
	for i := range vals {
		f := flowtest.Full(i, false)
		f.Present.Clear(flow.SourcePodLabels)
		f.Present.Clear(flow.DestinationPodLabels)
		v, err := flowproto.AppendFlow(nil, f)
		if err != nil {
			b.Fatal(err)
		}
		vals[i] = v
	}
	tr := newTracker(true, time.Hour, time.Now)
	tr.assign(0, -1, -1)
	dec := flowproto.NewDecoder()
	var key []byte
	var f flow.Flow
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f = flow.Flow{}
		if _, _, err := decodeValue(dec, vals[i%len(vals)], &f); err != nil {
			b.Fatal(err)
		}
		key = flowkey.Append(key[:0], &f)
		k := string(key)
		pt, _, _ := tr.fetched(k, 0, int64(i))
		tr.resolved([]*part{pt}, uint64(i), nil)
		if i%2 == 1 {
			tr.exported(k, uint64(i))
		}
	}
}
