package collector

// The gRPC collector's HTTP/2 server. Exporters send one Flow per
// ExportRequest (as Antrea's agents do), so a connection carries a DATA
// frame per record. The standard library's server passes every frame
// through three goroutines (its frame reader, its serve loop, the
// handler's body pipe) and the handler's reads back again for flow
// control: a few goroutine switches per record, most of its CPU. Here
// one goroutine per connection reads the frames and appends each
// stream's payload to that stream's buffer; the stream's goroutine is
// woken once per socket read (tens of frames), decodes the messages
// and hands the records on; window updates go out in quarters of the
// window. The server speaks what gRPC clients need: SETTINGS, PING,
// WINDOW_UPDATE, RST_STREAM and GOAWAY, a stream limit, flow control
// both ways, and a keepalive ping for dead peers.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// h2InitialWindow is HTTP/2's window before SETTINGS change it.
	h2InitialWindow = 65535
	// h2MaxHeaderList bounds a request's decoded header list.
	h2MaxHeaderList = 64 << 10
	// h2ReadBuffer is the connection's read buffer: more than a TLS
	// record's plaintext, so that a read takes a whole record.
	h2ReadBuffer = 64 << 10
)

// h2Server serves HTTP/2 connections, one goroutine each, handing each
// request stream to handle in a goroutine of its own.
type h2Server struct {
	log        *slog.Logger
	maxStreams uint32
	// handle serves one stream; it returns when the stream is over.
	handle func(c *h2Conn, s *h2Stream)
	// admit is asked before a stream starts (false: refused with
	// Unavailable, the collector is stopping); done after it ended.
	admit func() bool
	done  func()
	// protocolError, if set, counts a connection closed for breaking
	// the protocol.
	protocolError func()
	// Timings: the client's preface and SETTINGS, a write's bound, and
	// the keepalive (a ping after pingIdle without a frame; the
	// connection closed when nothing arrives pingTimeout after it).
	prefaceTimeout, writeTimeout time.Duration
	pingIdle, pingTimeout        time.Duration

	chunks chunkPool // streams' received octets

	mu      sync.Mutex
	conns   map[*h2Conn]struct{}
	closing bool
	wg      sync.WaitGroup // connections' goroutines
}

// serve accepts connections from ln until it fails (net.ErrClosed once
// closed).
func (h *h2Server) serve(ln net.Listener) error {
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		c := newH2Conn(h, nc)
		h.mu.Lock()
		if h.closing {
			h.mu.Unlock()
			nc.Close()
			continue
		}
		h.conns[c] = struct{}{}
		h.wg.Add(1)
		h.mu.Unlock()
		go func() {
			defer h.wg.Done()
			c.serve()
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
		}()
	}
}

// shutdown sends every connection GOAWAY and closes each once its
// streams have ended (they see the collector's context and end with
// Unavailable), closing whatever is left after timeout. It returns
// false when it had to close connections with streams open.
func (h *h2Server) shutdown(timeout time.Duration) bool {
	h.mu.Lock()
	h.closing = true
	conns := make([]*h2Conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	// Each in a goroutine: a connection's writer may be stuck on a
	// client that reads nothing (until the write timeout, longer than
	// the stop's); the timeout below bounds the stop, and closing the
	// connections ends such a write.
	var goAways sync.WaitGroup
	defer goAways.Wait()
	for _, c := range conns {
		goAways.Go(c.goAway)
	}
	stopped := make(chan struct{})
	go func() { h.wg.Wait(); close(stopped) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-stopped:
		return true
	case <-timer.C:
	}
	h.closeAll()
	<-stopped
	return false
}

// closeAll closes every connection and waits for their goroutines.
func (h *h2Server) closeAll() {
	h.mu.Lock()
	h.closing = true
	for c := range h.conns {
		c.nc.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// h2Conn is one client connection.
type h2Conn struct {
	h      *h2Server
	nc     net.Conn
	peer   netip.Addr
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	br     *bufio.Reader
	fr     *http2.Framer // reads only

	// Receiving flow control: what the client may still send on the
	// connection (written by the reader, credited by streams).
	recvWindow atomic.Int64
	frames     atomic.Uint64 // frames read, for the keepalive

	// Writing: frames from the reader and from the streams, one at a
	// time.
	wmu         sync.Mutex
	sendCond    *sync.Cond // a send window grew, or the connection ended
	bw          *bufio.Writer
	fw          *http2.Framer
	henc        *hpack.Encoder
	hbuf        bytes.Buffer
	werr        error // the first write failure: nothing more is written
	sendWindow  int64 // the client's connection window for our DATA
	peerWindow  int64 // the client's initial stream window
	connUncred  int64 // taken by streams, not yet credited to the client
	goneAway    bool
	pingPending bool

	// Streams: written by the reader (new ones) and by streams (their
	// end).
	mu       sync.Mutex
	streams  map[uint32]*h2Stream
	maxID    uint32 // the highest stream the client opened
	closing  bool   // GOAWAY sent: no new streams; close once none is left
	clientGA bool   // the client sent GOAWAY

	dirty []*h2Stream // the reader's: streams to wake before it blocks
}

// h2Stream is one request stream.
type h2Stream struct {
	id  uint32
	c   *h2Conn
	ctx context.Context // ends on the client's reset or the connection's end
	// cancel ends ctx.
	cancel context.CancelFunc
	req    h2Request

	// wake is signalled (never blocking) when data, the end of the
	// client's side or a reset is there to see.
	wake chan struct{}

	// recvWindow is what the client may still send on the stream.
	recvWindow atomic.Int64

	mu     sync.Mutex
	in     []*h2Chunk // received, not taken by the stream's goroutine
	pad    int64      // padding received since the last take (in no chunk)
	ended  bool       // the client's END_STREAM
	reset  bool       // the client reset the stream, or the connection ended
	closed bool       // the stream's goroutine is done with it
	// sendWindow is the client's window for our DATA (under c.wmu).
	sendWindow int64

	// The reader's own view, without locks.
	rEnded, rDirty bool
}

// h2Request is what a stream's HEADERS asked.
type h2Request struct {
	method, path, contentType, timeout, encoding string
}

func newH2Conn(h *h2Server, nc net.Conn) *h2Conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &h2Conn{h: h, nc: nc, ctx: ctx, cancel: cancel,
		streams: map[uint32]*h2Stream{}, sendWindow: h2InitialWindow, peerWindow: h2InitialWindow}
	if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
		c.peer = ap.Addr().Unmap()
	}
	c.sendCond = sync.NewCond(&c.wmu)
	c.br = bufio.NewReaderSize(nc, h2ReadBuffer)
	c.fr = http2.NewFramer(nil, c.br)
	c.fr.SetReuseFrames()
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = h2MaxHeaderList
	// The server leaves SETTINGS_MAX_FRAME_SIZE at its default: a larger
	// frame is an error, not a buffer of up to 16 MiB the framer keeps.
	c.fr.SetMaxReadFrameSize(h2ChunkSize)
	c.bw = bufio.NewWriterSize(nc, 4096)
	c.fw = http2.NewFramer(c.bw, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.recvWindow.Store(grpcConnWindow)
	return c
}

// serve reads the connection's frames until it ends, then ends its
// streams and waits for them.
func (c *h2Conn) serve() {
	var streams sync.WaitGroup
	defer func() {
		c.cancel()
		c.nc.Close()
		c.mu.Lock()
		for _, s := range c.streams {
			s.endByConn()
		}
		c.mu.Unlock()
		c.wmu.Lock()
		if c.werr == nil {
			c.werr = net.ErrClosed
		}
		c.sendCond.Broadcast()
		c.wmu.Unlock()
		streams.Wait()
	}()
	if !c.start() {
		return
	}
	stopKeepalive := c.keepalive()
	defer stopKeepalive()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				// A request's headers the client should not have
				// sent: that stream only.
				c.h.log.Debug("HTTP/2 stream error", "peer", c.peer.String(), "stream", se.StreamID, "err", err)
				c.refuseStream(se.StreamID, se.Code)
				c.onStreamError(se.StreamID)
				if c.br.Buffered() == 0 {
					c.wakeDirty() // as after any frame
				}
				continue
			}
			if errors.Is(err, http2.ErrFrameTooLarge) {
				c.h.log.Debug("HTTP/2 connection error", "peer", c.peer.String(), "err", err)
				c.fail(http2.ErrCodeFrameSize)
				return
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.h.log.Debug("HTTP/2 connection error", "peer", c.peer.String(), "err", err)
				c.fail(http2.ErrCode(ce))
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.h.log.Debug("HTTP/2 connection ended", "peer", c.peer.String(), "err", err)
			}
			return
		}
		c.frames.Add(1)
		var code http2.ErrCode
		switch f := f.(type) {
		case *http2.DataFrame:
			code = c.onData(f)
		case *http2.MetaHeadersFrame:
			code = c.onHeaders(f, &streams)
		case *http2.SettingsFrame:
			code = c.onSettings(f)
		case *http2.PingFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fw.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			code = c.onWindowUpdate(f)
		case *http2.RSTStreamFrame:
			c.onReset(f)
		case *http2.GoAwayFrame:
			c.mu.Lock()
			c.clientGA = true
			c.mu.Unlock()
		case *http2.PushPromiseFrame:
			code = http2.ErrCodeProtocol // a client does not push
		}
		if code != http2.ErrCodeNo {
			c.h.log.Debug("closing HTTP/2 connection on a protocol error", "peer", c.peer.String(), "code", code.String())
			c.fail(code)
			return
		}
		if c.br.Buffered() == 0 {
			c.wakeDirty()
		}
	}
}

// start reads the client's preface, sends the server's SETTINGS and
// opens the connection's window.
func (c *h2Conn) start() bool {
	c.nc.SetReadDeadline(time.Now().Add(c.h.prefaceTimeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		c.h.log.Debug("refusing a connection without the HTTP/2 preface", "peer", c.peer.String(), "err", err)
		return false
	}
	c.nc.SetReadDeadline(time.Time{})
	return c.write(func() error {
		if err := c.fw.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.h.maxStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: grpcStreamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: h2MaxHeaderList},
		); err != nil {
			return err
		}
		return c.fw.WriteWindowUpdate(0, grpcConnWindow-h2InitialWindow)
	}) == nil
}

// write runs w with the writer and flushes, within the write timeout.
// After a failure the connection is closed and writes do nothing.
func (c *h2Conn) write(w func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(w)
}

func (c *h2Conn) writeLocked(w func() error) error {
	if c.werr != nil {
		return c.werr
	}
	err := w()
	if err == nil && c.bw.Buffered() > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(c.h.writeTimeout))
		err = c.bw.Flush()
	}
	if err != nil {
		c.werr = err
		c.nc.Close() // ends the reader
		c.sendCond.Broadcast()
	}
	return err
}

// fail ends the connection with GOAWAY and code.
func (c *h2Conn) fail(code http2.ErrCode) {
	if f := c.h.protocolError; f != nil {
		f()
	}
	c.mu.Lock()
	last := c.maxID
	c.mu.Unlock()
	c.write(func() error { return c.fw.WriteGoAway(last, code, nil) })
	c.nc.Close()
}

// goAway tells the client the server is stopping: no new streams; the
// connection closes once its streams have ended.
func (c *h2Conn) goAway() {
	c.mu.Lock()
	c.closing = true
	last, idle := c.maxID, len(c.streams) == 0
	c.mu.Unlock()
	c.write(func() error {
		if c.goneAway {
			return nil
		}
		c.goneAway = true
		return c.fw.WriteGoAway(last, http2.ErrCodeNo, nil)
	})
	if idle {
		c.nc.Close()
	}
}

// keepalive pings a connection that has been silent for pingIdle and
// closes it when the ping draws nothing in pingTimeout.
func (c *h2Conn) keepalive() (stop func()) {
	var mu sync.Mutex
	last := c.frames.Load()
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(c.h.pingIdle, func() {
		mu.Lock()
		defer mu.Unlock()
		if c.ctx.Err() != nil {
			return
		}
		if n := c.frames.Load(); n != last {
			last = n
			c.wmu.Lock()
			c.pingPending = false
			c.wmu.Unlock()
			t.Reset(c.h.pingIdle)
			return
		}
		c.wmu.Lock()
		pending := c.pingPending
		c.pingPending = true
		c.wmu.Unlock()
		if pending {
			c.h.log.Info("closing a gRPC connection that did not answer a ping", "peer", c.peer.String(), "timeout", c.h.pingTimeout.String())
			c.nc.Close()
			return
		}
		c.write(func() error { return c.fw.WritePing(false, [8]byte{'s', 'l', 'u', 'i', 'c', 'e'}) })
		t.Reset(c.h.pingTimeout)
	})
	return func() { t.Stop() }
}

func (c *h2Conn) onSettings(f *http2.SettingsFrame) http2.ErrCode {
	if f.IsAck() {
		return http2.ErrCodeNo
	}
	var code http2.ErrCode
	c.wmu.Lock()
	f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			code = http2.ErrCodeProtocol
			if s.ID == http2.SettingInitialWindowSize {
				code = http2.ErrCodeFlowControl
			}
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			// Applies to the open streams' send windows too.
			delta := int64(s.Val) - c.peerWindow
			c.peerWindow = int64(s.Val)
			c.mu.Lock()
			for _, st := range c.streams {
				st.sendWindow += delta
			}
			c.mu.Unlock()
			c.sendCond.Broadcast()
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if code == http2.ErrCodeNo {
		c.writeLocked(func() error { return c.fw.WriteSettingsAck() })
	}
	c.wmu.Unlock()
	return code
}

func (c *h2Conn) onWindowUpdate(f *http2.WindowUpdateFrame) http2.ErrCode {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWindow+inc > 1<<31-1 {
			return http2.ErrCodeFlowControl
		}
		c.sendWindow += inc
	} else {
		c.mu.Lock()
		s := c.streams[f.StreamID]
		c.mu.Unlock()
		if s == nil {
			return http2.ErrCodeNo
		}
		s.sendWindow += inc
	}
	c.sendCond.Broadcast()
	return http2.ErrCodeNo
}

// onHeaders opens a stream, or ends one (trailers).
func (c *h2Conn) onHeaders(f *http2.MetaHeadersFrame, streams *sync.WaitGroup) http2.ErrCode {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ErrCodeProtocol
	}
	c.mu.Lock()
	if s := c.streams[id]; s != nil {
		c.mu.Unlock()
		// Trailers: they must end the client's side.
		if !f.StreamEnded() || s.rEnded {
			return http2.ErrCodeProtocol
		}
		c.endRemote(s)
		return http2.ErrCodeNo
	}
	if id <= c.maxID {
		c.mu.Unlock()
		return http2.ErrCodeStreamClosed
	}
	c.maxID = id
	refuse := c.closing || c.clientGA || uint32(len(c.streams)) >= c.h.maxStreams
	c.mu.Unlock()
	if refuse || f.Truncated {
		c.refuseStream(id, http2.ErrCodeRefusedStream)
		return http2.ErrCodeNo
	}
	s := &h2Stream{id: id, c: c, wake: make(chan struct{}, 1)}
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":method":
			s.req.method = hf.Value
		case ":path":
			s.req.path = hf.Value
		case "content-type":
			s.req.contentType = hf.Value
		case "grpc-timeout":
			s.req.timeout = hf.Value
		case "grpc-encoding":
			s.req.encoding = hf.Value
		}
	}
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	s.recvWindow.Store(grpcStreamWindow)
	c.wmu.Lock()
	s.sendWindow = c.peerWindow
	c.wmu.Unlock()
	if f.StreamEnded() {
		s.ended, s.rEnded = true, true
	}
	c.mu.Lock()
	c.streams[id] = s
	c.mu.Unlock()
	if !c.h.admit() {
		c.respondStatus(s, 14, "the aggregator is shutting down") // Unavailable
		c.streamDone(s)
		return http2.ErrCodeNo
	}
	streams.Go(func() {
		defer c.h.done()
		defer c.streamDone(s)
		c.h.handle(c, s)
	})
	return http2.ErrCodeNo
}

// onData appends a DATA frame's payload to its stream.
func (c *h2Conn) onData(f *http2.DataFrame) http2.ErrCode {
	n := int64(f.Header().Length)
	if c.recvWindow.Add(-n) < 0 {
		return http2.ErrCodeFlowControl
	}
	c.mu.Lock()
	s := c.streams[f.StreamID]
	c.mu.Unlock()
	if s == nil || s.rEnded {
		// A stream that is over (frames in flight when it ended): its
		// octets are given back at once.
		c.credit(nil, nil, n)
		if s == nil && f.StreamID > c.maxID {
			return http2.ErrCodeProtocol // DATA on a stream never opened
		}
		return http2.ErrCodeNo
	}
	if s.recvWindow.Add(-n) < 0 {
		c.credit(nil, nil, n)
		c.refuseStream(s.id, http2.ErrCodeFlowControl)
		s.endByConn()
		s.rEnded = true
		c.wmu.Lock()
		c.sendCond.Broadcast() // a response waiting for window gives up
		c.wmu.Unlock()
		return http2.ErrCodeNo
	}
	data := f.Data()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.credit(nil, nil, n)
		return http2.ErrCodeNo
	}
	for len(data) > 0 {
		// Chunks are filled whole: the stream's memory is the octets
		// its window let in, not the frames' count.
		var last *h2Chunk
		if k := len(s.in); k > 0 {
			last = s.in[k-1]
		}
		if last == nil || len(last.b) == cap(last.b) {
			last = c.h.chunks.get()
			s.in = append(s.in, last)
		}
		k := copy(last.b[len(last.b):cap(last.b)], data)
		last.b = last.b[:len(last.b)+k]
		data = data[k:]
	}
	s.pad += n - int64(len(f.Data()))
	if f.StreamEnded() {
		s.ended = true
	}
	s.mu.Unlock()
	if f.StreamEnded() {
		s.rEnded = true
	}
	if !s.rDirty {
		s.rDirty = true
		c.dirty = append(c.dirty, s)
	}
	return http2.ErrCodeNo
}

// onStreamError ends, for the server too, a stream just reset for a
// frame the framer refused: the client sends it nothing more, so its
// goroutine must not wait for more. A stream not yet opened (refused
// HEADERS) is counted as opened, so that DATA in flight for it is
// ignored rather than taken for DATA on an idle stream.
func (c *h2Conn) onStreamError(id uint32) {
	c.mu.Lock()
	s := c.streams[id]
	if s == nil && id%2 == 1 && id > c.maxID {
		c.maxID = id
	}
	c.mu.Unlock()
	if s != nil {
		s.rEnded = true
		s.endByConn()
		c.wmu.Lock()
		c.sendCond.Broadcast() // a response waiting for window gives up
		c.wmu.Unlock()
	}
}

// endRemote records the end of the client's side of s.
func (c *h2Conn) endRemote(s *h2Stream) {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.rEnded = true
	if !s.rDirty {
		s.rDirty = true
		c.dirty = append(c.dirty, s)
	}
}

func (c *h2Conn) onReset(f *http2.RSTStreamFrame) {
	c.mu.Lock()
	s := c.streams[f.StreamID]
	c.mu.Unlock()
	if s != nil {
		s.rEnded = true
		s.endByConn()
		c.wmu.Lock()
		c.sendCond.Broadcast() // a response waiting for window gives up
		c.wmu.Unlock()
	}
}

// wakeDirty wakes the streams that got frames since the reader last
// blocked: one wake-up per socket read, not per frame.
func (c *h2Conn) wakeDirty() {
	for i, s := range c.dirty {
		s.rDirty = false
		s.signal()
		c.dirty[i] = nil
	}
	c.dirty = c.dirty[:0]
}

// refuseStream resets a stream the server does not serve.
func (c *h2Conn) refuseStream(id uint32, code http2.ErrCode) {
	c.write(func() error { return c.fw.WriteRSTStream(id, code) })
}

// streamDone forgets s once its goroutine is done; a stopping
// connection closes with its last stream.
func (c *h2Conn) streamDone(s *h2Stream) {
	s.mu.Lock()
	s.closed = true
	// What the stream did not take is the connection's window still.
	left := s.pad
	s.pad = 0
	for i, ch := range s.in {
		left += int64(len(ch.b))
		c.h.chunks.put(ch)
		s.in[i] = nil
	}
	s.in = nil
	s.mu.Unlock()
	s.cancel()
	if left > 0 {
		c.credit(nil, nil, left)
	}
	c.mu.Lock()
	delete(c.streams, s.id)
	last := c.closing && len(c.streams) == 0
	c.mu.Unlock()
	if last {
		// Under wmu: a stream that respond has already forgotten may be
		// writing its response still; it goes out first.
		c.wmu.Lock()
		c.nc.Close()
		c.wmu.Unlock()
	}
}

// credit gives back what a stream took from its buffer: to the stream
// (when its share reaches a quarter of its window) and to the
// connection (a quarter of its window). Small credits wait: the client
// is blocked only when a window is spent, and then a quarter of it is
// owed. s is nil for octets of a stream that is over.
func (c *h2Conn) credit(s *h2Stream, streamOwed *int64, n int64) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.connUncred += n
	var sInc int64
	if s != nil && *streamOwed >= grpcStreamWindow/4 {
		s.mu.Lock()
		open := !s.ended && !s.reset
		s.mu.Unlock()
		if open {
			sInc = *streamOwed
		}
		*streamOwed = 0
	}
	cInc := int64(0)
	if c.connUncred >= grpcConnWindow/4 {
		cInc, c.connUncred = c.connUncred, 0
	}
	if sInc == 0 && cInc == 0 {
		return
	}
	// The windows open before the client hears of it.
	if sInc > 0 {
		s.recvWindow.Add(sInc)
	}
	if cInc > 0 {
		c.recvWindow.Add(cInc)
	}
	c.writeLocked(func() error {
		if sInc > 0 {
			if err := c.fw.WriteWindowUpdate(s.id, uint32(sInc)); err != nil {
				return err
			}
		}
		if cInc > 0 {
			return c.fw.WriteWindowUpdate(0, uint32(cInc))
		}
		return nil
	})
}

// signal wakes the stream's goroutine if it waits.
func (s *h2Stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// endByConn ends the stream from outside: the client reset it or the
// connection ended.
func (s *h2Stream) endByConn() {
	s.mu.Lock()
	s.reset = true
	s.mu.Unlock()
	s.cancel()
	s.signal()
}

// take moves the chunks the reader filled to r, at most maxTake of
// them, and returns the octets their frames took (for flow control) and
// whether the client's side ended (all taken) or the stream was reset.
// What is taken is credited to the client, so the stream holds at most
// its window untaken and maxTake chunks taken but not yet read.
func (s *h2Stream) take(r *bodyReader) (n int64, ended, reset bool) {
	s.mu.Lock()
	k := min(len(s.in), maxTake)
	r.add(s.in[:k])
	for _, ch := range s.in[:k] {
		n += int64(len(ch.b))
	}
	rest := copy(s.in, s.in[k:])
	clear(s.in[rest:])
	s.in = s.in[:rest]
	n += s.pad
	s.pad = 0
	// The end and a reset are seen once everything before them is
	// taken: whole messages a client sent before resetting still go on.
	ended, reset = s.ended && rest == 0, s.reset && rest == 0
	s.mu.Unlock()
	if rest > 0 {
		s.signal() // the rest, once these are read
	}
	return n, ended, reset
}

// maxTake is the most chunks a stream takes at once (256 KiB).
const maxTake = 16

// h2ChunkSize is a DATA frame's largest payload (the server does not
// raise SETTINGS_MAX_FRAME_SIZE).
const h2ChunkSize = 16 << 10

// h2Chunk is a piece of a stream's received octets.
type h2Chunk struct{ b []byte }

// chunkPool keeps the chunks of ended reads for the next ones.
type chunkPool struct{ p sync.Pool }

func (p *chunkPool) get() *h2Chunk {
	if c, _ := p.p.Get().(*h2Chunk); c != nil {
		return c
	}
	return &h2Chunk{b: make([]byte, 0, h2ChunkSize)}
}

func (p *chunkPool) put(c *h2Chunk) {
	c.b = c.b[:0]
	p.p.Put(c)
}

// bodyReader is a stream goroutine's view of the octets it took: their
// chunks, in order, read as gRPC's length-prefixed messages. A message
// inside a chunk is read where it lies; one that spans chunks is put
// together in carry.
type bodyReader struct {
	pool  *chunkPool
	max   int        // the largest message
	cur   []byte     // the unread octets of the region being read
	chunk *h2Chunk   // cur's chunk; nil when cur is in carry
	carry []byte     // a message that spans chunks
	queue []*h2Chunk // taken, not yet read (from qi on)
	qi    int
	qoff  int // octets of queue[qi] already read
}

func (r *bodyReader) add(chunks []*h2Chunk) {
	if r.qi == len(r.queue) {
		clear(r.queue)
		r.queue, r.qi = r.queue[:0], 0
	}
	r.queue = append(r.queue, chunks...)
}

// next returns the next whole message (without its head), valid until
// the following call, or nil when the rest of it has not arrived yet.
// A head it refuses (compressed, larger than max) is an error.
func (r *bodyReader) next() ([]byte, error) {
	for {
		if len(r.cur) >= 5 {
			if r.cur[0] != 0 {
				return nil, status.Errorf(codes.Internal, "grpc: %v", errCompressed)
			}
			size := int(binary.BigEndian.Uint32(r.cur[1:5]))
			if size > r.max {
				return nil, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", size, r.max)
			}
			if 5+size <= len(r.cur) {
				msg := r.cur[5 : 5+size]
				r.cur = r.cur[5+size:]
				return msg, nil
			}
		}
		if !r.fill() {
			return nil, nil
		}
	}
}

// ready says whether next may return a message or an error.
func (r *bodyReader) ready() bool {
	if r.qi < len(r.queue) {
		return true
	}
	if len(r.cur) < 5 {
		return false
	}
	size := int(binary.BigEndian.Uint32(r.cur[1:5]))
	return r.cur[0] != 0 || size > r.max || 5+size <= len(r.cur)
}

// partial says whether octets of an unfinished message are held.
func (r *bodyReader) partial() bool { return len(r.cur) > 0 || r.qi < len(r.queue) }

// fill moves to the next chunk, or, with a message begun in cur, adds
// to carry what completes it. It returns false when nothing was taken.
func (r *bodyReader) fill() bool {
	if r.qi == len(r.queue) {
		return false
	}
	if len(r.cur) == 0 {
		r.drop()
		r.chunk = r.queue[r.qi]
		r.cur = r.chunk.b[r.qoff:]
		r.pop()
		return true
	}
	if r.chunk != nil {
		r.carry = append(r.carry[:0], r.cur...)
		r.drop()
	} else {
		r.carry = r.carry[:copy(r.carry, r.cur)]
	}
	for r.qi < len(r.queue) {
		want := 5 - len(r.carry)
		if want <= 0 {
			size := int(binary.BigEndian.Uint32(r.carry[1:5]))
			if r.carry[0] != 0 || size > r.max {
				break // next refuses it
			}
			if want = 5 + size - len(r.carry); want <= 0 {
				break
			}
		}
		head := r.queue[r.qi]
		avail := head.b[r.qoff:]
		k := min(want, len(avail))
		r.carry = append(r.carry, avail[:k]...)
		if r.qoff += k; r.qoff == len(head.b) {
			r.pool.put(head)
			r.pop()
		}
	}
	r.cur = r.carry
	return true
}

func (r *bodyReader) pop() {
	r.queue[r.qi] = nil
	r.qi++
	r.qoff = 0
}

// drop lets go of cur's chunk (or of a large carry).
func (r *bodyReader) drop() {
	if r.chunk != nil {
		r.pool.put(r.chunk)
		r.chunk = nil
	} else if cap(r.carry) > maxKeptRequestBuffer {
		r.carry = nil
	}
	r.cur = nil
}

// release gives every chunk back: the stream is over.
func (r *bodyReader) release() {
	r.drop()
	for r.qi < len(r.queue) {
		r.pool.put(r.queue[r.qi])
		r.pop()
	}
}

// respondStatus ends s with a trailers-only gRPC response.
func (c *h2Conn) respondStatus(s *h2Stream, code uint32, msg string) {
	fields := []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: grpcContentType},
		{Name: "grpc-status", Value: strconv.FormatUint(uint64(code), 10)}}
	if msg != "" {
		fields = append(fields, hpack.HeaderField{Name: "grpc-message", Value: encodeGRPCMessage(msg)})
	}
	c.respond(s, fields, nil, nil)
}

// respondHTTP ends s with an HTTP error (a request that is not gRPC).
func (c *h2Conn) respondHTTP(s *h2Stream, code int, body string, extra ...hpack.HeaderField) {
	fields := append([]hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(code)},
		{Name: "content-type", Value: "text/plain; charset=utf-8"},
		{Name: "content-length", Value: strconv.Itoa(len(body))}}, extra...)
	c.respond(s, fields, []byte(body), nil)
}

// respondOK ends s with one response message and status OK.
func (c *h2Conn) respondOK(s *h2Stream, msg []byte) {
	data := make([]byte, 5+len(msg))
	data[1], data[2], data[3], data[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	copy(data[5:], msg)
	c.respond(s, []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: grpcContentType}},
		data, []hpack.HeaderField{{Name: "grpc-status", Value: "0"}})
}

// respond writes s's response: headers, then (if any) data within the
// client's windows, then (if any) trailers; the last frame ends the
// stream. A client still sending is told to stop (RST_STREAM
// NO_ERROR). A stream the client reset gets nothing.
func (c *h2Conn) respond(s *h2Stream, head []hpack.HeaderField, data []byte, trailers []hpack.HeaderField) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(data) > 0 && c.werr == nil && !s.isReset() && (c.sendWindow < int64(len(data)) || s.sendWindow < int64(len(data))) {
		c.sendCond.Wait()
	}
	s.mu.Lock()
	reset, clientDone := s.reset, s.ended
	s.mu.Unlock()
	if reset {
		return
	}
	// The stream is over for the client once it reads the last frame:
	// it may open the next one at once, within the limit.
	c.mu.Lock()
	delete(c.streams, s.id)
	c.mu.Unlock()
	c.writeLocked(func() error {
		if err := c.writeHeaders(s.id, head, len(data) == 0 && len(trailers) == 0); err != nil {
			return err
		}
		if len(data) > 0 {
			c.sendWindow -= int64(len(data))
			s.sendWindow -= int64(len(data))
			if err := c.fw.WriteData(s.id, len(trailers) == 0, data); err != nil {
				return err
			}
		}
		if len(trailers) > 0 {
			if err := c.writeHeaders(s.id, trailers, true); err != nil {
				return err
			}
		}
		if !clientDone {
			return c.fw.WriteRSTStream(s.id, http2.ErrCodeNo)
		}
		return nil
	})
}

func (s *h2Stream) isReset() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reset
}

// writeHeaders encodes fields into one HEADERS frame (a gRPC response's
// headers are far below the smallest frame size).
func (c *h2Conn) writeHeaders(id uint32, fields []hpack.HeaderField, end bool) error {
	c.hbuf.Reset()
	for _, f := range fields {
		if len(f.Value) > 4096 {
			f.Value = f.Value[:4096] // a long grpc-message
		}
		if err := c.henc.WriteField(f); err != nil {
			return err
		}
	}
	if c.hbuf.Len() > 16384 {
		return fmt.Errorf("http2: a response header block of %d octets", c.hbuf.Len())
	}
	return c.fw.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: end, EndHeaders: true})
}
