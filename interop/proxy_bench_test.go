package interop

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"

	"sluice/ipfix"
)

// proxyBenchRecords is the number of Antrea v2.7 records one
// BenchmarkProxyForward operation forwards.
const proxyBenchRecords = 20000

// countingSink is a TCP collector that decodes with Sluice and counts data
// records, across every connection it accepts.
type countingSink struct {
	ln    net.Listener
	count atomic.Int64
	errs  atomic.Int64
}

func newCountingSink(tb testing.TB) *countingSink {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &countingSink{ln: ln}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
				mr := ipfix.NewMessageReader(conn)
				for {
					m, err := mr.Next()
					if err != nil {
						return
					}
					if err := d.Reset(m, time.Now()); err != nil {
						s.errs.Add(1)
						return
					}
					n := int64(0)
					for d.Next() {
						n++
					}
					if d.Err() != nil {
						s.errs.Add(1)
						return
					}
					s.count.Add(n)
				}
			}()
		}
	}()
	return s
}

// waitCount waits until the sink has counted at least want records.
func (s *countingSink) waitCount(tb testing.TB, want int64, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for s.count.Load() < want {
		if s.errs.Load() != 0 {
			tb.Fatal("the sink could not decode what it received")
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the sink counted %d of %d records", s.count.Load(), want)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// goIPFIXProxy is the go-ipfix counterpart of Sluice's Proxy mode: it
// reads the messages its CollectingProcess decodes and, for each data
// record, builds a new record with the same elements plus
// originalObservationDomainId, originalExporterIPv4Address,
// originalExporterIPv6Address and flowDirection, exported with an
// ExportingProcess over TCP (through BufferedIPFIXExporter, flushed after
// every received message).
func goIPFIXProxy(tb testing.TB, collectorAddr string) (addr string, errc <-chan error) {
	tb.Helper()
	cp := startGoIPFIXCollector(tb, "tcp")
	ep, err := exporter.InitExportingProcess(exporter.ExporterInput{
		CollectorAddress: collectorAddr, CollectorProtocol: "tcp", ObservationDomainID: 77,
	})
	if err != nil {
		tb.Fatal(err)
	}
	ieDomain := goIPFIXElement(tb, "originalObservationDomainId")
	ieExp4 := goIPFIXElement(tb, "originalExporterIPv4Address")
	ieExp6 := goIPFIXElement(tb, "originalExporterIPv6Address")
	ieDir := goIPFIXElement(tb, "flowDirection")
	bep := exporter.NewBufferedIPFIXExporter(ep)
	stop := make(chan struct{})
	done := make(chan struct{})
	ec := make(chan error, 1)
	tb.Cleanup(func() { close(stop); <-done; ep.CloseConnToCollector() })
	go func() {
		defer close(done)
		fail := func(err error) {
			select {
			case ec <- err:
			default:
			}
		}
		tids := map[uint16]uint16{} // received template ID → exported one
		msgs := cp.GetMsgChan()
		for {
			var msg *entities.Message
			select {
			case <-stop:
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				msg = m
			}
			set := msg.GetSet()
			if set.GetSetType() != entities.Data {
				continue
			}
			exp := net.ParseIP(msg.GetExportAddress())
			exp4, exp6 := net.IPv4zero.To4(), net.IPv6zero
			if v4 := exp.To4(); v4 != nil {
				exp4 = v4
			} else if exp != nil {
				exp6 = exp
			}
			for _, rec := range set.GetRecords() {
				orig := rec.GetOrderedElementList()
				elems := make([]entities.InfoElementWithValue, 0, len(orig)+4)
				elems = append(elems, orig...)
				elems = append(elems,
					entities.NewUnsigned32InfoElement(ieDomain, msg.GetObsDomainID()),
					entities.NewIPAddressInfoElement(ieExp4, exp4),
					entities.NewIPAddressInfoElement(ieExp6, exp6),
					entities.NewUnsigned8InfoElement(ieDir, 0),
				)
				tid, ok := tids[rec.GetTemplateID()]
				if !ok {
					tid = ep.NewTemplateID()
					tmpl := entities.NewTemplateRecordFromElements(tid, elems)
					if err := tmpl.PrepareRecord(); err != nil {
						fail(err)
						return
					}
					if err := bep.AddRecord(tmpl); err != nil {
						fail(err)
						return
					}
					tids[rec.GetTemplateID()] = tid
				}
				if err := bep.AddRecord(entities.NewDataRecordFromElements(tid, elems)); err != nil {
					fail(err)
					return
				}
			}
			if err := bep.Flush(); err != nil {
				fail(err)
				return
			}
		}
	}()
	return cp.GetAddress().String(), ec
}

// BenchmarkProxyForward forwards the same proxyBenchRecords Antrea v2.7
// IPv4 records per operation, pre-encoded into messages of up to 65535
// octets written by one TCP connection, through a proxy that receives
// over loopback TCP and exports over loopback TCP to a sink that counts
// the records by decoding them with Sluice.
//
//   - sluice: a Sluice aggregator in Proxy mode, in process.
//   - goipfix: go-ipfix's CollectingProcess, a loop that rebuilds each
//     record with the four Proxy-mode elements, and its ExportingProcess
//     (goIPFIXProxy).
//
// Operations are pipelined: operation k ends when the sink has counted
// all records of operations 0..k but for at most one output message's
// worth (slack). Sluice's exporter sends a partly filled message only
// after its flush interval (1s) of idleness, so waiting for the very last
// record of every operation would measure that timer, not the forwarding;
// the tail of an operation is pushed out by the next one instead. After
// the timed loop, with the timer stopped, every record must arrive.
//
// Allocations are those of every goroutine (the proxy's, the writer's
// and the sink's) between the start and the end of the timed loop.
func BenchmarkProxyForward(b *testing.B) {
	flows := sampleAntreaFlows(proxyBenchRecords, false)
	tmpl, data := sluiceMessages(b, flows, false, benchMsgSize)
	stream := bytes.Join(data, nil)
	// No output message can hold more records than the largest input
	// message: the output records carry more elements.
	slack := 0
	{
		d := primedDecoder(b, tmpl)
		for _, m := range data {
			n, _, err := decodeSluice(d, [][]byte{m}, func(*ipfix.Record) (uint64, error) { return 0, nil })
			if err != nil {
				b.Fatal(err)
			}
			slack = max(slack, n)
		}
	}

	run := func(b *testing.B, sink *countingSink, addr string, errc <-chan error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write(tmpl); err != nil {
			b.Fatal(err)
		}
		check := func() {
			select {
			case err := <-errc:
				b.Fatal(err)
			default:
			}
		}
		// Warm up: connections made, templates sent, buffers sized.
		if _, err := conn.Write(stream); err != nil {
			b.Fatal(err)
		}
		sink.waitCount(b, proxyBenchRecords, 30*time.Second)
		check()
		base := sink.count.Load()
		if base != proxyBenchRecords {
			b.Fatalf("warm-up: the sink counted %d records, want %d", base, proxyBenchRecords)
		}
		wc := make(chan error, 1)
		ms := startTimer(b)
		for i := range b.N {
			go func() { _, err := conn.Write(stream); wc <- err }()
			sink.waitCount(b, base+int64(i+1)*proxyBenchRecords-int64(slack), 60*time.Second)
			if err := <-wc; err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, proxyBenchRecords, ms)
		want := base + int64(b.N)*proxyBenchRecords
		sink.waitCount(b, want, 30*time.Second)
		check()
		time.Sleep(10 * time.Millisecond)
		if got := sink.count.Load(); got != want {
			b.Fatalf("the sink counted %d records, want %d", got, want)
		}
	}

	b.Run("sluice", func(b *testing.B) {
		sink := newCountingSink(b)
		addr := startSluiceProxy(b, sink.ln.Addr().String(), "recordBufferSize: 262144\n")
		run(b, sink, addr, nil)
	})
	b.Run("goipfix", func(b *testing.B) {
		sink := newCountingSink(b)
		addr, errc := goIPFIXProxy(b, sink.ln.Addr().String())
		run(b, sink, addr, errc)
	})
}
