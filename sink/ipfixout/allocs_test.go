package ipfixout_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"sluice/flow/ipfixmap"
	"sluice/internal/testkit/recpool"
	"sluice/ipfix"
	"sluice/sink/ipfixout"
)

// sinkFor is an Aggregate mode sink (the export's templates) to addr.
func sinkFor(tb testing.TB, addr string, json bool) *ipfixout.Sink {
	table, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Aggregate: true}, false, ipfix.MinDataSetID)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := ipfixout.New(ipfixout.Options{Address: addr, Proto: "tcp", JSON: json, Exporter: ex,
		FlushInterval: 20 * time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// drain accepts one connection at a time and reads everything, telling
// whether a recycled record's poison ever went out.
func drain(ln net.Listener, poisoned *atomic.Bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			keep := 0 // bytes kept from the last read, for a poison split across reads
			for {
				n, err := c.Read(buf[keep:])
				if bytes.Contains(buf[:keep+n], []byte(recpool.Poison)) {
					poisoned.Store(true)
				}
				if err != nil {
					return
				}
				end := keep + n
				keep = min(end, len(recpool.Poison)-1)
				copy(buf, buf[end-keep:end])
			}
		}()
	}
}

// TestExportAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled once every reader released them), the IPFIX and JSON
// export allocate nothing per record; no recycled record goes out.
func TestExportAllocatesNothingPerRecord(t *testing.T) {
	for _, json := range []bool{false, true} {
		exportRounds(t, json, 8192, 256, func(round func()) float64 { return recpool.Measure(8, 2048, round) })
	}
}

// TestLappedNeverSendsRecycled: a sink lapped by the producer again and
// again (a small buffer) never sends a record that was recycled under it.
func TestLappedNeverSendsRecycled(t *testing.T) {
	for _, json := range []bool{false, true} {
		exportRounds(t, json, 64, 64, func(round func()) float64 {
			for range 10 {
				round()
			}
			return 0
		})
	}
}

// exportRounds runs a sink on a recycling buffer of capacity records fed
// in chunks, through run, and checks what went out.
func exportRounds(t *testing.T, json bool, capacity, chunk int, run func(round func()) float64) {
	{
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var poisoned atomic.Bool
		go drain(ln, &poisoned)
		s := sinkFor(t, ln.Addr().String(), json)
		p := recpool.New(capacity)
		p.Quarantine = capacity < 1024 // the lapped test: see the poison for sure
		c := p.Buf.Consumer()
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background(), c) }()
		recs := recpool.Records(2048)
		round := func() {
			p.Round(t, context.Background(), recs, chunk, func() bool { return c.Unread() == 0 })
		}
		per := run(round)
		t.Logf("json %v: %.4f allocations per record; %d records made, %d recycled", json, per, p.Made, p.Recycled)
		p.Buf.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		ln.Close()
		if per > recpool.PerRecordBound {
			t.Errorf("json %v: %.3f allocations per record, want none (but a few per batch)", json, per)
		}
		if poisoned.Load() {
			t.Errorf("json %v: a recycled record was sent", json)
		}
	}
}

func BenchmarkExport(b *testing.B) {
	for _, c := range []struct {
		name string
		json bool
	}{{"ipfix", false}, {"json", true}} {
		b.Run(c.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			var poisoned atomic.Bool
			go drain(ln, &poisoned)
			s := sinkFor(b, ln.Addr().String(), c.json)
			p := recpool.New(8192)
			cons := p.Buf.Consumer()
			done := make(chan error, 1)
			go func() { done <- s.Run(context.Background(), cons) }()
			recs := recpool.Records(1024)
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n += len(recs) {
				p.Round(b, context.Background(), recs[:min(len(recs), b.N-n)], 256, func() bool { return cons.Unread() == 0 })
			}
			b.StopTimer()
			p.Buf.Close()
			<-done
		})
	}
}
