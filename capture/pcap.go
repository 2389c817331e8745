package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/google/gopacket/layers"
)

// maxPacket bounds the packet size a capture may claim, so that a corrupt
// length field cannot make the reader allocate gigabytes.
const maxPacket = 256 << 10

// packet is one captured frame and its link type.
type packet struct {
	data []byte
	link layers.LinkType
}

// packetReader yields packets until io.EOF.
type packetReader interface {
	next() (packet, error)
}

// pcapReader reads the classic libpcap format, either byte order, micro-
// or nanosecond timestamps (which we do not need).
type pcapReader struct {
	r    io.Reader
	bo   binary.ByteOrder
	link layers.LinkType
	hdr  [16]byte
	buf  []byte
}

func newPcapReader(r io.Reader) (*pcapReader, error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("pcap file header: %w", noEOF(err))
	}
	p := &pcapReader{r: r}
	switch binary.BigEndian.Uint32(h[:]) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		p.bo = binary.BigEndian
	default:
		p.bo = binary.LittleEndian
	}
	p.link = layers.LinkType(p.bo.Uint32(h[20:]) & 0xffff)
	return p, nil
}

func (p *pcapReader) next() (packet, error) {
	if _, err := io.ReadFull(p.r, p.hdr[:]); err != nil {
		if err == io.EOF {
			return packet{}, io.EOF
		}
		return packet{}, fmt.Errorf("pcap record header: %w", noEOF(err))
	}
	n := p.bo.Uint32(p.hdr[8:])
	if n > maxPacket {
		return packet{}, fmt.Errorf("pcap record claims %d octets (limit %d)", n, maxPacket)
	}
	if cap(p.buf) < int(n) {
		p.buf = make([]byte, n)
	}
	b := p.buf[:n]
	if _, err := io.ReadFull(p.r, b); err != nil {
		return packet{}, fmt.Errorf("pcap record of %d octets: %w", n, noEOF(err))
	}
	return packet{data: b, link: p.link}, nil
}

// ngReader reads pcapng: section headers (either byte order), interface
// descriptions for link types, and enhanced and simple packet blocks;
// other blocks are skipped.
type ngReader struct {
	r     io.Reader
	bo    binary.ByteOrder
	links []layers.LinkType
	buf   []byte
}

func newNgReader(r io.Reader) *ngReader { return &ngReader{r: r, bo: binary.LittleEndian} }

func (g *ngReader) next() (packet, error) {
	for {
		var h [8]byte
		if _, err := io.ReadFull(g.r, h[:]); err != nil {
			if err == io.EOF {
				return packet{}, io.EOF
			}
			return packet{}, fmt.Errorf("pcapng block header: %w", noEOF(err))
		}
		typ := binary.BigEndian.Uint32(h[:])
		if typ == 0x0a0d0d0a {
			// The byte-order magic after the length decides how the
			// length itself reads.
			var m [4]byte
			if _, err := io.ReadFull(g.r, m[:]); err != nil {
				return packet{}, fmt.Errorf("pcapng section header: %w", noEOF(err))
			}
			switch binary.BigEndian.Uint32(m[:]) {
			case 0x1a2b3c4d:
				g.bo = binary.BigEndian
			case 0x4d3c2b1a:
				g.bo = binary.LittleEndian
			default:
				return packet{}, errors.New("pcapng section header: bad byte-order magic")
			}
			g.links = g.links[:0]
			if _, err := g.body(g.bo.Uint32(h[4:]), 12); err != nil {
				return packet{}, err
			}
			continue
		}
		typ = g.bo.Uint32(h[:])
		body, err := g.body(g.bo.Uint32(h[4:]), 8)
		if err != nil {
			return packet{}, err
		}
		switch typ {
		case 1: // interface description
			if len(body) < 2 {
				return packet{}, errors.New("pcapng interface block too short")
			}
			g.links = append(g.links, layers.LinkType(g.bo.Uint16(body)))
		case 6: // enhanced packet
			if len(body) < 20 {
				return packet{}, errors.New("pcapng packet block too short")
			}
			ifc, n := g.bo.Uint32(body), g.bo.Uint32(body[12:])
			if int(ifc) >= len(g.links) {
				return packet{}, fmt.Errorf("pcapng packet names interface %d of %d", ifc, len(g.links))
			}
			if uint64(n) > uint64(len(body)-20) {
				return packet{}, fmt.Errorf("pcapng packet claims %d octets, block holds %d", n, len(body)-20)
			}
			return packet{data: body[20 : 20+n], link: g.links[ifc]}, nil
		case 3: // simple packet, on interface 0
			if len(body) < 4 || len(g.links) == 0 {
				return packet{}, errors.New("pcapng simple packet block without interface")
			}
			n := min(int(g.bo.Uint32(body)), len(body)-4)
			return packet{data: body[4 : 4+n], link: g.links[0]}, nil
		}
	}
}

// body reads the rest of a block of total length n, of which read octets
// are consumed, and returns it less the trailing length copy.
func (g *ngReader) body(n uint32, read int) ([]byte, error) {
	if n < uint32(read)+4 || n%4 != 0 || n > maxPacket+64 {
		return nil, fmt.Errorf("pcapng block length %d is invalid", n)
	}
	rest := int(n) - read
	if cap(g.buf) < rest {
		g.buf = make([]byte, rest)
	}
	b := g.buf[:rest]
	if _, err := io.ReadFull(g.r, b); err != nil {
		return nil, fmt.Errorf("pcapng block of %d octets: %w", n, noEOF(err))
	}
	return b[:rest-4], nil
}

// noEOF turns a clean EOF inside a structure into an unexpected one.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
