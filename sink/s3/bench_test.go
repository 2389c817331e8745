package s3

import (
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/flowtest"
)

// BenchmarkEncode measures writing records into a file of each format:
// time and allocations per record, and the file's octets per record.
func BenchmarkEncode(b *testing.B) {
	recs := make([]*flow.Flow, 20000)
	for i := range recs {
		recs[i] = flowtest.Full(i, true)
	}
	for _, c := range []struct {
		name     string
		format   string
		compress bool
	}{{"csv", FormatCSV, false}, {"csv.gz", FormatCSV, true}, {"parquet", FormatParquet, false}, {"parquet.zstd", FormatParquet, true}} {
		b.Run(c.name, func(b *testing.B) {
			f, err := newFormat(c.format, c.compress, "")
			if err != nil {
				b.Fatal(err)
			}
			const perFile = 100000
			now := time.Now()
			var octets, rows int
			b.ReportAllocs()
			enc := f.newEncoder()
			n := 0
			for i := 0; b.Loop(); i++ {
				if err := enc.add(recs[i%len(recs)], now); err != nil {
					b.Fatal(err)
				}
				if n++; n == perFile {
					data, err := enc.finish()
					if err != nil {
						b.Fatal(err)
					}
					octets, rows = octets+len(data), rows+n
					enc, n = f.newEncoder(), 0
				}
			}
			if n > 0 {
				data, err := enc.finish()
				if err != nil {
					b.Fatal(err)
				}
				octets, rows = octets+len(data), rows+n
			}
			b.ReportMetric(float64(octets)/float64(rows), "B/record")
		})
	}
}
