package collector

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// TestBodyReaderAnyChunking: messages cut into chunks at any octet,
// taken a few chunks at a time, read back whole and in order; a message
// that is not all there yet is not returned.
func TestBodyReaderAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var pool chunkPool
	pattern := make([]byte, 4*h2ChunkSize)
	for j := range pattern {
		pattern[j] = byte(j * 7)
	}
	for round := range 100 {
		var msgs [][]byte
		var wire []byte
		for i := range 1 + rng.IntN(60) {
			k := rng.IntN(h2ChunkSize)
			m := pattern[k+i : k+i+rng.IntN(3*h2ChunkSize)]
			if rng.IntN(4) == 0 {
				m = m[:rng.IntN(3)]
			}
			msgs = append(msgs, m)
			wire = append(wire, 0, 0, 0, 0, 0)
			binary.BigEndian.PutUint32(wire[len(wire)-4:], uint32(len(m)))
			wire = append(wire, m...)
		}
		r := bodyReader{pool: &pool, max: 4 << 20}
		var got [][]byte
		for len(wire) > 0 {
			// Chunks as the reader fills them: whole but the last.
			var in []*h2Chunk
			for range 1 + rng.IntN(4) {
				if len(wire) == 0 {
					break
				}
				c := pool.get()
				k := min(len(wire), 1+rng.IntN(h2ChunkSize), cap(c.b))
				c.b = append(c.b, wire[:k]...)
				wire = wire[k:]
				in = append(in, c)
			}
			r.add(in)
			for {
				m, err := r.next()
				if err != nil {
					t.Fatal(err)
				}
				if m == nil {
					break
				}
				got = append(got, bytes.Clone(m))
			}
		}
		if r.partial() {
			t.Fatalf("round %d: octets left over", round)
		}
		if len(got) != len(msgs) {
			t.Fatalf("round %d: %d messages, want %d", round, len(got), len(msgs))
		}
		for i := range msgs {
			if !bytes.Equal(got[i], msgs[i]) {
				t.Fatalf("round %d: message %d differs (%d vs %d octets)", round, i, len(got[i]), len(msgs[i]))
			}
		}
		r.release()
	}
}

// TestBodyReaderRefusesHeads: a compressed message and one larger than
// the limit are refused from their head, before their octets arrive.
func TestBodyReaderRefusesHeads(t *testing.T) {
	var pool chunkPool
	for _, head := range [][]byte{{1, 0, 0, 0, 3}, {0, 0, 0, 4, 1}} {
		r := bodyReader{pool: &pool, max: 1024}
		c := pool.get()
		c.b = append(c.b, head[:3]...)
		r.add([]*h2Chunk{c})
		if m, err := r.next(); m != nil || err != nil {
			t.Fatalf("%x: a partial head gave %v, %v", head, m, err)
		}
		c = pool.get()
		c.b = append(c.b, head[3:]...)
		r.add([]*h2Chunk{c})
		if _, err := r.next(); err == nil {
			t.Errorf("%x: no error", head)
		}
	}
}

// h2Client is a raw HTTP/2 client of the collector's server.
type h2Client struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// What the server's windows let the client send (one stream's),
	// as of the last sync.
	connWin, streamWin int64
}

// sync reads every frame the server wrote before it answers a ping,
// keeping count of the windows.
func (c *h2Client) sync() {
	c.t.Helper()
	c.fr.WritePing(false, [8]byte{'s', 'y', 'n', 'c'})
	c.next(false, func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok && !f.IsAck() {
				c.streamWin += int64(v) - h2InitialWindow
				c.fr.WriteSettingsAck()
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.connWin += int64(f.Increment)
			} else {
				c.streamWin += int64(f.Increment)
			}
		case *http2.PingFrame:
			return f.IsAck() && f.Data == [8]byte{'s', 'y', 'n', 'c'}
		}
		return false
	})
}

// send writes b as DATA frames on stream id, counting it against the
// windows (whatever they are: a test may overrun them on purpose).
func (c *h2Client) send(id uint32, b []byte) {
	c.t.Helper()
	for len(b) > 0 {
		k := min(len(b), 16384)
		if err := c.fr.WriteData(id, false, b[:k]); err != nil {
			c.t.Fatal(err)
		}
		c.connWin -= int64(k)
		c.streamWin -= int64(k)
		b = b[k:]
	}
}

// startH2 serves the gRPC collector's HTTP/2 (without TLS) with a
// pipeline of out, and returns its address and server.
func startH2(t *testing.T, out chan flow.Batch, maxStreams uint32) (string, *h2Server, *Server) {
	t.Helper()
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Table: tb, Out: out, Metrics: NewMetrics(prometheus.NewRegistry()),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), GRPC: GRPCOptions{MaxStreams: maxStreams}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var handlers handlerCount
	h := s.newH2Server(&exportService{s: s, ctx: ctx}, &handlers, s.o.Log)
	served := make(chan error, 1)
	go func() { served <- h.serve(ln) }()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-served
		h.shutdown(5 * time.Second)
		handlers.closeAndWait()
	})
	return ln.Addr().String(), h, s
}

func dialH2(t *testing.T, addr string) *h2Client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &h2Client{t: t, nc: nc, fr: http2.NewFramer(nc, bufio.NewReader(nc)), connWin: h2InitialWindow, streamWin: h2InitialWindow}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// open starts an Export call on stream id.
func (c *h2Client) open(id uint32) {
	c.t.Helper()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", flowpb.FlowExportService_Export_FullMethodName},
		{":authority", "sluice"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
}

// next reads frames until one that keep says to keep (answering the
// server's pings on the way if ack).
func (c *h2Client) next(ack bool, keep func(http2.Frame) bool) http2.Frame {
	c.t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() && ack {
			c.fr.WritePing(true, p.Data)
		}
		if keep(f) {
			return f
		}
	}
}

func fieldValue(h *http2.MetaHeadersFrame, name string) string {
	for _, f := range h.Fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// request is an ExportRequest of one flow, framed.
func request(i int) []byte {
	req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), flowtest.Wire(flowtest.Full(i, false), nil, nil))
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(req))), req...)
}

// TestH2StreamLimit: streams beyond the limit are refused
// (REFUSED_STREAM); once one ends, its answer comes and a new one is
// served.
func TestH2StreamLimit(t *testing.T) {
	out := make(chan flow.Batch, 64)
	addr, _, _ := startH2(t, out, 2)
	c := dialH2(t, addr)
	c.open(1)
	c.open(3)
	c.open(5)
	f := c.next(true, func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if f.StreamID != 5 || f.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("stream %d reset with %v, want 5 with REFUSED_STREAM", f.StreamID, f.ErrCode)
	}
	if err := c.fr.WriteData(1, true, request(7)); err != nil {
		t.Fatal(err)
	}
	trailers := c.next(true, func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 1 && h.StreamEnded()
	}).(*http2.MetaHeadersFrame)
	if st := fieldValue(trailers, "grpc-status"); st != "0" {
		t.Errorf("stream 1 ended with %v, want grpc-status 0", trailers.Fields)
	}
	if got := (<-out).Flows[0].SourcePodName; got != "client-7" {
		t.Errorf("record %q", got)
	}
	// Stream 1 is over: a new one fits.
	c.open(7)
	if err := c.fr.WriteData(7, true, request(8)); err != nil {
		t.Fatal(err)
	}
	c.next(true, func(f http2.Frame) bool {
		if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == 7 {
			t.Fatalf("stream 7 reset: %v", r.ErrCode)
		}
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 7 && h.StreamEnded()
	})
	if got := (<-out).Flows[0].SourcePodName; got != "client-8" {
		t.Errorf("record %q", got)
	}
}

// TestH2Pings: a ping is answered with its data; a client that answers
// the server's keepalive pings stays, one that does not is closed.
func TestH2Pings(t *testing.T) {
	addr, h, _ := startH2(t, make(chan flow.Batch, 1), 4)
	h.pingIdle, h.pingTimeout = 50*time.Millisecond, 50*time.Millisecond
	c := dialH2(t, addr)
	data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	c.fr.WritePing(false, data)
	p := c.next(true, func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() }).(*http2.PingFrame)
	if p.Data != data {
		t.Errorf("ping answered with %x", p.Data)
	}
	// Answering: several keepalive pings come and go.
	for range 3 {
		c.next(true, func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() })
	}
	// Silent: the server gives up on the connection.
	silent := dialH2(t, addr)
	for {
		if _, err := silent.fr.ReadFrame(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("a client that answers no ping is still connected")
				}
			}
			break
		}
	}
}

// TestH2FlowControl: while the pipeline is full the stream's window is
// not given back; a client that then sends what its windows allow is
// served, one octet more and it is refused.
func TestH2FlowControl(t *testing.T) {
	out := make(chan flow.Batch) // nobody reads it yet
	addr, _, s := startH2(t, out, 4)
	c := dialH2(t, addr)
	sync, send := c.sync, func(b []byte) { c.send(1, b) }
	sync()
	c.open(1)
	// grpcBatch records wait for the pipeline: then the stream takes
	// nothing more.
	var msgs []byte
	for i := range grpcBatch + 100 {
		msgs = append(msgs, request(i)...)
	}
	if int64(len(msgs)) > min(c.connWin, c.streamWin) {
		t.Fatalf("%d octets of requests, more than the windows", len(msgs))
	}
	send(msgs)
	records := s.o.Metrics.Records.WithLabelValues("grpc", "127.0.0.1")
	deadline := time.Now().Add(20 * time.Second)
	for testutil.ToFloat64(records) < grpcBatch {
		if time.Now().After(deadline) {
			t.Fatalf("%v records decoded", testutil.ToFloat64(records))
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, not a synchronisation
	}
	sync()
	allowed := min(c.connWin, c.streamWin)
	if allowed <= 0 || allowed > 2*grpcConnWindow {
		t.Fatalf("windows %d/%d after the pipeline filled", c.connWin, c.streamWin)
	}
	// Exactly the windows: no complaint (the octets need not be whole
	// messages: the stream takes none of them now).
	send(make([]byte, allowed))
	sync()
	if c.connWin != 0 && c.streamWin != 0 {
		t.Fatalf("windows %d/%d: the server gave credit while its pipeline was full", c.connWin, c.streamWin)
	}
	send([]byte{0})
	f := c.next(false, func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			return true
		case *http2.RSTStreamFrame:
			return f.StreamID == 1
		}
		return false
	})
	var code http2.ErrCode
	switch f := f.(type) {
	case *http2.GoAwayFrame:
		code = f.ErrCode
	case *http2.RSTStreamFrame:
		code = f.ErrCode
	}
	if code != http2.ErrCodeFlowControl {
		t.Fatalf("one octet beyond the window: %v, want FLOW_CONTROL_ERROR", code)
	}
	// What the stream had decoded still arrives.
	n := 0
	for n < grpcBatch {
		select {
		case b := <-out:
			for _, f := range b.Flows {
				if want := "client-" + strconv.Itoa(n); f.SourcePodName != want {
					t.Fatalf("record %d is %q", n, f.SourcePodName)
				}
				n++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d records", n)
		}
	}
}

// TestH2GoAwayOnStop: a stopping server says GOAWAY to an idle client
// and closes the connection.
func TestH2GoAwayOnStop(t *testing.T) {
	addr, h, _ := startH2(t, make(chan flow.Batch, 1), 4)
	c := dialH2(t, addr)
	c.fr.WritePing(false, [8]byte{})
	c.next(true, func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	go h.shutdown(5 * time.Second)
	g := c.next(true, func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if g.ErrCode != http2.ErrCodeNo {
		t.Errorf("GOAWAY %v", g.ErrCode)
	}
	if _, err := c.fr.ReadFrame(); err == nil {
		t.Error("the connection stayed open")
	}
}

// openStreams counts the streams the server holds open on its
// connections.
func openStreams(h *h2Server) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for c := range h.conns {
		c.mu.Lock()
		n += len(c.streams)
		c.mu.Unlock()
	}
	return n
}

// TestH2StreamErrorEndsStream: a stream the server resets for a frame
// the framer refuses (here a WINDOW_UPDATE of 0, a stream error) is over
// for the server too: its goroutine ends and its slot is free, rather
// than waiting forever for octets the client will not send.
func TestH2StreamErrorEndsStream(t *testing.T) {
	addr, h, _ := startH2(t, make(chan flow.Batch, 1), 1)
	c := dialH2(t, addr)
	c.open(1)
	if err := c.fr.WriteRawFrame(http2.FrameWindowUpdate, 0, 1, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	r := c.next(true, func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if r.StreamID != 1 || r.ErrCode != http2.ErrCodeProtocol {
		t.Fatalf("stream %d reset with %v, want 1 with PROTOCOL_ERROR", r.StreamID, r.ErrCode)
	}
	deadline := time.Now().Add(10 * time.Second)
	for openStreams(h) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server still holds the stream it reset")
		}
		time.Sleep(5 * time.Millisecond) // polling the server's state, not a synchronisation
	}
}

// TestH2FrameSizeLimit: a frame larger than SETTINGS_MAX_FRAME_SIZE
// (16384, which the server does not raise) is a FRAME_SIZE_ERROR
// (RFC 9113 4.2), not read into a buffer the connection keeps.
func TestH2FrameSizeLimit(t *testing.T) {
	addr, _, s := startH2(t, make(chan flow.Batch, 1), 4)
	// However the client sees the end, the connection is counted as
	// closed for a protocol error.
	defer func() {
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(s.o.Metrics.DecodeErrors.WithLabelValues("grpc")) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("decode errors %v, want 1", testutil.ToFloat64(s.o.Metrics.DecodeErrors.WithLabelValues("grpc")))
			}
			time.Sleep(5 * time.Millisecond) // polling a counter, not a synchronisation
		}
	}()
	c := dialH2(t, addr)
	// The server may close the connection before the frame is all
	// written: a failed write is one of the answers wanted.
	if err := c.fr.WriteRawFrame(0xfe, 0, 0, make([]byte, 1<<20)); err != nil {
		return
	}
	c.fr.WritePing(false, [8]byte{'a', 'f', 't', 'e', 'r'})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return // closed: fine
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if f.IsAck() && f.Data == [8]byte{'a', 'f', 't', 'e', 'r'} {
				t.Fatal("a 1 MiB frame was read and ignored; want FRAME_SIZE_ERROR")
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeFrameSize {
				t.Errorf("GOAWAY %v, want FRAME_SIZE_ERROR", f.ErrCode)
			}
			return
		}
	}
}

// TestH2ShutdownBoundedByStuckWriter: a client that reads nothing and
// has filled the server's socket buffer holds the connection's writer
// until the write timeout; shutdown is still bounded by its own timeout.
func TestH2ShutdownBoundedByStuckWriter(t *testing.T) {
	addr, h, _ := startH2(t, make(chan flow.Batch, 1), 4)
	h.writeTimeout = 20 * time.Second
	c := dialH2(t, addr)
	if tc, ok := c.nc.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096)
	}
	// Pings until the server stops reading (its reader is stuck writing
	// their answers): then the client's writes block, none of a ping
	// going out within a second, twice running.
	ping := make([]byte, 0, 17*1024)
	for range 1024 {
		ping = append(ping, 0, 0, 8, byte(http2.FramePing), 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8)
	}
	deadline := time.Now().Add(60 * time.Second)
	stalls, off := 0, 0
	for stalls < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the server kept reading")
		}
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := c.nc.Write(ping[off:])
		off = (off + n) % len(ping)
		switch {
		case err == nil:
			stalls = 0
		case n > 0:
			stalls = 0
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
		default:
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
			stalls++
		}
	}
	start := time.Now()
	h.shutdown(200 * time.Millisecond)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("shutdown with a 200ms timeout took %v", d)
	}
}

// TestH2StreamErrorWakesStreams: a frame refused with a stream error,
// last in a read, does not keep the streams that got data before it
// in the same read from being woken.
func TestH2StreamErrorWakesStreams(t *testing.T) {
	out := make(chan flow.Batch, 1)
	addr, _, _ := startH2(t, out, 4)
	c := dialH2(t, addr)
	c.open(1)
	// One write: stream 1's request and its end, then a WINDOW_UPDATE
	// of 0 on stream 3 (a stream error).
	var b bytes.Buffer
	fw := http2.NewFramer(&b, nil)
	if err := fw.WriteData(1, true, request(3)); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteRawFrame(http2.FrameWindowUpdate, 0, 3, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nc.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer on stream 1: %v", err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == 1 && h.StreamEnded() {
			break
		}
	}
	select {
	case <-out:
	case <-time.After(10 * time.Second):
		t.Fatal("stream 1's record was not handed on")
	}
}

// TestH2ResetKeepsWholeMessages: a client that resets its stream while
// the pipeline is full, with more than one take's worth of messages
// buffered, still has every whole message it sent handed on, in order.
func TestH2ResetKeepsWholeMessages(t *testing.T) {
	out := make(chan flow.Batch) // nobody reads it yet
	addr, _, s := startH2(t, out, 4)
	c := dialH2(t, addr)
	c.sync()
	c.open(1)
	next := 0
	var msgs []byte
	// fill sends whole messages up to limit octets.
	fill := func(limit int64) {
		msgs = msgs[:0]
		for {
			m := request(next)
			if int64(len(msgs)+len(m)) > limit {
				break
			}
			msgs = append(msgs, m...)
			next++
		}
		c.send(1, msgs)
	}
	// grpcBatch records decoded and waiting for the pipeline: then the
	// stream takes nothing more.
	fill(int64(grpcBatch+50) * int64(len(request(0))))
	records := s.o.Metrics.Records.WithLabelValues("grpc", "127.0.0.1")
	deadline := time.Now().Add(20 * time.Second)
	for testutil.ToFloat64(records) < grpcBatch {
		if time.Now().After(deadline) {
			t.Fatalf("%v records decoded", testutil.ToFloat64(records))
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, not a synchronisation
	}
	// Then what the windows allow, more than one take's worth.
	c.sync()
	allowed := min(c.connWin, c.streamWin)
	if allowed < 2*maxTake*h2ChunkSize {
		t.Fatalf("the windows allow %d octets more", allowed)
	}
	fill(allowed)
	c.sync() // the server has read them all
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < next {
		select {
		case b := <-out:
			for _, f := range b.Flows {
				if want := "client-" + strconv.Itoa(got); f.SourcePodName != want {
					t.Fatalf("record %d is %q", got, f.SourcePodName)
				}
				got++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d records after the reset", got, next)
		}
	}
}
