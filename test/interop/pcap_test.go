package interop_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// pcapBase is the timestamp of the first packet of the synthetic capture.
var pcapBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// The synthetic capture holds numFlows TCP connections from
// clientAddr:clientPort+i to serverAddr:serverPort.
var (
	clientAddr = netip.MustParseAddr("10.244.1.10")
	serverAddr = netip.MustParseAddr("10.244.2.20")
	clientMAC  = net.HardwareAddr{0x02, 0x00, 0x0a, 0xf4, 0x01, 0x0a}
	serverMAC  = net.HardwareAddr{0x02, 0x00, 0x0a, 0xf4, 0x02, 0x14}
)

const (
	numFlows   = 3
	clientPort = 40000
	serverPort = 80
	// Payload sizes of the request and of the response.
	requestLen  = 78
	responseLen = 1000
)

// flowKey is a unidirectional 5-tuple.
type flowKey struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

func (k flowKey) reverse() flowKey {
	return flowKey{Src: k.Dst, Dst: k.Src, SrcPort: k.DstPort, DstPort: k.SrcPort, Proto: k.Proto}
}

// directionCount is what a metering process should report for one
// direction of a connection, computed from the packets as generated.
type directionCount struct {
	Packets, Octets uint64 // octets: sum of the IPv4 total lengths
	// First and Last are the times of the first and last packet of this
	// direction; ConnFirst and ConnLast those of the whole connection.
	First, Last         time.Time
	ConnFirst, ConnLast time.Time
}

// step is one packet of a connection's script.
type step struct {
	at      time.Duration // after the connection's start
	fromCli bool
	syn     bool
	fin     bool
	payload int
}

// connectionScript is SYN, SYN-ACK, request, response, FIN, FIN.
var connectionScript = []step{
	{at: 0, fromCli: true, syn: true},
	{at: 1 * time.Millisecond, fromCli: false, syn: true},
	{at: 2 * time.Millisecond, fromCli: true, payload: requestLen},
	{at: 5 * time.Millisecond, fromCli: false, payload: responseLen},
	{at: 7 * time.Millisecond, fromCli: true, fin: true},
	{at: 9 * time.Millisecond, fromCli: false, fin: true},
}

// tcpOptions returns the options Linux puts on a segment: MSS, SACK
// permitted, timestamps and window scale on a SYN, timestamps otherwise.
// They make every IPv4 packet at least 52 octets long, so no frame needs
// Ethernet padding (see writeFlowPcap).
func tcpOptions(syn bool, tsval, tsecr uint32) []layers.TCPOption {
	ts := make([]byte, 8)
	binary.BigEndian.PutUint32(ts, tsval)
	binary.BigEndian.PutUint32(ts[4:], tsecr)
	tsOpt := layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: ts}
	nop := layers.TCPOption{OptionType: layers.TCPOptionKindNop, OptionLength: 1}
	if !syn {
		return []layers.TCPOption{nop, nop, tsOpt}
	}
	return []layers.TCPOption{
		{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
		{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
		tsOpt,
		nop,
		{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}},
	}
}

// writeFlowPcap writes a deterministic Ethernet capture of numFlows TCP
// connections to path and returns, for each direction of each connection,
// the packet and octet counts and packet times a meter should report.
func writeFlowPcap(t testing.TB, path string) map[flowKey]*directionCount {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	want := map[flowKey]*directionCount{}
	for i := range numFlows {
		start := pcapBase.Add(time.Duration(i) * 100 * time.Millisecond)
		fwd := flowKey{clientAddr, serverAddr, uint16(clientPort + i), serverPort, 6}
		seq := map[bool]uint32{true: 1000 + uint32(i)*7919, false: 5000 + uint32(i)*104729}
		tsval := map[bool]uint32{true: 100000 + uint32(i), false: 200000 + uint32(i)}
		for j, s := range connectionScript {
			ts := start.Add(s.at)
			key, srcMAC, dstMAC := fwd, clientMAC, serverMAC
			if !s.fromCli {
				key, srcMAC, dstMAC = fwd.reverse(), serverMAC, clientMAC
			}
			ip := &layers.IPv4{
				Version: 4, IHL: 5, TTL: 64, Id: uint16(100*i + j), Flags: layers.IPv4DontFragment,
				Protocol: layers.IPProtocolTCP, SrcIP: key.Src.AsSlice(), DstIP: key.Dst.AsSlice(),
			}
			tcp := &layers.TCP{
				SrcPort: layers.TCPPort(key.SrcPort), DstPort: layers.TCPPort(key.DstPort),
				Seq: seq[s.fromCli], Window: 502,
				SYN: s.syn, FIN: s.fin, PSH: s.payload > 0,
				// Everything but the client's SYN acknowledges the peer.
				ACK: j > 0,
			}
			if tcp.ACK {
				tcp.Ack = seq[!s.fromCli]
			}
			tcp.Options = tcpOptions(s.syn, tsval[s.fromCli], tsval[!s.fromCli])
			if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, s.payload)
			for k := range payload {
				payload[k] = byte('a' + (k+i)%26)
			}
			eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
			buf := gopacket.NewSerializeBuffer()
			opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
			if err := gopacket.SerializeLayers(buf, opts, eth, ip, tcp, gopacket.Payload(payload)); err != nil {
				t.Fatal(err)
			}
			frame := buf.Bytes()
			ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: len(frame)}
			if err := w.WritePacket(ci, frame); err != nil {
				t.Fatal(err)
			}

			// A meter counts the IPv4 total length (RFC 7012,
			// octetDeltaCount), but softflowd counts the frame length less
			// the link header, so it would count the padding gopacket adds
			// to a frame shorter than 60 octets (a bare 40-octet SYN
			// counts as 46). The TCP options keep every frame long enough
			// for both counts to agree; check that they do.
			ipLen := int(binary.BigEndian.Uint16(frame[14+2:]))
			if ipLen != int(ip.Length) || ipLen != len(frame)-14 {
				t.Fatalf("packet %d.%d: IPv4 total length %d (layer %d), but the frame holds %d octets after the Ethernet header",
					i, j, ipLen, ip.Length, len(frame)-14)
			}

			// SYN and FIN take one sequence number, data its length.
			seq[s.fromCli] += uint32(s.payload)
			if s.syn || s.fin {
				seq[s.fromCli]++
			}
			tsval[s.fromCli] += 3

			c := want[key]
			if c == nil {
				c = &directionCount{First: ts}
				want[key] = c
			}
			c.Packets++
			c.Octets += uint64(ipLen)
			c.Last = ts
		}
		last := start.Add(connectionScript[len(connectionScript)-1].at)
		for _, k := range []flowKey{fwd, fwd.reverse()} {
			want[k].ConnFirst, want[k].ConnLast = start, last
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestFlowPcapDeterministic checks that the capture is the same file on
// every run and reads back as written.
func TestFlowPcapDeterministic(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.pcap"), filepath.Join(dir, "b.pcap")
	want := writeFlowPcap(t, a)
	writeFlowPcap(t, b)
	ab, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ab, bb) {
		t.Fatal("two runs wrote different captures")
	}

	f, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	got := map[flowKey]*directionCount{}
	for {
		data, ci, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if ip == nil || tcp == nil || pkt.ErrorLayer() != nil {
			t.Fatalf("packet at %s does not decode as TCP/IPv4: %v", ci.Timestamp, pkt.ErrorLayer())
		}
		src, _ := netip.AddrFromSlice(ip.SrcIP)
		dst, _ := netip.AddrFromSlice(ip.DstIP)
		k := flowKey{src, dst, uint16(tcp.SrcPort), uint16(tcp.DstPort), uint8(ip.Protocol)}
		c := got[k]
		if c == nil {
			c = &directionCount{First: ci.Timestamp}
			got[k] = c
		}
		c.Packets++
		c.Octets += uint64(ip.Length)
		c.Last = ci.Timestamp
	}
	if len(got) != 2*numFlows {
		t.Fatalf("capture holds %d directions, want %d", len(got), 2*numFlows)
	}
	for k, w := range want {
		g := got[k]
		if g == nil || g.Packets != w.Packets || g.Octets != w.Octets || !g.First.Equal(w.First) || !g.Last.Equal(w.Last) {
			t.Errorf("%v: read back %+v, want %+v", k, g, w)
		}
	}
}
