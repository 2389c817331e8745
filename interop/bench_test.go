package interop

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// benchRecords is the number of Antrea v2.7 IPv4 records one benchmark
// operation decodes or encodes. Per-record figures divide by it.
const benchRecords = 4096

// benchMsgSize is the maximum message size of the benchmarks: the largest
// IPFIX message, which is what go-ipfix's exporter uses over TCP (the
// Antrea agent to Flow Aggregator transport).
const benchMsgSize = ipfix.MaxMessageLen

// The checksums below read every value of a record through each library's
// typed accessors and fold it into a number, so that neither side can skip
// a field and both can be checked against each other: unsigned values and
// timestamps (in seconds) add up, addresses add their octets, strings their
// length and first and last octets. (Folding every octet of every string
// would add the same consumer work to both sides; the string contents
// themselves are compared in full by the interop tests.)

// foldString is the checksum of one string value.
func foldString[T string | []byte](v T) uint64 {
	if len(v) == 0 {
		return 0
	}
	return uint64(len(v)) + uint64(v[0]) + uint64(v[len(v)-1])
}

func sumSluice(r *ipfix.Record) (uint64, error) { return sumSluiceWith(r, false) }

// sumSluiceString is sumSluice reading strings with Record.String, which
// copies each into a new Go string as go-ipfix's decoder does.
func sumSluiceString(r *ipfix.Record) (uint64, error) { return sumSluiceWith(r, true) }

func sumSluiceWith(r *ipfix.Record, copyStrings bool) (uint64, error) {
	var s uint64
	for i := range r.NumFields() {
		switch t := r.Field(i).Type; {
		case t.IsUnsigned():
			v, err := r.Uint(i)
			if err != nil {
				return 0, err
			}
			s += v
		case t == ipfix.String && copyStrings:
			v, err := r.String(i)
			if err != nil {
				return 0, err
			}
			s += foldString(v)
		case t == ipfix.String:
			v, err := r.StringBytes(i)
			if err != nil {
				return 0, err
			}
			s += foldString(v)
		case t == ipfix.IPv4Address || t == ipfix.IPv6Address:
			v, err := r.Addr(i)
			if err != nil {
				return 0, err
			}
			s += foldAddr(v)
		case t.IsTime():
			v, err := r.Time(i)
			if err != nil {
				return 0, err
			}
			s += uint64(v.Unix())
		default:
			return 0, fmt.Errorf("field %d: unexpected type %s", i, t)
		}
	}
	return s, nil
}

func foldAddr(a netip.Addr) uint64 {
	var s uint64
	if a.Is4() {
		for _, c := range a.As4() {
			s += uint64(c)
		}
	} else {
		for _, c := range a.As16() {
			s += uint64(c)
		}
	}
	return s
}

// sumFlows is the checksum of the values sent, computed from the flows
// themselves, that both decoders must reproduce.
func sumFlows(flows []antreaFlow) uint64 {
	var s uint64
	for i := range flows {
		for _, v := range flows[i].values() {
			switch v := v.(type) {
			case uint64:
				s += v
			case string:
				s += foldString(v)
			case netip.Addr:
				s += foldAddr(v)
			case time.Time:
				s += uint64(v.Unix())
			default:
				panic(fmt.Sprintf("value of type %T", v))
			}
		}
	}
	return s
}

func sumGoIPFIX(rec entities.Record) (uint64, error) {
	var s uint64
	for _, e := range rec.GetOrderedElementList() {
		switch e.GetDataType() {
		case entities.Unsigned8:
			s += uint64(e.GetUnsigned8Value())
		case entities.Unsigned16:
			s += uint64(e.GetUnsigned16Value())
		case entities.Unsigned32, entities.DateTimeSeconds:
			s += uint64(e.GetUnsigned32Value())
		case entities.Unsigned64:
			s += e.GetUnsigned64Value()
		case entities.String:
			v := e.GetStringValue()
			s += foldString(v)
		case entities.Ipv4Address, entities.Ipv6Address:
			for _, c := range e.GetIPAddressValue() {
				s += uint64(c)
			}
		default:
			return 0, fmt.Errorf("element %s: unexpected type %d", e.GetName(), e.GetDataType())
		}
	}
	return s, nil
}

// decodeSluice decodes data messages with d, reading every field, and
// returns the number of records and their checksum.
func decodeSluice(d *ipfix.Decoder, msgs [][]byte, sum func(*ipfix.Record) (uint64, error)) (int, uint64, error) {
	n, total := 0, uint64(0)
	for _, m := range msgs {
		if err := d.Reset(m, time.Now()); err != nil {
			return n, total, err
		}
		for d.Next() {
			s, err := sum(d.Record())
			if err != nil {
				return n, total, err
			}
			total += s
			n++
		}
		if err := d.Err(); err != nil {
			return n, total, err
		}
	}
	return n, total, nil
}

// primedDecoder returns a decoder whose session knows the template.
func primedDecoder(tb testing.TB, tmpl []byte) *ipfix.Decoder {
	tb.Helper()
	d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	if err := d.Reset(tmpl, time.Now()); err != nil {
		tb.Fatal(err)
	}
	for d.Next() {
	}
	if err := d.Err(); err != nil {
		tb.Fatal(err)
	}
	return d
}

// perRecord reports a benchmark's figures per record. ms0 was read just
// before the timed loop; allocations of every goroutine count, so those of
// go-ipfix's collector goroutines are included.
func perRecord(b *testing.B, records int, ms0 *runtime.MemStats) {
	b.StopTimer()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	n := float64(records) * float64(b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/record")
	b.ReportMetric(n/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/record")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, "B/record")
}

func startTimer(b *testing.B) *runtime.MemStats {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ResetTimer()
	return &ms
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// BenchmarkDecode decodes the same bytes, benchRecords Antrea v2.7 IPv4
// records in messages of up to 65535 octets (one data set each, template
// in its own first message), with both libraries, reading every value.
//
//   - sluice: Decoder over the messages in memory, strings read without
//     copying (Record.StringBytes).
//   - sluice-string: the same, strings copied into Go strings.
//   - sluice-tcp: the bytes written to a loopback TCP connection, framed by
//     MessageReader and decoded by Decoder in the reading goroutine.
//   - goipfix: the bytes written to a loopback TCP connection accepted by
//     go-ipfix's CollectingProcess, whose decoded messages are read from
//     its message channel. Its decode function is unexported; the TCP
//     collector is the smallest exported path that runs it.
func BenchmarkDecode(b *testing.B) {
	flows := sampleAntreaFlows(benchRecords, false)
	tmpl, data := sluiceMessages(b, flows, false, benchMsgSize)
	stream := bytes.Join(data, nil)
	// Both decoders must reproduce the checksum of the values sent.
	want := sumFlows(flows)

	inMemory := func(sum func(*ipfix.Record) (uint64, error)) func(b *testing.B) {
		return func(b *testing.B) {
			d := primedDecoder(b, tmpl)
			ms := startTimer(b)
			for range b.N {
				n, s, err := decodeSluice(d, data, sum)
				if err != nil || n != benchRecords || s != want {
					b.Fatalf("decoded %d records, checksum %d (want %d): %v", n, s, want, err)
				}
			}
			perRecord(b, benchRecords, ms)
		}
	}
	b.Run("sluice", inMemory(sumSluice))
	b.Run("sluice-string", inMemory(sumSluiceString))

	b.Run("sluice-tcp", func(b *testing.B) {
		client, server := tcpPair(b)
		if _, err := client.Write(tmpl); err != nil {
			b.Fatal(err)
		}
		mr := ipfix.NewMessageReader(server)
		d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
		errc := make(chan error, 1)
		ms := startTimer(b)
		for range b.N {
			go func() { _, err := client.Write(stream); errc <- err }()
			n, s := 0, uint64(0)
			for n < benchRecords {
				msg, err := mr.Next()
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Reset(msg, time.Now()); err != nil {
					b.Fatal(err)
				}
				for d.Next() {
					v, err := sumSluice(d.Record())
					if err != nil {
						b.Fatal(err)
					}
					s += v
					n++
				}
				if err := d.Err(); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-errc; err != nil || s != want {
				b.Fatalf("checksum %d (want %d): %v", s, want, err)
			}
		}
		perRecord(b, benchRecords, ms)
	})

	b.Run("goipfix", func(b *testing.B) {
		cp := startGoIPFIXCollector(b, "tcp")
		conn, err := net.Dial("tcp", cp.GetAddress().String())
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write(tmpl); err != nil {
			b.Fatal(err)
		}
		select {
		case msg := <-cp.GetMsgChan():
			if msg.GetSet().GetSetType() != entities.Template {
				b.Fatal("go-ipfix's first message is not the template")
			}
		case <-time.After(5 * time.Second):
			b.Fatal("go-ipfix did not decode the template")
		}
		errc := make(chan error, 1)
		msgs := cp.GetMsgChan()
		ms := startTimer(b)
		for range b.N {
			go func() { _, err := conn.Write(stream); errc <- err }()
			n, s := 0, uint64(0)
			for n < benchRecords {
				var msg *entities.Message
				select {
				case msg = <-msgs:
				case <-time.After(30 * time.Second):
					b.Fatalf("go-ipfix decoded %d of %d records", n, benchRecords)
				}
				for _, rec := range msg.GetSet().GetRecords() {
					v, err := sumGoIPFIX(rec)
					if err != nil {
						b.Fatal(err)
					}
					s += v
					n++
				}
			}
			if err := <-errc; err != nil || s != want {
				b.Fatalf("checksum %d (want %d): %v", s, want, err)
			}
		}
		perRecord(b, benchRecords, ms)
	})
}

// goBytesEncoder serialises data records with go-ipfix's exporter
// machinery without a connection: records are batched into one data set
// per message as ExportingProcess.SendDataRecords does, and each message
// is written by exporter.WriteIPFIXMsgToBuffer, the serialiser SendSet and
// SendDataRecords use before writing to their connection. A data set
// holds its records until it is serialised, so one record object is needed
// per record of a message; they are kept in a pool and refilled, message
// after message, which keeps them in cache.
type goBytesEncoder struct {
	tid    uint16
	domain uint32
	max    int
	elems  [][]entities.InfoElementWithValue
	pool   []entities.Record
	set    entities.Set
	buf    bytes.Buffer
	seq    uint32
	emit   func([]byte) error
}

func newGoBytesEncoder(maxSize int, emit func([]byte) error) *goBytesEncoder {
	g := &goBytesEncoder{tid: 256, domain: interopDomain, max: maxSize, set: entities.NewSet(false), emit: emit}
	g.buf.Grow(maxSize)
	return g
}

// record returns the k-th pooled record, filled with f's values.
func (g *goBytesEncoder) record(k int, f *antreaFlow) (entities.Record, error) {
	if k == len(g.pool) {
		e, err := goIPFIXElements(false)
		if err != nil {
			return nil, err
		}
		g.elems = append(g.elems, e)
		g.pool = append(g.pool, entities.NewDataRecordFromElements(g.tid, e))
	}
	setGoIPFIX(g.elems[k], f)
	return g.pool[k], nil
}

// template emits the template message.
func (g *goBytesEncoder) template() error {
	e, err := goIPFIXElements(false)
	if err != nil {
		return err
	}
	ies := make([]*entities.InfoElement, len(e))
	for i := range e {
		ies[i] = e[i].GetInfoElement()
	}
	set, err := entities.MakeTemplateSet(g.tid, ies)
	if err != nil {
		return err
	}
	set.UpdateLenInHeader()
	g.buf.Reset()
	if _, err := exporter.WriteIPFIXMsgToBuffer(set, g.domain, g.seq, time.Now(), &g.buf); err != nil {
		return err
	}
	return g.emit(g.buf.Bytes())
}

func (g *goBytesEncoder) encode(flows []antreaFlow) error {
	for len(flows) > 0 {
		g.set.ResetSet()
		if err := g.set.PrepareSet(entities.Data, g.tid); err != nil {
			return err
		}
		length, k := entities.MsgHeaderLength+entities.SetHeaderLen, 0
		for ; k < len(flows); k++ {
			rec, err := g.record(k, &flows[k])
			if err != nil {
				return err
			}
			l := rec.GetRecordLength()
			if length+l > g.max {
				break
			}
			if err := g.set.AddRecordV3(rec); err != nil {
				return err
			}
			length += l
		}
		if k == 0 {
			return fmt.Errorf("record of %d octets does not fit", g.pool[0].GetRecordLength())
		}
		g.set.UpdateLenInHeader()
		g.buf.Reset()
		if _, err := exporter.WriteIPFIXMsgToBuffer(g.set, g.domain, g.seq, time.Now(), &g.buf); err != nil {
			return err
		}
		if err := g.emit(g.buf.Bytes()); err != nil {
			return err
		}
		g.seq += uint32(k)
		flows = flows[k:]
	}
	return nil
}

// sluiceEncoder returns an encoder that has sent the Antrea template.
func sluiceEncoder(tb testing.TB, maxSize int, emit func([]byte) error) (*ipfix.Encoder, *ipfix.Template) {
	tb.Helper()
	t, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, antreaNames(false))
	if err != nil {
		tb.Fatal(err)
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: maxSize}, emit)
	if err != nil {
		tb.Fatal(err)
	}
	if err := enc.AddTemplate(interopDomain, t); err != nil {
		tb.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return enc, t
}

func encodeSluice(enc *ipfix.Encoder, t *ipfix.Template, flows []antreaFlow) error {
	for i := range flows {
		if err := writeSluice(enc, interopDomain, t, &flows[i]); err != nil {
			return err
		}
	}
	return enc.Flush()
}

// discardTCP returns the client end of a loopback TCP connection whose
// server end reads and drops everything.
func discardTCP(tb testing.TB) net.Conn {
	tb.Helper()
	client, server := tcpPair(tb)
	go io.Copy(io.Discard, server) //nolint:errcheck // ends when the test closes the connection
	return client
}

// BenchmarkEncode encodes benchRecords Antrea v2.7 IPv4 records, from the
// same Go values, into messages of up to 65535 octets.
//
//   - sluice: Encoder, messages handed to a function that drops them.
//   - goipfix: go-ipfix's serialiser without a connection (goBytesEncoder).
//   - sluice-tcp: Encoder writing each message to a loopback TCP connection.
//   - goipfix-tcp: go-ipfix's ExportingProcess over loopback TCP, driven by
//     BufferedIPFIXExporter with one reused record refilled per flow (the
//     Antrea agent's way).
//   - floor, floor-tcp: not a library but the least any encoder of these
//     values does (floor_test.go): appends written for exactly this
//     template, with no checks. Its ratio to goipfix-tcp bounds what an
//     encoder that writes from its own goroutine can reach over TCP on
//     the machine measured.
//
// The TCP peers read and discard in another goroutine. Every variant
// encodes the records once before the timer starts, so that what is
// measured is the steady state (buffers sized, go-ipfix's records made).
func BenchmarkEncode(b *testing.B) {
	flows := sampleAntreaFlows(benchRecords, false)

	b.Run("sluice", func(b *testing.B) {
		var octets int
		enc, t := sluiceEncoder(b, benchMsgSize, func(m []byte) error { octets += len(m); return nil })
		if err := encodeSluice(enc, t, flows); err != nil { // warm up, as the others
			b.Fatal(err)
		}
		ms := startTimer(b)
		for range b.N {
			if err := encodeSluice(enc, t, flows); err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, benchRecords, ms)
	})

	b.Run("goipfix", func(b *testing.B) {
		var octets int
		g := newGoBytesEncoder(benchMsgSize, func(m []byte) error { octets += len(m); return nil })
		if err := g.template(); err != nil {
			b.Fatal(err)
		}
		if err := g.encode(flows); err != nil { // fills the record pool
			b.Fatal(err)
		}
		ms := startTimer(b)
		for range b.N {
			if err := g.encode(flows); err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, benchRecords, ms)
	})

	b.Run("sluice-tcp", func(b *testing.B) {
		conn := discardTCP(b)
		enc, t := sluiceEncoder(b, benchMsgSize, func(m []byte) error { _, err := conn.Write(m); return err })
		if err := encodeSluice(enc, t, flows); err != nil {
			b.Fatal(err)
		}
		ms := startTimer(b)
		for range b.N {
			if err := encodeSluice(enc, t, flows); err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, benchRecords, ms)
	})

	floor := func(b *testing.B, emit func([]byte) error) {
		fe := newFloorEncoder(benchMsgSize, emit)
		if err := encodeFloor(fe, flows); err != nil {
			b.Fatal(err)
		}
		ms := startTimer(b)
		for range b.N {
			if err := encodeFloor(fe, flows); err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, benchRecords, ms)
	}
	b.Run("floor", func(b *testing.B) { floor(b, func([]byte) error { return nil }) })
	b.Run("floor-tcp", func(b *testing.B) {
		conn := discardTCP(b)
		floor(b, func(m []byte) error { _, err := conn.Write(m); return err })
	})

	b.Run("goipfix-tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			io.Copy(io.Discard, conn) //nolint:errcheck // ends when the exporter closes
		}()
		ep, err := exporter.InitExportingProcess(exporter.ExporterInput{
			CollectorAddress: ln.Addr().String(), CollectorProtocol: "tcp", ObservationDomainID: interopDomain,
		})
		if err != nil {
			b.Fatal(err)
		}
		defer ep.CloseConnToCollector()
		bep := exporter.NewBufferedIPFIXExporter(ep)
		tmplElems, err := goIPFIXElements(false)
		if err != nil {
			b.Fatal(err)
		}
		tid := ep.NewTemplateID()
		tmpl := entities.NewTemplateRecordFromElements(tid, tmplElems)
		if err := tmpl.PrepareRecord(); err != nil {
			b.Fatal(err)
		}
		if err := bep.AddRecord(tmpl); err != nil {
			b.Fatal(err)
		}
		elems, err := goIPFIXElements(false)
		if err != nil {
			b.Fatal(err)
		}
		rec := entities.NewDataRecordFromElements(tid, elems)
		encode := func() error {
			for i := range flows {
				setGoIPFIX(elems, &flows[i])
				if err := bep.AddRecord(rec); err != nil {
					return err
				}
			}
			return bep.Flush()
		}
		if err := encode(); err != nil {
			b.Fatal(err)
		}
		ms := startTimer(b)
		for range b.N {
			if err := encode(); err != nil {
				b.Fatal(err)
			}
		}
		perRecord(b, benchRecords, ms)
	})
}
