// Package capture reads IPFIX messages out of files: a raw IPFIX stream (the
// bytes a TCP collector receives) or a pcap/pcapng capture, whose UDP
// datagrams and reassembled TCP streams to or from a port carry IPFIX.
// Every message is tagged with its transport session, so that templates are
// applied per session as a collector would.
package capture

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"sluice/ipfix"
)

// Format is the kind of file.
type Format int

// The formats Open recognises by their magic numbers.
const (
	FormatRaw Format = iota
	FormatPcap
	FormatPcapNG
)

func (f Format) String() string {
	return [...]string{"raw IPFIX stream", "pcap", "pcapng"}[f]
}

// Message is one IPFIX message and where it came from.
type Message struct {
	// Session names the transport session: "stream" for a raw file,
	// "udp SRC -> DST" or "tcp SRC -> DST" for a capture.
	Session string
	// UDP is true when the session is a UDP one (templates then expire).
	UDP bool
	// Where locates the message for error messages: a file offset or a
	// packet number.
	Where string
	Data  []byte
}

// Handler receives each message in turn. Data is only valid during the
// call. A Handler error stops the reading.
type Handler func(Message) error

// Problem is a non-fatal defect of the capture, such as a TCP stream with
// missing segments: what could be read was delivered.
type Problem struct {
	Session string
	Msg     string
}

// Detect reads the magic number at the start of b.
func Detect(b []byte) (Format, error) {
	if len(b) < 4 {
		return 0, fmt.Errorf("capture: file too short (%d octets) to recognise", len(b))
	}
	switch binary.BigEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xd4c3b2a1, 0xa1b23c4d, 0x4d3cb2a1:
		return FormatPcap, nil
	case 0x0a0d0d0a:
		return FormatPcapNG, nil
	}
	if binary.BigEndian.Uint16(b) == ipfix.Version {
		return FormatRaw, nil
	}
	return 0, fmt.Errorf("capture: neither pcap, pcapng nor IPFIX (starts with %x)", b[:4])
}

// ReadFile reads the file at path, detects its format and calls h for
// every IPFIX message found; port selects the IPFIX traffic of a capture.
// It returns the problems that did not stop the reading.
func ReadFile(path string, port uint16, h Handler) ([]Problem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, port, h)
}

// Read is ReadFile for an open reader.
func Read(r io.Reader, port uint16, h Handler) ([]Problem, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, _ := br.Peek(4)
	if len(magic) == 0 {
		return nil, errors.New("capture: empty file")
	}
	format, err := Detect(magic)
	if err != nil {
		return nil, err
	}
	switch format {
	case FormatRaw:
		return nil, readRaw(br, h)
	case FormatPcap:
		pr, err := newPcapReader(br)
		if err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		return readPackets(pr, port, h)
	default:
		return readPackets(newNgReader(br), port, h)
	}
}

func readRaw(r io.Reader, h Handler) error {
	mr := ipfix.NewMessageReader(r)
	for {
		msg, err := mr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := h(Message{Session: "stream", Where: fmt.Sprintf("offset %d", mr.Offset), Data: msg}); err != nil {
			return err
		}
	}
}

// readPackets delivers UDP messages as their packets come and TCP streams
// when the capture ends, each reassembled in sequence order.
func readPackets(src packetReader, port uint16, h Handler) ([]Problem, error) {
	streams := map[string]*tcpStream{}
	var order []string
	var problems []Problem
	for n := 1; ; n++ {
		p, err := src.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			// What was read stays good: report, then deliver the
			// streams gathered so far.
			problems = append(problems, Problem{Session: "capture", Msg: fmt.Sprintf("packet %d: %v; the rest of the file is not read", n, err)})
			break
		}
		pkt := gopacket.NewPacket(p.data, p.link, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
		net := pkt.NetworkLayer()
		if net == nil {
			continue
		}
		if fragment(pkt) {
			problems = append(problems, Problem{Session: "capture", Msg: fmt.Sprintf("packet %d: an IP fragment; fragments are not reassembled, so what it carries is not decoded", n)})
			continue
		}
		src, dst := net.NetworkFlow().Endpoints()
		switch tl := pkt.TransportLayer().(type) {
		case *layers.UDP:
			if uint16(tl.SrcPort) != port && uint16(tl.DstPort) != port {
				continue
			}
			sess := fmt.Sprintf("udp %s:%d -> %s:%d", src, tl.SrcPort, dst, tl.DstPort)
			if err := h(Message{Session: sess, UDP: true, Where: fmt.Sprintf("packet %d", n), Data: tl.Payload}); err != nil {
				return problems, err
			}
		case *layers.TCP:
			if uint16(tl.SrcPort) != port && uint16(tl.DstPort) != port {
				continue
			}
			sess := fmt.Sprintf("tcp %s:%d -> %s:%d", src, tl.SrcPort, dst, tl.DstPort)
			s := streams[sess]
			if s == nil {
				s = &tcpStream{}
				streams[sess] = s
				order = append(order, sess)
			}
			s.add(tl)
		}
	}
	for _, sess := range order {
		data, gap := streams[sess].assemble()
		if gap != "" {
			problems = append(problems, Problem{Session: sess, Msg: gap})
		}
		if len(data) == 0 {
			continue
		}
		mr := ipfix.NewMessageReader(bytes.NewReader(data))
		for {
			msg, err := mr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				// After a hole, a message cut short is its consequence,
				// already reported.
				if gap == "" || !errors.Is(err, io.ErrUnexpectedEOF) {
					problems = append(problems, Problem{Session: sess, Msg: err.Error()})
				}
				break
			}
			if err := h(Message{Session: sess, Where: fmt.Sprintf("stream offset %d", mr.Offset), Data: msg}); err != nil {
				return problems, err
			}
		}
	}
	return problems, nil
}

// fragment reports whether pkt is an IPv4 or IPv6 fragment.
func fragment(pkt gopacket.Packet) bool {
	if ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		return ip.Flags&layers.IPv4MoreFragments != 0 || ip.FragOffset != 0
	}
	return pkt.Layer(layers.LayerTypeIPv6Fragment) != nil
}

// tcpStream collects one direction's segments.
type tcpStream struct {
	isn    uint32
	hasSYN bool
	segs   []segment
}

type segment struct {
	seq  uint32
	data []byte
}

func (s *tcpStream) add(t *layers.TCP) {
	seq := t.Seq
	if t.SYN {
		// The SYN takes one sequence number; data it carries (TCP Fast
		// Open) starts after it.
		s.isn, s.hasSYN = t.Seq+1, true
		seq++
	}
	if len(t.Payload) == 0 {
		return
	}
	s.segs = append(s.segs, segment{seq: seq, data: bytes.Clone(t.Payload)})
}

// assemble orders the segments by their offset from the start of the
// stream, drops retransmitted bytes and stops at the first hole.
func (s *tcpStream) assemble() ([]byte, string) {
	if len(s.segs) == 0 {
		return nil, ""
	}
	base := s.isn
	if !s.hasSYN {
		// Without the handshake, the lowest sequence number (modulo
		// wrap, relative to the first segment) starts the stream.
		base = s.segs[0].seq
		for _, g := range s.segs {
			if int32(g.seq-base) < 0 {
				base = g.seq
			}
		}
	}
	sort.SliceStable(s.segs, func(i, j int) bool { return s.segs[i].seq-base < s.segs[j].seq-base })
	var out []byte
	for _, g := range s.segs {
		if int32(g.seq-base) < 0 {
			continue // before the stream began: a stray retransmission
		}
		off := int64(g.seq - base)
		end := off + int64(len(g.data))
		switch {
		case end <= int64(len(out)):
			continue // a retransmission of bytes we have
		case off > int64(len(out)):
			return out, fmt.Sprintf("capture is missing %d octets at stream offset %d; the rest of the stream is not decoded", off-int64(len(out)), len(out))
		}
		out = append(out, g.data[int64(len(out))-off:]...)
	}
	return out, ""
}
